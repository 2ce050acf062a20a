"""Delta layers (issue 11 item 4, docs/overlay-create.md): a create after a
tracked one on the same upper makes a layer of what changed since, stacked
on the previous create's layers. Random workloads of programs' kinds of
changes between creates; every checkpoint restores exactly what it
captured, whether its layer was a delta or a full one (a directory made,
moved or removed, or a hard link, makes a full one). These roots are below
the size the daemon tracks by default (2,000 entries), so each daemon names
its tracking: "always" (deltas), or "never" where the same workload runs
untracked. The daemons run with track_check: each tracked layer is also
compared, read-only, with the live tree when made."""
import ctypes
import json
import mmap
import os
import resource
import random
import re
import subprocess
import threading
import time

import pytest

from conftest import assert_same_tree, tree_state, unmount_all


@pytest.fixture
def tmp_path(tmp_path):
    """A tmpfs of the test's own for its daemons' roots and state dirs.
    The tracker marks the upper's directories (fanotify inode marks), so
    other programs' files on that filesystem send no events; the tmpfs
    keeps what these tests count (deltas, events) apart from the machine's
    other work all the same, and lets test_tracker_hears_only_the_upper
    write beside the upper on its filesystem."""
    own = tmp_path / "own-fs"
    own.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1g,mode=0755", "tmpfs", str(own)], check=True)
    yield own
    unmount_all(own)


def overlay(daemon_factory, track="always", **kw):
    d = daemon_factory(backend="overlay", start=False, config={"track_changes": track}, **kw)
    root = d.roots[0]
    for i in range(6):
        (root / f"d{i}" / "sub").mkdir(parents=True)
        for k in range(8):
            (root / f"d{i}" / f"f{k}.txt").write_text(f"{i}/{k}\n" * 50)
        (root / f"d{i}" / "sub" / "deep.txt").write_text("deep\n")
    os.symlink("d0/f0.txt", root / "link")
    d.start()
    return d


def metric(d, name):
    text = d.request("GET", "/metrics").text
    m = re.search(rf"^{name} (\d+)$", text, re.M)
    assert m, f"{name} missing from /metrics"
    return int(m.group(1))


def chains(d):
    return {p.stem: next(iter(json.loads(p.read_text()).values()))
            for p in (d.state_dir / "overlay/c").glob("*.json")}


def files(root):
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def file_change(rng, root, i):
    fs = files(root)
    f = rng.choice(fs)
    k = rng.randrange(9)
    if k == 0:
        (rng.choice([p for p in root.rglob("*") if p.is_dir()]) / f"new{i}.txt").write_text(f"new {i}\n")
    elif k == 1:
        with open(f, "r+b") as h:
            h.seek(rng.randrange(max(1, f.stat().st_size)))
            h.write(b"in place %d" % i)
    elif k == 2:
        with open(f, "ab") as h:
            h.write(os.urandom(rng.randrange(1, 70000)))
    elif k == 3:
        os.truncate(f, rng.randrange(f.stat().st_size + 1))
    elif k == 4 and len(fs) > 10:
        f.unlink()
    elif k == 5:
        os.chmod(f, rng.choice([0o600, 0o644, 0o755]))
        os.utime(f, ns=(1_500_000_000_000_000_000 + i, 1_500_000_000_000_000_000 + i))
    elif k == 6:
        os.setxattr(f, "user.round", str(i).encode())
    elif k == 7:  # a file moved between directories
        to = rng.choice([p for p in root.rglob("*") if p.is_dir()])
        os.rename(f, to / f"moved{i}")
    else:
        link = root / f"sym{i % 3}"
        if link.is_symlink():
            link.unlink()
        os.symlink(f"target-{i}", link)


def structural_change(rng, root, i, k=None):
    k = rng.randrange(4) if k is None else k
    if k == 0:
        (root / f"dir{i}").mkdir()
        (root / f"dir{i}" / "x").write_text("x\n")
    elif k == 1:
        ds = [p for p in root.iterdir() if p.is_dir() and not p.is_symlink()]
        os.rename(rng.choice(ds), root / f"renamed{i}")
    elif k == 2:
        os.link(rng.choice(files(root)), root / f"hard{i}")
    else:
        for p in root.glob("dir*"):
            for c in p.iterdir():
                c.unlink()
            p.rmdir()
            break


