"""Very deep trees through every operation, on both backends. Build
systems, node_modules and test suites that probe PATH_MAX make them. A
path below a root may be up to PATH_MAX - 1 bytes (4095): one-letter
directories 2,040 levels deep. Deeper is refused with 409 path_too_long
and changes nothing. The daemon starts with a soft RLIMIT_NOFILE of 1024,
as systemd gives it; a walk holds a descriptor per level, so it raises
that to the hard limit. Trees are compared by a walk with dir_fd: their
absolute paths exceed PATH_MAX."""
import os
import stat
import subprocess

import pytest

from test_registry import pull, push, reg_config, registry  # noqa: F401 (fixture)

BACKENDS = ["tar", "overlay"]
PATH_MAX = 4096
LEAF = "leaf.txt"
# the deepest chain of one-letter directories whose leaf path fits
DEEPEST = (PATH_MAX - 1 - len(LEAF)) // 2
SOFT_1024 = ["prlimit", "--nofile=1024:", "--"]


def make_deep(root, depth, leaf=b"bottom\n", name="d"):
    """A chain of depth directories below root (kept where it exists), with
    LEAF at the bottom."""
    fd = os.open(root, os.O_DIRECTORY)
    for _ in range(depth):
        try:
            os.mkdir(name, dir_fd=fd)
        except FileExistsError:
            pass
        nfd = os.open(name, os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        os.close(fd)
        fd = nfd
    write_at(fd, LEAF, leaf)
    os.close(fd)


def write_at(dirfd, name, data):
    f = os.open(name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644, dir_fd=dirfd)
    os.write(f, data)
    os.close(f)


def open_at_depth(root, depth, name="d"):
    fd = os.open(root, os.O_DIRECTORY)
    for _ in range(depth):
        nfd = os.open(name, os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
        os.close(fd)
        fd = nfd
    return fd


def deep_state(root):
    """path (a tuple of names) -> type, mode, owner and content; by dir_fd
    and without recursion, so depth and path length do not matter."""
    out = {}
    stack = [(os.open(root, os.O_DIRECTORY), ())]
    while stack:
        fd, at = stack.pop()
        for n in sorted(os.listdir(fd)):
            st = os.stat(n, dir_fd=fd, follow_symlinks=False)
            key = (st.st_mode, st.st_uid, st.st_gid)
            if stat.S_ISDIR(st.st_mode):
                out[at + (n,)] = key
                stack.append((os.open(n, os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd), at + (n,)))
            elif stat.S_ISREG(st.st_mode):
                f = os.open(n, os.O_RDONLY, dir_fd=fd)
                out[at + (n,)] = key + (os.read(f, 1 << 20), int(st.st_mtime_ns))
                os.close(f)
            else:
                out[at + (n,)] = key
        os.close(fd)
    return out


@pytest.fixture
def deep_cleanup(tmp_path):
    """Requested before daemon_factory, so it runs after the daemons are
    stopped: rm -rf, as Python's rmtree recurses and a 2,000-level tree
    would end it in RecursionError."""
    yield
    subprocess.run(["rm", "-rf", "--one-file-system", str(tmp_path)], check=False)


def start(daemon_factory, backend, **kw):
    d = daemon_factory(backend=backend, wrap=SOFT_1024, **kw)
    assert "open files: soft limit raised from 1024 to the hard limit" in d.log()
    return d


def restore_ok(d, cid):
    out = d.restore(cid)
    assert out["ok"] is True, out
    return out


def export_import(d, cid):
    r = d.request("GET", f"/v1/checkpoints/{cid}/export", stream=True)
    assert r.status_code == 200, r.text
    blob = b"".join(r.iter_content(1 << 16))
    r = d.request("POST", "/v1/checkpoints/import", data=blob, headers={"Content-Type": "application/zstd"})
    assert r.status_code == 201, r.text
    return r.json()["checkpoint_id"]


def refused(r):
    assert r.status_code == 409, r.text
    body = r.json()
    assert body["code"] == "path_too_long" and body["status"] == 409, body
    return body


@pytest.mark.parametrize("backend", BACKENDS)
def test_deepest_tree_every_operation(deep_cleanup, daemon_factory, backend):
    d = start(daemon_factory, backend)
    root = d.roots[0]
    make_deep(root, DEEPEST)
    # two names of one file at the bottom: an export's hard link entry
    # names the first with "roots/0/" before it, past PATH_MAX
    fd = open_at_depth(root, DEEPEST)
    write_at(fd, "ab", b"linked\n")
    os.link("ab", "ac", src_dir_fd=fd, dst_dir_fd=fd)
    os.close(fd)
    want1 = deep_state(root)
    assert len(want1) == DEEPEST + 3
    cp1 = d.create("one")["checkpoint_id"]

    # changed near the bottom: a new file two levels up, the leaf rewritten
    fd = open_at_depth(root, DEEPEST - 2)
    write_at(fd, "near.txt", b"near\n")
    os.close(fd)
    make_deep(root, DEEPEST, leaf=b"bottom, changed\n")
    want2 = deep_state(root)
    cp2 = d.create("two")["checkpoint_id"]  # the second: incremental, or a delta layer

    r = d.request("GET", f"/v1/checkpoints/{cp1}/diff")
    assert r.status_code == 200, r.text
    paths = {c["path"] for c in r.json()["changes"]}
    assert paths == {f"{root}/{'d/' * (DEEPEST - 2)}near.txt", f"{root}/{'d/' * DEEPEST}{LEAF}"}, paths

    restore_ok(d, cp1)
    assert deep_state(root) == want1
    restore_ok(d, cp2)
    assert deep_state(root) == want2

    imported = export_import(d, cp2)
    restore_ok(d, cp1)
    restore_ok(d, imported)
    assert deep_state(root) == want2

    where = d.base / "forks-here" / "f"
    where.mkdir(parents=True)
    r = d.request("POST", f"/v1/checkpoints/{cp1}/fork", json={"path": str(where)})
    assert r.status_code == 201, r.text
    assert deep_state(where) == want1
    assert d.request("DELETE", f"/v1/forks/{r.json()['fork_id']}").status_code == 204


@pytest.mark.parametrize("backend", BACKENDS)
def test_deeper_is_refused_and_changes_nothing(deep_cleanup, daemon_factory, backend):
    d = start(daemon_factory, backend)
    root = d.roots[0]
    make_deep(root, 10)
    want0 = deep_state(root)
    cp0 = d.create("shallow")["checkpoint_id"]
    held = {cp0}

    # one level past the limit, and deeper than WALK_DEPTH_MAX (4096)
    for depth in (DEEPEST + 1, 5000):
        make_deep(root, depth)
        live = deep_state(root)
        body = refused(d.request("POST", "/v1/checkpoints", json={"name": f"deep-{depth}"}))
        assert deep_state(root) == live
        assert {c["checkpoint_id"] for c in d.list()} == held

        assert body["detail"].startswith("a path below a root is 4096 bytes or longer")
        r = d.request("GET", f"/v1/checkpoints/{cp0}/diff")
        if depth <= 4096:
            assert r.status_code == 200 and r.json()["changes"], r.text
        else:  # the diff's walk, WALK_DEPTH_MAX levels deep, is stopped
            refused(r)
        held.add(export_import(d, cp0))  # reads the checkpoint only

        # a restore takes the too deep tree away, however deep (the tar
        # backend removes what lies past the walk's depth bound)
        r = d.request("POST", f"/v1/checkpoints/{cp0}/restore", json={})
        assert r.status_code == 200 and r.json()["ok"] is True, r.text
        assert deep_state(root) == want0
    assert d.health()["status"] in ("ok", "degraded")


@pytest.mark.parametrize("backend", BACKENDS)
def test_deep_push_pull(deep_cleanup, daemon_factory, registry, tmp_path, backend):  # noqa: F811
    reg = registry()
    a = start(daemon_factory, backend, config=reg_config(tmp_path, reg))
    b = start(daemon_factory, backend, config=reg_config(tmp_path, reg))
    # A layer names its entries by absolute path: the root's path counts
    # against PATH_MAX too. 1,000 levels of "dd" stay well below it.
    make_deep(a.roots[0], 1000, name="dd")
    want = deep_state(a.roots[0])
    cp = a.create("deep")["checkpoint_id"]
    out = push(a, cp, f"{reg.host}/team/deep")
    p = pull(b, out["ref"], roots={str(a.roots[0]): str(b.roots[0])})
    restore_ok(b, p["checkpoint_id"])
    assert deep_state(b.roots[0]) == want

    # the deepest tree a root takes: its absolute paths pass PATH_MAX
    root = a.roots[0]
    subprocess.run(["rm", "-rf", str(root / "dd")], check=True)
    make_deep(root, DEEPEST)
    cp2 = a.create("deepest")["checkpoint_id"]
    r = a.request("POST", f"/v1/checkpoints/{cp2}/push", json={"ref": f"{reg.host}/team/deep"})
    refused(r)
    assert a.health()["status"] in ("ok", "degraded")
