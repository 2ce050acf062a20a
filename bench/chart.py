"""Create and restore time against tree size, each backend beside the
baselines, measured in the same run, drawn as SVG by gnuplot (`make bench`).

At each tree size, every series repeats the same step: 10 files change, a
"create" keeps the tree, 10 other files change, a "restore" brings the tree
back to that create. Each time is the median wall clock of the repeats, in ms.

- overlay, tar: ckptd over HTTP (create; restore of that checkpoint).
- btrfs: the tree in a subvolume on a loop device (btrfs on a file in the
  bench's work dir). Create: `btrfs subvolume snapshot -r`. Rollback: delete
  the live subvolume and snapshot the read-only one back in its place.
- rsync: create `rsync -a --delete tree/ copy/`; restore `rsync -a --delete
  copy/ tree/`.
- tar -x: create `tar -cf` of the whole tree; restore `tar -xf` of that full
  archive into an empty dir (removing the old tree is not timed).

Results go to docs/bench/chart.dat (one line a size), a markdown table, and
docs/bench/create.svg and docs/bench/restore.svg. `bench/chart.py DAT` draws
the charts again from a .dat file without measuring."""
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import time

TOP = pathlib.Path(__file__).resolve().parents[1]
OUT = TOP / "docs" / "bench"
SERIES = ["overlay", "tar", "btrfs", "rsync", "tar -x"]
# ckptd's backends solid, the baselines dashed.
STYLES = {"overlay": 'lc rgb "#1f77b4" dt 1', "tar": 'lc rgb "#ff7f0e" dt 1', "btrfs": 'lc rgb "#2ca02c" dt 2',
          "rsync": 'lc rgb "#d62728" dt 2', "tar -x": 'lc rgb "#7f7f7f" dt 2'}
TITLES = {"overlay": "ckptd overlay", "tar": "ckptd tar", "btrfs": "btrfs snapshot / rollback",
          "rsync": "rsync -a --delete", "tar -x": "tar -c / tar -x (full archive)"}


def chart_log(*a):
    print(*a, file=sys.stderr, flush=True)


def chart_timed(argv):
    subprocess.run(["sync"])
    t0 = time.perf_counter()
    subprocess.run(argv, check=True, stdout=subprocess.DEVNULL)
    return (time.perf_counter() - t0) * 1000


def chart_ckptd(bench, backend, work, src, n_files, reps):
    """Medians (create, restore) of ckptd's backend, wall clock of the HTTP call."""
    d = bench.Daemon(backend, src, work / f"state-chart-{backend}")
    try:
        bench.wait_ready(d)
        d.create("c0")
        creates, restores = [], []
        for i in range(reps):
            bench.touch_10(src, n_files, f"c{i}")
            c, wall = d.create(f"chart{i}")
            creates.append(wall)
            bench.touch_10(src, n_files, f"r{i}", off=1)
            _, wall = d.restore(c["checkpoint_id"])
            restores.append(wall)
        return statistics.median(creates), statistics.median(restores)
    finally:
        d.stop()


def chart_btrfs(bench, work, src, n_files, total, reps):
    """Medians (snapshot, rollback) of the tree in a btrfs subvolume on a loop device."""
    img, mnt = work / "btrfs.img", work / "btrfs"
    mnt.mkdir()
    with open(img, "wb") as f:
        f.truncate(max(3 * total + (n_files << 13), 512 << 20))
    subprocess.run(["mkfs.btrfs", "-q", "-f", str(img)], check=True, stdout=subprocess.DEVNULL)
    subprocess.run(["mount", "-o", "loop", str(img), str(mnt)], check=True)
    try:
        live = mnt / "live"
        subprocess.run(["btrfs", "-q", "subvolume", "create", str(live)], check=True)
        subprocess.run(["cp", "-a", f"{src}/.", str(live)], check=True)
        creates, restores = [], []
        for i in range(reps):
            bench.touch_10(live, n_files, f"c{i}")
            snap = mnt / f"snap{i}"
            creates.append(chart_timed(["btrfs", "-q", "subvolume", "snapshot", "-r", str(live), str(snap)]))
            bench.touch_10(live, n_files, f"r{i}", off=1)
            restores.append(chart_timed(["sh", "-c", f"btrfs -q subvolume delete {live} && "
                                         f"btrfs -q subvolume snapshot {snap} {live}"]))
        return statistics.median(creates), statistics.median(restores)
    finally:
        subprocess.run(["umount", str(mnt)], check=False)
        img.unlink()


def chart_rsync(bench, work, src, n_files, reps):
    copy = work / "chart-rsync"
    subprocess.run(["cp", "-a", str(src), str(copy)], check=True)
    try:
        creates, restores = [], []
        for i in range(reps):
            bench.touch_10(src, n_files, f"c{i}")
            creates.append(chart_timed(["rsync", "-a", "--delete", f"{src}/", f"{copy}/"]))
            bench.touch_10(src, n_files, f"r{i}", off=1)
            restores.append(chart_timed(["rsync", "-a", "--delete", f"{copy}/", f"{src}/"]))
        return statistics.median(creates), statistics.median(restores)
    finally:
        bench.drop_tree(copy)


