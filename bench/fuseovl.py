#!/usr/bin/python3
"""fuse-overlayfs in a user namespace, measured for the choice of a backend
there (docs/environments.md): what an overlay variant on it would cost, done
by hand as ckptd's overlay backend does it, on 10,000 files / 100 MB.

    bench/fuseovl.py            (as root: it runs itself as nobody in unshare -Urm)

- restore: unmount, mount the checkpoint's layer over the base with a fresh upper;
- create after 10 changes: copy the upper into a new layer, then sync;
- rename(2) of a directory of the base, which a managed root must allow;
- reading every file and a stat walk, through FUSE and directly.
/dev/fuse is 0600 here; a rootless runtime passes it in. The script opens it
to all for its run and puts the mode back. Prints one dict of medians in ms."""
import os
import pathlib
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = pathlib.Path(__file__).resolve().parent
NOBODY = 65534
N, MB, RUNS = 10_000, 100, 7


def ms(t0):
    return (time.perf_counter() - t0) * 1000


def fuse_mount(lowers, up, wk, m):
    opts = f"lowerdir={':'.join(map(str, lowers))},upperdir={up},workdir={wk}"
    subprocess.run(["fuse-overlayfs", "-o", opts, str(m)], check=True, stderr=subprocess.DEVNULL)


def read_all(root, files_of):
    t0 = time.perf_counter()
    for p in files_of(root, N):
        with open(p, "rb") as f:
            f.read()
    return ms(t0)


def stat_walk(root):
    t0 = time.perf_counter()
    for dp, _, fn in os.walk(root):
        for x in fn:
            os.lstat(os.path.join(dp, x))
    return ms(t0)


def measure(work):
    sys.path.insert(0, str(HERE))
    from run import files_of, make_tree, touch_10
    base, m = work / "base", work / "m"
    make_tree(base, N, MB << 20)
    m.mkdir()
    ups = [(work / f"u{i}", work / f"w{i}") for i in range(RUNS + 1)]
    for u, w in ups:
        u.mkdir()
        w.mkdir()
    fuse_mount([base], *ups[0], m)
    res = {"read_all_direct": statistics.median(read_all(base, files_of) for _ in range(3)),
           "read_all_fuse": statistics.median(read_all(m, files_of) for _ in range(3)),
           "stat_walk_direct": statistics.median(stat_walk(base) for _ in range(3)),
           "stat_walk_fuse": statistics.median(stat_walk(m) for _ in range(3))}
    creates, restores = [], []
    for i in range(RUNS):
        touch_10(m, N, f"c{i}", off=i)
        t0 = time.perf_counter()
        subprocess.run(["cp", "-a", str(ups[0][0]), str(work / f"l{i}")], check=True)
        os.sync()
        creates.append(ms(t0))
    for i in range(RUNS):
        touch_10(m, N, f"r{i}", off=i)
        t0 = time.perf_counter()
        subprocess.run(["umount", str(m)], check=True)
        fuse_mount([work / "l0", base], *ups[i + 1], m)
        restores.append(ms(t0))
    try:
        os.rename(m / "d0050", m / "d0050-moved")
        res["rename_base_dir"] = "ok"
    except OSError as e:
        res["rename_base_dir"] = e.strerror
    subprocess.run(["umount", str(m)], check=True)
    res.update(create10=statistics.median(creates), restore=statistics.median(restores))
    return res


def main():
    if len(sys.argv) > 1:  # inside: nobody in its own user namespace
        print({k: round(v, 1) if isinstance(v, float) else v for k, v in measure(pathlib.Path(sys.argv[1])).items()})
        return 0
    work = pathlib.Path(tempfile.mkdtemp(prefix="ckptd-fuseovl-", dir="/tmp"))
    os.chown(work, NOBODY, NOBODY)
    mode = os.stat("/dev/fuse").st_mode & 0o777
    os.chmod("/dev/fuse", 0o666)
    try:
        return subprocess.run(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "unshare",
                               "-Urm", sys.executable, __file__, str(work)]).returncode
    finally:
        os.chmod("/dev/fuse", mode)
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
