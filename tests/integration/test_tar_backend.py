"""The tar backend through the daemon: what only this backend has to get right
(xattrs, hardlinks, fifos, devices, owners, sparse files, incremental restore,
an interrupted restore finished at restart, out of space, reset to the base)."""
import json
import os
import pathlib
import re
import shutil
import socket
import stat
import subprocess
import threading
import time

import pytest
import requests

from conftest import assert_same_tree, make_full_tree, tree_state
from test_failpoints import FPDaemon, fp_build


def add_backend_extras(root):
    root = pathlib.Path(root)
    os.mknod(root / "chardev", 0o640 | stat.S_IFCHR, os.makedev(1, 3))
    os.mknod(root / "blockdev", 0o600 | stat.S_IFBLK, os.makedev(7, 200))
    os.chown(root / "chardev", 4321, 8765)
    os.symlink("/etc", root / "dir/abs-link")
    os.lchown(root / "dir/abs-link", 77, 88)
    os.setxattr(root / "dir/abs-link", "trusted.owner", b"sym", follow_symlinks=False)
    os.setxattr(root / "sparse.img", "user.a", b"1")
    os.setxattr(root / "sparse.img", "user.b", b"\x00\xff binary")
    os.link(root / "file.txt", root / "dir/sub/third-link")
    (root / "we ird\tname\nwith newline %41").write_text("odd\n")
    (root / "ünïcødé-日本").write_text("utf-8 name\n")
    with open(os.path.join(os.fsencode(root), b"latin1-\xe9\xff"), "w") as f:
        f.write("not utf-8\n")
    os.chmod(root, 0o751)
    os.setxattr(root, "user.rootattr", b"r")


def mutate_everything(root):
    root = pathlib.Path(root)
    (root / "file.txt").write_text("HELLO\n")            # same inode, new content
    os.removexattr(root / "sparse.img", "user.a")
    os.setxattr(root / "dir", "user.extra", b"x")
    os.unlink(root / "dir/hardlink.txt")
    (root / "dir/hardlink.txt").write_text("no longer a link\n")
    os.unlink(root / "fifo")
    os.mkdir(root / "fifo")                              # fifo replaced by a dir
    (root / "fifo/inside").write_text("x")
    os.chown(root / "chardev", 0, 0)
    os.chmod(root / "secret", 0o644)
    os.unlink(root / "link-rel")
    os.symlink("secret", root / "link-rel")              # symlink retargeted
    subprocess.run(["rm", "-rf", str(root / "dir/sub")], check=True)
    (root / "new-dir/a/b").mkdir(parents=True)
    (root / "new-file").write_bytes(os.urandom(5000))
    with open(root / "sparse.img", "r+b") as f:
        f.truncate(100)
    os.chmod(root, 0o700)
    os.removexattr(root, "user.rootattr")


def test_every_file_type_round_trip(daemon_factory):
    d = daemon_factory(backend="tar", start=False)
    make_full_tree(d.roots[0])
    add_backend_extras(d.roots[0])
    d.start()
    assert d.health()["backend"] == "tar"
    before = tree_state(d.roots[0])
    root_st = os.stat(d.roots[0])
    cp = d.create("all-types")
    assert cp["backend"] == "tar" and cp["size_bytes"] > 0
    mutate_everything(d.roots[0])
    rep = d.restore(cp["checkpoint_id"], verify=True)
    assert rep["ok"] is True
    # every type, owner, xattr, hardlink and sparse file compares equal
    assert rep["verified"] is True and rep["verify_differences"] == [], rep
    assert rep["verify_ms"] >= 0
    assert_same_tree(before, tree_state(d.roots[0]))
    r = d.roots[0]
    assert os.stat(r / "file.txt").st_ino == os.stat(r / "dir/hardlink.txt").st_ino \
        == os.stat(r / "dir/sub/third-link").st_ino
    assert os.stat(r / "sparse.img").st_blocks * 512 < 1 << 20, "sparse file was filled in"
    after_root = os.stat(r)
    assert stat.S_IMODE(after_root.st_mode) == 0o751
    assert after_root.st_mtime_ns == root_st.st_mtime_ns
    assert os.getxattr(r, "user.rootattr") == b"r"


def test_incremental_restore_keeps_unchanged_inodes(daemon_factory):
    d = daemon_factory(backend="tar", start=False)
    many = d.roots[0] / "many"
    many.mkdir()
    for i in range(500):
        (many / f"f{i:03d}").write_bytes(os.urandom(2000))
    d.start()
    before = tree_state(d.roots[0])
    inodes = {p.name: p.stat().st_ino for p in many.iterdir()}
    cp = d.create("base")["checkpoint_id"]
    for i in (1, 2, 3):
        (many / f"f{i:03d}").write_bytes(b"changed")
    (many / "f004").unlink()
    (many / "added").write_text("x")
    rep = d.restore(cp)
    assert_same_tree(before, tree_state(d.roots[0]))
    kept = [n for n in inodes if n not in ("f001", "f002", "f003", "f004")]
    assert all((many / n).stat().st_ino == inodes[n] for n in kept)
    # the engine passes the backend's counters through: 3 files back, 1 file
    # recreated, and their directory's times
    assert rep["tar"]["rewritten"] == 5 and rep["tar"]["removed"] == 1, rep["tar"]
    assert rep["tar"]["kept"] == 496  # 500 files and the dir, less those 5
    # the next restore counts what the last one wrote as unchanged
    (many / "f001").write_bytes(b"again")
    rewritten_ino = (many / "f002").stat().st_ino
    d.restore(cp)
    assert (many / "f002").stat().st_ino == rewritten_ino
    assert_same_tree(before, tree_state(d.roots[0]))


def test_restore_enters_an_archive_where_the_entries_begin(daemon_factory):
    # 12 MB of big files make the archive a dozen zstd frames: a restore of
    # a few small files enters it where they begin, several in one frame,
    # one reader going on from one to the next, and writes the same tree.
    d = daemon_factory(backend="tar", start=False)
    root = d.roots[0]
    for i in range(3):
        (root / f"big{i}").write_bytes(os.urandom(4 << 20))
    many = root / "many"
    many.mkdir()
    for i in range(200):
        (many / f"f{i:03d}").write_bytes(os.urandom(2000))
    d.start()
    before = tree_state(root)
    cp = d.create("base")["checkpoint_id"]
    for i in (1, 2, 3, 150):
        (many / f"f{i:03d}").write_bytes(b"changed")
    rep = d.restore(cp)
    assert_same_tree(before, tree_state(root))
    assert rep["tar"]["rewritten"] == 5, rep["tar"]  # 4 files and their directory
    last = d.health().get("tar_last_restore", {})
    assert last.get("entered") == 4, last  # the files; the directory is set in place