@pytest.mark.parametrize("seed,track", [(1, "always"), (2, "always"), (3, "always"), (1, "never")])
def test_deltas_restore_what_they_captured(daemon_factory, seed, track):
    rng = random.Random(seed)
    d = overlay(daemon_factory, track)
    root = d.roots[0]
    for f in files(root):  # every directory and file in the upper, as in the bench
        with open(f, "ab") as h:
            h.write(b"!")
    saved = [(d.create("all")["checkpoint_id"], tree_state(root))]
    for i in range(24):
        for _ in range(rng.randrange(1, 6)):
            file_change(rng, root, i)
        if i % 7 == 6:  # the first a hard link: a full layer for sure
            structural_change(rng, root, i, 2 if i == 6 else None)
        saved.append((d.create(f"c{i}")["checkpoint_id"], tree_state(root)))
        if i == 12:  # a restore in the middle: a new upper, full again, deltas after
            cid, state = saved[rng.randrange(len(saved))]
            d.restore(cid)
            assert_same_tree(state, tree_state(root))
    log = d.log()
    deepest = max(len(c) for c in chains(d).values())
    if track == "always":
        assert log.count("delta pass of") >= 20, "no deltas were made"
        assert "gets a full layer, not a delta" in log  # the hard link
        assert deepest >= 5, chains(d)
    else:  # untracked: every layer full, its frozen pass a walk
        assert "delta pass of" not in log and "frozen pass of" not in log, log
        assert deepest <= 2, chains(d)  # full layers (over the restored one after the restore)
    for cid, state in rng.sample(saved, len(saved)):
        d.restore(cid)
        assert_same_tree(state, tree_state(root))
    d.stop()  # a restart: the next create is full, then deltas again
    d.start()
    file_change(rng, root, 100)
    d.create("after-restart-full")
    file_change(rng, root, 101)
    state = tree_state(root)
    cid = d.create("after-restart-delta")["checkpoint_id"]
    file_change(rng, root, 102)
    d.restore(cid)
    assert_same_tree(state, tree_state(root))


def test_delta_keeps_writes_through_a_mapping(daemon_factory):
    """A file written through a shared mapping held across creates: no
    event, no new ctime for writes into dirty pages. The delta copies it
    every time (a suspect), so each checkpoint has what it held."""
    d = overlay(daemon_factory)
    root = d.roots[0]
    f = root / "d1/f1.txt"
    with open(f, "r+b") as h:
        m = mmap.mmap(h.fileno(), 0)
        d.create("full")
        states = []
        for i in range(5):
            m[0:8] = b"map%05d" % i
            (root / "d2" / f"n{i}").write_text("n\n")
            states.append((d.create(f"m{i}")["checkpoint_id"], f.read_bytes()))
        m.close()
    assert d.log().count("delta pass of") >= 5
    for cid, data in states:
        d.restore(cid)
        assert f.read_bytes() == data


@pytest.mark.parametrize("track", ["always", "never"])
def test_a_mapping_kept_across_a_create_then_closed(daemon_factory, track):
    """The tar backend's case (test_tar_gvisor.py) on overlay: a file mapped
    at a create, stored into again after it (a dirty page: no new ctime, no
    event) and unmapped before the next create. The next create copies it
    again, tracked or not, and a restore from either to the other gives
    each checkpoint's data."""
    d = overlay(daemon_factory, track)
    root = d.roots[0]
    f = root / "d1/f1.txt"
    c0, want0 = d.create("full")["checkpoint_id"], tree_state(root)
    with open(f, "r+b") as h:
        m = mmap.mmap(h.fileno(), 0)
    m[0:6] = b"first!"
    c1, want1 = d.create("mapped")["checkpoint_id"], tree_state(root)
    m[6:12] = b"second"
    m.close()
    c2, want2 = d.create("closed")["checkpoint_id"], tree_state(root)
    for cid, want in ((c1, want1), (c2, want2), (c0, want0), (c2, want2), (c1, want1)):
        d.restore(cid)
        assert_same_tree(want, tree_state(root))


