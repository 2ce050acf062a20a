"""Write faults with real parts, on both backends: EDQUOT from a btrfs qgroup
limit (this kernel has no XFS or ext4 quota support: CONFIG_XFS_QUOTA and
CONFIG_QFMT_V2 are off; btrfs enforces qgroup limits for root too) and EIO from
tests/integration/fusefs.py, a FUSE pass-through volume the test tells to fail
(--fault-file). A failed restore or create is never reported as success, and
once the fault is gone the next restore rewrites everything the failed one
touched."""
import json
import os
import pathlib
import subprocess
import time

import pytest

from conftest import assert_same_tree, tree_state

FUSEFS = pathlib.Path(__file__).parent / "fusefs.py"


def run(*argv):
    return subprocess.run(list(argv), check=True, capture_output=True, text=True).stdout.strip()


class Btrfs:
    """A btrfs on a loop device with qgroups on; subvolumes get limits."""

    def __init__(self, tmp_path):
        self.img, self.mnt = tmp_path / "btrfs.img", tmp_path / "btrfs"
        self.mnt.mkdir()
        run("truncate", "-s", "160M", str(self.img))
        run("mkfs.btrfs", "-q", "-f", str(self.img))
        self.dev = run("losetup", "-f", "--show", str(self.img))
        run("mount", self.dev, str(self.mnt))
        run("btrfs", "quota", "enable", str(self.mnt))

    def subvolume(self, name):
        run("btrfs", "subvolume", "create", str(self.mnt / name))
        return self.mnt / name

    def limit(self, sub, size):
        """size like "3M", or "none"; accounting is settled first."""
        run("btrfs", "filesystem", "sync", str(self.mnt))
        run("btrfs", "qgroup", "limit", size, str(sub))

    def close(self):
        subprocess.run(["umount", "-l", str(self.mnt)], check=False)
        subprocess.run(["losetup", "-d", self.dev], check=False)


# Take btrfs or faulty before daemon_factory in a test's arguments: fixtures are
# torn down in reverse, so ckptd stops before its file system goes away.
@pytest.fixture
def btrfs(tmp_path):
    fs = Btrfs(tmp_path)
    yield fs
    fs.close()


class FaultyVolume:
    """fusefs.py over a backing dir; arm() makes chosen operations fail with EIO."""

    def __init__(self, backing, mnt):
        self.mnt = pathlib.Path(mnt)
        pathlib.Path(backing).mkdir(parents=True, exist_ok=True)
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.fault_file = pathlib.Path(str(mnt) + ".fault")
        self.proc = subprocess.Popen(["/usr/bin/python3", str(FUSEFS), str(backing), str(mnt),
                                      "--fault-file", str(self.fault_file)])
        deadline = time.time() + 10
        while not os.path.ismount(mnt):
            assert self.proc.poll() is None and time.time() < deadline, "fusefs did not mount"
            time.sleep(0.05)

    def arm(self, ops, match="", after_bytes=0):
        self.fault_file.write_text(json.dumps({"ops": ops, "match": match, "after_bytes": after_bytes}))

    def clear(self):
        self.fault_file.unlink(missing_ok=True)

    def stop(self):
        self.clear()
        subprocess.run(["umount", "-l", str(self.mnt)], check=False)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def faulty(tmp_path):
    made = []

    def mount(name):
        v = FaultyVolume(tmp_path / (name + "-backing"), tmp_path / name)
        made.append(v)
        return v

    yield mount
    for v in made:
        v.stop()


def fill_tree(root):
    for i in range(3):
        (root / f"data{i}.bin").write_bytes(os.urandom(1 << 20))
    (root / "dir").mkdir()
    (root / "dir/small.txt").write_text("small\n")
    (root / "untouched.txt").write_text("never changed\n")


def damage_tree(root):
    for i in range(3):
        (root / f"data{i}.bin").write_bytes(b"x")
    (root / "dir/small.txt").write_text("changed\n")
    (root / "new.txt").write_text("not in the checkpoint\n")


