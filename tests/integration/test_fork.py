"""Forks through the real daemon on both backends: a writable, independent
view of a checkpoint mounted (overlay) or extracted (tar) at an empty dir
outside the roots. Independence, many forks, delete, restart survival, the
409 on deleting a forked checkpoint, and bad dirs."""
import os
import time

import pytest

from conftest import make_full_tree, mounts_under, tree_state

BACKENDS = ["overlay", "tar"]


def place(d, name):
    """An empty dir beside the daemon's roots: its cleanup unmounts it."""
    p = d.base / "forks-here" / name
    p.mkdir(parents=True)
    return p


def start(daemon_factory, backend, **kw):
    d = daemon_factory(backend=backend, start=False, **kw)
    make_full_tree(d.roots[0])
    d.start()
    return d


def fork(d, cid, path, expect=201):
    r = d.request("POST", f"/v1/checkpoints/{cid}/fork", json={"path": str(path)})
    assert r.status_code == expect, r.text
    return r.json()


def forks(d):
    r = d.request("GET", "/v1/forks")
    assert r.status_code == 200, r.text
    return r.json()["forks"]


def is_overlay_mount(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) and " - overlay " in line for line in f)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fork_is_an_independent_copy(daemon_factory, tmp_path, backend):
    d = start(daemon_factory, backend)
    root = d.roots[0]
    cp = d.create("base")
    at_cp = tree_state(root)
    (root / "after-checkpoint").write_text("live only\n")
    a, b = place(d, "fa"), place(d, "fb")
    fa = fork(d, cp["checkpoint_id"], a)
    fb = fork(d, cp["checkpoint_id"], b)
    assert fa["checkpoint_id"] == cp["checkpoint_id"] and fa["path"] == str(a)
    assert fa["fork_id"] != fb["fork_id"]
    if backend == "overlay":
        assert is_overlay_mount(a) and is_overlay_mount(b)
    # the forks show the checkpoint, not the live tree
    assert tree_state(a) == at_cp
    assert not (a / "after-checkpoint").exists()
    # writes in one fork reach neither the root nor the other fork
    (a / "file.txt").write_text("changed in a\n")
    (a / "new-in-a").write_text("a\n")
    os.unlink(a / "exec.sh")
    (b / "dir" / "new-in-b").write_text("b\n")
    assert (root / "file.txt").read_text() == "hello\n"
    assert (b / "file.txt").read_text() == "hello\n"
    assert not (root / "new-in-a").exists() and not (b / "new-in-a").exists()
    assert (root / "exec.sh").exists() and (b / "exec.sh").exists()
    assert not (a / "dir" / "new-in-b").exists()
    # and writes in the root reach no fork
    (root / "dir" / "sub" / "live-file").write_text("live\n")
    assert not (a / "dir" / "sub" / "live-file").exists()
    ids = {f["fork_id"] for f in forks(d)}
    assert ids == {fa["fork_id"], fb["fork_id"]}


@pytest.mark.parametrize("backend", BACKENDS)
def test_forked_checkpoint_cannot_be_deleted_and_delete_fork(daemon_factory, tmp_path, backend):
    d = start(daemon_factory, backend)
    cp = d.create("base")
    dirs = [place(d, f"f{i}") for i in range(5)]
    made = []
    for p in dirs:
        made.append(fork(d, cp["checkpoint_id"], p))
        (p / "mine").write_text(str(p))
    assert len(forks(d)) == 5
    r = d.request("DELETE", f"/v1/checkpoints/{cp['checkpoint_id']}")
    assert r.status_code == 409 and r.json()["code"] == "checkpoint_forked", r.text
    for f, p in zip(made, dirs):
        assert (p / "mine").read_text() == str(p)
        r = d.request("DELETE", f"/v1/forks/{f['fork_id']}")
        assert r.status_code == 204, r.text
        assert not mounts_under(p)
        assert p.is_dir() and os.listdir(p) == []
    assert forks(d) == []
    assert d.request("DELETE", f"/v1/forks/{made[0]['fork_id']}").status_code == 404
    d.delete(cp["checkpoint_id"])
    if backend == "overlay":  # the fork's upper dirs are gone from the state dir
        assert not any(os.listdir(f) for f in d.state_dir.glob("overlay/r/*/f"))


def test_expired_forked_checkpoint_is_kept(daemon_factory, tmp_path):
    d = daemon_factory(backend="overlay", start=False, config={"cleanup_interval_secs": 1})
    make_full_tree(d.roots[0])
    d.start()
    cp = d.create("short", ttl_secs=1)
    p = place(d, "f")
    f = fork(d, cp["checkpoint_id"], p)
    # a witness expiring after it: once the sweeper has removed the witness,
    # it has looked at the forked checkpoint too
    witness = d.create("witness", ttl_secs=1)["checkpoint_id"]
    deadline = time.monotonic() + 60
    while d.request("GET", f"/v1/checkpoints/{witness}").status_code != 404:
        assert time.monotonic() < deadline, "the sweeper never removed the expired witness"
        time.sleep(0.1)
    assert d.request("GET", f"/v1/checkpoints/{cp['checkpoint_id']}").status_code == 200
    assert (p / "file.txt").read_text() == "hello\n"
    assert d.request("DELETE", f"/v1/forks/{f['fork_id']}").status_code == 204