def manifest_offsets(d, cp):
    """path -> (type, link, offset in the tar stream) from the checkpoint's
    manifest: the archive's order (a create lists directories as readdir
    gives them, not sorted)."""
    text = (d.state_dir / "tar" / cp / "r0.manifest").read_text(errors="replace")
    out = {}
    for line in text.splitlines()[1:]:
        f = line.split("\t")
        if len(f) >= 15 and f[14] != "-" and f[13] == "-":  # in this checkpoint's own archive
            out[f[10]] = (f[0], f[11], int(f[14]))
    return out


def test_restore_enters_frames_at_the_edges(daemon_factory):
    # A many-frame archive entered where the changed entries begin: its
    # first and its last entry, a file whose data spans frames, a hard link
    # whose first name (which holds the data) is frames before it, and a
    # sparse file. Every one is entered (no fallback to reading it all),
    # and the tree is the checkpoint's, holes and shared inodes too.
    MB = 1 << 20
    # every create full: one archive holds every entry (no data from a parent's)
    d = daemon_factory(backend="tar", start=False, config={"tar_chain_max": 0})
    root = d.roots[0]
    for i in range(5):
        (root / f"big{i}").write_bytes(os.urandom(3 * MB))
    with open(root / "sparse.img", "wb") as f:
        for at in (0, 2 * MB, 4 * MB - 4096):
            f.seek(at)
            f.write(os.urandom(4096))
    d.start()
    # The archive's order is readdir's: names are drawn again until the
    # link's names are not all in one frame (a tenth of draws are).
    for attempt in range(6):
        names = [f"h{attempt}{i}" for i in range(3)]
        (root / names[0]).write_bytes(os.urandom(5000))
        for n in names[1:]:
            os.link(root / names[0], root / n)
        before = tree_state(root)
        cp = d.create(f"base{attempt}")["checkpoint_id"]
        offs = manifest_offsets(d, cp)
        order = sorted(offs, key=lambda p: offs[p][2])
        group = [p for p in order if p in names]
        head, link = group[0], group[-1]
        assert offs[head][0] == "f" and all(offs[p][0] == "h" and offs[p][1] == head for p in group[1:])
        if offs[link][2] // MB > offs[head][2] // MB:
            break
        for n in names:
            os.unlink(root / n)
    else:
        pytest.fail("six draws of names put a hard link's names in one frame")
    first, last = order[0], order[-1]
    middle = [p for p in order[1:-1] if p.startswith("big")][0]
    # the changes: each rewritten where its entry begins
    for p in {first, last}:
        with open(root / p, "r+b") as f:
            f.write(b"changed")
    with open(root / middle, "r+b") as f:
        f.seek(3 * MB // 2)
        f.write(b"across frames")
    os.unlink(root / link)  # the group comes back whole, its data from head's frame
    with open(root / "sparse.img", "r+b") as f:
        f.seek(MB)
        f.write(b"in a hole")
    needed = {first, last, middle, "sparse.img", *names}
    rep = d.restore(cp)
    assert rep["ok"] is True
    assert_same_tree(before, tree_state(root))
    assert len({os.stat(root / n).st_ino for n in names}) == 1
    assert os.stat(root / "sparse.img").st_blocks * 512 < 64 << 10, "the sparse file was filled in"
    last_rep = d.health().get("tar_last_restore", {})
    assert last_rep.get("entered") == len(needed), last_rep  # none read from the archive's start


def test_kill9_during_restore_then_restart(daemon_factory):
    d = daemon_factory(backend="tar", start=False)
    r = d.roots[0]
    for i in range(40):
        sub = r / f"d{i:02d}"
        sub.mkdir()
        for j in range(100):
            (sub / f"f{j:02d}").write_bytes(os.urandom(8192))
    d.start()
    before = tree_state(d.roots[0])
    cp = d.create("big")["checkpoint_id"]
    subprocess.run(["rm", "-rf"] + [str(p) for p in r.iterdir()], check=True)
    (r / "junk").write_text("added after the checkpoint")
    intent = d.state_dir / "tar" / "restoring.json"

    def restore_until_killed():
        try:
            d.request("POST", f"/v1/checkpoints/{cp}/restore", json={})
        except Exception:  # the daemon dies under the request: expected
            pass

    t = threading.Thread(target=restore_until_killed)
    t.start()
    deadline = time.monotonic() + 30
    while not intent.exists() and time.monotonic() < deadline:
        time.sleep(0.001)
    assert intent.exists(), "restore never wrote its intent"
    d.kill9()
    t.join()
    assert intent.exists(), "restore finished before the kill: the tree is too small to test this"
    assert tree_state(r) != before
    d.start()
    assert not intent.exists()
    assert_same_tree(before, tree_state(r))
    assert [c["checkpoint_id"] for c in d.list()] == [cp]


def restore_cut_short(d):
    """Fill d's stopped root, checkpoint it, change it, and leave what a
    restore cut before its first change leaves (tar_meta_intent_write): the
    next start finishes that restore. Returns the checkpoint's tree."""
    r = d.roots[0]
    for i in range(50):
        (r / f"f{i:02d}").write_bytes(os.urandom(4096))
    d.start()
    before = tree_state(r)
    cp = d.create("clean")["checkpoint_id"]
    for p in list(r.iterdir())[:10]:
        p.unlink()
    (r / "junk").write_text("added after the checkpoint")
    d.stop()
    (d.state_dir / "tar" / "restoring.json").write_text(json.dumps({"id": cp}) + "\n")
    return before


def test_start_that_recovers_asks_systemd_for_time(daemon_factory, tmp_path):
    """A start that finishes a restore cut short may take long: it rewrites
    every file of the roots. While it runs, ckptd asks systemd for more time
    (EXTEND_TIMEOUT_USEC) and pets the watchdog, before READY=1. systemd is
    this test: NOTIFY_SOCKET names a datagram socket that it reads."""
    d = daemon_factory(backend="tar", start=False)
    r = d.roots[0]
    before = restore_cut_short(d)
    path = tmp_path / "notify.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
        s.bind(str(path))
        s.settimeout(60)
        d.env = {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "60000000"}
        d.start()
        msgs = []
        while not any("READY=1" in m.split("\n") for m in msgs):
            msgs.append(s.recv(4096).decode())
    lines = [line for m in msgs[:-1] for line in m.split("\n")]
    extend = [line for line in lines if line.startswith("EXTEND_TIMEOUT_USEC=")]
    assert extend, f"no EXTEND_TIMEOUT_USEC before READY=1: {msgs}"
    assert all(int(x.split("=", 1)[1]) >= 10_000_000 for x in extend), extend
    assert "WATCHDOG=1" in lines, f"the watchdog was not petted during the start: {msgs}"
    assert not (d.state_dir / "tar" / "restoring.json").exists()
    assert_same_tree(before, tree_state(r))
    d.stop()
    d.env = None


def test_start_that_hangs_stops_asking_systemd_for_time(tmp_path):
    """A start that makes no progress gets no more time. After a minute
    without a read, a write or CPU time (src/lib/startwatch.h), ckptd logs
    why and stops sending EXTEND_TIMEOUT_USEC and WATCHDOG=1. systemd's
    start timeout then fails the unit: it does not stay
    "activating" forever. The failpoint build hangs the start's recovery
    at its third unlink (CKPTD_FAILPOINT_ACTION=hang), as a lock that is
    never released would. systemd is this test, as above."""
    fp_build()
    d = FPDaemon(tmp_path / "d", backend="tar")
    try:
        r = d.roots[0]
        before = restore_cut_short(d)
        intent = d.state_dir / "tar" / "restoring.json"
        path = tmp_path / "notify.sock"
        stalled = "start: no progress for"
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as s:
            s.bind(str(path))
            s.settimeout(1)
            d.env = {"NOTIFY_SOCKET": str(path), "WATCHDOG_USEC": "60000000",
                     "CKPTD_FAILPOINT": "tar.restore.file.unlink.before:3", "CKPTD_FAILPOINT_ACTION": "hang"}
            d.start(wait=False)
            msgs = []
            deadline = time.monotonic() + 600  # the window is a minute; this machine may be slow
            while stalled not in d.log():
                assert d.proc.poll() is None, f"ckptd exited:\n{d.log()[-3000:]}"
                assert time.monotonic() < deadline, f"still asking for time:\n{msgs}\n{d.log()[-3000:]}"
                try:
                    msgs.append(s.recv(4096).decode())
                except socket.timeout:
                    pass
            assert "failpoint hang tar.restore.file.unlink.before" in d.log()
            # sent before the verdict, still queued: nothing is sent after it
            s.setblocking(False)
            while True:
                try:
                    msgs.append(s.recv(4096).decode())
                except BlockingIOError:
                    break
            lines = [line for m in msgs for line in m.split("\n")]
            assert any(x.startswith("EXTEND_TIMEOUT_USEC=") for x in lines), msgs
            assert "WATCHDOG=1" in lines, msgs
            assert "READY=1" not in lines, msgs
            # three periods of 5 s and more: not one message
            s.settimeout(20)
            with pytest.raises(socket.timeout):
                late = s.recv(4096).decode()
                raise AssertionError(f"asked for time after logging the stall: {late!r}\n{d.log()[-3000:]}")
            assert d.proc.poll() is None, "the hung start is ended by systemd, not by ckptd"
        d.kill9()
        # the next start finishes the restore the hang left
        d.env = None
        d.start()
        assert not intent.exists()
        assert_same_tree(before, tree_state(r))
        d.stop()
    finally:
        d.kill9()
        d.cleanup()


def test_out_of_space_leaves_no_trace(daemon_factory):
    d = daemon_factory(backend="tar", start=False)
    d.state_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(d.state_dir)], check=True)
    d.start()
    (d.roots[0] / "small").write_text("fits")
    ok = d.create("fits")
    (d.roots[0] / "big").write_bytes(os.urandom(6 << 20))
    live = tree_state(d.roots[0])
    res = d.request("POST", "/v1/checkpoints", json={"name": "too-big"})
    assert res.status_code == 507, res.text
    assert res.json()["code"] == "insufficient_storage"
    assert tree_state(d.roots[0]) == live
    left = sorted(os.listdir(d.state_dir / "tar"))
    assert left == sorted(["base", "head", "running", ok["checkpoint_id"]]), left
    assert [c["name"] for c in d.list()] == ["fits"]
    d.restore(ok["checkpoint_id"])
    assert not (d.roots[0] / "big").exists()


