"""The overlay backend through the real daemon with real overlay mounts:
restore after deletes/replaced dirs/renames, retry loop and multi-step
flows, adopt after restart and after a "reboot", the busy mount, and kill -9
in the middle of create, restore and delete."""
import json
import os
import pathlib
import re
import shutil
import subprocess
import threading
import time

import pytest

from conftest import assert_same_tree, make_full_tree, unmount_all
from conftest import tree_state


def overlay_daemon(daemon_factory, tree=True, **kw):
    d = daemon_factory(backend="overlay", start=False, **kw)
    if tree:
        make_full_tree(d.roots[0])
    d.start()
    return d


def is_overlay(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) and " - overlay " in line for line in f)


def test_health_says_overlay(daemon_factory):
    d = overlay_daemon(daemon_factory, tree=False)
    h = d.request("GET", "/v1/health").json()
    assert h["backend"] == "overlay"
    assert "overlay" in h["backend_reason"]
    assert h["overlay_roots"][0]["path"] == str(d.roots[0])
    assert is_overlay(d.roots[0])


def test_untracked_creates_and_a_bad_tracking_setting(daemon_factory):
    """track_changes other than auto, always or never is refused at start,
    naming the key. By default ("auto") a small upper is copied without
    tracking (its frozen pass walks; the scans for files mapped shared and
    writable run before and after the first pass), and the checkpoints hold
    what the root did, a file held mapped meanwhile included."""
    import mmap
    bad = daemon_factory(backend="overlay", start=False, config={"track_changes": "yes"})
    with pytest.raises(RuntimeError, match='track_changes must be "auto", "always" or "never"'):
        bad.start()
    d = daemon_factory(backend="overlay")
    root = d.roots[0]
    (root / "db").write_bytes(b"a" * 8192)
    with open(root / "db", "r+b") as f, mmap.mmap(f.fileno(), 8192) as m:
        m[0:1] = b"b"
        first = d.create("first")["checkpoint_id"]
        m[1:2] = b"c"
        (root / "other").write_text("x\n")
        second = d.create("second")["checkpoint_id"]
        want = tree_state(root)
        m[2:3] = b"d"
    d.restore(first)
    assert (root / "db").read_bytes()[:2] == b"ba"
    assert not (root / "other").exists()
    d.restore(second)
    assert tree_state(root) == want
    assert (root / "db").read_bytes()[:3] == b"bca"
    log = d.log()
    assert "frozen pass of" not in log  # untracked: the walk, without a word
    assert "second pass of" not in log


def test_default_tracks_an_upper_of_2000_entries(daemon_factory):
    """By default ("auto") tracking starts at 2,000 entries in the upper: a
    create of such an upper has a tracked frozen pass, and a delta follows
    (track_check compares both with the tree, read-only)."""
    d = daemon_factory(backend="overlay")
    root = d.roots[0]
    for i in range(2100):
        (root / f"d{i % 20}").mkdir(exist_ok=True)
        (root / f"d{i % 20}" / f"f{i}").write_text(f"{i}\n")
    d.create("full")
    (root / "d3" / "f3").write_text("changed\n")
    want = tree_state(root)
    cid = d.create("delta")["checkpoint_id"]
    log = d.log()
    assert "frozen pass of" in log and "delta pass of" in log, log
    (root / "d3" / "f3").write_text("again\n")
    d.restore(cid)
    assert_same_tree(want, tree_state(root))