def test_delta_keeps_a_write_before_an_mprotect(daemon_factory):
    """A file mapped shared with no fd left open, written, then made
    read-only with mprotect: no event and no writable mapping, but its
    write moved the ctime. The frozen pass still compares files mapped
    shared read-only, so the delta keeps the write."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.mprotect.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    d = overlay(daemon_factory)
    root = d.roots[0]
    f = root / "d1/f1.txt"
    fd = os.open(f, os.O_RDWR)
    addr = libc.mmap(None, 4096, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd, 0)
    assert addr not in (None, ctypes.c_void_p(-1).value)
    os.close(fd)  # only the mapping is left: no fd for the scan to find
    try:
        d.create("full")
        ctypes.memmove(addr, b"write001", 8)
        c1 = d.create("c1")["checkpoint_id"]
        os.sync()  # writeback, as the kernel does in time: the next write faults
        ctypes.memmove(addr, b"write002", 8)
        assert libc.mprotect(addr, 4096, mmap.PROT_READ) == 0
        (root / "d2" / "other").write_text("x\n")
        c2 = d.create("c2")["checkpoint_id"]
    finally:
        libc.munmap(addr, 4096)
    assert d.log().count("delta pass of") >= 2
    d.restore(c1)
    assert f.read_bytes()[:8] == b"write001"
    d.restore(c2)
    assert f.read_bytes()[:8] == b"write002"


def upper_holds_all(root):
    """Every directory and file in the upper, as in the bench: what a full
    layer costs (a link for each file) and what a fold weighs against."""
    for f in files(root):
        with open(f, "ab") as h:
            h.write(b"!")


def test_delta_layers_fold_at_the_maximum(daemon_factory):
    """After 16 deltas over one full layer the next create folds them into
    its own delta, made over that full layer alone: it links no file again
    (a full layer links every file of the upper: 3.3-3.6 s at 100k files)."""
    d = overlay(daemon_factory)
    root = d.roots[0]
    upper_holds_all(root)
    d.create("full")
    seen, saved = [], []
    for i in range(35):
        (root / "d0" / f"x{i}").write_text(str(i))
        saved.append((d.create(f"x{i}")["checkpoint_id"], tree_state(root)))
        seen.append(d.health()["overlay_roots"][0]["deltas"])
    # health counts them; the 17th folds them: one delta over the full layer
    assert seen == list(range(1, 17)) * 2 + [1, 2, 3], seen
    assert d.log().count("folds its 16 deltas into the next") == 2
    depths = [len(chains(d)[cid]) for cid, _ in saved]
    assert depths == list(range(2, 18)) * 2 + [2, 3, 4], depths
    assert list(chains(d).values()).count([chains(d)[saved[0][0]][-1]]) == 1  # one full layer
    for cid, state in [saved[15], saved[16], saved[0], saved[33], saved[32]]:
        d.restore(cid)
        assert_same_tree(state, tree_state(root))


def test_delta_layers_of_much_of_the_upper_make_a_full_layer(daemon_factory):
    """Deltas that changed most directories of the upper: the 17th create
    is a full layer, which costs about what a fold would."""
    d = overlay(daemon_factory)
    root = d.roots[0]
    upper_holds_all(root)
    d.create("full")
    seen = []
    for i in range(18):
        for k in range(6):
            (root / f"d{k}" / f"x{i}").write_text(str(i))
        d.create(f"x{i}")
        seen.append(d.health()["overlay_roots"][0]["deltas"])
    assert seen == list(range(1, 17)) + [0, 1], seen  # x16 full, x17 a delta on it
    assert re.search(r"gets a full layer: folding its 16 deltas would compare about \d+ entries \(7 "
                     r"directories\), a full layer about \d+", d.log())
    assert sorted(len(c) for c in chains(d).values()).count(1) == 2  # two full layers over the base


@pytest.mark.parametrize("seed", [1, 2])
def test_folded_deltas_restore_what_they_captured(daemon_factory, seed):
    """Random changes of every kind a delta holds (files written, cut,
    moved between directories, removed, made; modes, times, xattrs,
    symlinks; directories made and removed) over 36 creates: the folds
    among them hold what the deltas they replace held, and the checkpoints
    restore exactly what they captured: every one made over a full layer
    (folds and first deltas), a sample of the others and the last
    (track_check compares each layer with the upper when made, too)."""
    rng = random.Random(seed)
    d = overlay(daemon_factory)
    root = d.roots[0]
    for k in range(50):  # more directories, so that a fold costs less than a full layer
        (root / f"e{k}").mkdir()
        for n in range(8):
            (root / f"e{k}" / f"f{n}").write_text(f"{k}/{n}\n")
    upper_holds_all(root)
    saved = [(d.create("all")["checkpoint_id"], tree_state(root))]
    for i in range(36):
        for _ in range(rng.randrange(1, 4)):
            file_change(rng, root, i)
        if i % 9 == 4:
            structural_change(rng, root, i, rng.choice([0, 3]))
        cid = d.create(f"c{i}")["checkpoint_id"]
        # a tree's state costs a read of every file (slow under gVisor)
        if len(chains(d)[cid]) == 2 or rng.random() < 0.2 or i == 35:
            saved.append((cid, tree_state(root)))
    assert "folds its 16 deltas into the next" in d.log()
    folds = [cid for cid, _ in saved if len(chains(d)[cid]) == 2]
    assert len(folds) >= 2, folds  # a first delta over a full layer, and a fold
    for cid, state in rng.sample(saved, len(saved)):
        d.restore(cid)
        assert_same_tree(state, tree_state(root))


def test_new_directories_stay_in_deltas(daemon_factory):
    """Directories made since the last create (mkdir, a copy-up of a lower
    one, a rename of one made in the upper) are copied whole into the delta;
    changes inside them later are deltas too."""
    d = overlay(daemon_factory)
    root = d.roots[0]
    d.create("full")
    saved = []
    (root / "fresh/a/b").mkdir(parents=True)
    (root / "fresh/a/b/f").write_text("1\n")
    (root / "d3" / "f0.txt").write_text("copied up\n")  # d3 copied up
    saved.append((d.create("mkdir")["checkpoint_id"], tree_state(root)))
    (root / "fresh/a/b/f").write_text("2\n")
    (root / "fresh/a/g").write_text("g\n")
    os.rename(root / "fresh/a/b", root / "fresh/a/c")  # made in the upper: no redirect
    saved.append((d.create("inside")["checkpoint_id"], tree_state(root)))
    for p in (root / "fresh/a/c").iterdir():
        p.unlink()
    (root / "fresh/a/c").rmdir()
    saved.append((d.create("removed")["checkpoint_id"], tree_state(root)))
    log = d.log()
    assert "gets a full layer, not a delta" not in log, log
    assert max(len(c) for c in chains(d).values()) == 4, chains(d)
    for cid, state in saved + saved[::-1]:
        d.restore(cid)
        assert_same_tree(state, tree_state(root))


@pytest.mark.parametrize("name", ["d1x", "a-base-directory-with-a-long-name"])
def test_a_moved_base_directory_makes_a_full_layer(daemon_factory, name):
    """A directory of the base renamed since the last create carries its
    old name in trusted.overlay.redirect, however long that name is. A
    delta never copies such a directory: the layer is full."""
    d = daemon_factory(backend="overlay", start=False, config={"track_changes": "always"})
    root = d.roots[0]
    (root / name / "sub").mkdir(parents=True)
    (root / name / "sub" / "f").write_text("in the base\n")
    (root / "other").mkdir()
    d.start()
    d.create("full")
    (root / "other" / "g").write_text("g\n")
    d.create("delta")  # the previous layer is a full one of the upper
    full = "gets a full layer, not a delta"
    before = d.log().count(full)
    os.rename(root / name, root / "moved")
    state = tree_state(root)
    cid = d.create("moved")["checkpoint_id"]
    # gVisor's overlay keeps renames to itself (no redirect xattrs, no
    # redirect_dir): there the layer may be a delta, and the restore below
    # is what must hold
    if os.environ.get("CKPTD_TEST_ENV") != "gvisor":
        assert d.log().count(full) == before + 1, d.log()
    (root / "moved" / "sub" / "f").write_text("changed\n")
    d.restore(cid)
    assert_same_tree(state, tree_state(root))


def test_track_check_out_of_fds_says_so(daemon_factory):
    """The track check walks the whole tree of a delta, two directories
    open a level. Out of fds (EMFILE) in a 120-deep directory, it reported
    a change the tracker missed ("cannot open the directory"), or skipped
    the subtree where a later change was seen. The create now fails with
    the cause; with the fd limit back, the same create is made."""
    d = overlay(daemon_factory)
    d.create("full")
    p = d.roots[0] / "deep"
    for _ in range(120):
        p = p / "d"
    p.mkdir(parents=True)
    (p / "leaf").write_text("x")
    d.create("with the deep dir")
    (d.roots[0] / "d0" / "f0.txt").write_text("changed\n")
    pid = d.proc.pid
    soft, hard = resource.prlimit(pid, resource.RLIMIT_NOFILE)
    used = max(int(fd) for fd in os.listdir(f"/proc/{pid}/fd"))
    resource.prlimit(pid, resource.RLIMIT_NOFILE, (used + 100, hard))  # a tracked copy needs few
    try:
        r = d.request("POST", "/v1/checkpoints", json={"name": "delta"})
    finally:
        resource.prlimit(pid, resource.RLIMIT_NOFILE, (soft, hard))
    assert r.status_code == 500, r.text
    assert "open files" in r.json()["detail"] and "missed" not in r.json()["detail"], r.text
    before = tree_state(d.roots[0])
    cp = d.create("delta")["checkpoint_id"]
    (d.roots[0] / "d0" / "f0.txt").write_text("again\n")
    d.restore(cp)
    assert_same_tree(before, tree_state(d.roots[0]))


def test_tracker_hears_only_the_upper(daemon_factory, tmp_path):
    """The tracker marks the upper's directories, not its filesystem: the
    files a create writes into ckptd's layer store, and other programs'
    files on the same filesystem, never reach its queue
    (ckptd_change_tracking_events_total); a change in the upper does."""
    d = overlay(daemon_factory)
    root = d.roots[0]
    for f in files(root):  # the upper holds every file, as in the bench
        with open(f, "ab") as h:
            h.write(b"!")
    d.create("full")
    (root / "d0/f0.txt").write_text("warm\n")
    d.create("warm")  # a delta: the tracker stays armed from here on
    outside = tmp_path / "outside"
    outside.mkdir()
    before = metric(d, "ckptd_change_tracking_events_total")
    for i in range(200):  # beside the upper, on its filesystem
        (outside / f"o{i}").write_text("o\n")
    with open(root / "d1/f1.txt", "ab") as h:
        h.write(b"one change\n")
    for i in range(5):  # a delta writing into the layer store: its own files
        (root / "d2" / f"n{i}").write_text(f"{i}\n")
    state = tree_state(root)
    cid = d.create("one")["checkpoint_id"]
    heard = metric(d, "ckptd_change_tracking_events_total") - before
    # the changes: a write and its close for each file, a create for each
    # new one (fanotify may merge some; inotify under gVisor); not 400 and
    # more from outside, nor one for each file, directory and record the
    # delta wrote (462 with the filesystem mark)
    assert 6 <= heard <= 40, heard
    assert "gets a full layer, not a delta" not in d.log()
    d.restore(cid)
    assert_same_tree(state, tree_state(root))


def test_directories_made_after_arming_are_heard(daemon_factory):
    """Directories that reach the upper after the tracker was armed (a
    copy-up of a base directory, a mkdir, one moved in the upper) are marked
    when their event is read: a change inside one at any later create is in
    that create's delta (track_check compares each delta with the upper)."""
    d = overlay(daemon_factory)
    root = d.roots[0]
    d.create("full")  # armed over an empty upper
    (root / "d4/sub/deep.txt").write_text("copied up\n")  # d4 and d4/sub copied up
    (root / "made/a/b").mkdir(parents=True)
    saved = [(d.create("first")["checkpoint_id"], tree_state(root))]
    for i in range(3):
        with open(root / "d4/sub/deep.txt", "ab") as h:
            h.write(b"%d\n" % i)
        (root / "made/a/b" / f"n{i}").write_text(f"{i}\n")
        os.chmod(root / "made/a", 0o750 + i)
        saved.append((d.create(f"inside{i}")["checkpoint_id"], tree_state(root)))
    os.rename(root / "made/a", root / "made/moved")  # made in the upper: no redirect
    (root / "made/moved/b/late").write_text("late\n")
    saved.append((d.create("moved")["checkpoint_id"], tree_state(root)))
    (root / "made/moved/b/late").write_text("later\n")
    saved.append((d.create("after-move")["checkpoint_id"], tree_state(root)))
    log = d.log()
    assert "gets a full layer, not a delta" not in log, log
    assert log.count("frozen delta pass of") == len(saved), log
    for cid, state in saved[::-1] + saved:
        d.restore(cid)
        assert_same_tree(state, tree_state(root))


