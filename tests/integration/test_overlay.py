"""The overlay backend through the real daemon with real overlay mounts:
restore after deletes/replaced dirs/renames, retry loop and multi-step
flows, adopt after restart and after a "reboot", the busy mount, and kill -9
in the middle of create, restore and delete."""
import os
import shutil
import subprocess
import threading
import time

from conftest import make_full_tree, unmount_all
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
    # write on the layer of cp2 (a lower dir under the mount, an image of the
    # whole upper: cp2's chain is that one layer over the base)
    rdir = next((d.state_dir / "overlay" / "r").iterdir())
    layer = next(p for p in (rdir / "l").iterdir() if (p / "second.txt").exists())
    (layer / "file.txt").write_text("changed behind ckptd's back\n")
    os.unlink(layer / "gone.txt")
    (layer / "planted").write_text("x")
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
    holder = subprocess.Popen(["sleep", "60"], cwd=root)
    try:
        time.sleep(0.2)
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