@pytest.mark.parametrize("dirs", [0, 300], ids=["few", "many"])
def test_delta_keeps_a_time_a_refused_rename_moved(daemon_factory, dirs):
    """A base directory in the upper (p/q, copied up) renamed over a
    directory that is not empty: overlayfs renames with RENAME_WHITEOUT,
    ext4 refuses with ENOTEMPTY after making the whiteout and, resetting the
    entry, moves the mtime of the parent (p) with no event at all (the
    second time: the first one sets q's redirect, which is an event on q).
    Only the frozen pass's look at every directory's metadata finds it;
    track_check fails the create if the delta misses it. On ext4 (/tmp):
    the tmpfs of test_overlay_delta.py checks emptiness first. Under gVisor
    (test_environments.py reruns this file there) nothing moves it, and
    the test shows only that the restores are exact. With 300 more
    directories in the upper the look runs on a thread from the start of
    the create (no unit is frozen): the rename is refused before the
    request, so that look must find it too."""
    import errno
    d = daemon_factory(backend="overlay", start=False, config={"track_changes": "always"})
    root = d.roots[0]
    (root / "p/q").mkdir(parents=True)
    (root / "p/q/f").write_text("base\n")
    d.start()
    (root / "p/q/f").write_text("copied up\n")  # p and p/q now merge directories
    (root / "full/x").mkdir(parents=True)  # only in the upper, and not empty
    for i in range(dirs):
        (root / "many" / f"d{i:03d}").mkdir(parents=True)
    d.create("full")
    moved, saved = 0, []
    for i in range(2):
        (root / "other").write_text(f"{i}\n")
        d.create(f"before{i}")
        mtime = os.stat(root / "p").st_mtime_ns
        time.sleep(0.01)
        with pytest.raises(OSError) as e:
            os.rename(root / "p/q", root / "full")
        assert e.value.errno == errno.ENOTEMPTY
        moved += os.stat(root / "p").st_mtime_ns != mtime
        # track_check: the create fails unless its delta has p's new mtime
        saved.append((d.create(f"after{i}")["checkpoint_id"], os.stat(root / "p").st_mtime_ns))
    for cid, want in saved:
        d.restore(cid)
        assert os.stat(root / "p").st_mtime_ns == want
    kind = d.health()["overlay"]["kind"]
    if kind == "kernel":  # gVisor's overlay moves no mtime here: the restores above are what it shows
        assert moved == 2, "the kernel no longer moves the parent's mtime: the test shows nothing"
    else:
        print(f"{kind} overlay: the refused rename moved the parent's mtime {moved} of 2 times")
    log = d.log()
    assert log.count("frozen delta pass of") >= 4, log
    assert "gets a full layer, not a delta" not in log, log
    begun = log.count("begun with the first pass")
    assert begun >= 4 if dirs else begun == 0, log


def test_a_second_daemon_on_a_managed_root_refuses(daemon_factory):
    """A root that another ckptd's overlay is mounted on (a second daemon
    started with a new state dir beside a running one) is refused at start,
    naming that state dir. Before, the second daemon mounted its overlay
    over the first one's, or failed with EINVAL and left its base bound;
    the first one's restores then changed the tree under it."""
    a = overlay_daemon(daemon_factory, tree=False)
    root = a.roots[0]
    (root / "f").write_text("one\n")
    mounts_before = pathlib.Path("/proc/self/mountinfo").read_text().count(" - overlay ")
    b = daemon_factory(start=False, backend="overlay", roots=[root])
    # gVisor's mount table shows no upperdir: the start is refused there
    # too, by the base check, which names no state dir
    gvisor = os.environ.get("CKPTD_TEST_ENV") == "gvisor"
    refused = "is not mounted under its overlay" if gvisor else "is mounted as the overlay of another ckptd"
    b.start(wait=False)
    assert b.proc.wait(timeout=60) != 0
    log = b.log()
    assert refused in log and (gvisor or str(a.state_dir) in log), log
    mountinfo = pathlib.Path("/proc/self/mountinfo").read_text()
    assert str(b.base) not in mountinfo  # no base bound, no overlay
    assert mountinfo.count(" - overlay ") == mounts_before
    # the first daemon still manages the root, its restores whole
    cp = a.create("one")["checkpoint_id"]
    (root / "f").write_text("two\n")
    a.restore(cp)
    assert (root / "f").read_text() == "one\n"
    # stopped, the first one leaves its overlay mounted for its next start:
    # still refused; once that is unmounted, the second one starts
    a.stop()
    b.start(wait=False)
    assert b.proc.wait(timeout=60) != 0
    assert b.log().count(refused) == 2
    unmount_all(a.base)
    assert not is_overlay(root)
    b.start()
    assert is_overlay(root)
    b.stop()


def test_restore_deleted_replaced_renamed(daemon_factory):
    d = overlay_daemon(daemon_factory)
    root = d.roots[0]
    (root / "added-before").write_text("upper file\n")
    before = tree_state(root)
    cp = d.create("before")
    assert cp["backend"] == "overlay"
    os.unlink(root / "file.txt")                     # a lower file deleted
    shutil.rmtree(root / "dir")                      # a directory replaced ...
    (root / "dir").write_text("now a file\n")        # ... by a file
    os.rename(root / "exec.sh", root / "renamed.sh")  # a file renamed
    (root / "added-before").write_text("changed\n")
    (root / "new-dir").mkdir()
    assert tree_state(root) != before
    rep = d.restore(cp["checkpoint_id"])
    assert rep["ok"] is True
    assert tree_state(root) == before


