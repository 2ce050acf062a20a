"""POST /v1/roots/release (issue 11 item 3) on real overlay mounts and on the
tar backend: the root becomes a plain directory holding exactly what it
showed (contents, hard links, xattrs, renamed directories), the next start
adopts it again, open files refuse it, and kill -9 at any point leaves the
managed root or the released directory, complete."""
import json
import os
import random
import subprocess
import threading
import time

import pytest

from conftest import CKPT, assert_same_tree, make_full_tree, tree_state


def is_mounted(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


def daemon(daemon_factory, backend, **kw):
    d = daemon_factory(backend=backend, start=False, **kw)
    make_full_tree(d.roots[0])
    d.start()
    return d


def change(root):
    """Changes of every kind over the adopted base: a base dir renamed (a
    redirect on overlay), a file deleted, a new hard link, an xattr."""
    os.rename(root / "dir", root / "dir-renamed")
    os.unlink(root / "secret")
    (root / "new.txt").write_text("new\n")
    os.link(root / "new.txt", root / "new-link.txt")
    os.setxattr(root / "new.txt", "user.tag", b"written after adoption")
    (root / "dir-renamed/sub/deeper/note").write_text("changed below a renamed dir\n")


def release(d, expect=200, **body):
    r = d.request("POST", "/v1/roots/release", json=body)
    assert r.status_code == expect, r.text
    return r.json()


@pytest.mark.parametrize("backend", ["overlay", "tar"])
def test_release_leaves_the_live_contents(daemon_factory, backend):
    d = daemon(daemon_factory, backend)
    root = d.roots[0]
    change(root)
    want = tree_state(root)
    if backend == "overlay":
        assert is_mounted(root)
    out = release(d, drop_checkpoints=True)
    assert out["released"] == [str(root)]
    assert not is_mounted(root)
    assert_same_tree(want, tree_state(root))
    assert os.getxattr(root / "new.txt", "user.tag") == b"written after adoption"
    a, b = os.stat(root / "new.txt"), os.stat(root / "new-link.txt")
    assert (a.st_ino, a.st_nlink) == (b.st_ino, 2)
    assert not [n for n in os.listdir(root.parent) if n.endswith(".ckpt-release")]
    h = d.health()
    assert h["released_roots"] == [str(root)]
    # Not managed any more: the operations say so instead of half working.
    r = d.request("POST", "/v1/checkpoints", json={"name": "after"})
    assert r.status_code == 409 and r.json()["code"] == "root_released", r.text
    # Twice: a clear 409, and nothing changes.
    r = d.request("POST", "/v1/roots/release", json={"root": str(root)})
    assert r.status_code == 409 and r.json()["code"] == "root_released", r.text
    assert_same_tree(want, tree_state(root))
    # Written while unmanaged, kept; the next start adopts it again.
    (root / "while-unmanaged").write_text("x\n")
    want = tree_state(root)
    d.stop()
    d.start()
    assert_same_tree(want, tree_state(root))
    if backend == "overlay":
        assert is_mounted(root)
    cp = d.create("readopted")
    (root / "later").write_text("later\n")
    d.restore(cp["checkpoint_id"])
    assert_same_tree(want, tree_state(root))


def test_release_drops_checkpoints_when_asked(daemon_factory):
    d = daemon(daemon_factory, "overlay")
    root = d.roots[0]
    d.create("one")
    want = tree_state(root)
    out = release(d, drop_checkpoints=True)
    assert len(out["dropped_checkpoints"]) == 1 and out["checkpoints_kept"] is False
    assert d.list() == []
    assert_same_tree(want, tree_state(root))
    # nothing needed the old base: it is not kept
    assert not _kept_base_layers(d)


def keep_across_release(d):
    """A checkpoint, changes, a release that keeps it (no restore until the
    next start), a restart, and the checkpoint restored exactly."""
    root = d.roots[0]
    old = tree_state(root)
    cp = d.create("old")["checkpoint_id"]
    change(root)
    want = tree_state(root)
    out = release(d)
    assert out["checkpoints_kept"] is True and out["dropped_checkpoints"] == []
    assert_same_tree(want, tree_state(root))
    assert "ckpt-release" not in " ".join(os.listdir(root.parent))
    r = d.request("POST", f"/v1/checkpoints/{cp}/restore", json={})
    assert r.status_code == 409 and r.json()["code"] == "root_released", r.text
    d.stop()
    d.start()
    assert_same_tree(want, tree_state(root))
    d.restore(cp)
    assert_same_tree(old, tree_state(root))


@pytest.mark.parametrize("backend", ["overlay", "tar"])
def test_release_keeps_checkpoints_restorable(daemon_factory, backend):
    d = daemon(daemon_factory, backend)
    keep_across_release(d)
    if backend == "overlay":
        assert len(_kept_base_layers(d)) == 1


def _kept_base_layers(d):
    return sorted(p.name for p in (d.state_dir / "overlay/r").glob("*/l/B*"))


def _diff(d, cid, **params):
    r = d.request("GET", f"/v1/checkpoints/{cid}/diff", params=params)
    assert r.status_code == 200, r.text
    root = str(d.roots[0])
    return {c["path"][len(root) + 1:]: c["change"] for c in r.json()["changes"]}


def _chains(d):
    return [next(iter(json.loads(p.read_text()).values()))
            for p in (d.state_dir / "overlay/c").glob("*.json")]


def test_second_release_keeps_layers_when_no_checkpoint_needs_the_base(daemon_factory):
    """Every checkpoint lies on a base kept by an earlier release: the next
    release keeps no base, but keeps their layers."""
    d = daemon(daemon_factory, "overlay")
    root = d.roots[0]
    change(root)
    state = tree_state(root)
    cp = d.create("one")["checkpoint_id"]
    release(d)
    d.stop()
    d.start()
    d.restore(cp)
    (root / "later").write_text("after the restore\n")
    release(d)
    assert len(_kept_base_layers(d)) == 1
    d.stop()
    d.start()
    d.restore(cp)
    assert_same_tree(state, tree_state(root))


def test_overlay_checkpoints_across_two_releases(daemon_factory):
    """Checkpoints from before a release lie on the base it replaced, kept as
    a base layer: after the next start they restore exactly, also when the
    directory gained names while unmanaged, and again after a second release
    (checkpoints of both generations), a restart, flattening, an export and
    an import, and a diff across the two bases."""
    d = daemon(daemon_factory, "overlay", config={"flatten_depth": 2})
    root = d.roots[0]
    (root / "gone-later").write_text("in the first base only\n")
    first = tree_state(root)
    cp0 = d.create("first-base")["checkpoint_id"]
    change(root)
    cp1 = d.create("changed")["checkpoint_id"]
    changed = tree_state(root)
    (root / "live-at-release").write_text("live\n")
    os.unlink(root / "gone-later")
    released = tree_state(root)
    out = release(d)
    assert out["checkpoints_kept"] is True
    assert_same_tree(released, tree_state(root))
    kept = _kept_base_layers(d)
    assert len(kept) == 1, kept
    # written while unmanaged: part of the next base, in no old checkpoint
    (root / "while-unmanaged").write_text("x\n")
    (root / "file.txt").write_text("rewritten while unmanaged\n")
    second = tree_state(root)
    d.stop()
    d.start()
    assert is_mounted(root)
    assert_same_tree(second, tree_state(root))
    cp2 = d.create("second-base")["checkpoint_id"]
    d.restore(cp0)
    assert_same_tree(first, tree_state(root))
    assert not (root / "while-unmanaged").exists()
    # the restored chain lies on the kept base: new checkpoints too
    (root / "after-old").write_text("on the old base\n")
    on_old = tree_state(root)
    cp3 = d.create("on-old-base")["checkpoint_id"]
    d.restore(cp2)
    assert_same_tree(second, tree_state(root))
    # a diff across the two bases names what only the new base holds
    delta = _diff(d, cp0, against=cp2)
    assert delta.get("while-unmanaged") == "added", delta
    assert delta.get("live-at-release") == "added", delta
    assert delta.get("gone-later") == "deleted", delta
    assert delta.get("file.txt") == "modified", delta
    # deeper chains on the kept base flatten above it (flatten_depth 2)
    d.restore(cp3)
    for i in range(4):
        (root / f"gen{i}").write_text(str(i))
        cp4 = d.create(f"gen{i}")["checkpoint_id"]
    deepest = tree_state(root)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and max(map(len, _chains(d))) > 2:
        d.delete(d.create("kick")["checkpoint_id"])  # each delete kicks maintenance
        time.sleep(0.2)
    assert max(map(len, _chains(d))) <= 2, _chains(d)
    for chain in _chains(d):
        assert kept[0] not in chain[:-1], chain
    # a second release: the checkpoints on the second base get their own
    d.restore(cp2)
    (root / "second-live").write_text("y\n")
    release(d)
    kept2 = _kept_base_layers(d)
    assert len(kept2) == 2, kept2
    (root / "third-only").write_text("z\n")
    d.stop()
    d.start()
    for cid, state in ((cp0, first), (cp1, changed), (cp2, second), (cp3, on_old), (cp4, deepest)):
        d.restore(cid)
        assert_same_tree(state, tree_state(root))
    # export of a checkpoint on a kept base, imported again: the same tree
    r = d.request("GET", f"/v1/checkpoints/{cp0}/export", stream=True)
    assert r.status_code == 200, r.text
    blob = b"".join(r.iter_content(1 << 16))
    r = d.request("POST", "/v1/checkpoints/import", data=blob, headers={"Content-Type": "application/zstd"})
    assert r.status_code == 201, r.text
    d.restore(cp2)
    d.restore(r.json()["checkpoint_id"])
    assert_same_tree(first, tree_state(root))
    # deleting every checkpoint lets GC take the kept bases
    d.restore(cp2)
    for c in d.list():
        d.delete(c["checkpoint_id"])
    d.stop()
    d.start()
    assert len(_kept_base_layers(d)) <= 1  # the live chain (cp2's) still lies on one
    d.create("fresh")
    d.stop()
    d.start()


def test_overlay_release_refused_while_a_file_is_open_and_with_a_fork(daemon_factory, tmp_path):
    d = daemon(daemon_factory, "overlay")
    root = d.roots[0]
    want = tree_state(root)
    holder = subprocess.Popen(["sleep", "60"], cwd=root)
    try:
        r = d.request("POST", "/v1/roots/release", json={})
        assert r.status_code == 409 and r.json()["code"] == "root_busy", r.text
        assert str(holder.pid) in r.json()["detail"]
        assert is_mounted(root)
        assert_same_tree(want, tree_state(root))
    finally:
        holder.kill()
        holder.wait()
    cp = d.create("forked")
    fdir = tmp_path / "fork"
    fdir.mkdir()
    r = d.request("POST", f"/v1/checkpoints/{cp['checkpoint_id']}/fork", json={"path": str(fdir)})
    assert r.status_code == 201, r.text
    fid = r.json()["fork_id"]
    r = d.request("POST", "/v1/roots/release", json={"drop_checkpoints": True})
    assert r.status_code == 409 and r.json()["code"] == "forks_exist", r.text
    assert is_mounted(root) and len(d.list()) == 1
    assert d.request("DELETE", f"/v1/forks/{fid}").status_code == 204
    out = release(d, drop_checkpoints=True)
    assert out["released"] == [str(root)]
    assert_same_tree(want, tree_state(root))


def test_overlay_release_killed_at_any_point(daemon_factory):
    """SIGKILL during release at random delays: before the restart the path is
    our mount (release not reached the swap) or a plain directory; after the
    restart the root is managed and shows exactly the live contents. Every
    other round keeps a checkpoint: it restores exactly, on its own base."""
    d = daemon(daemon_factory, "overlay")
    root = d.roots[0]
    (root / "big").mkdir()
    for i in range(300):
        (root / "big" / f"f{i}").write_bytes(os.urandom(4096))
    change(root)
    want = tree_state(root)
    t0 = time.monotonic()
    release(d, drop_checkpoints=True)
    full = time.monotonic() - t0
    d.stop()
    d.start()
    assert_same_tree(want, tree_state(root))
    rng = random.Random(11)
    outcomes = set()
    saved = []
    for i in range(12):
        cp = None
        if i % 2:  # a checkpoint the release keeps (its base becomes a layer)
            (root / "marker").write_text(f"checkpoint of round {i}\n")
            cp = d.create(f"round{i}")["checkpoint_id"]
            saved.append((cp, tree_state(root)))
            os.unlink(root / "marker")
        (root / f"round{i}").write_text(str(i))
        want = tree_state(root)
        def go():
            try:
                d.request("POST", "/v1/roots/release", json={})
            except Exception:  # killed while answering
                pass
        th = threading.Thread(target=go, daemon=True)
        th.start()
        time.sleep(rng.uniform(0, full * 1.2))
        d.kill9()
        th.join(10)
        # still mounted (undone at start), or a plain directory: released
        # (finished at start), or killed between the unmount and the swap
        # (the path shows the base until the next start undoes it)
        outcomes.add("mounted" if is_mounted(root) else
                     "released" if tree_state(root) == want else "between")
        d.start()
        assert is_mounted(root)
        assert_same_tree(want, tree_state(root))
        assert not [n for n in os.listdir(root.parent) if n.endswith(".ckpt-release")]
        assert not [n for n in os.listdir(d.state_dir / "overlay/r") if n.startswith(".released-")]
        if cp:  # on its own base, not on what the release left
            d.restore(cp)
            assert_same_tree(saved[-1][1], tree_state(root))
    print("kill outcomes:", sorted(outcomes))
    assert "mounted" in outcomes
    for cp, state in saved:
        d.restore(cp)
        assert_same_tree(state, tree_state(root))


def test_ckpt_release_command(daemon_factory):
    d = daemon(daemon_factory, "overlay")
    root = d.roots[0]
    d.create("one")
    want = tree_state(root)
    ckpt = [CKPT, "--url", d.url]
    r = subprocess.run(ckpt + ["release", "a", "b"], capture_output=True, text=True)
    assert r.returncode == 2 and 'unexpected argument "b"' in r.stderr
    r = subprocess.run(ckpt + ["release", str(root), "--drop-checkpoints"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"Released {root}" in r.stdout and "Dropped 1 checkpoint" in r.stdout
    assert not is_mounted(root)
    assert_same_tree(want, tree_state(root))
    r = subprocess.run(ckpt + ["release"], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout == ""  # nothing left to release
    r = subprocess.run(ckpt + ["status"], capture_output=True, text=True)
    assert f"warning: {root} was released" in r.stdout, r.stdout
    d.stop()
    d.start()
    d.create("two")
    r = subprocess.run(ckpt + ["release", str(root)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert f"Released {root}" in r.stdout and "Checkpoints kept" in r.stdout, r.stdout
    assert_same_tree(want, tree_state(root))


def test_release_keeps_the_base_by_copy_across_mounts(daemon_factory):
    """The state dir on another filesystem than the root (a tmpfs here): the
    old base cannot be renamed into the layer store, so it is copied, and the
    checkpoints on it restore exactly after the next start."""
    d = daemon_factory(backend="overlay", start=False)
    d.state_dir.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256m", "tmpfs", str(d.state_dir)], check=True)
    try:
        make_full_tree(d.roots[0])
        d.start()
        keep_across_release(d)
        assert len(_kept_base_layers(d)) == 1
    finally:
        d.stop()
        subprocess.run(["bash", "-c", f"awk '$5 ~ \"^{d.state_dir}/\" {{print $5}}' /proc/self/mountinfo | tac | "
                        "xargs -r -n1 umount -l"], check=False)
        subprocess.run(["umount", "-l", str(d.state_dir)], check=False)