def test_without_running_marker_no_ctime_is_trusted(daemon_factory):
    """Ctimes are trusted only while tar/running is on disk: a power cut
    in a run that could not write it leaves no trace of that run. So that
    run trusts no ctime: its first restore rewrites every file, and only
    then, with the marker written, restores read what changed."""
    d = daemon_factory(backend="tar", start=False)
    d.state_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(d.state_dir)], check=True)
    for i in range(20):
        (d.roots[0] / f"f{i}").write_text(f"file {i}\n")
    d.start()
    a = d.create("a")["checkpoint_id"]
    d.stop()
    assert not (d.state_dir / "tar" / "running").exists()
    st = os.statvfs(d.state_dir)
    used = st.f_files - st.f_ffree
    subprocess.run(["mount", "-o", f"remount,nr_inodes={used}", str(d.state_dir)], check=True)
    d.start()
    assert "cannot write 'running'" in d.log(), d.log()
    assert not (d.state_dir / "tar" / "running").exists()
    subprocess.run(["mount", "-o", f"remount,nr_inodes={used + 10000}", str(d.state_dir)], check=True)
    (d.roots[0] / "f3").write_text("changed\n")
    rep = d.restore(a)
    assert rep["tar"]["rewritten"] == 20 and rep["tar"]["kept"] == 0, rep["tar"]
    assert (d.state_dir / "tar" / "running").exists()
    (d.roots[0] / "f5").write_text("changed\n")
    rep = d.restore(a)
    assert rep["tar"]["rewritten"] == 1 and rep["tar"]["kept"] == 19, rep["tar"]
    assert (d.roots[0] / "f5").read_text() == "file 5\n"


def test_fresh_reset_returns_to_adopted_state(daemon_factory):
    d = daemon_factory(backend="tar", start=False)
    make_full_tree(d.roots[0])
    add_backend_extras(d.roots[0])
    adopted = tree_state(d.roots[0])
    d.start()
    (d.roots[0] / "later.txt").write_text("after adoption")
    cp = d.create("short", ttl_secs=1)["checkpoint_id"]
    mutate_everything(d.roots[0])
    time.sleep(1.5)
    rep = d.restore(cp, if_expired="fresh")
    assert rep["restored_from_checkpoint"] is False and rep["ttl_expired"] is True
    assert_same_tree(adopted, tree_state(d.roots[0]))