def test_verify_catches_a_layer_changed_behind_ckptds_back(daemon_factory):
    d = overlay_daemon(daemon_factory)
    root = d.roots[0]
    (root / "file.txt").write_text("in the first layer\n")
    (root / "gone.txt").write_text("in the first layer too\n")
    cp1 = d.create("one")["checkpoint_id"]
    (root / "second.txt").write_text("second layer\n")
    os.unlink(root / "dir/sub/deeper/note")  # a whiteout in the second layer
    cp2 = d.create("two")["checkpoint_id"]
    (root / "later.txt").write_text("after both\n")
    rep = d.restore(cp2, verify=True)
    assert rep["ok"] is True and rep["verified"] is True and rep["verify_differences"] == [], rep
    rep = d.restore(cp1, verify=True)
    assert rep["ok"] is True and rep["verified"] is True, rep
    # write on the layers of cp2 (lower dirs under the mount: cp2's chain is a
    # delta over cp1's layer, or one full layer), newest holding each file
    rdir = next((d.state_dir / "overlay" / "r").iterdir())
    chain = [rdir / "l" / n for n in json.loads((d.state_dir / f"overlay/c/{cp2}.json").read_text())[rdir.name]]
    holding = lambda name: next(p for p in chain if (p / name).exists())
    holding("file.txt").joinpath("file.txt").write_text("changed behind ckptd's back\n")
    os.unlink(holding("gone.txt") / "gone.txt")
    (chain[0] / "planted").write_text("x")
    rep = d.restore(cp2, verify=True)
    assert rep["ok"] is False and rep["verified"] is False, rep
    got = {(x["path"], x["reason"]) for x in rep["verify_differences"]}
    assert got == {(str(root / "file.txt"), "size"), (str(root / "gone.txt"), "missing"),
                   (str(root / "planted"), "unexpected")}, got
    assert rep["verify_ms"] >= 0 and rep["phases"]["swap_ms"] >= 0
    # the merged view does show the change: verify told the truth
    assert (root / "planted").exists() and not (root / "gone.txt").exists()


def test_retry_loop_and_multi_step(daemon_factory):
    d = overlay_daemon(daemon_factory, tree=False)
    root = d.roots[0]
    (root / "app.txt").write_text("v0\n")
    base = d.create("base")["checkpoint_id"]
    for attempt in range(5):  # checkpoint, try, roll back, retry
        (root / "app.txt").write_text(f"attempt {attempt}\n")
        (root / f"junk{attempt}").write_text("x")
        d.restore(base)
        assert (root / "app.txt").read_text() == "v0\n"
        assert not (root / f"junk{attempt}").exists()
    steps = []
    for step in range(4):  # checkpoint after each good step
        (root / f"step{step}").write_text(str(step))
        steps.append((d.create(f"step{step}")["checkpoint_id"], tree_state(root)))
    (root / "step3").write_text("broken")
    os.unlink(root / "step1")
    d.restore(steps[1][0])  # back to the last good one
    assert tree_state(root) == steps[1][1]
    (root / "step2b").write_text("branch")
    branch = d.create("branch")["checkpoint_id"]
    d.restore(steps[3][0])
    assert tree_state(root) == steps[3][1]
    d.restore(branch)
    assert (root / "step2b").read_text() == "branch"
    d.delete(steps[0][0])
    d.restore(steps[2][0])
    assert tree_state(root) == steps[2][1]


def test_adopt_after_restart_and_reboot(daemon_factory):
    d = overlay_daemon(daemon_factory)
    root = d.roots[0]
    (root / "written").write_text("before restart\n")
    cp = d.create("one")["checkpoint_id"]
    (root / "after-cp").write_text("not checkpointed\n")
    state = tree_state(root)
    d.stop()
    assert is_overlay(root)  # unmount_on_exit is off by default
    d.start()
    assert tree_state(root) == state
    assert [c["checkpoint_id"] for c in d.list()] == [cp]
    d.stop()
    unmount_all(d.base)  # a reboot: every mount is gone, the state dir stays
    assert not (root / "written").exists()
    d.start()
    assert is_overlay(root)
    assert tree_state(root) == state
    d.restore(cp)
    assert (root / "written").exists() and not (root / "after-cp").exists()