@pytest.mark.parametrize("backend", BACKENDS)
def test_fork_survives_restart(daemon_factory, tmp_path, backend):
    d = start(daemon_factory, backend, extra_args=("-v",))
    cp = d.create("base")
    p = place(d, "f")
    f = fork(d, cp["checkpoint_id"], p)
    (p / "written").write_text("before restart\n")
    d.kill9()
    if backend == "overlay":  # as after a reboot: the mount is gone, the record stays
        os.system(f"umount -l {p}")
        assert not is_overlay_mount(p)
    d.start()
    listed = forks(d)
    assert [x["fork_id"] for x in listed] == [f["fork_id"]]
    assert listed[0]["mounted"] is True
    if backend == "overlay":
        assert is_overlay_mount(p)
    assert (p / "written").read_text() == "before restart\n"
    assert (p / "file.txt").read_text() == "hello\n"
    # its layers were not collected: a create + delete runs GC
    other = d.create("other")["checkpoint_id"]
    runs = d.maintenance_runs()
    d.delete(other)
    d.wait_log("sweeper: maintenance done", runs + 1)
    assert (p / "dir" / "sub" / "deeper" / "note").read_text() == "deep\n"
    assert d.request("DELETE", f"/v1/checkpoints/{cp['checkpoint_id']}").status_code == 409


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_dirs_are_refused(daemon_factory, tmp_path, backend):
    d = start(daemon_factory, backend)
    cp = d.create("base")["checkpoint_id"]
    full = tmp_path / "full"
    full.mkdir()
    (full / "x").write_text("x")
    real = place(d, "real")
    link = tmp_path / "link"
    os.symlink(real, link)
    inside_root = d.roots[0] / "empty-dir"
    inside_state = d.state_dir / "somewhere"
    inside_state.mkdir()
    afile = tmp_path / "afile"
    afile.write_text("")
    cases = {
        inside_root: "managed root",
        inside_state: "state dir",
        full: "not empty",
        link: "symlink",
        link / ".": "symlink",
        tmp_path / "nonexistent": "does not exist",
        afile: "not a directory",
        "relative/dir": "absolute",
    }
    before = mounts_under("/")
    for path, why in cases.items():
        r = d.request("POST", f"/v1/checkpoints/{cp}/fork", json={"path": str(path)})
        assert r.status_code == 400, (path, r.text)
        assert why in r.json()["detail"], (path, r.text)
    assert d.request("POST", f"/v1/checkpoints/{cp}/fork", json={}).status_code == 400
    assert d.request("POST", "/v1/checkpoints/cp_000000000000000000000000/fork",
                     json={"path": str(real)}).status_code == 404
    assert mounts_under("/") == before
    assert forks(d) == []
    assert os.listdir(real) == []


def mount_at(path):
    """(fstype, upperdir or None) of the mount at path, or None."""
    for line in open("/proc/self/mountinfo"):
        pre, post = line.split(" - ")
        if pre.split()[4] == str(path):
            opts = dict(o.split("=", 1) for o in post.split()[2].split(",") if "=" in o)
            return post.split()[0], opts.get("upperdir")
    return None


def count_files(top):
    return sum(len(files) + len(dirs) for _, dirs, files in os.walk(top))


def test_overlay_fork_copies_nothing_whatever_the_size(daemon_factory, tmp_path):
    """A fork mounts the checkpoint's layers under an empty upper: its cost
    does not grow with the tree. Counted in entries written, not in time
    (the time is printed; make bench measures it)."""
    d = daemon_factory(backend="overlay", start=False)
    root = d.roots[0]
    for i in range(20):
        sub = root / f"d{i}"
        sub.mkdir()
        for j in range(200):
            (sub / f"f{j}").write_text("x" * 100)
    d.start()
    cp = d.create("big")["checkpoint_id"]
    before = count_files(d.state_dir)
    times, server = [], []
    for i in range(7):
        p = place(d, f"f{i}")
        t0 = time.monotonic()
        f = fork(d, cp, p)
        times.append((time.monotonic() - t0) * 1000)
        server.append(f["fork_ms"])
    # a handful of records and empty dirs per fork, against 4,020 entries in the tree
    grown = count_files(d.state_dir) - before
    assert grown <= 7 * 40, grown
    for i in range(7):  # each fork is a mount; an overlay whose upper starts empty
        m = mount_at(d.base / "forks-here" / f"f{i}")
        assert m is not None, i
        if m[1] is not None:  # gVisor's overlay names no upperdir in mountinfo
            assert count_files(m[1]) == 0, (i, m)
    assert (d.base / "forks-here" / "f0" / "d19" / "f199").read_text() == "x" * 100
    print(f"overlay fork of a 4000-file checkpoint: {min(times):.1f}..{max(times):.1f} ms round trip,"
          f" server {server} ms, {grown} state entries for 7 forks")


