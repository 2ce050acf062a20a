#!/usr/bin/python3
"""Run inside one of the sandboxes ckptd is for (test_environments.py starts it
under `runsc do`, `unshare -Urm` or `capsh --drop=cap_sys_admin`): a daemon
started here, driven over this environment's loopback.

    envrun.py exact --dir D --backend B [--tmpfs-state] [--owner-ids mapped|any]
    envrun.py crash --dir D --backend B [--tmpfs-state] --kills N --seed S
    envrun.py start --dir D --backend B [--tmpfs-state]

exact: every file type, a rename of base directories before and after
restores, restore after a restart, a fork. crash: SIGKILL during creates and restores
(tests/crash/crash.py's harness and invariants). start: start, report, stop.
Each prints one line `RESULT {json}` (health's backend fields, what ran) and
exits 1 on the first broken promise."""
import argparse
import json
import os
import pathlib
import random
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "crash"))
from conftest import Daemon, assert_same_tree, make_full_tree, tree_state, unmount_all  # noqa: E402


def backend_fields(d):
    h = d.health()
    return {k: h.get(k) for k in ("backend", "backend_reason", "overlay", "root_details")}


def tmpfs_state(state_dir):
    """gVisor's overlay makes whiteouts in the state dir: a tmpfs of the sandbox."""
    state_dir.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "mode=0700", "tmpfs", str(state_dir)], check=True)


def xattrs_allowed(root):
    probe = root / ".xattr-probe"
    probe.write_text("")
    try:
        os.setxattr(probe, "user.probe", b"1")
        return True
    except OSError:
        return False
    finally:
        probe.unlink()


def change_tree(root, n, xattrs):
    """Renames of base directories (nested too), edits through a hard link,
    a mode, a deletion, new files of every kind, an xattr alone (gVisor
    keeps ctime then)."""
    moved = root / f"dir-moved{n}"
    os.rename(sorted(root.glob("dir*"))[0], moved)
    os.rename(sorted(moved.glob("sub*"))[0], moved / f"sub-moved{n}")
    os.rename(sorted(root.glob("empty-dir*"))[0], root / f"empty-dir{n}")
    with open(root / "file.txt", "a") as f:  # hard-linked from dir/hardlink.txt
        f.write(f"change {n}\n")
    os.chmod(root / "exec.sh", 0o700 - n)
    if (root / "secret").exists():
        (root / "secret").unlink()
    (root / f"new{n}").mkdir()
    (root / f"new{n}" / "f").write_bytes(os.urandom(5000))
    os.link(root / f"new{n}" / "f", root / f"new{n}" / "f-link")
    os.symlink(f"new{n}/f", root / f"link{n}")
    os.mkfifo(root / f"fifo{n}")
    with open(root / "sparse.img", "r+b") as f:
        f.seek(n << 20)
        f.write(b"middle")
    if xattrs:
        os.setxattr(root / "new1" / "f", "user.round", str(n).encode())
        os.setxattr(root / "exec.sh", "user.round", str(n).encode())


def check_fork(d, cid, want):
    """A fork shows the checkpoint; deleting it leaves its directory empty."""
    path = d.base / "fork"
    path.mkdir()
    r = d.request("POST", f"/v1/checkpoints/{cid}/fork", json={"path": str(path)})
    assert r.status_code == 201, r.text
    assert_same_tree(want, tree_state(path))
    r = d.request("DELETE", f"/v1/forks/{r.json()['fork_id']}")
    assert r.status_code == 204, r.text
    assert not any(path.iterdir()), "a deleted fork left files"


def run_exact(a, d):
    root = d.roots[0]
    xattrs = xattrs_allowed(root)
    make_full_tree(root, owner=(1234, 5678) if a.owner_ids == "any" else None, xattrs=xattrs)
    d.start()
    out = dict(backend_fields(d), xattrs=xattrs, xattr_only=xattrs)
    c1 = d.create("c1")["checkpoint_id"]
    s1 = tree_state(root)
    change_tree(root, 1, xattrs)
    c2 = d.create("c2")["checkpoint_id"]
    s2 = tree_state(root)
    change_tree(root, 2, xattrs)  # base directories renamed again, now over the c2 layer
    d.restore(c1)
    assert_same_tree(s1, tree_state(root))
    d.restore(c2)
    assert_same_tree(s2, tree_state(root))
    os.rename(root / "dir-moved1", root / "after-restore")
    os.rename(root / "after-restore" / "sub-moved1", root / "sub-out")  # a base directory, after a restore
    (root / "in-upper").write_text("u\n")  # after the restore: in the upper at c3 and c4
    c3 = d.create("c3")["checkpoint_id"]
    s3 = tree_state(root)
    if xattrs:  # an xattr alone, on files c3 holds: gVisor moves no ctime then
        os.setxattr(root / "in-upper", "user.round", b"only")
        os.setxattr(root / "exec.sh", "user.round", b"only")
    c4 = d.create("c4")["checkpoint_id"]
    s4 = tree_state(root)
    d.stop()
    d.start()
    assert_same_tree(s4, tree_state(root))
    out["after_restart"] = backend_fields(d)["backend"]
    for cid, want in ((c1, s1), (c2, s2), (c3, s3), (c4, s4), (c1, s1), (c4, s4)):
        d.restore(cid)
        assert_same_tree(want, tree_state(root))
    check_fork(d, c2, s2)
    d.stop()
    out["checked"] = ["types", "renames", "restart", "fork"]
    return out


def run_crash(a, d):
    from crash import Harness  # tests/crash/crash.py: its rounds and invariants

    # two roots; these rounds neither push nor pull: no docker-registry
    h = Harness(d.base / "crash", a.backend, random.Random(a.seed), registry=False)
    if a.tmpfs_state:
        tmpfs_state(h.d.state_dir)
    try:
        h.seed_tree()
        h.d.start()
        out = backend_fields(h.d)
        h.create_acked("calibrate")
        while h.kills < a.kills:
            h.rng.choice([h.round_create, h.round_restore])()
        for cid, (_, tree) in sorted(h.acked.items()):
            h.check_restores_to(cid, tree)
    finally:
        h.cleanup()
    out["kills"] = h.counts
    out["checks"] = h.checks
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("mode", choices=["exact", "crash", "start"])
    ap.add_argument("--dir", required=True)
    ap.add_argument("--backend", default="auto")
    ap.add_argument("--tmpfs-state", action="store_true")
    ap.add_argument("--owner-ids", choices=["mapped", "any"], default="any")
    ap.add_argument("--kills", type=int, default=6)
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    base = pathlib.Path(a.dir)
    d = Daemon(base, backend=a.backend, config={"cleanup_interval_secs": 3600, "default_ttl_secs": 0})
    if a.tmpfs_state:
        tmpfs_state(d.state_dir)
    try:
        if a.mode == "start":
            try:
                d.start()
                out = backend_fields(d)
            except RuntimeError as e:
                out = {"error": str(e)}
        else:
            out = (run_exact if a.mode == "exact" else run_crash)(a, d)
    finally:
        d.cleanup()
        unmount_all(base)
    print("RESULT " + json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