def test_busy_mount_lists_holders(daemon_factory):
    d = overlay_daemon(daemon_factory, tree=False)
    root = d.roots[0]
    (root / "a").write_text("1")
    cp = d.create("one")["checkpoint_id"]
    (root / "a").write_text("2")
    holder = subprocess.Popen(["sleep", "60"], cwd=root)  # returns once it runs there
    try:
        rep = d.restore(cp)
        pids = [p["pid"] for p in rep.get("busy_processes", [])]
        assert holder.pid in pids
        assert any(p["command"] == "sleep" for p in rep["busy_processes"])
        assert (root / "a").read_text() == "1"  # new opens see the restored tree
    finally:
        holder.kill()
        holder.wait()


def _in_thread(d, method, path, **kw):
    def run():
        try:
            d.request(method, path, timeout=10, **kw)
        except Exception:  # the daemon is killed under the request
            pass
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_kill9_during_restore_before_or_after(daemon_factory):
    d = overlay_daemon(daemon_factory)
    root = d.roots[0]
    cp = d.create("good")["checkpoint_id"]
    good = tree_state(root)
    for i, delay in enumerate([0, 0.001, 0.003, 0.006, 0.012]):
        (root / f"bad{i}").write_text("bad")
        bad = tree_state(root)
        t = _in_thread(d, "POST", f"/v1/checkpoints/{cp}/restore", json={})
        time.sleep(delay)
        d.kill9()
        t.join(5)
        d.start()
        now = tree_state(root)
        assert now in (good, bad), f"mixed state after kill at {delay}s"
        assert [c["checkpoint_id"] for c in d.list()] == [cp]
        if now == bad:
            os.unlink(root / f"bad{i}")
            d.restore(cp)
        assert _temp_files(d.state_dir) == []  # .live.json.tmp.* of the killed restore too


def test_kill9_during_create_and_delete(daemon_factory):
    d = overlay_daemon(daemon_factory)
    root = d.roots[0]
    acked = [d.create("first")["checkpoint_id"]]
    for i, delay in enumerate([0, 0.002, 0.01]):
        (root / f"f{i}").write_bytes(os.urandom(100_000))
        t = _in_thread(d, "POST", "/v1/checkpoints", json={"name": f"c{i}"})
        time.sleep(delay)
        d.kill9()
        t.join(5)
        d.start()
        ids = [c["checkpoint_id"] for c in d.list()]
        assert set(acked) <= set(ids)
        acked = ids  # a create that finished before the kill may be there
    victim = acked[0]
    t = _in_thread(d, "DELETE", f"/v1/checkpoints/{victim}")
    d.kill9()
    t.join(5)
    d.start()
    ids = [c["checkpoint_id"] for c in d.list()]
    assert set(ids) <= set(acked)
    for cid in ids:  # every listed checkpoint still restores
        assert d.restore(cid)["ok"] is True
    layers = list((d.state_dir / "overlay" / "r").glob("*/l/*"))
    assert not [p for p in layers if p.name.startswith(".tmp")]


# --- Directory renames (redirect_dir=on): a managed root behaves like a plain
# directory. Every operation runs on the root and on a plain copy (the mirror);
# the two trees must stay equal, and each checkpoint restores its tree.

# test_environments.py runs this file under gVisor too, where a plain
# directory is one of gVisor's overlay (runsc's rootfs). Its copy-up is not
# the kernel's: a renamed base directory is copied whole, which splits hard
# links with names outside it, and a directory copied up loses its setgid bit
# (docs/environments.md). There the mirror is such an overlay too.
IN_GVISOR = os.environ.get("CKPTD_TEST_ENV") == "gvisor"


def _mirror(root, mirror):
    lower = mirror.parent / (mirror.name + "-lower") if IN_GVISOR else mirror
    lower.mkdir(exist_ok=True)
    subprocess.run(["cp", "-a", f"{root}/.", str(lower)], check=True)
    if IN_GVISOR:
        for d in ("u", "w"):
            (mirror.parent / (mirror.name + "-" + d)).mkdir()
        subprocess.run(["mount", "-t", "overlay", "overlay", "-o",
                        f"lowerdir={lower},upperdir={mirror}-u,workdir={mirror}-w", str(mirror)], check=True)


