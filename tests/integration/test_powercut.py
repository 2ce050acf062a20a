"""Power loss, not only kill -9: ckptd's state dir on powerfs.py, a FUSE file
system that keeps what was not fsynced in memory only and drops it at a
simulated power cut (file data, and a create, rename or unlink not followed by
an fsync of its directory). Power is cut at random points of create, restore,
delete and import; ckptd restarts on what survived and must keep its promises:
every acknowledged checkpoint is listed and restores exactly; nothing
half-written is read back as valid (a checkpoint that was not acknowledged
restores exactly or answers an error, never ok with other data).

Tar backend only: overlayfs refuses an upper dir on a FUSE file system
("upper fs missing required features": libfuse 2 has no RENAME_WHITEOUT), and
the overlay backend keeps its uppers in the state dir. The managed roots are
not on powerfs (their writes survive, as under kill -9).

POWERCUT_ROUNDS cuts per operation (default 8), from the seed POWERCUT_SEED
(default: a random one, printed)."""
import json
import os
import pathlib
import random
import subprocess
import sys
import threading
import time

import pytest

from conftest import Daemon, tree_state, unmount_all

HERE = pathlib.Path(__file__).resolve().parent
ROUNDS = int(os.environ.get("POWERCUT_ROUNDS", "8"))
SEED = int(os.environ.get("POWERCUT_SEED") or random.randrange(1 << 30))


def is_mount(path):
    with open("/proc/self/mountinfo") as f:
        return any(line.split()[4] == str(path) for line in f)