def test_restore_does_not_follow_a_symlinked_parent(daemon_factory, tmp_path):
    d = daemon_factory(backend="tar", start=False)
    (d.roots[0] / "dir").mkdir()
    (d.roots[0] / "dir/file").write_text("inside")
    d.start()
    before = tree_state(d.roots[0])
    cp = d.create("before-swap")["checkpoint_id"]
    outside = tmp_path / "outside"
    outside.mkdir()
    subprocess.run(["rm", "-rf", str(d.roots[0] / "dir")], check=True)
    os.symlink(outside, d.roots[0] / "dir")
    d.restore(cp)
    assert list(outside.iterdir()) == []
    assert_same_tree(before, tree_state(d.roots[0]))


def test_start_removes_temp_files(daemon_factory):
    """What a kill -9 leaves of write-temp-then-rename, in every dir the tar
    backend, the catalog and the engine write to, is gone after a start."""
    d = daemon_factory(backend="tar")
    (d.roots[0] / "a").write_text("1")
    cp = d.create("one")["checkpoint_id"]
    d.kill9()
    tar = d.state_dir / "tar"
    planted = [d.state_dir / ".ckptd.json.tmp.0badcafe",
               tar / ".restoring.json.tmp.12345678",
               tar / cp / ".r0.alias.tmp.abcdef01",
               d.state_dir / "catalog" / f".{cp}.json.tmp.deadbeef"]
    for p in planted:
        p.write_text("{torn")
    d.start()
    assert [p for p in planted if p.exists()] == []
    assert [c["checkpoint_id"] for c in d.list()] == [cp]
    assert d.restore(cp)["ok"] is True
def fill_fs(path):
    """Write path until its filesystem has no room left."""
    with open(path, "wb") as f:
        chunk = os.urandom(64 << 10)
        try:
            while True:
                f.write(chunk)
                f.flush()
        except OSError as e:
            assert e.errno == 28, e


def test_restore_onto_a_full_filesystem_fails_then_the_next_one_heals(daemon_factory, tmp_path):
    fs = tmp_path / "smallfs"
    fs.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(fs)], check=True)
    try:
        root = fs / "root"
        root.mkdir()
        d = daemon_factory(backend="tar", start=False, roots=[root])
        for i in range(3):
            (root / f"data{i}.bin").write_bytes(os.urandom(1 << 20))
        (root / "dir").mkdir()
        (root / "dir/small.txt").write_text("small\n")
        (root / "untouched.txt").write_text("never changed\n")
        d.start()
        before = tree_state(root)
        cp = d.create("before-full")["checkpoint_id"]
        for i in range(3):
            (root / f"data{i}.bin").write_bytes(b"x")
        (root / "dir/small.txt").write_text("changed\n")
        fill_fs(fs / "filler")
        res = d.request("POST", f"/v1/checkpoints/{cp}/restore", json={})
        assert res.status_code == 507, res.text
        assert res.json()["code"] == "insufficient_storage"
        assert d.health()["tar_unfinished_restore"]["id"] == cp
        (fs / "filler").unlink()
        rep = d.restore(cp)
        assert rep["ok"] is True
        assert_same_tree(before, tree_state(root))
        # after a failed restore nothing is trusted: all of it written again,
        # even the file no one changed
        assert rep["tar"]["rewritten"] == 6 and rep["tar"]["kept"] == 0, rep["tar"]
        rep = d.restore(cp)  # and the one after that is incremental again
        assert rep["tar"]["rewritten"] == 0 and rep["tar"]["kept"] == 6, rep["tar"]
        assert "tar_unfinished_restore" not in d.health()
        for i in range(3):  # data, not holes
            assert os.stat(root / f"data{i}.bin").st_blocks * 512 >= 1 << 20
        d.stop()
    finally:
        subprocess.run(["umount", "-l", str(fs)], check=False)


def physical_offset(path):
    """Byte offset of path's first block on its block device (ext4)."""
    out = subprocess.run(["filefrag", "-v", "-b4096", str(path)], check=True, capture_output=True,
                         text=True).stdout
    for line in out.splitlines():
        cols = line.replace(":", " ").replace("..", " ").split()
        if cols and cols[0] == "0":  # ext 0: logical start, end, physical start
            return int(cols[3]) * 4096
    raise AssertionError(out)


def test_verify_catches_a_change_behind_ckptds_back(daemon_factory, tmp_path):
    """Change a file's bytes on the block device, under the filesystem: its
    inode, ctime and size stay, so restore keeps it; verify reads it."""
    img, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "32M", str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-O", "^has_journal", str(img)], check=True)
    dev = subprocess.run(["losetup", "-f", "--show", str(img)], check=True, capture_output=True,
                         text=True).stdout.strip()
    subprocess.run(["mount", dev, str(mnt)], check=True)
    try:
        root = mnt / "root"
        root.mkdir()
        (root / "other.txt").write_text("untouched\n")
        (root / "victim.bin").write_bytes(b"A" * 8192)
        d = daemon_factory(backend="tar", start=False, roots=[root])
        d.start()
        cp = d.create("clean")["checkpoint_id"]
        rep = d.restore(cp, verify=True)
        assert rep["ok"] is True and rep["verified"] is True, rep
        os.sync()
        off = physical_offset(root / "victim.bin")
        d.stop()
        subprocess.run(["umount", str(mnt)], check=True)
        fd = os.open(dev, os.O_WRONLY)  # through the device: its cache stays coherent
        try:
            os.pwrite(fd, b"B" * 16, off)
            os.fsync(fd)
        finally:
            os.close(fd)
        subprocess.run(["mount", dev, str(mnt)], check=True)
        # A mount namespace made meanwhile by any process keeps the old
        # superblock alive, with the file's old pages: drop clean caches.
        pathlib.Path("/proc/sys/vm/drop_caches").write_text("3\n")
        assert (root / "victim.bin").read_bytes()[:16] == b"B" * 16
        d.start()
        rep = d.restore(cp)  # the shortcut trusts the unchanged inode
        assert rep["ok"] is True and rep["tar"]["rewritten"] == 0 and "verified" not in rep
        rep = d.restore(cp, verify=True)
        assert rep["ok"] is False and rep["verified"] is False, rep
        assert rep["verify_differences"] == [{"path": str(root / "victim.bin"), "reason": "content"}]
        assert rep["restore_duration_ms"] >= 0 and rep["verify_ms"] >= 0
        assert d.health()["tar_unfinished_restore"]["error"] == "verify found differences"
        # the next restore trusts nothing and repairs it
        rep = d.restore(cp, verify=True)
        assert rep["ok"] is True and rep["verified"] is True and rep["tar"]["kept"] == 0, rep
        assert (root / "victim.bin").read_bytes() == b"A" * 8192
        assert "tar_unfinished_restore" not in d.health()
        d.stop()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        subprocess.run(["losetup", "-d", dev], check=False)