def _both(root, mirror, op):
    op(root)
    op(mirror)
    assert_same_tree(tree_state(mirror, mtimes=False), tree_state(root, mtimes=False))


def _rename_ops():
    """A sequence of directory renames: base dirs, dirs living in layers after a
    restore, across parents, over an empty directory, and files changed inside
    renamed dirs (copy-ups below a redirect)."""
    def g0(r):
        os.rename(r / "dir", r / "d0")                      # a base dir
        (r / "d0/sub/deeper/note").write_text("changed in d0\n")
    def g1(r):
        os.rename(r / "d0", r / "d1")                       # the same dir, now in a layer
        (r / "d1/new.txt").write_text("new in d1\n")
    def g2(r):
        os.rename(r / "d1/sub", r / "setgid-dir/s2")        # across parents, out of a renamed dir
        os.unlink(r / "d1/data.bin")
    def g3(r):
        os.rename(r / "setgid-dir/s2", r / "empty-dir")     # over an empty directory
        (r / "empty-dir/deeper/more").write_text("more\n")
    def g4(r):
        os.mkdir(r / "fresh")
        os.rename(r / "empty-dir/deeper", r / "fresh/deepest")  # into a new (opaque-free) dir
        os.rename(r / "d1", r / "fresh/d5")
    return [g0, g1, g2, g3, g4]


def _generations(d, mirror):
    root = d.roots[0]
    cps = [(d.create("g-base")["checkpoint_id"], tree_state(root))]
    for i, op in enumerate(_rename_ops()):
        _both(root, mirror, op)
        cp = d.create(f"g{i}")["checkpoint_id"]
        cps.append((cp, tree_state(root)))
        assert d.restore(cp)["ok"] is True  # the next renames meet dirs in layers
        assert_same_tree(cps[-1][1], tree_state(root))
    return cps


def _restore_each(d, cps):
    root = d.roots[0]
    for cp, state in list(reversed(cps)) + cps[1::2]:
        assert d.restore(cp)["ok"] is True
        assert_same_tree(state, tree_state(root))


def test_rename_dirs_through_generations(daemon_factory, tmp_path):
    d = overlay_daemon(daemon_factory)
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    _mirror(d.roots[0], mirror)
    cps = _generations(d, mirror)
    _restore_each(d, cps)
    # a renamed dir of a restored checkpoint renames again, and checkpoints
    d.restore(cps[3][0])
    os.rename(d.roots[0] / "d1", d.roots[0] / "again")
    state = tree_state(d.roots[0])
    cp = d.create("again")["checkpoint_id"]
    d.restore(cps[0][0])
    d.restore(cp)
    assert_same_tree(state, tree_state(d.roots[0]))


def test_rename_dirs_survive_flattening(daemon_factory, tmp_path):
    d = overlay_daemon(daemon_factory, config={"flatten_depth": 2})
    mirror = tmp_path / "mirror"
    mirror.mkdir()
    _mirror(d.roots[0], mirror)
    cps = _generations(d, mirror)
    chains = d.state_dir / "overlay" / "c"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # maintenance flattens in the background
        depths = [len(next(iter(json.loads(p.read_text()).values()))) for p in chains.glob("*.json")]
        if max(depths) <= 2 and d.health()["overlay_roots"][0]["layers"] <= 2:
            break
        time.sleep(0.1)
    assert max(depths) <= 2, depths
    _restore_each(d, cps)
    d.stop()
    unmount_all(d.base)  # remounted from the flattened chain after a "reboot"
    d.start()
    _restore_each(d, cps)


def _git(root, *args):
    return subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args],
                          cwd=root, capture_output=True, text=True)