def test_a_create_that_freezes_nothing_makes_its_delta_in_one_pass(daemon_factory):
    """With no unit to freeze, a delta is made in one pass: no first pass
    (l/.pre-*) ever appears, even while a 64 MB change is copied. A file
    mapped shared and written through the mapping before the create (no
    event tells) is in the checkpoint: the /proc scan names it. One written
    while the create runs holds, in the checkpoint, the bytes before or
    after, nothing else. (Two passes with a mapping made between them:
    tests/unit/test_overlay.c, test_delta_passes.)"""
    d = overlay(daemon_factory)
    root = d.roots[0]
    target = root / "d3" / "f3.txt"
    with open(target, "ab") as h:  # in the upper: opening it copies nothing up
        h.write(b"upper\n")
    d.create("full")
    (root / "d0/f0.txt").write_text("warm\n")
    d.create("warm")
    block = os.urandom(1 << 20)
    seen_pre, saved = [], []
    for rnd in range(4):
        with open(root / "d5" / "big", "wb") as h:
            for _ in range(64):
                h.write(block)
        with open(target, "r+b") as h:
            m = mmap.mmap(h.fileno(), 0)
        m[0:8] = b"pre%05d" % rnd  # before the request
        before = target.read_bytes()
        done = threading.Event()

        def watch():
            while not done.is_set():
                seen_pre.extend(d.state_dir.glob("overlay/r/*/l/.pre-*"))
                m[0:8] = b"run%05d" % rnd  # while it runs
                time.sleep(0.0005)

        th = threading.Thread(target=watch)
        th.start()
        try:
            cid = d.create(f"r{rnd}")["checkpoint_id"]
        finally:
            done.set()
            th.join()
        after = target.read_bytes()
        m.close()
        saved.append((cid, before, after))
    assert not seen_pre, seen_pre
    log = d.log()
    assert "gets a full layer, not a delta" not in log
    assert log.count("first delta pass") == 5, log  # "warm" and the four
    for cid, before, after in saved:
        d.restore(cid)
        assert target.read_bytes() in (before, after)