def chart_tar(bench, work, src, n_files, reps):
    archive, dst = work / "chart.tar", work / "chart-x"
    try:
        creates, restores = [], []
        for i in range(reps):
            bench.touch_10(src, n_files, f"c{i}")
            creates.append(chart_timed(["tar", "-C", str(src), "-cf", str(archive), "."]))
            bench.touch_10(src, n_files, f"r{i}", off=1)
            bench.drop_tree(dst)
            dst.mkdir()
            restores.append(chart_timed(["tar", "-C", str(dst), "-xf", str(archive)]))
        return statistics.median(creates), statistics.median(restores)
    finally:
        bench.drop_tree(dst)
        archive.unlink(missing_ok=True)


def chart_measure(bench, work, src, n_files, total, runs):
    """{series: (create ms, restore ms)} at one tree size; a series that
    cannot run here is left out, with its reason in the log."""
    reps = max(3, runs // 4)
    res = {}
    for backend in ("overlay", "tar"):
        chart_log(f"[chart] {backend}")
        res[backend] = chart_ckptd(bench, backend, work, src, n_files, reps)
    if shutil.which("mkfs.btrfs") and os.path.exists("/dev/loop-control"):
        chart_log("[chart] btrfs on a loop device")
        try:
            res["btrfs"] = chart_btrfs(bench, work, src, n_files, total, reps)
        except subprocess.CalledProcessError as e:
            chart_log(f"[chart] btrfs left out: {e}")
    else:
        chart_log("[chart] btrfs left out: no mkfs.btrfs or no loop devices")
    chart_log("[chart] rsync -a --delete")
    res["rsync"] = chart_rsync(bench, work, src, n_files, reps)
    chart_log("[chart] tar -c / tar -x")
    res["tar -x"] = chart_tar(bench, work, src, n_files, reps)
    return res


def chart_dat(points):
    """points: [(files, MB, {series: (create, restore)})] -> the .dat text."""
    head = "# files MB " + " ".join(f"{s.replace(' ', '_')}_create {s.replace(' ', '_')}_restore" for s in SERIES)
    lines = [head]
    for files, mb, res in sorted(points):
        cells = []
        for s in SERIES:
            c, r = res.get(s, (None, None))
            cells += ["NaN" if c is None else f"{c:.2f}", "NaN" if r is None else f"{r:.2f}"]
        lines.append(f"{files} {mb} " + " ".join(cells))
    return "\n".join(lines) + "\n"


def chart_table(dat):
    """The markdown table of a .dat text: one row a size, create / restore ms."""
    rows = [line.split() for line in dat.splitlines() if line and not line.startswith("#")]
    out = ["| files (MB) | " + " | ".join(f"{TITLES[s]}: create / restore" for s in SERIES) + " |",
           "| --- |" + " --- |" * len(SERIES)]
    for r in rows:
        cells = []
        for i in range(len(SERIES)):
            c, v = r[2 + 2 * i], r[3 + 2 * i]
            cells.append("-" if c == "NaN" else f"{float(c):.1f} / {float(v):.1f}")
        out.append(f"| {int(r[0]):,} ({r[1]}) | " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


GNUPLOT = """set terminal svg size 760,480 dynamic font "sans,12" background "white"
set output "{out}"
set title "{title}"
set xlabel "files in the tree (100 per directory)"
set ylabel "ms, median wall clock (log scale)"
set logscale xy
set autoscale xfix
set offsets graph 0.05, graph 0.05, 0, 0
set format x "%.0s%c"
set grid
set key below horizontal maxcols 3 width 1
set datafile missing "NaN"
plot {plots}
"""


def chart_draw(dat_path, out=OUT):
    """create.svg and restore.svg from a .dat file, by gnuplot."""
    if not shutil.which("gnuplot"):
        chart_log("[chart] not drawn: gnuplot is missing (make deps installs gnuplot-nox)")
        return False
    for what, col, title in (("create", 0, "Create: keep the tree after 10 changed files"),
                             ("restore", 1, "Restore: bring the tree back after 10 changed files")):
        plots = ", ".join(f'"{dat_path}" using 1:{3 + 2 * i + col} with linespoints lw 2 {STYLES[s]} title "{TITLES[s]}"'
                          for i, s in enumerate(SERIES))
        script = GNUPLOT.format(out=out / f"{what}.svg", title=title, plots=plots)
        subprocess.run(["gnuplot"], input=script, text=True, check=True)
    return True


def chart_write(points, out=OUT):
    """Writes chart.dat, draws the SVGs and returns the markdown table."""
    out.mkdir(parents=True, exist_ok=True)
    dat = chart_dat(points)
    (out / "chart.dat").write_text(dat)
    chart_draw(out / "chart.dat", out)
    return chart_table(dat)


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: bench/chart.py DAT  (draws docs/bench/*.svg from it)")
    p = pathlib.Path(sys.argv[1]).resolve()
    chart_draw(p)
    print(chart_table(p.read_text()))