def test_git_mv_and_python_rename(daemon_factory):
    d = daemon_factory(backend="overlay", start=False)
    root = d.roots[0]
    (root / "pkg/sub").mkdir(parents=True)
    (root / "pkg/__init__.py").write_text("")
    (root / "pkg/sub/mod.py").write_text("X = 1\n")
    (root / "data/deep").mkdir(parents=True)
    (root / "data/deep/rows.csv").write_text("a,b\n")
    assert _git(root, "init", "-q").returncode == 0
    assert _git(root, "add", "-A").returncode == 0
    assert _git(root, "commit", "-qm", "one").returncode == 0
    d.start()
    first = d.create("first")["checkpoint_id"]
    r = _git(root, "mv", "pkg", "pkg2")  # a base dir: EXDEV with redirect_dir=off
    assert r.returncode == 0, r.stderr
    os.rename(root / "data/deep", root / "data/deeper")  # Python: OSError 18 with redirect_dir=off
    assert (root / "data/deeper/rows.csv").read_text() == "a,b\n"
    assert _git(root, "add", "-A").returncode == 0
    assert _git(root, "commit", "-qm", "mv").returncode == 0
    moved = tree_state(root)
    second = d.create("second")["checkpoint_id"]
    d.restore(first)
    assert (root / "pkg/sub/mod.py").exists() and not (root / "pkg2").exists()
    assert _git(root, "status", "--porcelain").stdout == ""
    r = _git(root, "mv", "pkg", "lib")  # after a restore the dir lives in a layer
    assert r.returncode == 0, r.stderr
    d.restore(second)
    assert_same_tree(moved, tree_state(root))
    assert _git(root, "status", "--porcelain").stdout == ""
    assert _git(root, "log", "--format=%s").stdout.split() == ["mv", "one"]
    assert _git(root, "fsck", "--strict").returncode == 0


def test_base_bind_is_private(daemon_factory, tmp_path):
    """Mounts on or below the root (the overlay itself included) must not
    propagate onto base, the read-only bind of the root's original contents."""
    d = daemon_factory(backend="overlay", start=False)
    make_full_tree(d.roots[0])
    # as on a systemd host, where / is a shared mount
    subprocess.run(["mount", "--bind", "--make-shared", str(d.base), str(d.base)], check=True)
    subprocess.run(["mount", "--make-shared", str(d.base)], check=True)
    d.start()
    base = next((d.state_dir / "overlay" / "r").glob("*/base"))
    cp = d.create("one")["checkpoint_id"]
    d.restore(cp)
    (d.roots[0] / "dir" / "mnt").mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(d.roots[0] / "dir" / "mnt")], check=True)
    try:
        with open("/proc/self/mountinfo") as f:
            fields = [line.split() for line in f]
        on_base = [x for x in fields if x[4] == str(base) or x[4].startswith(str(base) + "/")]
        assert len(on_base) == 1, on_base  # the bind alone
        assert "shared:" not in " ".join(on_base[0][6:on_base[0].index("-")])
        assert not (base / "dir" / "mnt").exists()
    finally:
        subprocess.run(["umount", "-l", str(d.roots[0] / "dir" / "mnt")])


TEMP_NAME = re.compile(r"^\..+\.tmp(\.[0-9a-f]{8})?$|^\.tmp-|^\.probe-")


def _temp_files(state_dir):
    """Temp files of ckptd's own writes (not the users' files in layers and uppers)."""
    out = []
    for dirpath, dirnames, filenames in os.walk(state_dir):
        rel = os.path.relpath(dirpath, state_dir).split(os.sep)
        if len(rel) >= 4 and rel[:2] == ["overlay", "r"] and rel[3] in ("l", "u", "w", "base"):
            dirnames[:] = []
            continue
        out += [os.path.join(dirpath, n) for n in filenames + dirnames if TEMP_NAME.match(n)]
    return sorted(out)


def test_start_removes_temp_files(daemon_factory):
    d = overlay_daemon(daemon_factory)
    cp = d.create("one")["checkpoint_id"]
    d.kill9()
    rdir = next((d.state_dir / "overlay" / "r").glob("*/live.json")).parent
    planted = [d.state_dir / ".ckptd.json.tmp.0badcafe",
               rdir / ".live.json.tmp.1234abcd",
               rdir / "idx" / ".index.tmp",
               d.state_dir / "overlay" / "c" / f".{cp}.json.tmp.00000000",
               d.state_dir / "catalog" / f".{cp}.json.tmp.deadbeef"]
    for p in planted:
        p.write_text("{torn")
    probe = d.state_dir / "overlay" / ".probe-0a1b2c3d"
    for sub in "luwm":
        (probe / sub).mkdir(parents=True)
    keep = rdir / "notes.tmp.txt"  # not a temp file of ours: stays
    keep.write_text("x")
    d.start()
    assert _temp_files(d.state_dir) == []
    assert keep.exists()
    assert [c["checkpoint_id"] for c in d.list()] == [cp]
    assert d.restore(cp)["ok"] is True


