#!/usr/bin/python3
"""ckptd benchmarks (`make bench`): overlay restore against the tar backend,
`tar -x` into an empty dir and `cp -a`; create after 10 small changes against
create after rewriting everything; restore in a retry loop writing 500 MB per
attempt (p99 wall clock) and the create's freeze time with a writer running,
each beside its target; diff of 10 changes on both backends; incremental tar
creates against a full one and the tar restore against `rsync -a --delete`
from a pristine copy (--cases tarinc). Drives the real daemon over HTTP. Then load:
wrk on the GET endpoints while restores run (bench/load.py): req/s and p99.
Host mode: handoff overhead over raw runsc, volume and etcd locks (bench/host.py).
Charts (bench/chart.py, --cases chart): create and restore time against tree
size for both backends beside btrfs, `rsync -a --delete` and `tar -x`, at the
--chart-sizes, drawn by gnuplot into docs/bench/*.svg.
Environments (--cases env): the backend auto picks on the host, under runsc do,
in unshare -Urm and without CAP_SYS_ADMIN, beside rsync there (bench/envbench.py).

Usage: bench/run.py [--sizes small,large] [--runs N] [--load-secs S] [--out bench/results.md]
                    [--cases all|retry|freeze|diff|tarinc|track|host|chart|env|wholeroot]  (one case: printed only)
                    [--chart-sizes 1000:10,small,large]
(--sizes "" --load-secs 5 runs only a short load section; a size may also be
FILES:MB, e.g. --sizes 20000:200 --cases track for a quick run.)
Not a test: it prints a markdown table and writes it to bench/results.md."""
import argparse
import os
import pathlib
import platform
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time

import requests

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import load  # noqa: E402
import chart  # noqa: E402
import host  # noqa: E402
import envbench  # noqa: E402
import wholeroot  # noqa: E402

TOP = pathlib.Path(__file__).resolve().parents[1]
BUILD = pathlib.Path(os.environ.get("BUILD", TOP / "build"))
CKPTD = str(BUILD / "ckptd" if BUILD.is_absolute() else TOP / BUILD / "ckptd")
SIZES = {"small": (10_000, 100 << 20), "large": (100_000, 1 << 30)}


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def size_of(name):
    """small, large, or FILES:MB."""
    if name in SIZES:
        return SIZES[name]
    files, mb = name.split(":")
    SIZES[name] = (int(files), int(mb) << 20)
    return SIZES[name]


def make_tree(root, n_files, total):
    """n_files files of total bytes, 100 per directory, incompressible data."""
    per = total // n_files
    pool = os.urandom(per + 4096)
    for i in range(n_files):
        d = root / f"d{i // 100:04d}"
        if i % 100 == 0:
            d.mkdir(parents=True, exist_ok=True)
        off = (i * 131) % 4096
        with open(d / f"f{i:06d}", "wb") as f:
            f.write(pool[off:off + per])


def files_of(root, n_files):
    return [root / f"d{i // 100:04d}" / f"f{i:06d}" for i in range(n_files)]


def drop_tree(p):
    subprocess.run(["rm", "-rf", str(p)], check=False)


class Daemon:
    def __init__(self, backend, root, state):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [CKPTD, "--listen", f"127.0.0.1:{self.port}", "--state-dir", str(state),
                "--root", str(root), "--backend", backend, "--unmount-on-exit"]
        self.log = open(state.parent / f"ckptd-{backend}.log", "wb")
        self.proc = subprocess.Popen(argv, stdout=self.log, stderr=self.log)
        self.s = requests.Session()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if self.s.get(self.url + "/v1/health", timeout=1).status_code == 200:
                    return
            except requests.ConnectionError:
                time.sleep(0.05)
        raise RuntimeError("ckptd did not start")

    def create(self, name):
        t0 = time.perf_counter()
        r = self.s.post(self.url + "/v1/checkpoints", json={"name": name}, timeout=3600)
        wall = (time.perf_counter() - t0) * 1000
        assert r.status_code == 201, r.text
        return r.json(), wall

    def restore(self, cid):
        t0 = time.perf_counter()
        r = self.s.post(self.url + f"/v1/checkpoints/{cid}/restore", json={}, timeout=3600)
        wall = (time.perf_counter() - t0) * 1000
        assert r.status_code == 200, r.text
        return r.json(), wall

    def stop(self):
        self.proc.terminate()
        self.proc.wait(60)
        self.log.close()