def test_first_start_answers_at_once_while_the_base_is_taken(daemon_factory):
    d = daemon_factory(backend="tar", start=False)
    big = d.roots[0] / "big"
    big.mkdir()
    for i in range(96):
        (big / f"f{i:02d}").write_bytes(os.urandom(1 << 20))
    adopted = tree_state(d.roots[0])
    d.start(wait=False)
    deadline, health = time.monotonic() + 30, None
    while time.monotonic() < deadline and health is None:
        try:
            health = requests.get(d.url + "/v1/health", timeout=5).json()
        except requests.ConnectionError:
            time.sleep(0.005)
    assert health is not None, d.log()
    # the first answer comes while 96 MB are still being archived
    assert health["status"] == "preparing" and health["tar_base"] is False, health
    cp = d.create("right-away", ttl_secs=1)  # waits for the base
    h = d.health()
    assert h["status"] == "ok" and h["tar_base"] is True, h
    (d.roots[0] / "later.txt").write_text("after adoption\n")
    time.sleep(1.2)
    rep = d.restore(cp["checkpoint_id"], if_expired="fresh", verify=True)
    assert rep["restored_from_checkpoint"] is False and rep["verified"] is True, rep
    assert_same_tree(adopted, tree_state(d.roots[0]))


def test_restore_whose_writeback_fails_is_not_ok(daemon_factory, tmp_path):
    """ext4 on a loop device whose backing file lives on a tmpfs that runs
    out: write(2) succeeds into the page cache, writeback fails, and only the
    restore's final syncfs sees it. The next restore with room heals."""
    back, mnt = tmp_path / "back", tmp_path / "mnt"
    back.mkdir()
    mnt.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=64m", "tmpfs", str(back)], check=True)
    dev = None
    try:
        subprocess.run(["truncate", "-s", "48M", str(back / "img")], check=True)
        subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", "-O", "^has_journal", str(back / "img")],
                       check=True)
        dev = subprocess.run(["losetup", "-f", "--show", str(back / "img")], check=True, capture_output=True,
                             text=True).stdout.strip()
        subprocess.run(["mount", "-o", "errors=continue", dev, str(mnt)], check=True)
        root = mnt / "root"
        root.mkdir()
        for i in range(3):
            (root / f"data{i}.bin").write_bytes(os.urandom(4 << 20))
        d = daemon_factory(backend="tar", start=False, roots=[root])
        d.start()
        before = tree_state(root)
        cp = d.create("before")["checkpoint_id"]
        for i in range(3):
            (root / f"data{i}.bin").write_bytes(b"x")
        os.sync()
        fill_fs(back / "filler")  # the loop's backing store is full; ext4 does not know
        res = d.request("POST", f"/v1/checkpoints/{cp}/restore", json={})
        # the loop reports its backing store's ENOSPC; only syncfs sees it
        assert res.status_code == 507 and "cannot sync root" in res.json()["detail"], res.text
        assert d.health()["tar_unfinished_restore"]["id"] == cp
        (back / "filler").unlink()
        rep = d.restore(cp, verify=True)
        assert rep["ok"] is True and rep["verified"] is True, rep
        assert rep["tar"]["kept"] == 0, rep["tar"]
        assert_same_tree(before, tree_state(root))
        d.stop()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        if dev:
            subprocess.run(["losetup", "-d", dev], check=False)
        subprocess.run(["umount", "-l", str(back)], check=False)


def test_base_that_does_not_fit_is_retried_by_the_next_create(daemon_factory):
    d = daemon_factory(backend="tar", start=False)
    d.state_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(d.state_dir)], check=True)
    (d.roots[0] / "big.bin").write_bytes(os.urandom(4 << 20))
    (d.roots[0] / "small.txt").write_text("stays\n")
    d.start()
    h = d.health()
    assert h["status"] == "ok" and h["tar_base"] is False and "space" in h["tar_base_error"], h
    res = d.request("POST", "/v1/checkpoints", json={"name": "no-room"})
    assert res.status_code == 507, res.text
    assert sorted(os.listdir(d.state_dir / "tar")) == ["running"], "a half base was left behind"
    (d.roots[0] / "big.bin").unlink()
    cp = d.create("fits")
    h = d.health()
    assert h["tar_base"] is True and "tar_base_error" not in h, h
    assert [c["checkpoint_id"] for c in d.list()] == [cp["checkpoint_id"]]


def test_compacted_chains_restore_what_was_captured(daemon_factory):
    """What a program does to its files (writes in place, some past the end,
    leaving holes; unlinks; new files; appends) across many creates, with
    chains compacted after every second one: every checkpoint still restores
    to exactly what it captured. Compaction once dropped the holes of files
    written past their end, and restores answered ok with shifted data."""
    import random
    rnd = random.Random(7)
    d = daemon_factory(backend="tar", start=False,
                       config={"tar_chain_max": 2, "max_checkpoints": 1000, "default_ttl_secs": 0})
    root = d.roots[0]
    for i in range(4):
        (root / f"d{i}").mkdir()
        for j in range(5):
            (root / f"d{i}" / f"f{j}.bin").write_bytes(os.urandom(rnd.randint(0, 70 << 10)))
    d.start()
    acked = {}
    for k in range(16):
        files = sorted(root.rglob("*.bin"))
        for p in rnd.sample(files, min(len(files), rnd.randint(1, 5))):
            with open(p, "r+b") as f:
                f.seek(rnd.randrange(0, 90 << 10))  # past the end at times: a hole
                f.write(os.urandom(rnd.randint(1, 8192)))
        for p in rnd.sample(files, rnd.randint(0, 2)):
            p.unlink()
        (root / f"d{rnd.randrange(4)}" / f"g{k}.bin").write_bytes(os.urandom(rnd.randint(0, 100 << 10)))
        with open(root / "notes.txt", "a") as f:
            f.write(f"create {k}\n")
        want = tree_state(root)
        acked[d.create(f"c{k}")["checkpoint_id"]] = want
    deadline = time.time() + 30
    while d.log().count("compacted the chain") < 4 and time.time() < deadline:
        time.sleep(0.1)
    assert d.log().count("compacted the chain") >= 4, "the chains were not compacted"
    assert "cannot compact" not in d.log()
    for cid, want in acked.items():
        assert d.restore(cid)["ok"] is True
        assert_same_tree(want, tree_state(root))