def _fill(path, chunk=1 << 16):
    """Write into path until the filesystem is full; the bytes written."""
    n = 0
    with open(path, "wb") as f:
        try:
            while True:
                f.write(os.urandom(chunk))
                f.flush()
                n += chunk
        except OSError as e:
            assert e.errno == 28, e
    return n


def test_out_of_space_fails_whole(daemon_factory):
    """The state dir on a small tmpfs: the uppers and layers live there, so a
    create that does not fit fails with 507 and leaves no half checkpoint, a
    restore that cannot record its intent fails and changes nothing, and both
    work again once space is freed."""
    d = daemon_factory(backend="overlay", start=False)
    d.state_dir.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(d.state_dir)], check=True)
    d.start()
    root = d.roots[0]
    (root / "a").write_bytes(os.urandom(3 << 20))
    ok = d.create("fits")
    (root / "b").write_bytes(os.urandom(3 << 19))  # fits in the upper, not twice
    live = tree_state(root)
    res = d.request("POST", "/v1/checkpoints", json={"name": "too-big"})
    assert res.status_code == 507, res.text
    assert res.json()["code"] == "insufficient_storage"
    assert tree_state(root) == live
    assert [c["name"] for c in d.list()] == ["fits"]
    assert [p.name for p in (d.state_dir / "overlay" / "c").iterdir()] == [ok["checkpoint_id"] + ".json"]
    layers = list((d.state_dir / "overlay" / "r").glob("*/l/*"))
    assert len(layers) == 1 and not layers[0].name.startswith(".tmp"), layers
    # a full disk: the restore cannot record its intent, so it does nothing
    _fill(root / "filler")
    full = tree_state(root)
    res = d.request("POST", f"/v1/checkpoints/{ok['checkpoint_id']}/restore", json={})
    assert res.status_code == 507, res.text
    assert tree_state(root) == full
    os.unlink(root / "filler")
    os.unlink(root / "b")  # space freed: both work again
    assert d.create("after")["size_bytes"] >= 0
    assert d.restore(ok["checkpoint_id"])["ok"] is True
    assert not (root / "b").exists() and (root / "a").stat().st_size == 3 << 20


@pytest.mark.parametrize("track", ["always", "auto"])
def test_sqlite_in_wal_mode_open_across_creates(daemon_factory, track):
    """SQLite in WAL mode keeps its -shm file mapped shared and writable and
    writes it through the mapping, often into pages already dirty (no new
    ctime): with its connection open across creates, each checkpoint must
    still hold the bytes SQLite had written. Tracked creates ("always") and
    untracked ones ("auto": this root is below the tracked size).
    The connection is closed before the restores; SQLite then opens each
    restored database and finds the rows of its checkpoint."""
    import sqlite3
    d = daemon_factory(backend="overlay", config={"track_changes": track})
    root = d.roots[0]
    db = sqlite3.connect(root / "data.db", isolation_level=None)
    db.execute("PRAGMA journal_mode=WAL")
    db.execute("PRAGMA wal_autocheckpoint=0")  # the WAL and -shm keep growing
    db.execute("CREATE TABLE t (k INTEGER PRIMARY KEY, v TEXT)")
    acked = []
    for step in range(6):
        for i in range(50):
            db.execute("INSERT INTO t (v) VALUES (?)", (f"step {step} row {i}",))
        if step % 2:
            db.execute("UPDATE t SET v = v || '!' WHERE k % 7 = ?", (step,))
        rows = db.execute("SELECT count(*), sum(length(v)) FROM t").fetchone()
        acked.append((d.create(f"s{step}")["checkpoint_id"], tree_state(root), rows))
    db.close()
    for cid, want, rows in acked:
        assert d.restore(cid)["ok"] is True
        assert_same_tree(want, tree_state(root))
        check = sqlite3.connect(root / "data.db")
        assert check.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert check.execute("SELECT count(*), sum(length(v)) FROM t").fetchone() == rows
        check.close()