def test_cli_fork_commands(daemon_factory, tmp_path):
    import subprocess
    from conftest import CKPT
    d = start(daemon_factory, "overlay")
    cp = d.create("base")["checkpoint_id"]
    p = place(d, "f")
    env = dict(os.environ, CKPTD_URL=d.url)
    out = subprocess.run([CKPT, "fork", cp, str(p)], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert (p / "file.txt").read_text() == "hello\n"
    fid = forks(d)[0]["fork_id"]
    assert fid in out.stdout
    out = subprocess.run([CKPT, "forks"], env=env, capture_output=True, text=True)
    assert out.returncode == 0 and fid in out.stdout and str(p) in out.stdout, out
    out = subprocess.run([CKPT, "fork-delete", fid], env=env, capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert forks(d) == [] and not mounts_under(p)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fork_of_two_roots_goes_to_one_subdir_each(daemon_factory, backend):
    d = daemon_factory(backend=backend, n_roots=2, start=False)
    (d.roots[0] / "a").write_text("first root\n")
    (d.roots[1] / "b").write_text("second root\n")
    d.start()
    cp = d.create("two")["checkpoint_id"]
    p = place(d, "f")
    f = fork(d, cp, p)
    assert f["paths"] == [str(p / "root0"), str(p / "root1")]
    assert (p / "root0" / "a").read_text() == "first root\n"
    assert (p / "root1" / "b").read_text() == "second root\n"
    (p / "root1" / "b").write_text("forked\n")
    assert (d.roots[1] / "b").read_text() == "second root\n"
    changes = d.request("GET", f"/v1/checkpoints/{cp}/diff").json()["changes"]
    assert changes == []
    (d.roots[1] / "c").write_text("new\n")
    changes = d.request("GET", f"/v1/checkpoints/{cp}/diff").json()["changes"]
    assert [(c["path"], c["change"]) for c in changes] == [(str(d.roots[1] / "c"), "added")]
    assert d.request("DELETE", f"/v1/forks/{f['fork_id']}").status_code == 204
    assert os.listdir(p) == [] and not mounts_under(p)


def test_fork_layers_survive_flattening_and_gc(daemon_factory):
    """Flattening merges every checkpoint's chain into a new layer and GC then
    removes the old ones: not those a fork is mounted on, before or after a
    restart (whose recovery collects garbage before forks are remounted)."""
    import json
    d = daemon_factory(backend="overlay", start=False, extra_args=("-v",))
    make_full_tree(d.roots[0])
    d.start()
    root = d.roots[0]
    ids = []
    for i in range(5):
        (root / f"step{i}").write_text(f"{i}\n")
        cp = d.create(f"c{i}")["checkpoint_id"]
        ids.append(cp)
        d.restore(cp)
    p = place(d, "f")
    f = fork(d, cp, p)
    ovl = d.state_dir / "overlay"
    fork_layers = {(h, name) for h, chain in json.loads((ovl / "fk" / f"{f['fork_id']}.json").read_text()).items()
                   for name in chain}

    def held_by_others():
        held = set()
        for c in (ovl / "c").glob("*.json"):
            held |= {(h, n) for h, chain in json.loads(c.read_text()).items() for n in chain}
        for live in ovl.glob("r/*/live.json"):
            rec = json.loads(live.read_text())
            held |= {(live.parent.name, n) for n in (rec.get("chain") or []) + (rec.get("mounted") or [])}
        return held

    d.stop()  # chains of 5 layers, now flattened down to 2
    d.config = {"flatten_depth": 2}
    d.start()
    d.restore(ids[0])  # the live mount lets go of c4's layers
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not fork_layers - held_by_others():
        d.delete(d.create("kick")["checkpoint_id"])  # each delete kicks maintenance: flatten, then GC
        time.sleep(0.3)
    only_fork = fork_layers - held_by_others()
    assert only_fork, "flattening left every fork layer in some checkpoint's chain: nothing tested"
    gc = d.create("gc")["checkpoint_id"]
    runs = d.maintenance_runs()
    d.delete(gc)
    d.wait_log("sweeper: maintenance done", runs + 1)
    for h, name in only_fork:
        assert (ovl / "r" / h / "l" / name).is_dir(), f"GC removed layer {name} the fork uses"
    assert [(p / f"step{i}").read_text() for i in range(5)] == ["0\n", "1\n", "2\n", "3\n", "4\n"]
    d.kill9()
    os.system(f"umount -l {p}")
    d.start()  # its open collects garbage before it answers
    gc = d.create("gc-after-start")["checkpoint_id"]
    runs = d.maintenance_runs()
    d.delete(gc)  # and the maintenance a delete kicks
    d.wait_log("sweeper: maintenance done", runs + 1)
    for h, name in only_fork:
        assert (ovl / "r" / h / "l" / name).is_dir(), f"GC at start removed layer {name} the fork uses"
    assert is_overlay_mount(p)
    assert [(p / f"step{i}").read_text() for i in range(5)] == ["0\n", "1\n", "2\n", "3\n", "4\n"]
    assert (p / "dir" / "sub" / "deeper" / "note").read_text() == "deep\n"