# Tar roots are tracked by default ("auto"); "never" runs the same
# workload with every create and restore reading the whole tree.
TRACKING = ["auto", "never"]


def assert_tracking_used(d, track, tracked_text):
    log, (t,) = d.log(), d.health()["root_details"]
    if track == "auto":
        assert tracked_text in log, "no create or restore used change tracking"
        assert t["tracking"] != "none" and t["tracked"] > 0, t
    else:
        assert "change tracking)" not in log, "tracking was used although track_changes is never"
        assert t["tracking"] == "none" and t["tracked"] == 0, t
        assert t["tracking_reason"] == 'turned off (track_changes "never")', t


@pytest.mark.parametrize("track", TRACKING)
def test_change_tracking_sees_what_programs_do(daemon_factory, tmp_path, track):
    """Tar creates read only the directories that changed since the head
    (fanotify, as on overlay); what programs do that makes no event in the
    directory or none at all must still be captured: a directory renamed
    with its contents, a tree made at once, metadata changes, a write
    through a hard link outside the root, a write through a shared mapping
    held across the create. The daemon runs with track_check, which fails
    a create whose journal missed an entry (read-only); every checkpoint is
    then restored and compared."""
    import mmap
    d = daemon_factory(backend="tar", start=False, extra_args=("-v",), config={"track_changes": track})
    root = d.roots[0]
    for i in range(6):
        (root / f"d{i}").mkdir()
        for j in range(20):
            (root / f"d{i}" / f"f{j}").write_bytes(os.urandom(3000))
    os.symlink("d0/f0", root / "link")
    d.start()
    outside = tmp_path / "outside-name"
    steps = [
        lambda: (root / "d0" / "f1").write_bytes(b"rewritten"),
        lambda: open(root / "d1" / "f2", "r+b").write(b"in place"),
        lambda: os.rename(root / "d2", root / "d3" / "moved"),
        lambda: (root / "d3" / "moved" / "f3").write_text("in the moved dir"),
        lambda: (root / "new" / "a" / "b").mkdir(parents=True) or (root / "new" / "a" / "b" / "x").write_text("x"),
        lambda: os.chmod(root / "d4" / "f4", 0o600),
        lambda: os.setxattr(root / "d4" / "f5", "user.k", b"v"),
        lambda: os.utime(root / "d4" / "f6", ns=(10**18, 10**18)),
        lambda: os.truncate(root / "d5" / "f7", 10),
        lambda: (os.unlink(root / "link"), os.symlink("d1/f1", root / "link")),
        lambda: os.link(root / "d5" / "f8", outside),
        lambda: open(outside, "r+b").write(b"through the other name"),
        lambda: os.unlink(outside),
        lambda: open(root / "d5" / "f8", "r+b").write(b"one name again"),
    ]
    acked = {}
    for k, step in enumerate(steps):
        step()
        want = tree_state(root)
        acked[d.create(f"s{k}")["checkpoint_id"]] = want
    # a write through a shared mapping that stays mapped across the create
    with open(root / "d1" / "f9", "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
        m[0:6] = b"mapped"
        want = tree_state(root)
        acked[d.create("mapped")["checkpoint_id"]] = want
        m[6:12] = b"again!"
        want = tree_state(root)
        acked[d.create("mapped-again")["checkpoint_id"]] = want
        m.close()
    assert_tracking_used(d, track, "(the changed ones: change tracking)")
    for cid, want in acked.items():
        assert d.restore(cid)["ok"] is True
        assert_same_tree(want, tree_state(root))
    # after a restore the journal counts for the restored checkpoint
    (root / "d0" / "f2").write_bytes(b"after the restore")
    want = tree_state(root)
    cid = d.create("after")["checkpoint_id"]
    d.restore(list(acked)[0])
    assert d.restore(cid)["ok"] is True
    assert_same_tree(want, tree_state(root))


@pytest.mark.parametrize("track", TRACKING)
def test_restore_of_the_head_reads_only_what_changed(daemon_factory, track):
    """Restoring the checkpoint the roots were last made or restored as (a
    retry loop) reads only the directories change tracking names; whatever
    a program did since, the restore must put back exactly that checkpoint."""
    import mmap
    d = daemon_factory(backend="tar", start=False, extra_args=("-v",), config={"track_changes": track})
    root = d.roots[0]
    for i in range(5):
        (root / f"d{i}" / "sub").mkdir(parents=True)
        for j in range(10):
            (root / f"d{i}" / f"f{j}").write_bytes(os.urandom(2000))
            (root / f"d{i}" / "sub" / f"g{j}").write_bytes(os.urandom(500))
    os.chmod(root / "d3" / "sub", 0o750)
    d.start()
    want = tree_state(root)
    cid = d.create("head")["checkpoint_id"]
    attempts = [
        lambda: (root / "d0" / "f1").write_bytes(b"rewritten"),
        lambda: open(root / "d1" / "sub" / "g2", "r+b").write(b"in place, one level down"),
        lambda: os.rename(root / "d2", root / "d4" / "moved-in"),
        lambda: os.rename(root / "d2" / "sub", root / "d2" / "renamed"),
        lambda: subprocess.run(["rm", "-rf", str(root / "d3" / "sub")], check=True),
        lambda: os.chmod(root / "d3" / "sub", 0o700),
        lambda: os.setxattr(root / "d0" / "sub", "user.k", b"v"),
        lambda: (os.unlink(root / "d1" / "f3"), os.mkdir(root / "d1" / "f3")),
        lambda: (root / "new" / "a" / "b").mkdir(parents=True),
        lambda: os.chmod(root, 0o700),
        lambda: os.truncate(root / "d4" / "sub" / "g9", 0),
        lambda: [p.unlink() for p in (root / "d0").glob("f*")],
        # what the events name in a directory: only those entries are compared
        lambda: os.rename(root / "d0" / "f2", root / "d0" / "f4"),
        lambda: os.link(root / "d1" / "f5", root / "d1" / "sub" / "hard"),
        lambda: (os.unlink(root / "d4" / "f6"), os.symlink("f7", root / "d4" / "f6")),
        lambda: ((root / "d4" / ".tmp").write_text("beside"), os.rename(root / "d4" / ".tmp", root / "d4" / "f8")),
        lambda: os.setxattr(root / "d4" / "sub" / "g1", "user.k", b"v"),
        lambda: (os.rename(root / "d1" / "sub", root / "d1" / "gone"), os.mkdir(root / "d1" / "sub")),
        # more names than a directory keeps: it is read whole
        lambda: [(root / "d4" / f"many{j:03d}").write_text("x") for j in range(300)] and os.unlink(root / "d4" / "f9"),
    ]
    for k, attempt in enumerate(attempts):
        attempt()
        rep = d.restore(cid)
        assert rep["ok"] is True
        assert_same_tree(want, tree_state(root)), k
    # a write through a shared mapping held across the restore
    with open(root / "d4" / "f5", "r+b") as f:
        m = mmap.mmap(f.fileno(), 0)
        m[0:6] = b"mapped"
        m.flush()
        assert d.restore(cid)["ok"] is True
        m.close()
    assert_same_tree(want, tree_state(root))
    log = d.log()
    if track == "auto":
        # every restore is answered by tracking, but for the one that may
        # read the events of a directory already removed (rm -rf): its
        # handle no longer resolves (ESTALE), and the restore walks, as
        # designed; under load that happened once in CI (and in stop 35)
        unresolved = log.count("(a directory of an event could not be resolved)")
        assert unresolved <= 1, log
        assert log.count("read the directories that changed (change tracking)") >= len(attempts) - unresolved
    assert_tracking_used(d, track, "read the directories that changed (change tracking)")


@pytest.mark.parametrize("track", TRACKING)
def test_programs_at_work_with_change_tracking(daemon_factory, tmp_path, track):
    """Programs nobody here wrote, in a tar root with change tracking (and
    track_check, which fails a create whose journal missed an entry), and
    the same without tracking:
    git committing, branching and repacking, Python compiling, SQLite in WAL
    mode with its connection (and the -shm mapping) open across creates, cp -al
    and rsync. After each step a create; then each checkpoint restored, the
    checkpoint before it restored, and it again (a restore of the head, which
    reads only what changed), each compared with what the step left."""
    import sqlite3
    d = daemon_factory(backend="tar", start=False, extra_args=("-v",), config={"track_changes": track})
    root = d.roots[0]
    (root / "src").mkdir()
    for i in range(20):
        (root / "src" / f"m{i}.py").write_text(f"def f{i}():\n    return {i}\n")
    d.start()
    env = dict(os.environ, GIT_AUTHOR_NAME="t", GIT_AUTHOR_EMAIL="t@e", GIT_COMMITTER_NAME="t",
               GIT_COMMITTER_EMAIL="t@e", HOME=str(tmp_path))

    def git(*args):
        subprocess.run(["git", "-C", str(root / "src"), *args], check=True, env=env, capture_output=True)

    db = sqlite3.connect(root / "data.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    steps = [
        lambda: (git("init", "-q"), git("add", "."), git("commit", "-qm", "one")),
        lambda: subprocess.run(["python3", "-m", "compileall", "-q", str(root / "src")], check=True),
        lambda: [db.execute("INSERT INTO t (v) VALUES (?)", (f"row {i}",)) for i in range(200)],
        lambda: ((root / "src" / "m3.py").write_text("changed\n"), git("checkout", "-qb", "topic"),
                 git("commit", "-qam", "two")),
        lambda: db.execute("UPDATE t SET v = v || '!' WHERE k % 3 = 0"),
        lambda: subprocess.run(["cp", "-al", str(root / "src"), str(root / "linked")], check=True),
        lambda: (git("checkout", "-q", "-"), git("gc", "-q", "--aggressive")),
        lambda: subprocess.run(["rsync", "-a", "--delete", str(root / "src") + "/", str(root / "copy")],
                               check=True),
        lambda: db.execute("DELETE FROM t WHERE k > 100"),
    ]
    acked = []
    for step in steps:
        step()
        acked.append((d.create(f"step")["checkpoint_id"], tree_state(root)))
    assert_tracking_used(d, track, "(the changed ones: change tracking)")
    for i, (cid, want) in enumerate(acked):
        assert d.restore(cid)["ok"] is True
        assert_same_tree(want, tree_state(root))
        if i:
            assert d.restore(acked[i - 1][0])["ok"] is True
            assert_same_tree(acked[i - 1][1], tree_state(root))
            assert d.restore(cid)["ok"] is True
            assert_same_tree(want, tree_state(root))
    db.close()


def burst(root, tag):
    """600 writes into a and e (their handles repeat across several reads of
    the queue), b renamed into c midway and its path made again, then
    removals that name only their directory."""
    for i in range(600):
        if i <= 300 or i % 20 > 12:
            (root / "a" / f"f{i % 20}").write_text(f"{tag}{i}")
        if i == 300:
            (root / "b" / "sub" / f"new{tag}").mkdir()
            os.rename(root / "b", root / "c" / f"b{tag}")
            (root / "b" / "sub").mkdir(parents=True)
        if i > 300 and i % 50 == 0:
            (root / "c" / f"b{tag}" / "sub" / f"old{i // 50}").unlink()
            (root / "a" / f"f{i // 50}").unlink()
            (root / "e" / f"old{i // 50}").unlink()
            (root / "e" / f"{tag}{i}").write_text("e")
            (root / "b" / "sub" / f"z{i}").write_text("z")
    os.rename(root / "a" / "f1", root / "c" / f"f1{tag}")


def walk_reasons(d):
    """The daemon's words on why an operation read the whole tree."""
    return "\n".join(l for l in d.log().splitlines()
                     if re.search(r"change tracking|whole tree|outside the root|read the", l))[-4000:]


def test_tracking_repeated_handles_and_a_directory_renamed(daemon_factory):
    """One collect resolves each directory handle once (change_track.c's
    cache). A burst whose events repeat handles across several reads of the
    queue, with a directory renamed midway, must give the dirty set a fresh
    resolve would. A restore right after the burst compares only the
    entries the events named in a directory; a create is checked against
    the live tree (track_check, conftest)."""
    d = daemon_factory(backend="tar", start=False, extra_args=["--verbose"])  # why a walk, if one comes
    root = d.roots[0]
    for name in ("a", "b/sub", "c", "e"):
        (root / name).mkdir(parents=True)
    for i in range(20):
        (root / "a" / f"f{i}").write_text(f"a{i}")
        (root / "b" / "sub" / f"old{i}").write_text(f"b{i}")
        (root / "e" / f"old{i}").write_text(f"e{i}")
    d.start()
    assert d.health()["root_details"][0]["tracking"] == "fanotify"
    cid0, want0 = d.create("base")["checkpoint_id"], tree_state(root)
    burst(root, "x")
    tracked = d.health()["root_details"][0]["tracked"]
    assert d.restore(cid0)["ok"] is True
    assert_same_tree(want0, tree_state(root))
    burst(root, "y")
    cid1, want1 = d.create("after")["checkpoint_id"], tree_state(root)
    assert d.health()["root_details"][0]["tracked"] == tracked + 2, walk_reasons(d)  # the restore and the create
    assert d.restore(cid0)["ok"] is True
    assert_same_tree(want0, tree_state(root))
    assert d.restore(cid1)["ok"] is True
    assert_same_tree(want1, tree_state(root))



def test_a_restored_file_linked_outside_the_root(daemon_factory):
    """A file a restore wrote (a new inode, recorded as the checkpoint's
    alias) gets a second name outside the root and is written through it:
    the writes' events name the outside directory only. Whichever name the
    kernel gives the link's event, the next create captures the new data
    (found by its inode among the checkpoint's, the restored one included,
    or in its directory)."""
    d = daemon_factory(backend="tar", start=False)
    root = d.roots[0]
    (root / "d").mkdir()
    for i in range(5):
        (root / "d" / f"f{i}").write_text(f"file {i}")
    d.start()
    assert d.health()["root_details"][0]["tracking"] == "fanotify"
    c0 = d.create("base")["checkpoint_id"]
    ino0 = (root / "d" / "f2").stat().st_ino
    with open(root / "d" / "f2") as held:  # its number stays taken
        (root / "d" / "f2").unlink()
        assert d.restore(c0)["ok"] is True  # f2 made again: another inode
    assert (root / "d" / "f2").stat().st_ino != ino0
    outside = d.base / "outside"
    outside.mkdir()
    os.link(root / "d" / "f2", outside / "f2")
    with open(outside / "f2", "a") as f:
        f.write(" and written elsewhere")
    want = tree_state(root)
    c1 = d.create("after")["checkpoint_id"]
    (outside / "f2").unlink()
    (root / "d" / "f2").write_text("later")
    assert d.restore(c1)["ok"] is True
    assert_same_tree(want, tree_state(root))
    assert (root / "d" / "f2").read_text() == "file 2 and written elsewhere"


def test_a_number_given_again_outside_is_not_the_roots_file(daemon_factory, tmp_path):
    """A file of the checkpoint is removed and the filesystem gives its inode
    number to a new file outside the root, which gets a second name there
    (its link event names the inode alone). That inode is not the
    checkpoint's file any more: the next create, and a restore of it, still
    read only what changed (a test run beside on the same filesystem made
    them read the whole tree), and both are exact. On an ext4 with a
    journal of its own: without one (this machine's /), ext4 gives no
    number removed in the last minute again while its inode table block is
    cached (recently_deleted), and the test found no reuse in 4 runs of 9."""
    img, mnt = tmp_path / "fs.img", tmp_path / "mnt"
    mnt.mkdir()
    subprocess.run(["truncate", "-s", "64M", str(img)], check=True)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", str(img)], check=True)
    dev = subprocess.run(["losetup", "-f", "--show", str(img)], check=True, capture_output=True,
                         text=True).stdout.strip()
    subprocess.run(["mount", dev, str(mnt)], check=True)
    try:
        root, outside = mnt / "root", mnt / "outside"
        root.mkdir()
        outside.mkdir()
        # why a walk, if one comes
        d = daemon_factory(backend="tar", start=False, roots=[root], extra_args=["--verbose"])
        (root / "d").mkdir()
        for i in range(20):
            (root / "d" / f"f{i}").write_text(f"file {i}")
        d.start()
        c0, want0 = d.create("base")["checkpoint_id"], tree_state(root)
        freed, reused = set(), False
        for i in range(20):  # a test run beside may take a number first
            freed.add((root / "d" / f"f{i}").stat().st_ino)
            (root / "d" / f"f{i}").unlink()
            (outside / f"o{i}").write_text("another file")
            if (outside / f"o{i}").stat().st_ino in freed:
                os.link(outside / f"o{i}", outside / f"o{i}.link")
                reused = True
                break
        assert reused, "the filesystem gave none of 20 removed files' inode numbers to a new file"
        tracked = d.health()["root_details"][0]["tracked"]
        c1, want1 = d.create("after")["checkpoint_id"], tree_state(root)
        (root / "d" / "f19").write_text("changed")
        assert d.restore(c1)["ok"] is True  # the head again: only what changed
        assert_same_tree(want1, tree_state(root))
        assert d.health()["root_details"][0]["tracked"] == tracked + 2, walk_reasons(d)
        assert d.restore(c0)["ok"] is True
        assert_same_tree(want0, tree_state(root))
        d.stop()
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)
        subprocess.run(["losetup", "-d", dev], check=False)