def test_upper_index_outlives_a_restart(daemon_factory):
    """The upper's index (idx/index) is written after each full create and
    read at the next start: the first create after a restart links the
    files unchanged since the last one instead of copying them. (It was
    written to a temp path in a directory that does not exist, so every
    restart lost it.)"""
    d = daemon_factory(backend="overlay")
    root = d.roots[0]
    (root / "big.bin").write_bytes(os.urandom(1 << 20))
    d.create("one")
    rdir = next((d.state_dir / "overlay/r").iterdir())
    assert (rdir / "idx/index").is_file(), sorted(p.name for p in (rdir / "idx").iterdir())
    before = {p.parent.name for p in (rdir / "l").glob("*/big.bin")}
    d.stop()
    d.start()
    (root / "small.txt").write_text("after the restart\n")
    d.create("two")
    layers = {p.parent.name: p.stat() for p in (rdir / "l").glob("*/big.bin")}
    new = [n for n in layers if n not in before]
    assert len(before) == 1 and len(new) == 1, (before, layers)
    assert layers[new[0]].st_ino == layers[before.pop()].st_ino  # linked, not copied


def test_upper_index_is_not_trusted_after_a_kill(daemon_factory):
    """A start after a kill (or a power cut) reads no upper's index: after
    a power cut a file rewritten and fdatasynced has new data and its old
    ctime, so the index would take it as unchanged. The first create after
    it copies what it would have linked; a clean stop and start trust the
    index again (overlay_running.c)."""
    d = daemon_factory(backend="overlay")
    root = d.roots[0]
    (root / "big.bin").write_bytes(os.urandom(1 << 20))
    d.create("one")
    rdir = next((d.state_dir / "overlay/r").iterdir())
    assert (d.state_dir / "overlay/running").exists()
    d.kill9()
    d.start()
    assert "the last run did not end cleanly" in d.log()
    assert not (rdir / "idx/index").exists()
    inos = {p.stat().st_ino for p in (rdir / "l").glob("*/big.bin")}
    (root / "small.txt").write_text("after the kill\n")
    d.create("two")
    after = {p.stat().st_ino for p in (rdir / "l").glob("*/big.bin")}
    assert len(inos) == 1 and len(after) == 2, (inos, after)  # copied, not linked
    d.stop()
    assert not (d.state_dir / "overlay/running").exists()
    d.start()
    (root / "third.txt").write_text("after a clean stop\n")
    d.create("three")
    assert len({p.stat().st_ino for p in (rdir / "l").glob("*/big.bin")}) == 2  # linked again


def traced_restore(d, cid, out):
    """d.restore(cid) while strace follows every thread of ckptd, writing the
    renames, unlinks and syncs it makes to out; the report."""
    pid = d.proc.pid
    threads = len(os.listdir(f"/proc/{pid}/task"))
    st = subprocess.Popen(["strace", "-f", "-p", str(pid), "-o", str(out), "-e",
                           "trace=rename,renameat,renameat2,unlink,unlinkat,fsync,fdatasync,syncfs"],
                          stderr=subprocess.PIPE, text=True)
    attached = 0
    while attached < threads:  # every thread, before the restore begins
        line = st.stderr.readline()
        assert line, "strace ended before attaching"
        if "attached with" in line:  # "Process N attached with K threads": all at once
            break
        attached += "attached" in line
    try:
        return d.restore(cid)
    finally:
        st.terminate()
        st.wait(10)


@pytest.mark.parametrize("n_roots", [1, 2])
def test_restore_intent_only_with_several_roots(daemon_factory, tmp_path, n_roots):
    """restore.json orders the live.json renames of several roots, so that a
    kill between two leaves no mix. One root's live.json rename is atomic by
    itself: there it is not written, and saves the restore three syncs."""
    d = daemon_factory(backend="overlay", n_roots=n_roots, start=False)
    for k, r in enumerate(d.roots):
        (r / "f").write_text(f"a{k}")
    d.start()
    cp = d.create("a")["checkpoint_id"]
    for k, r in enumerate(d.roots):
        (r / "f").write_text(f"b{k}")
    rep = traced_restore(d, cp, tmp_path / "trace")
    assert rep["ok"] is True
    assert [(r / "f").read_text() for r in d.roots] == [f"a{k}" for k in range(n_roots)]
    trace = (tmp_path / "trace").read_text()
    live = len(re.findall(r'rename\w*\(.*"live\.json"', trace))
    assert live == n_roots, trace
    intent = re.findall(r'(?:rename|unlink)\w*\(.*"restore\.json"', trace)
    assert len(intent) == (0 if n_roots == 1 else 2), trace  # written, then removed