class PowerFS:
    def __init__(self, base):
        self.back, self.mnt, self.stats_file = base / "disk", base / "mnt", base / "powerfs.json"
        self.back.mkdir(parents=True)
        self.mnt.mkdir()
        self.log = open(base / "powerfs.log", "wb")
        self.proc = subprocess.Popen([sys.executable, str(HERE / "powerfs.py"), str(self.back), str(self.mnt),
                                      "--stats", str(self.stats_file)], stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while not is_mount(self.mnt):
            assert self.proc.poll() is None and time.monotonic() < deadline, "powerfs did not mount"
            time.sleep(0.05)

    def cut(self):
        try:
            os.mkdir(self.mnt / ".powerfs-cut")
        except FileExistsError:  # the cut answers EEXIST once done
            pass

    def stats(self):
        try:
            return json.loads(self.stats_file.read_text())
        except FileNotFoundError:
            return {}

    def close(self):
        subprocess.run(["fusermount", "-u", str(self.mnt)], stderr=subprocess.DEVNULL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def powerfs(tmp_path):
    fs = PowerFS(tmp_path / "powerfs")
    yield fs
    fs.close()


def test_powerfs_drops_what_was_not_synced(powerfs):
    """The model itself: fsync of a file keeps its data, not its name; fsync
    of a directory keeps its entries; the rest is gone after a cut."""
    m = powerfs.mnt

    def write(name, data, sync):
        with open(m / name, "w") as f:
            f.write(data)
            f.flush()
            if sync:
                os.fsync(f.fileno())

    def sync_dir(p):
        fd = os.open(p, os.O_RDONLY | os.O_DIRECTORY)
        os.fsync(fd)
        os.close(fd)

    write("kept", "v1", True)
    sync_dir(m)
    write("kept", "v2 unsynced", False)
    write(".new.tmp", "renamed in", True)
    write("named-only", "data never synced", False)
    os.mkdir(m / "sub")
    write("sub/file", "x", True)
    sync_dir(m)  # keeps .new.tmp, named-only (empty: its data was never synced) and sub (empty)
    os.rename(m / ".new.tmp", m / "renamed")  # the rename is not synced: lost
    os.unlink(m / "kept")  # not synced: it comes back
    write("lost", "never synced", True)
    powerfs.cut()
    assert sorted(os.listdir(m)) == [".new.tmp", "kept", "named-only", "sub"]
    assert (m / "kept").read_text() == "v1"
    assert (m / ".new.tmp").read_text() == "renamed in"
    assert (m / "named-only").read_text() == ""
    assert os.listdir(m / "sub") == []
    s = powerfs.stats()
    assert s["cuts"] == 1 and s["lost_entries"] == 3 and s["came_back"] == 2, s


class Rig:
    """ckptd (tar, two roots) with its state dir on powerfs."""

    def __init__(self, base, fs, rng):
        self.fs, self.rng = fs, rng
        # tar_chain_max 2: a create sets off a compaction, which a cut may hit too
        self.d = Daemon(base, backend="tar", n_roots=2,
                        config={"cleanup_interval_secs": 3600, "max_checkpoints": 1000, "default_ttl_secs": 0,
                                "tar_chain_max": 2})
        self.d.state_dir = fs.mnt / "state"
        self.acked = {}  # cid -> (record, state of the roots)
        self.durations = {}
        self.gen = 0
        self.cuts = {}
        self.damaged = 0  # unacknowledged checkpoints that answered an error

    def state(self):
        return tuple(tree_state(r) for r in self.d.roots)

    def mutate(self):
        self.gen += 1
        for k, root in enumerate(self.d.roots):
            (root / f"d{self.gen % 4}").mkdir(exist_ok=True)
            (root / f"d{self.gen % 4}" / f"g{self.gen}.bin").write_bytes(os.urandom(self.rng.randint(0, 300 << 10)))
            with open(root / "log.txt", "a") as f:
                f.write(f"gen {self.gen} root {k}\n")
            old = sorted(root.rglob("g*.bin"))
            if len(old) > 6:
                old[0].unlink()

    def timed(self, op, fn):
        t0 = time.monotonic()
        r = fn()
        self.durations[op] = time.monotonic() - t0
        return r

    def cut_during(self, op, fn):
        """Run fn in a thread, cut power after a random delay around op's
        duration; the daemon dies first (the machine stops), then the disk
        drops what was not synced."""
        out = {}

        def go():
            try:
                out["r"] = fn()
            except Exception as e:  # the daemon died under it
                out["e"] = e
        delay = self.rng.uniform(0, self.durations.get(op, 0.1) * 1.3)
        t = threading.Thread(target=go)
        t.start()
        time.sleep(delay)
        self.d.kill9()
        self.fs.cut()
        t.join(60)
        self.cuts[op] = self.cuts.get(op, 0) + 1
        self.d.start(timeout=60)
        return out.get("r")

    def listed(self):
        return {c["checkpoint_id"]: c for c in self.d.list(limit=1000)}

    def restore_ok(self, cid):
        r = self.d.request("POST", f"/v1/checkpoints/{cid}/restore", json={"verify": True})
        return r.status_code == 200 and r.json().get("ok") is True, r

    def check(self, unacked=None):
        """Every acknowledged checkpoint is listed as it was and restores
        exactly; one not acknowledged restores exactly or answers an error."""
        listed = self.listed()
        for cid, (rec, st) in self.acked.items():
            assert cid in listed, f"acknowledged checkpoint {cid} lost at a power cut\n{self.d.log()[-3000:]}"
            for k in ("name", "created_at", "size_bytes", "status"):
                assert listed[cid][k] == rec[k], (cid, k, listed[cid][k], rec[k])
        for cid in self.rng.sample(sorted(self.acked), min(3, len(self.acked))):
            ok, r = self.restore_ok(cid)
            assert ok, f"acknowledged {cid} does not restore after a power cut: {r.status_code} {r.text}"
            assert self.state() == self.acked[cid][1], f"acknowledged {cid} restored other data"
        for cid, c in listed.items():
            if cid in self.acked:
                continue
            assert unacked and c["name"] in unacked, f"unknown checkpoint {cid} ({c['name']}) listed"
            ok, r = self.restore_ok(cid)
            if ok:  # ok is a promise: the data it was made from
                assert self.state() == unacked[c["name"]], f"{cid} restored ok with other data after a cut"
                self.acked[cid] = (c, unacked[c["name"]])
            else:
                self.damaged += 1
                assert r.status_code >= 400 or r.json().get("ok") is False, r.text
                self.d.request("DELETE", f"/v1/checkpoints/{cid}")

    def create(self, name):
        self.mutate()
        st = self.state()
        r = self.d.request("POST", "/v1/checkpoints", json={"name": name})
        assert r.status_code == 201, r.text
        self.acked[r.json()["checkpoint_id"]] = (r.json(), st)
        return r.json()["checkpoint_id"]

    def round_create(self, i):
        self.mutate()
        st = self.state()
        name = f"cut-create-{i}"
        r = self.cut_during("create", lambda: self.d.request("POST", "/v1/checkpoints", json={"name": name}))
        if r is not None and r.status_code == 201:
            self.acked[r.json()["checkpoint_id"]] = (r.json(), st)
        self.check({name: st})

    def round_restore(self, i):
        cid = self.rng.choice(sorted(self.acked))
        self.mutate()
        before = self.state()
        r = self.cut_during("restore", lambda: self.d.request("POST", f"/v1/checkpoints/{cid}/restore", json={}))
        now = self.state()
        assert now in (before, self.acked[cid][1]), f"restore of {cid} cut short left a mix"
        if r is not None and r.status_code == 200 and r.json().get("ok"):
            assert now == self.acked[cid][1], "an acknowledged restore was undone by a power cut"
        self.check()

    def round_delete(self, i):
        cid = self.create(f"to-delete-{i}")
        rec, st = self.acked.pop(cid)
        r = self.cut_during("delete", lambda: self.d.request("DELETE", f"/v1/checkpoints/{cid}"))
        listed = self.listed()
        if r is not None and r.status_code == 204:
            assert cid not in listed, f"deleted {cid} (204) came back after a power cut"
        elif cid in listed:  # whole, or an error: never ok with other data
            self.acked[cid] = (rec, st)
        self.check()

    def round_import(self, i, blob, st):
        r = self.cut_during("import", lambda: self.d.request("POST", "/v1/checkpoints/import", data=blob,
                                                             headers={"Content-Type": "application/zstd"}))
        if r is not None and r.status_code == 201:
            self.acked[r.json()["checkpoint_id"]] = (r.json(), st)
        names = {c["name"]: st for c in self.listed().values() if c["checkpoint_id"] not in self.acked}
        self.check(names)
        xfer = self.d.state_dir / "xfer"
        assert not xfer.exists() or not any(xfer.iterdir()), "a cut import left files in xfer/"


def test_power_cut_during_operations(powerfs, tmp_path, capsys):
    with capsys.disabled():
        print(f"\npowercut: seed {SEED}, {ROUNDS} cuts per operation (replay: POWERCUT_SEED={SEED})", flush=True)
    rig = Rig(tmp_path / "d", powerfs, random.Random(SEED))
    for r in rig.d.roots:
        (r / "base.txt").write_text(f"base of {r.name}\n")
    try:
        rig.d.start(timeout=60)
        first = rig.timed("create", lambda: rig.create("first"))
        rig.mutate()
        rig.timed("restore", lambda: rig.d.restore(first))
        rig.timed("delete", lambda: rig.d.delete(rig.create("calibrate")))
        rig.acked = {k: v for k, v in rig.acked.items() if v[0]["name"] != "calibrate"}
        blob = rig.d.request("GET", f"/v1/checkpoints/{first}/export").content
        imp = rig.timed("import", lambda: rig.d.request("POST", "/v1/checkpoints/import", data=blob,
                                                        headers={"Content-Type": "application/zstd"}))
        assert imp.status_code == 201, imp.text
        rig.acked[imp.json()["checkpoint_id"]] = (imp.json(), rig.acked[first][1])
        for i in range(ROUNDS):
            rig.round_create(i)
            rig.round_restore(i)
            rig.round_delete(i)
            rig.round_import(i, blob, rig.acked[first][1])
        # a clean restart keeps everything, and every checkpoint restores
        rig.d.stop()
        powerfs.cut()
        rig.d.start(timeout=60)
        for cid in sorted(rig.acked):
            ok, r = rig.restore_ok(cid)
            assert ok and rig.state() == rig.acked[cid][1], (cid, r.text)
        rig.d.stop()
        rig.d.start(timeout=60)
        rig.d.stop()
        left = [str(p) for p in rig.d.state_dir.rglob("*") if ".tmp" in p.name]
        assert not left, f"temp files survive a second restart: {left[:5]}"
        s = powerfs.stats()
        with capsys.disabled():
            print(f"powercut: {sum(rig.cuts.values())} cuts ({', '.join(f'{k} {v}' for k, v in sorted(rig.cuts.items()))}),"
                  f" {s.get('lost_entries')} entries lost, {s.get('reverted_files')} files reverted,"
                  f" {s.get('came_back')} came back, {rig.damaged} damaged checkpoints reported,"
                  f" {len(rig.acked)} checkpoints at the end", flush=True)
        # the cuts really dropped something, or this test proves nothing
        assert s["lost_entries"] + s["reverted_files"] + s["came_back"] > 0, s
    finally:
        rig.d.cleanup()
        unmount_all(tmp_path / "d")