def too_deep(top, data=None):
    """A chain of directories below top whose path is longer than PATH_MAX
    (18 x 251 bytes), made through each one's fd; with data, a file at the
    bottom: the tracker cannot name by path what changes there."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    try:
        for _ in range(18):
            os.mkdir("n" * 250, dir_fd=fd)
            sub = os.open("n" * 250, os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
            os.close(fd)
            fd = sub
        if data is not None:
            f = os.open("file", os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o644, dir_fd=fd)
            os.write(f, data)
            os.close(f)
    finally:
        os.close(fd)


def test_a_deep_tree_outside_the_root_is_none_of_its_business(daemon_factory):
    """Another program makes a tree deeper than PATH_MAX elsewhere on the
    root's filesystem (a build, a test of PATH_MAX): the tracker, which
    hears that whole filesystem, cannot name those directories by path, but
    finds them outside the root, and the next create still reads only what
    changed (it read the whole tree before: "a directory of an event could
    not be resolved"), and is exact."""
    d = daemon_factory(backend="tar", start=False, extra_args=["--verbose"])  # why a walk, if one comes
    root = d.roots[0]
    (root / "d").mkdir()
    (root / "d" / "f").write_text("before")
    outside = d.base / "outside"
    outside.mkdir()
    d.start()
    c0, want0 = d.create("base")["checkpoint_id"], tree_state(root)
    too_deep(outside, b"deep")
    (root / "d" / "f").write_text("after")
    tracked = d.health()["root_details"][0]["tracked"]
    c1, want1 = d.create("after")["checkpoint_id"], tree_state(root)
    assert d.health()["root_details"][0]["tracked"] == tracked + 1, walk_reasons(d)
    shutil.rmtree(outside)
    for cid, want in ((c0, want0), (c1, want1)):
        assert d.restore(cid)["ok"] is True
        assert_same_tree(want, tree_state(root))