def contents(root):
    """relpath -> bytes of every regular file (what a client would read)."""
    out = {}
    for dirpath, _, files in os.walk(root):
        for f in files:
            p = os.path.join(dirpath, f)
            out[os.path.relpath(p, root)] = pathlib.Path(p).read_bytes()
    return out


def assert_failed_restore(res, status):
    assert res.status_code == status, res.text
    body = res.json()
    assert body.get("ok") is not True and body["detail"], body
    return body


def test_tar_restore_over_quota_fails_then_the_next_heals(btrfs, daemon_factory):
    """The managed root is a btrfs subvolume: a qgroup limit (enforced for
    root) makes the restore's writes fail with EDQUOT: 507, not ok: true."""
    root = btrfs.subvolume("root")
    fill_tree(root)
    d = daemon_factory(backend="tar", start=False, roots=[root])
    d.start()
    before, data = tree_state(root), contents(root)
    cp = d.create("before")["checkpoint_id"]
    damage_tree(root)
    btrfs.limit(root, "2M")  # the checkpoint needs 3 MB
    res = d.request("POST", f"/v1/checkpoints/{cp}/restore", json={})
    body = assert_failed_restore(res, 507)
    assert body["code"] == "insufficient_storage" and "quota" in body["detail"].lower(), body
    assert d.health()["tar_unfinished_restore"]["id"] == cp
    assert contents(root) != data  # it really was cut short
    btrfs.limit(root, "none")
    rep = d.restore(cp, verify=True)
    assert rep["ok"] is True and rep["verified"] is True, rep
    assert rep["tar"]["kept"] == 0, rep["tar"]  # nothing the failed restore touched is trusted
    assert contents(root) == data
    assert_same_tree(before, tree_state(root))
    assert "tar_unfinished_restore" not in d.health()


def test_tar_create_over_quota_in_the_state_dir(btrfs, daemon_factory):
    """The tar state dir on a limited subvolume: a create that does not fit
    answers 507 and leaves no checkpoint and no partial archive; with the limit
    raised the next create and its restore work."""
    state = btrfs.subvolume("state")
    d = daemon_factory(backend="tar", start=False)
    d.state_dir = state
    (d.roots[0] / "small.txt").write_text("small\n")
    d.start()
    first = d.create("small")["checkpoint_id"]
    (d.roots[0] / "big.bin").write_bytes(os.urandom(6 << 20))
    btrfs.limit(state, "4M")
    files = sorted(p.name for p in (state / "tar").rglob("*"))
    res = d.request("POST", "/v1/checkpoints", json={"name": "too-big"})
    assert res.status_code == 507 and res.json()["code"] == "insufficient_storage", res.text
    assert [c["name"] for c in d.list()] == ["small"]
    assert sorted(p.name for p in (state / "tar").rglob("*")) == files, "a partial checkpoint was left"
    btrfs.limit(state, "none")
    live = tree_state(d.roots[0])
    big = d.create("big")["checkpoint_id"]
    assert d.restore(first)["ok"] is True and not (d.roots[0] / "big.bin").exists()
    assert d.restore(big, verify=True)["ok"] is True
    assert_same_tree(live, tree_state(d.roots[0]))


