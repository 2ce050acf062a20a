"""Restore latency as the client sees it, on real overlay mounts in an ext4
state dir: a retry loop whose attempts each write 200 MB and roll back.
The discarded upper is deleted in the background, never written back, and
the next restore does not wait for that cleanup (queue_ms says it)."""
import os
import time

import pytest

from test_overlay import overlay_daemon

MB = 1 << 20


def _write(path, size, chunk=4 * MB):
    buf = os.urandom(chunk)
    with open(path, "wb") as f:
        for _ in range(size // chunk):
            f.write(buf)


def _trash(d):
    return [p for p in d.state_dir.glob("overlay/r/*/t/*")]


def test_retry_loop_restores_stay_fast(daemon_factory):
    d = overlay_daemon(daemon_factory, tree=False)
    root = d.roots[0]
    (root / "app.txt").write_text("v0\n")
    base = d.create("base")["checkpoint_id"]
    walls, reports = [], []
    for attempt in range(4):
        _write(root / "big.bin", 200 * MB)  # dirty pages, never synced
        (root / "app.txt").write_text(f"attempt {attempt}\n")
        t0 = time.monotonic()
        rep = d.restore(base)
        walls.append((time.monotonic() - t0) * 1000)
        reports.append(rep)
        assert (root / "app.txt").read_text() == "v0\n"
        assert not (root / "big.bin").exists()
    print("restore wall ms:", [round(w) for w in walls])
    print("reported:", [(r["restore_duration_ms"], r["phases"]) for r in reports])
    for rep in reports:
        assert set(rep["phases"]) >= {"queue_ms", "stop_ms", "swap_ms", "start_ms"}
        assert rep["phases"]["queue_ms"] >= 0
        ph = rep["phases"]
        assert rep["restore_duration_ms"] >= ph["queue_ms"] + ph["swap_ms"]
    # No bound on the wall time here: make bench measures the retry loop
    # (bench/run.py, "retry-loop restore p99"); a loaded machine would fail it.

    # The old uppers are deleted in the background, none is left behind.
    deadline = time.monotonic() + 60
    while _trash(d) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not _trash(d)
    uppers = list(d.state_dir.glob("overlay/r/*/u/*"))
    assert len(uppers) <= 2, uppers  # the live upper and the spare
    assert not any(p.name == "big.bin" for u in uppers for p in u.iterdir())
    # No detached overlay of ours is left mounted.
    with open("/proc/self/mountinfo") as f:
        assert sum(str(d.state_dir) in line and " - overlay " in line for line in f) == 1


def test_discarded_upper_is_not_written_back(daemon_factory):
    """The bytes written to the state dir's disk while a 200 MB attempt is
    rolled back and cleaned up stay far below 200 MB (a plain unmount syncs
    them all). Measured on the block device under the state dir.
    The device is shared: another process's sync(2) between the write and
    the discard writes the 200 MB too. A ckptd that writes them back does
    so every time, so three attempts are made and one must stay below."""
    d = overlay_daemon(daemon_factory, tree=False)
    root = d.roots[0]
    base = d.create("base")["checkpoint_id"]
    dev = _block_dev(d.state_dir)
    seen = []
    for _ in range(3):
        _write(root / "big.bin", 200 * MB)
        before = _sectors_written(dev)
        d.restore(base)
        deadline = time.monotonic() + 60
        while _trash(d) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not _trash(d)
        os.sync()  # whatever would still be written by the unmount
        seen.append((_sectors_written(dev) - before) * 512)
        print(f"written during restore + cleanup: {seen[-1] / MB:.1f} MB of 200 MB discarded")
        if seen[-1] < 120 * MB:  # other agents share the disk: allow noise, not the 200 MB
            break
    assert min(seen) < 120 * MB, seen


def _block_dev(path):
    st = os.stat(path)
    name = os.path.basename(os.path.realpath(f"/sys/dev/block/{os.major(st.st_dev)}:{os.minor(st.st_dev)}"))
    return name


def _sectors_written(dev):
    with open(f"/sys/class/block/{dev}/stat") as f:
        return int(f.read().split()[6])


@pytest.mark.parametrize("track", ["always", "auto"])
def test_create_freezes_only_for_the_changes(daemon_factory, track):
    """A first pass copies the upper before the freeze; the frozen pass
    copies what a writer changed meanwhile. freeze_ms is in the answer and
    the record, and is a small part of the create. Tracked ("always"), the
    300 MB first pass takes over 50 ms, so the second pass catches up
    before the freeze, by the production rule; untracked ("auto": 31
    entries), the frozen pass walks the upper."""
    import threading
    d = overlay_daemon(daemon_factory, tree=False, config={"track_changes": track})
    root = d.roots[0]
    for i in range(30):
        _write(root / f"big{i}.bin", 10 * MB, chunk=MB)
    stop = threading.Event()

    def writer():
        n = 0
        while not stop.is_set():
            with open(root / "log.txt", "a") as f:
                f.write(f"line {n}\n")
            n += 1
            time.sleep(0.001)

    t = threading.Thread(target=writer)
    t.start()
    try:
        results = [d.create(f"c{i}") for i in range(3)]
    finally:
        stop.set()
        t.join()
    print("create duration_ms / freeze_ms:", [(c["duration_ms"], c["freeze_ms"]) for c in results])
    for c in results:
        assert d.get(c["checkpoint_id"])["freeze_ms"] == c["freeze_ms"]
        assert 0 <= c["queue_ms"] <= c["duration_ms"], c
    first = results[0]
    assert first["freeze_ms"] * 2 < first["duration_ms"], first
    # The checkpoint holds the files, and a log that is a prefix of the live one.
    log = d.log()
    if track == "always":
        assert "second pass of" in log and "frozen pass of" in log, log
    else:
        assert "second pass of" not in log and "frozen pass of" not in log, log
    live_log = (root / "log.txt").read_text()
    for i in range(30):
        (root / f"big{i}.bin").unlink()
    d.restore(first["checkpoint_id"])
    assert all((root / f"big{i}.bin").stat().st_size == 10 * MB for i in range(30))
    assert live_log.startswith((root / "log.txt").read_text())


def test_overlay_create_reports_totals(daemon_factory):
    """The overlay create's progress has bytes_total and files_total (from a
    stat walk of the upper before the first pass), so `ckpt create` draws a
    bar; the bytes move between 0 and the total."""
    from test_lifecycle import check_progress, fill_tree, start_async, wait_created
    d = overlay_daemon(daemon_factory, tree=False)
    root = d.roots[0]
    fill_tree(root, 200 << 20, 200)  # into the upper
    seen = []
    rec = wait_created(d, start_async(d, "big")["checkpoint_id"], seen, period=0.005)
    assert rec["status"] == "active", rec
    check_progress(seen, 200)
    final = [p for _, p in seen if p][-1]
    assert final["bytes_total"] >= 200 << 20, final


def test_tracked_frozen_pass_keeps_every_change(daemon_factory):
    """Change tracking (track_changes "always": this root is below the size
    tracked by default): the frozen pass compares only the
    directories fanotify and /proc name. With a writer appending, files
    renamed, removed (whiteouts), chmod'ed and written through a shared
    mapping held across the create, every checkpoint restores to exactly what
    the root held; track_check (set for every test daemon) fails a create
    whose tracked layer differs from the tree, read-only."""
    import mmap
    import threading
    from conftest import assert_same_tree, tree_state
    d = overlay_daemon(daemon_factory, config={"track_changes": "always"})
    root = d.roots[0]
    for i in range(200):
        (root / f"t{i % 10}").mkdir(exist_ok=True)
        (root / f"t{i % 10}" / f"f{i}").write_bytes(os.urandom(3000))
    d.create("warm")
    mfd = os.open(root / "t0" / "f0", os.O_RDWR)
    mp = mmap.mmap(mfd, 3000, mmap.MAP_SHARED)
    stop = threading.Event()

    def writer():
        while not stop.is_set():
            with open(root / "log.txt", "a") as f:
                f.write("x\n")
            time.sleep(0.002)

    t = threading.Thread(target=writer)
    t.start()
    states = []
    try:
        for k in range(4):
            mp[k] = 0x41 + k  # through the mapping, no write(2)
            (root / f"t{k + 1}" / f"f{k + 1}").rename(root / f"t{k + 2}" / f"moved{k}")
            os.chmod(root / f"t{k + 5}" / f"f{k + 5}", 0o600)
            (root / "dir" / "sub").mkdir(parents=True, exist_ok=True)
            (root / "dir" / "sub" / f"new{k}").write_text(str(k))
            if k == 2:
                import shutil
                shutil.rmtree(root / "t9")
            stop.set()
            t.join()
            states.append((d.create(f"c{k}")["checkpoint_id"], tree_state(root)))
            stop.clear()
            t = threading.Thread(target=writer)
            t.start()
    finally:
        stop.set()
        t.join()
        mp.close()
        os.close(mfd)
    assert "changed directories" in d.log(), d.log()[-2000:]
    assert "missed" not in d.log()
    for cid, want in reversed(states):
        d.restore(cid)
        assert_same_tree(want, tree_state(root))