def test_git_through_a_fold(daemon_factory):
    """git, a program this project did not write, commits between 22 creates
    (new object directories, files replaced by rename, refs and the index
    rewritten): the seventeenth folds the deltas, and restores on both sides
    of the fold give back the commit each checkpoint had, a repository
    `git fsck --full --strict` accepts, and a clean work tree. (A `git gc`
    between creates made a full layer here, as a change a delta cannot
    express, so none runs.)"""
    d = overlay(daemon_factory)
    root = d.roots[0]
    for k in range(40):  # files in the upper, so that a fold costs less than a full layer
        (root / f"e{k}").mkdir()
        for n in range(8):
            (root / f"e{k}" / f"f{n}").write_text(f"{k}/{n}\n")
    upper_holds_all(root)
    repo = root / "repo"
    repo.mkdir()

    def git(*a):
        return subprocess.run(["git", "-C", str(repo), *a], check=True, capture_output=True, text=True).stdout.strip()
    git("init", "-q")
    git("config", "user.email", "agent@example.com")
    git("config", "user.name", "agent")
    d.create("full")
    saved = []
    for i in range(22):
        (repo / f"file{i % 5}.txt").write_text(f"round {i}\n" * (i + 1))
        git("add", "-A")
        git("commit", "-q", "-m", f"r{i}")
        saved.append((d.create(f"c{i}")["checkpoint_id"], git("rev-parse", "HEAD")))
    assert d.log().count("folds its 16 deltas into the next") == 1
    for cid, head in [saved[16], saved[15], saved[21], saved[3], saved[17]]:
        d.restore(cid)
        assert git("rev-parse", "HEAD") == head
        fsck = subprocess.run(["git", "-C", str(repo), "fsck", "--full", "--strict"], capture_output=True, text=True)
        assert fsck.returncode == 0, fsck.stderr
        assert git("status", "--porcelain") == ""