def test_overlay_over_quota_fails_whole(btrfs, daemon_factory):
    """The overlay state dir (uppers, layers, records) on a limited subvolume,
    filled to the limit through the root: the create and the restore cannot
    write what they need (btrfs reflinks the layer copy, but the records and
    the restore intent need blocks), fail with 507 and change nothing; both
    work once the limit is raised."""
    state = btrfs.subvolume("state")
    d = daemon_factory(backend="overlay", start=False)
    d.state_dir = state
    d.start()
    root = d.roots[0]
    (root / "a").write_bytes(os.urandom(3 << 20))
    ok = d.create("fits")
    kept = contents(root)
    (root / "b").write_bytes(os.urandom(1 << 20))
    btrfs.limit(state, "8M")
    with open(root / "filler", "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as e:
            assert e.errno == 122, e  # EDQUOT, through the overlay
    live = tree_state(root)
    res = d.request("POST", "/v1/checkpoints", json={"name": "too-big"})
    assert res.status_code == 507 and res.json()["code"] == "insufficient_storage", res.text
    assert tree_state(root) == live
    assert [c["name"] for c in d.list()] == ["fits"]
    layers = list((state / "overlay" / "r").glob("*/l/*"))
    assert len(layers) == 1 and not layers[0].name.startswith(".tmp"), layers
    res = d.request("POST", f"/v1/checkpoints/{ok['checkpoint_id']}/restore", json={})
    assert_failed_restore(res, 507)
    assert tree_state(root) == live
    btrfs.limit(state, "none")
    assert d.create("after")["size_bytes"] >= 0
    rep = d.restore(ok["checkpoint_id"], verify=True)
    assert rep["ok"] is True and rep["verified"] is True, rep
    assert contents(root) == kept


def tar_root_on_fuse(faulty, daemon_factory):
    """A tar ckptd whose root (filled by fill_tree) is on a faulty FUSE volume."""
    vol = faulty("rootvol")
    root = vol.mnt / "root"
    root.mkdir()
    fill_tree(root)
    return vol, root, daemon_factory(backend="tar", roots=[root])


def test_tar_restore_meeting_eio_fails_then_the_next_heals(faulty, daemon_factory):
    """The managed root on a FUSE volume whose writes fail with EIO after 1 MB
    (and, in a second round, whose close() reports EIO, as a network volume
    does when it cannot flush): 500 with the reason, never ok: true; the
    restore after the fault is cleared rewrites everything."""
    vol, root, d = tar_root_on_fuse(faulty, daemon_factory)
    data = contents(root)
    cp = d.create("before")["checkpoint_id"]
    for fault in ({"ops": ["write"], "after_bytes": 1 << 20}, {"ops": ["flush"], "match": "small"}):
        damage_tree(root)
        vol.arm(**fault)
        res = d.request("POST", f"/v1/checkpoints/{cp}/restore", json={})
        body = assert_failed_restore(res, 500)
        assert "Input/output error" in body["detail"], (fault, body)
        assert d.health()["tar_unfinished_restore"]["id"] == cp
        vol.clear()
        assert contents(root) != data, fault
        rep = d.restore(cp, verify=True)
        assert rep["ok"] is True and rep["verified"] is True, (fault, json.dumps(rep))
        assert rep["tar"]["kept"] == 0, rep["tar"]
        assert contents(root) == data
        assert "tar_unfinished_restore" not in d.health()


def test_tar_create_reading_eio_from_the_root(faulty, daemon_factory):
    """A file of the root that cannot be read (EIO) fails the create: no
    checkpoint with a hole or a short file where the data should be."""
    vol, root, d = tar_root_on_fuse(faulty, daemon_factory)
    first = d.create("first")["checkpoint_id"]
    (root / "data1.bin").write_bytes(os.urandom(1 << 20))
    data = contents(root)
    vol.arm(["read"], match="data1")
    res = d.request("POST", "/v1/checkpoints", json={"name": "unreadable"})
    assert res.status_code == 500 and "Input/output error" in res.json()["detail"], res.text
    assert [c["name"] for c in d.list()] == ["first"]
    vol.clear()
    second = d.create("second")["checkpoint_id"]
    assert d.restore(first)["ok"] is True
    rep = d.restore(second, verify=True)
    assert rep["ok"] is True and rep["verified"] is True, rep
    assert contents(root) == data


def test_tar_state_dir_meeting_eio(faulty, daemon_factory):
    """The tar state dir on a FUSE volume: a create whose archive writes fail
    with EIO fails and leaves no checkpoint; a restore that cannot write its
    intent fails and does not touch the root; both work once it is cleared."""
    vol = faulty("statevol")
    d = daemon_factory(backend="tar", start=False)
    d.state_dir = vol.mnt / "state"
    fill_tree(d.roots[0])
    d.start()
    data = contents(d.roots[0])
    cp = d.create("before")["checkpoint_id"]
    damage_tree(d.roots[0])
    damaged = contents(d.roots[0])
    # every write failing, then only fsync (the data seemed written, but the
    # volume could not make it durable): both fail the create and the restore
    files = sorted(p.name for p in (d.state_dir / "tar").rglob("*"))
    for ops in (["write", "fsync"], ["fsync"]):
        vol.arm(ops)
        res = d.request("POST", "/v1/checkpoints", json={"name": "bad-disk"})
        assert res.status_code == 500 and "Input/output error" in res.json()["detail"], (ops, res.text)
        assert [c["name"] for c in d.list()] == ["before"], ops
        assert sorted(p.name for p in (d.state_dir / "tar").rglob("*")) == files, ops  # no partial archive
        res = d.request("POST", f"/v1/checkpoints/{cp}/restore", json={})
        assert_failed_restore(res, 500)
        assert contents(d.roots[0]) == damaged, ops
    vol.clear()
    assert d.restore(cp, verify=True)["ok"] is True
    assert contents(d.roots[0]) == data
    assert d.create("after")["checkpoint_id"]
    assert sorted(c["name"] for c in d.list()) == ["after", "before"]


def test_overlay_records_meeting_eio(faulty, daemon_factory):
    """Overlay cannot keep its uppers on FUSE (overlayfs refuses a remote upper
    without RENAME_WHITEOUT and xattrs, which a libfuse 2 file system cannot
    give), so EIO is tested where overlay's own writes can meet it apart from
    the upper: the checkpoint records (state/overlay/c) and the catalog
    (state/catalog), each on a failing FUSE volume. A create whose record
    cannot be written fails with the reason and leaves no checkpoint and no
    layer; the live tree stays; once cleared, creates and restores work."""
    d = daemon_factory(backend="overlay", start=False)
    vols = {"overlay/c": faulty("records"), "catalog": faulty("catalog")}
    for sub, vol in vols.items():
        (d.state_dir / sub).mkdir(parents=True)
        run("mount", "--bind", str(vol.mnt), str(d.state_dir / sub))
    d.start()
    root = d.roots[0]
    (root / "a").write_text("first\n")
    first = d.create("first")["checkpoint_id"]
    layers = sorted((d.state_dir / "overlay" / "r").glob("*/l/*"))
    for sub, vol in vols.items():
        (root / "b").write_text(f"changed under {sub}\n")
        live = tree_state(root)
        vol.arm(["write", "fsync", "flush"])
        res = d.request("POST", "/v1/checkpoints", json={"name": "bad-disk"})
        assert res.status_code == 500 and "Input/output error" in res.json()["detail"], (sub, res.text)
        vol.clear()
        assert [c["name"] for c in d.list()] == ["first"], sub
        assert tree_state(root) == live, sub
        rep = d.restore(first, verify=True)
        assert rep["ok"] is True and rep["verified"] is True, rep
        # a layer the live root may have stacked on is gone once nothing uses
        # it: the maintenance after the restore removes it, in the background
        deadline = time.monotonic() + 10
        while (sorted((d.state_dir / "overlay" / "r").glob("*/l/*")) != layers
               and time.monotonic() < deadline):
            time.sleep(0.05)
        assert sorted((d.state_dir / "overlay" / "r").glob("*/l/*")) == layers, sub
        assert not (root / "b").exists() and (root / "a").read_text() == "first\n"
    assert d.create("after")["checkpoint_id"]
    assert sorted(c["name"] for c in d.list()) == ["after", "first"]