def timed(argv, cwd=None):
    t0 = time.perf_counter()
    subprocess.run(argv, cwd=cwd, check=True)
    return (time.perf_counter() - t0) * 1000


def touch_10(root, n_files, tag, off=0):
    for p in files_of(root, n_files)[off:: n_files // 10][:10]:
        with open(p, "r+b") as f:
            f.write(tag.encode())


def rewrite_all(root, n_files):
    for p in files_of(root, n_files):
        with open(p, "r+b") as f:
            f.write(b"R")


def bench_overlay(work, src, n_files, runs):
    res = {}
    d = Daemon("overlay", src, work / "state-ovl")
    try:
        c0, _ = d.create("c0")
        touch_10(src, n_files, "a")
        c1, wall = d.create("ten")
        res["create10"] = (c1["duration_ms"], wall)
        api, walls, swaps = [], [], []
        for i in range(runs):
            rep, wall = d.restore(c0["checkpoint_id"] if i % 2 == 0 else c1["checkpoint_id"])
            api.append(rep["restore_duration_ms"])
            swaps.append(rep.get("phases", {}).get("swap_ms", rep["restore_duration_ms"]))
            walls.append(wall)
        res["restore"] = (statistics.median(api), statistics.median(walls), statistics.median(swaps))
        d.restore(c0["checkpoint_id"])
        rewrite_all(src, n_files)
        call, wall = d.create("all")
        res["create_all"] = (call["duration_ms"], wall)
        touch_10(src, n_files, "b")
        c3, wall = d.create("ten-after-all")
        res["create10_full_upper"] = (c3["duration_ms"], wall)
    finally:
        d.stop()
    return res


def bench_tar(work, src, n_files, runs):
    res = {}
    d = Daemon("tar", src, work / "state-tar")
    try:
        c0, wall = d.create("c0")
        res["tar_create"] = (c0["duration_ms"], wall)
        api, walls = [], []
        for i in range(max(3, runs // 3)):
            touch_10(src, n_files, "t")
            rep, wall = d.restore(c0["checkpoint_id"])
            api.append(rep["restore_duration_ms"])
            walls.append(wall)
        res["tar_restore"] = (statistics.median(api), statistics.median(walls))
    finally:
        d.stop()
    return res


def wait_ready(d):
    """The tar backend takes its base in the background ("preparing")."""
    while d.s.get(d.url + "/v1/health", timeout=5).json().get("status") == "preparing":
        time.sleep(0.05)


def bench_tarinc(work, src, n_files, runs):
    """Tar backend: a full create (every file rewritten since the previous
    checkpoint) against incremental creates after 10 changes, and a restore
    after 10 changes against `rsync -a --delete` from a pristine copy of the
    same state, alternating, in the same run."""
    d = Daemon("tar", src, work / "state-tarinc")
    try:
        wait_ready(d)
        rewrite_all(src, n_files)
        full, full_wall = d.create("full")
        inc, inc_walls, reused = [], [], []
        for i in range(max(3, runs // 3)):
            touch_10(src, n_files, f"i{i}")
            c, wall = d.create(f"inc{i}")
            inc.append(c["duration_ms"])
            inc_walls.append(wall)
        pristine = work / "pristine"
        subprocess.run(["cp", "-a", str(src), str(pristine)], check=True)
        subprocess.run(["sync"])
        rs, api, walls, archives = [], [], [], []
        for i in range(max(3, runs // 3)):
            # other files than the incremental creates changed: their data
            # is in the full archive, the far end of the chain
            touch_10(src, n_files, f"r{i}", off=1)
            rs.append(timed(["rsync", "-a", "--delete", f"{pristine}/", f"{src}/"]))
            touch_10(src, n_files, f"s{i}", off=1)
            rep, wall = d.restore(c["checkpoint_id"])
            api.append(rep["restore_duration_ms"])
            walls.append(wall)
            last = d.s.get(d.url + "/v1/health").json().get("tar_last_restore", {})
            archives.append((last.get("archives"), last.get("entered")))
        log(f"tarinc: full create {full['duration_ms']} ms, incremental {inc}, restores {api} ((archives read, "
            f"entries entered) {archives}), rsync {[round(x) for x in rs]}")
        drop_tree(pristine)
        return {"tarinc": (full["duration_ms"], full_wall, statistics.median(inc), statistics.median(inc_walls),
                           statistics.median(api), statistics.median(walls), statistics.median(rs))}
    finally:
        d.stop()


def p99(xs):
    xs = sorted(xs)
    return xs[max(0, -(-99 * len(xs) // 100) - 1)]


def bench_retry(work, src, runs, size=500 << 20, chunk=4 << 20):
    """A retry loop: each attempt writes size bytes into the root (no sync),
    then rolls back. Wall clock of every restore, including any wait for the
    previous attempt's cleanup."""
    d = Daemon("overlay", src, work / "state-retry")
    try:
        c0, _ = d.create("c0")
        buf = os.urandom(chunk)
        walls, queues, swaps = [], [], []
        for i in range(runs):
            with open(src / "attempt.bin", "wb") as f:
                for _ in range(size // chunk):
                    f.write(buf)
            rep, wall = d.restore(c0["checkpoint_id"])
            walls.append(wall)
            queues.append(rep["phases"].get("queue_ms", 0))
            swaps.append(rep["phases"]["swap_ms"])
        log(f"retry loop restore walls (ms): {[round(w) for w in walls]}")
        return {"retry": (p99(walls), statistics.median(walls), max(queues), max(swaps))}
    finally:
        d.stop()


class Writer:
    """Appends a line to a file in the root every millisecond, as a service would."""
    def __init__(self, path):
        import threading
        self.path, self.stop_ = path, threading.Event()
        self.t = threading.Thread(target=self.run)
        self.t.start()

    def run(self):
        with open(self.path, "a") as f:
            while not self.stop_.is_set():
                f.write("x" * 4000 + "\n")
                f.flush()
                time.sleep(0.001)

    def stop(self):
        self.stop_.set()
        self.t.join()


def bench_freeze(work, src, n_files, runs):
    """freeze_ms of creates with a writer running: after 10 changes, and when
    the upper holds every file of the root (all rewritten once)."""
    d = Daemon("overlay", src, work / "state-freeze")
    try:
        d.create("c0")
        w = Writer(src / "writer.log")
        try:
            small = []
            for i in range(max(3, runs // 3)):
                touch_10(src, n_files, f"f{i}")
                c, _ = d.create(f"ten{i}")
                small.append(c["freeze_ms"])
            rewrite_all(src, n_files)
            full, _ = d.create("all")
        finally:
            w.stop()
        log(f"freeze_ms after 10 changes: {small}; upper holding every file: {full['freeze_ms']} "
            f"(create {full['duration_ms']} ms)")
        return {"freeze": (max(small), full["freeze_ms"], full["duration_ms"])}
    finally:
        d.stop()


def bench_diff(work, src, n_files, runs):
    """GET /v1/checkpoints/{id}/diff with 10 changes: between two checkpoints
    (?against=) and from a checkpoint to the live root, on both backends."""
    res = {}
    for backend in ("overlay", "tar"):
        d = Daemon(backend, src, work / f"state-diff-{backend}")
        try:
            c0, _ = d.create("d0")
            touch_10(src, n_files, "d")
            c1, _ = d.create("d1")
            touch_10(src, n_files, "e")
            pair, live = [], []
            for _ in range(max(3, runs // 3)):
                for out, url in ((pair, f"/v1/checkpoints/{c0['checkpoint_id']}/diff?against={c1['checkpoint_id']}"),
                                 (live, f"/v1/checkpoints/{c1['checkpoint_id']}/diff")):
                    t0 = time.perf_counter()
                    r = d.s.get(d.url + url, timeout=3600)
                    out.append((time.perf_counter() - t0) * 1000)
                    assert r.status_code == 200 and len(r.json()["changes"]) == 10, r.text[:300]
            res[f"diff_{backend}"] = (statistics.median(pair), statistics.median(live))
            d.restore(c0["checkpoint_id"])
        finally:
            d.stop()
    return res


def upper_of(root):
    """The upperdir of the overlay mounted at root (from mountinfo)."""
    for line in open("/proc/self/mountinfo"):
        f = line.split()
        if f[4] == str(root) and "upperdir=" in line:
            opts = line.split(" - ", 1)[1].split()[2]
            return [o.split("=", 1)[1] for o in opts.split(",") if o.startswith("upperdir=")][0]
    raise RuntimeError(f"no overlay at {root}")


def bench_track(work, src, n_files, runs):
    """Issue 11.4's case: creates of 10 small changes when the upper already
    holds every file (all rewritten once since the restore), against the
    20 ms target, beside a bare stat walk of that upper (`find -printf` of
    inode, size and ctime: what any create that walks the upper pays at least)."""
    d = Daemon("overlay", src, work / "state-track")
    try:
        d.create("c0")
        rewrite_all(src, n_files)
        d.create("all")
        up = upper_of(src)
        api, walls, walks = [], [], []
        for i in range(max(3, runs // 3)):
            touch_10(src, n_files, f"k{i}")
            c, wall = d.create(f"ten{i}")
            api.append(c["duration_ms"])
            walls.append(wall)
            t0 = time.perf_counter()
            subprocess.run(["find", up, "-printf", "%i %s %C@\\n"], stdout=subprocess.DEVNULL, check=True)
            walks.append((time.perf_counter() - t0) * 1000)
        log(f"create of 10 changes, upper holding every file: API {api}, wall {[round(w) for w in walls]}, "
            f"stat walk of the upper {[round(w) for w in walks]}")
        return {"track": (statistics.median(api), statistics.median(walls), statistics.median(walks))}
    finally:
        d.stop()


def bench_baselines(work, src, runs):
    archive = work / "tree.tar"
    subprocess.run(["tar", "-C", str(src), "-cf", str(archive), "."], check=True)
    tx, cp = [], []
    for i in range(runs):
        dst = work / f"x{i}"
        dst.mkdir()
        subprocess.run(["sync"])
        tx.append(timed(["tar", "-C", str(dst), "-xf", str(archive)]))
        drop_tree(dst)
        subprocess.run(["sync"])
        cp.append(timed(["cp", "-a", str(src), str(work / f"c{i}")]))
        drop_tree(work / f"c{i}")
    archive.unlink()
    return {"tar_x": statistics.median(tx), "cp_a": statistics.median(cp)}


def one_size(name, runs, cases="all"):
    n_files, total = size_of(name)
    work = pathlib.Path(tempfile.mkdtemp(prefix=f"ckptd-bench-{name}-", dir="/tmp"))
    try:
        src = work / "tree"
        log(f"[{name}] making {n_files} files / {total >> 20} MB")
        make_tree(src, n_files, total)
        subprocess.run(["sync"])
        res = {}
        if cases == "all":
            log(f"[{name}] baselines")
            res = bench_baselines(work, src, 3 if name == "small" else 1)
            log(f"[{name}] tar backend")
            res.update(bench_tar(work, src, n_files, runs))
            log(f"[{name}] overlay backend")
            res.update(bench_overlay(work, src, n_files, runs))
        if cases in ("all", "freeze"):
            log(f"[{name}] freeze time with a writer")
            res.update(bench_freeze(work, src, n_files, runs))
        if cases in ("all", "diff"):
            log(f"[{name}] diff of 10 changes")
            res.update(bench_diff(work, src, n_files, runs))
        if cases in ("all", "tarinc"):
            log(f"[{name}] tar incremental create and restore beside rsync")
            res.update(bench_tarinc(work, src, n_files, runs))
        if cases in ("all", "track"):
            log(f"[{name}] create of 10 changes when the upper holds every file")
            res.update(bench_track(work, src, n_files, runs))
        if cases in ("all", "retry"):
            log(f"[{name}] retry loop, 500 MB per attempt")
            res.update(bench_retry(work, src, runs))
        if cases in ("all", "chart"):
            log(f"[{name}] create and restore beside btrfs, rsync and tar, for the charts")
            res["chart"] = chart.chart_measure(sys.modules[__name__], work, src, n_files, total, runs)
        return res
    finally:
        subprocess.run(["bash", "-c", f"awk '$5 ~ \"^{work}/\" {{print $5}}' /proc/self/mountinfo | tac | "
                        "xargs -r -n1 umount -l"], check=False)
        drop_tree(work)


def machine():
    fs = subprocess.run(["findmnt", "-no", "FSTYPE", "-T", "/tmp"], capture_output=True, text=True).stdout.strip()
    return f"nproc {os.cpu_count()}, kernel {platform.release()}, /tmp on {fs}"


def fmt(x):
    return f"{x:.1f}" if x < 100 else f"{x:.0f}"


def table(results, runs):
    lines = [f"Machine: {machine()}. Medians; overlay restore over {runs} restores, no services.",
             "Times in ms: API duration field / wall clock around the HTTP call.", "",
             "| measure | " + " | ".join(f"{k} ({SIZES[k][0] // 1000}k files, {SIZES[k][1] >> 20} MB)"
                                       for k in results) + " |",
             "| --- |" + " --- |" * len(results)]

    def row(label, f):
        def cell(r):
            try:
                return f(r)
            except KeyError:  # a case not run (--cases)
                return "-"
        lines.append(f"| {label} | " + " | ".join(cell(r) for r in results.values()) + " |")

    row("overlay restore (API / wall / swap phase)",
        lambda r: f"{fmt(r['restore'][0])} / {fmt(r['restore'][1])} / {fmt(r['restore'][2])}")
    row("tar backend restore after 10 changes (API / wall)",
        lambda r: f"{fmt(r['tar_restore'][0])} / {fmt(r['tar_restore'][1])}")
    row("`tar -x` into an empty dir", lambda r: fmt(r["tar_x"]))
    row("`cp -a`", lambda r: fmt(r["cp_a"]))
    row("ratio tar backend / overlay restore (wall)", lambda r: f"{r['tar_restore'][1] / r['restore'][1]:.1f}x")
    row("ratio `tar -x` / overlay restore (wall)", lambda r: f"{r['tar_x'] / r['restore'][1]:.0f}x")
    row("ratio `cp -a` / overlay restore (wall)", lambda r: f"{r['cp_a'] / r['restore'][1]:.0f}x")
    row("overlay create after 10 small changes (API / wall)",
        lambda r: f"{fmt(r['create10'][0])} / {fmt(r['create10'][1])}")
    row("overlay create after rewriting everything (API / wall)",
        lambda r: f"{fmt(r['create_all'][0])} / {fmt(r['create_all'][1])}")
    row("ratio rewrite-all / 10 changes (wall)", lambda r: f"{r['create_all'][1] / r['create10'][1]:.0f}x")
    row("overlay create of 10 changes when the upper already holds every file (API / wall)",
        lambda r: f"{fmt(r['create10_full_upper'][0])} / {fmt(r['create10_full_upper'][1])}")
    row("tar backend first create (API / wall)", lambda r: f"{fmt(r['tar_create'][0])} / {fmt(r['tar_create'][1])}")
    row("overlay restore in a retry loop writing 500 MB per attempt: p99 wall (target ≤ 20) / median wall / "
        "max queue_ms / max swap_ms",
        lambda r: f"{fmt(r['retry'][0])} (target 20) / {fmt(r['retry'][1])} / {r['retry'][2]} / {r['retry'][3]}")
    row("overlay create with a writer running: freeze_ms after 10 changes, max (target ≤ 50) / "
        "freeze_ms when the upper holds every file / that create's duration_ms",
        lambda r: f"{r['freeze'][0]} (target 50) / {r['freeze'][1]} / {r['freeze'][2]}")
    row("diff of 10 changes, overlay: checkpoint to checkpoint / checkpoint to live root, wall (target ≤ 100)",
        lambda r: f"{fmt(r['diff_overlay'][0])} / {fmt(r['diff_overlay'][1])} (target 100)")
    row("diff of 10 changes, tar backend: checkpoint to checkpoint / checkpoint to live root, wall",
        lambda r: f"{fmt(r['diff_tar'][0])} / {fmt(r['diff_tar'][1])}")
    row("tar create: full (API / wall) / after 10 changes, incremental (API / wall) / ratio (target ≤ 10 %)",
        lambda r: f"{fmt(r['tarinc'][0])} / {fmt(r['tarinc'][1])} / {fmt(r['tarinc'][2])} / {fmt(r['tarinc'][3])} / "
        f"{100 * r['tarinc'][3] / r['tarinc'][1]:.1f} % (target 10 %)")
    row("tar restore after 10 changes (API / wall) / `rsync -a --delete` from a pristine copy / ratio wall "
        "(target ≤ 0.25x)",
        lambda r: f"{fmt(r['tarinc'][4])} / {fmt(r['tarinc'][5])} / {fmt(r['tarinc'][6])} / "
        f"{r['tarinc'][5] / r['tarinc'][6]:.2f}x (target 0.25x)")
    row("overlay create of 10 changes when the upper holds every file, median: API (target ≤ 20) / wall / "
        "bare stat walk of the upper (`find`), the floor of any create that walks it",
        lambda r: f"{fmt(r['track'][0])} (target 20) / {fmt(r['track'][1])} / {fmt(r['track'][2])}")
    return "\n".join(lines) + "\n"


def chart_section(tbl):
    return ("Create and restore against tree size (median wall clock in ms; bench/chart.py says what "
            "each series does). Charts: docs/bench/create.svg, docs/bench/restore.svg.\n\n" + tbl)


def bench_load(secs, conns=32):
    """Overlay backend, 1,000 files: wrk for secs while two checkpoints restore in turn."""
    work = pathlib.Path(tempfile.mkdtemp(prefix="ckptd-bench-load-", dir="/tmp"))
    try:
        src = work / "tree"
        make_tree(src, 1000, 10 << 20)
        d = Daemon("overlay", src, work / "state-load")
        try:
            a, _ = d.create("a")
            touch_10(src, 1000, "l")
            b, _ = d.create("b")
            log(f"[load] wrk {secs} s, {conns} connections, restores in a loop")
            res = load.run_load(d.url, [a["checkpoint_id"], b["checkpoint_id"]], secs, conns=conns)
        finally:
            d.stop()
        return res
    finally:
        subprocess.run(["bash", "-c", f"awk '$5 ~ \"^{work}/\" {{print $5}}' /proc/self/mountinfo | tac | "
                        "xargs -r -n1 umount -l"], check=False)
        drop_tree(work)


def load_table(res):
    errs = res["non2xx"] + res["socket_errors"] + len(res["restore_failures"])
    return "\n".join([
        f"Load: wrk, {res['conns']} connections, {res['secs']} s, GET /v1/health and /v1/checkpoints "
        "alternately, while two checkpoints restore in turn (overlay, 1,000 files).", "",
        "| req/s | p50 ms | p99 ms | requests | non-2xx | socket errors | restores meanwhile (failed) |",
        "| --- | --- | --- | --- | --- | --- | --- |",
        f"| {res['rps']:.0f} | {res['p50_ms']:.2f} | {res['p99_ms']:.2f} | {res['requests']} | {res['non2xx']} "
        f"| {res['socket_errors']} | {res['restores']} ({len(res['restore_failures'])}) |",
        "", "Errors: none." if errs == 0 else f"Errors: {errs}."]) + "\n"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="small,large")
    ap.add_argument("--runs", type=int, default=21)
    ap.add_argument("--load-secs", type=int, default=30, help="wrk duration of the load section (0: skip)")
    ap.add_argument("--out", default=str(TOP / "bench/results.md"))
    ap.add_argument("--cases", default="all",
                    choices=["all", "retry", "freeze", "diff", "tarinc", "track", "host", "chart", "env",
                             "wholeroot"],
                    help="all, or one case alone (printed, results.md untouched; chart still draws the SVGs)")
    ap.add_argument("--chart-sizes", default="1000:10,small,large",
                    help="tree sizes of the charts; those not in --sizes run the chart case alone")
    a = ap.parse_args()
    if not os.path.exists(CKPTD):
        sys.exit(f"{CKPTD} missing: run make first")
    sizes = [s for s in a.sizes.split(",") if s] if a.cases not in ("host", "chart", "env", "wholeroot") else []
    results = {s: one_size(s, a.runs, a.cases) for s in sizes}
    md = "# ckptd benchmarks\n\n" + (table(results, a.runs) if results else "")
    if a.cases in ("all", "chart"):
        points = []
        for s in [s for s in a.chart_sizes.split(",") if s]:
            r = results[s] if s in results else one_size(s, a.runs, "chart")
            points.append((size_of(s)[0], size_of(s)[1] >> 20, r["chart"]))
        md += ("\n" if results else "") + chart_section(chart.chart_write(points))
    if a.cases in ("all", "env"):
        env = {s: envbench.env_case(*size_of(s), min(a.runs, 7), log) for s in a.sizes.split(",") if s}
        md += ("\n" if results or a.cases == "all" else "") + envbench.env_table(env)
    load = a.load_secs > 0 and a.cases == "all"  # one case alone: no load section
    if load and not shutil.which("wrk"):
        log("[load] skipped: wrk is not installed (make deps installs it)")
    elif load:
        md += ("\n" if results else "") + load_table(bench_load(a.load_secs))
    if a.cases == "all":  # written before host mode, so its failure loses nothing else
        pathlib.Path(a.out).write_text(md)
    if a.cases in ("all", "wholeroot"):
        log("[wholeroot] a Debian rootfs as /: restore after apt-get install, beside rsync")
        md += "\n" + wholeroot.table(wholeroot.bench_wholeroot(CKPTD, min(a.runs, 5)))
    if a.cases in ("all", "host"):
        log("[host] handoffs between two host-mode instances, volume and etcd locks")
        md += "\n" + host.host_table(host.bench_host(CKPTD, min(a.runs, 9)))
    print(md)
    if a.cases == "all":
        pathlib.Path(a.out).write_text(md)


if __name__ == "__main__":
    main()
