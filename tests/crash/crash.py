#!/usr/bin/python3
"""Crash harness: SIGKILL ckptd at random points of create, restore, delete, import, fork,
push and pull, and of the background work (compaction, flattening, the sweeper), restart it, and check what
it promised.

    crash.py [--backend tar|overlay|both] [--kills N] [--seed S] [--dir DIR]

ckptd manages two roots. Each round changes them, starts one operation in a
thread and kills the daemon after a delay drawn around that operation's
measured duration (from before it starts to after it ends). Some rounds first
make a few acknowledged creates, so that the killed create is a delta (overlay)
or a tracked incremental one (tar), not the first after a start. Each restart
picks one of two configurations: the quiet one (sweeper every hour, the default
chain limits) or the busy one (sweeper every second, tar_chain_max 2,
flatten_depth 3, some checkpoints with a TTL of 1-2 s), under which the
"background" rounds make creates and kill ckptd while it compacts, flattens,
sweeps and removes. After every restart:

- every acknowledged checkpoint is listed, active, and its record unchanged; an
  acknowledged delete stays deleted;
- a create that was killed is either complete (active, and restores to the tree
  it was made from) or absent; nothing stays "creating" or "deleting";
- a killed restore leaves the roots as they were before or as the checkpoint,
  never a mix (of files, or of roots: both roots come from one checkpoint);
- a checkpoint made with a TTL is listed whole until it expires, then may go;
- a killed delete leaves the checkpoint whole or gone;
- a killed import is whole (active, and restores to the exported tree) or absent,
  and leaves nothing in the state dir's xfer/;
- a killed fork is listed whole (holding its checkpoint's tree) or absent, and then
  leaves its directory empty and unmounted; a killed fork delete leaves the fork
  whole or gone; no fork upper survives that nobody lists;
- a killed push changes no checkpoint, leaves nothing in xfer/, and pushing
  again gives the same digest as any push of the same checkpoint before;
- a killed pull is whole (active, and restores to the pushed trees) or absent,
  and leaves nothing in xfer/ (pushes and pulls go through a docker-registry).
At the end every surviving checkpoint is restored and compared with the tree it
was made from, and after a second, clean restart no temp file is left in the
state dir. Prints the number of kills and of invariants checked; exits 1 on the
first broken invariant."""
import argparse
import os
import pathlib
import random
import shutil
import sys
import tempfile
import threading
import time

import requests

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))
from test_registry import Registry, reg_config  # noqa: E402
from conftest import Daemon, tree_state, unmount_all  # noqa: E402


class Broken(Exception):
    pass


class Harness:
    # track_changes "always": overlay tracks every upper, not only from 2,000
    # entries, so a create after a create is a delta (tar tracks by default).
    QUIET = {"cleanup_interval_secs": 3600, "max_checkpoints": 1000, "default_ttl_secs": 0,
             "track_changes": "always"}
    # Background work at every turn: the sweeper each second, compaction of
    # tar chains longer than 2, flattening of overlay chains deeper than 3.
    BUSY = {**QUIET, "cleanup_interval_secs": 1, "tar_chain_max": 2, "flatten_depth": 3}
    # Files of 64 KiB in the first root and in the others at the start.
    SEED_FILES = (120, 40)

    def __init__(self, base, backend, rng, registry=True):
        """registry False: no docker-registry, for a harness without push
        and pull rounds (tests/integration/test_powercut_fs.py)."""
        self.rng = rng
        self.reg = Registry(pathlib.Path(base) / "registry") if registry else None
        self.regcfg = reg_config(pathlib.Path(base), self.reg) if registry else {}
        self.d = Daemon(base, backend=backend, n_roots=2, config={**self.QUIET, **self.regcfg})
        self.pushed = {}  # cid -> (ref, digest) of its pushes
        self.roots = self.d.roots
        self.acked = {}  # cid -> (name, state of every root)
        self.records = {}  # cid -> record as acknowledged
        self.deleted = set()
        self.ephemeral = {}  # cid -> (monotonic time it expires by, state): a TTL'd checkpoint
        self.durations = {"create": 0.05, "restore": 0.05, "delete": 0.02, "import": 0.1, "fork": 0.05,
                          "fork-delete": 0.05, "background": 1.0, "push": 0.1, "pull": 0.1}
        self.exports = {}  # cid -> its export archive
        self.kills = 0
        self.checks = 0
        self.counts = {}
        self.gen = 0
        self.forks = {}  # fork id -> (dir, tree)
        self.fork_dirs = 0
        self.series = 0  # creates killed after 1-4 acknowledged ones
        self.busy_starts = 0

    def check(self, cond, what):
        self.checks += 1
        if not cond:
            raise Broken(what)

    # ---- the managed trees ----
    def seed_tree(self):
        blob = os.urandom(64 << 10)
        for k, root in enumerate(self.roots):
            for i in range(self.SEED_FILES[min(k, 1)]):
                sub = root / f"d{i % 6}"
                sub.mkdir(exist_ok=True)
                (sub / f"f{i:03}.bin").write_bytes(blob[i * 97 + k:] + blob[:i * 97 + k])
            (root / "notes.txt").write_text(f"root {k} start\n")
            os.symlink("notes.txt", root / "link")

    def state(self):
        """The trees of all roots, in order: one value, so that a mix of two
        checkpoints' roots matches neither."""
        return tuple(tree_state(r) for r in self.roots)

    def mutate(self):
        """Change one root or both (a root left alone makes a checkpoint whose
        roots differ from the previous one's in one root only)."""
        self.gen += 1
        r = self.rng
        which = r.choice([[0], [1], [0, 1], [0, 1]])
        for k in which:
            root = self.roots[k]
            files = [p for p in root.rglob("*.bin")]
            for p in r.sample(files, min(len(files), r.randint(1, 6))):
                with open(p, "r+b") as f:
                    f.seek(r.randrange(0, 60 << 10))
                    f.write(os.urandom(r.randint(1, 8192)))
            for p in r.sample(files, min(len(files), r.randint(0, 2))):
                if p.exists():
                    p.unlink()
            new = root / f"d{r.randrange(6)}" / f"g{self.gen}.bin"
            new.parent.mkdir(exist_ok=True)
            new.write_bytes(os.urandom(r.randint(0, 200 << 10)))
            with open(root / "notes.txt", "a") as f:
                f.write(f"gen {self.gen}\n")

    # ---- one killed operation ----
    def run_killed(self, op, fn):
        """Run fn() in a thread, SIGKILL ckptd after a delay; returns the response or None."""
        out = {}

        def go():
            try:
                out["r"] = fn()
                out["t"] = time.monotonic()
            except requests.RequestException as e:
                out["e"] = e

        avg = self.durations[op]
        # Mostly during the operation; some before it starts and after it ends.
        delay = self.rng.choice([0, self.rng.uniform(0, avg * 1.2), self.rng.uniform(0, avg * 1.2), avg * 2])
        t = threading.Thread(target=go)
        t0 = time.monotonic()
        t.start()
        time.sleep(delay)
        self.crash()
        self.kills += 1
        t.join(60)
        r = out.get("r")
        if r is not None and not self.answered_before_crash(out["t"]):
            r = None  # an answer the crash may have made untrue: as if lost
        if r is not None and r.status_code < 300:
            # Finished before the kill: learn how long the operation takes.
            self.durations[op] = 0.7 * avg + 0.3 * (time.monotonic() - t0)
        self.counts[op] = self.counts.get(op, 0) + 1
        return r

    def crash(self):
        """The crash itself: SIGKILL (a subclass cuts power too)."""
        self.d.kill9()

    def answered_before_crash(self, t):
        """Whether an answer that came at time t can be believed. After a
        SIGKILL no answer comes: every answer can."""
        return True

    def restart(self):
        """Start again, in the quiet or the busy configuration."""
        self.busy = self.rng.random() < 0.4
        self.busy_starts += self.busy
        self.d.config = {**(self.BUSY if self.busy else self.QUIET), **self.regcfg}
        self.d.start(timeout=60)

    # ---- invariants ----
    def list_all(self):
        """Every checkpoint, page after page (a page holds 100 by default: a
        long run keeps more, and the first page alone lost the oldest)."""
        out, token = [], None
        while True:
            params = {"limit": 1000, **({"page_token": token} if token else {})}
            body = self.d.request("GET", "/v1/checkpoints", params=params).json()
            out += body["checkpoints"]
            token = body.get("next_page_token")
            if not token:
                return out

    def check_catalog(self, maybe=()):
        """maybe: cids that an interrupted operation may have removed."""
        listed = {c["checkpoint_id"]: c for c in self.list_all()}
        for c in listed.values():
            self.check(c["status"] in ("active", "failed"),
                       f"{c['checkpoint_id']} is '{c['status']}' after a restart")
        for cid in list(self.acked):
            if cid in maybe and cid not in listed:
                del self.acked[cid]
                continue
            self.check(cid in listed, f"acknowledged checkpoint {cid} lost")
            self.check(listed[cid]["status"] == "active", f"acknowledged {cid} is {listed[cid]['status']}")
            for k in ("name", "created_at", "size_bytes"):
                self.check(listed[cid].get(k) == self.records[cid].get(k), f"{cid}: {k} changed")
        for cid, (by, _) in list(self.ephemeral.items()):
            if cid in listed:
                self.check(listed[cid]["status"] == "active", f"{cid} (TTL) is {listed[cid]['status']}")
                for k in ("name", "created_at", "size_bytes"):
                    self.check(listed[cid].get(k) == self.records[cid].get(k), f"{cid}: {k} changed")
            else:
                self.check(time.monotonic() >= by, f"checkpoint {cid} gone before its TTL ran out")
                del self.ephemeral[cid]
                self.deleted.add(cid)
        for cid in self.deleted:
            self.check(cid not in listed, f"deleted checkpoint {cid} came back")
        return listed

    def describe(self, now, **named):
        """Which root matches which named state: says what a mix is made of."""
        return "; ".join(f"root {k}: " + (", ".join(n for n, st in named.items() if st[k] == now[k]) or "none")
                         for k in range(len(now)))

    def check_restores_to(self, cid, tree):
        r = self.d.request("POST", f"/v1/checkpoints/{cid}/restore", json={})
        self.check(r.status_code == 200 and r.json().get("ok") is True, f"restore of {cid}: {r.status_code} {r.text}")
        now = self.state()
        self.check(now == tree, f"{cid} did not restore to the trees it was made from ("
                   f"{self.describe(now, checkpoint=tree)})")

    def adopt_unacked(self, listed, name, tree):
        """A create of `name` that was not acknowledged but is listed must be
        complete: active, and holding the trees it was made from."""
        for cid, c in listed.items():
            if c["name"] == name and cid not in self.acked and cid not in self.ephemeral:
                self.check(c["status"] == "active", f"half-made checkpoint {cid} is listed")
                self.acked[cid] = (name, tree)
                self.records[cid] = c
                self.check_restores_to(cid, tree)

    # ---- the rounds ----
    def create_acked(self, name, ttl=None):
        """One create that is not killed; returns its tree."""
        self.mutate()
        tree = self.state()
        body = {"name": name, **({"ttl_secs": ttl} if ttl else {})}
        t0 = time.monotonic()
        r = self.d.request("POST", "/v1/checkpoints", json=body)
        self.check(r.status_code == 201, f"create {name}: {r.status_code} {r.text}")
        self.note_created(r.json(), tree, t0, ttl)
        return tree

    def note_created(self, rec, tree, t0, ttl=None):
        cid = rec["checkpoint_id"]
        self.records[cid] = rec
        if ttl:
            # listed until t0 + ttl at least; gone (once swept) some time later
            self.ephemeral[cid] = (t0 + ttl, tree)
        else:
            self.acked[cid] = (rec["name"], tree)

    def round_create(self, before=0):
        """before: acknowledged creates first, so that the killed one follows
        a create of the same process (a delta, a tracked tar create)."""
        for i in range(before):
            self.create_acked(f"c{self.kills}-{i}")
        self.mutate()
        tree = self.state()
        name = f"c{self.kills}"
        r = self.run_killed("create", lambda: self.d.request("POST", "/v1/checkpoints", json={"name": name}))
        self.restart()
        if r is not None and r.status_code == 201:
            self.note_created(r.json(), tree, 0)
        listed = self.check_catalog()
        self.check(self.state() == tree, "a killed create changed the roots")
        self.adopt_unacked(listed, name, tree)

    def round_series(self):
        """Several creates, the last one killed: deltas and tracked creates."""
        self.series += 1
        self.round_create(before=self.rng.randint(1, 4))

    def round_background(self):
        """Creates (some with a TTL of 1-2 s) under the busy configuration, then
        a kill during the last create or the background work it set off:
        compaction, flattening, the sweeper's expiry and removals."""
        if not self.busy:
            return self.round_series()
        for i in range(self.rng.randint(2, 5)):
            self.create_acked(f"b{self.kills}-{i}", ttl=self.rng.choice([None, None, 1, 2]))
        self.mutate()
        tree = self.state()
        name = f"b{self.kills}"
        ttl = self.rng.choice([None, 1])
        t0 = time.monotonic()
        body = {"name": name, **({"ttl_secs": ttl} if ttl else {})}
        linger = self.rng.choice([self.rng.uniform(0, 0.3), self.rng.uniform(0, 1.0)])  # drawn here: the thread must not draw (a seed replays)

        def go():
            r = self.d.request("POST", "/v1/checkpoints", json=body)
            time.sleep(linger)  # the kill lands in the work it started
            return r
        r = self.run_killed("background", go)
        self.restart()
        if r is not None and r.status_code == 201:
            self.note_created(r.json(), tree, t0, ttl)
        listed = self.check_catalog()
        self.check(self.state() == tree, "a kill during background work changed the roots")
        if not ttl:
            self.adopt_unacked(listed, name, tree)
        # Compaction and flattening rewrite the newest checkpoints' data: they
        # must still restore exactly.
        newest = sorted(self.acked, key=lambda c: self.records[c]["created_at"])[-3:]
        if newest:
            cid = self.rng.choice(newest)
            self.check_restores_to(cid, self.acked[cid][1])

    def round_restore(self):
        if not self.acked:
            return self.round_create()
        cid = self.rng.choice(sorted(self.acked))
        # At times a create first: the restore then follows a create of this
        # process (tar: a tracked restore of the roots' own checkpoint).
        if self.rng.random() < 0.3:
            self.create_acked(f"r{self.kills}")
        self.mutate()
        before = self.state()
        r = self.run_killed("restore",
                            lambda: self.d.request("POST", f"/v1/checkpoints/{cid}/restore", json={}))
        self.restart()
        self.check_catalog()
        now = self.state()
        target = self.acked[cid][1]
        if r is not None and r.status_code == 200 and r.json().get("ok"):
            self.check(now == target, f"acknowledged restore of {cid} not in place after a restart "
                       f"({self.describe(now, checkpoint=target)})")
        else:
            self.check(now in (before, target), f"killed restore of {cid} left a mix "
                       f"({self.describe(now, before=before, checkpoint=target)})")

    def round_delete(self):
        if len(self.acked) < 3:
            return self.round_create()
        cid = self.rng.choice(sorted(self.acked))
        r = self.run_killed("delete", lambda: self.d.request("DELETE", f"/v1/checkpoints/{cid}"))
        self.restart()
        if r is not None and r.status_code == 204:
            del self.acked[cid]
            self.deleted.add(cid)
        self.check_catalog(maybe={cid})

    def round_import(self):
        """Import an export of an acknowledged checkpoint while ckptd is killed:
        the import is whole (active, holding the tree) or absent."""
        if not self.acked:
            return self.round_create()
        src = self.rng.choice(sorted(self.acked))
        blob = self.exports.get(src)
        if blob is None:
            r = self.d.request("GET", f"/v1/checkpoints/{src}/export")
            self.check(r.status_code == 200, f"export of {src}: {r.status_code}")
            blob = self.exports[src] = r.content
        r = self.run_killed("import", lambda: self.d.request("POST", "/v1/checkpoints/import", data=blob,
                                                             headers={"Content-Type": "application/zstd"}))
        self.restart()
        tree = self.acked[src][1]
        if r is not None and r.status_code == 201:
            rec = r.json()
            self.acked[rec["checkpoint_id"]] = (rec["name"], tree)
            self.records[rec["checkpoint_id"]] = rec
        listed = self.check_catalog()
        xfer = self.d.state_dir / "xfer"
        self.check(not xfer.exists() or not any(xfer.iterdir()), "an interrupted import left files in xfer/")
        for cid, c in listed.items():
            if c.get("import_of") == src and cid not in self.acked and cid not in self.ephemeral:
                self.check(c["status"] == "active", f"half-imported checkpoint {cid} is listed")
                self.acked[cid] = (c["name"], tree)
                self.records[cid] = c
                self.check_restores_to(cid, tree)

    def round_push(self):
        """Push an acknowledged checkpoint while ckptd is killed: no checkpoint
        changes, xfer/ is empty, and a push again gives the same digest."""
        live = sorted(c for c in self.acked if c not in self.ephemeral)
        if not live:
            return self.round_create()
        cid = self.rng.choice(live)
        ref = f"{self.reg.host}/crash/img:{cid}"
        r = self.run_killed("push", lambda: self.d.request("POST", f"/v1/checkpoints/{cid}/push", json={"ref": ref}))
        self.restart()
        self.check_catalog()
        xfer = self.d.state_dir / "xfer"
        self.check(not xfer.exists() or not any(xfer.iterdir()), "an interrupted push left files in xfer/")
        again = self.d.request("POST", f"/v1/checkpoints/{cid}/push", json={"ref": ref})
        if again.status_code == 404 and cid not in self.acked:  # an ancestor of a TTL'd one: gone meanwhile
            return
        self.check(again.status_code == 200, f"push of {cid} after a kill: {again.status_code} {again.text}")
        digest = again.json()["digest"]
        if r is not None and r.status_code == 200:
            self.check(r.json()["digest"] == digest, f"push of {cid} gave another digest after a kill")
        self.pushed[cid] = (ref, digest)

    def round_pull(self):
        """Pull a pushed checkpoint while ckptd is killed: the new checkpoint
        is whole (active, holding the trees) or absent."""
        live = sorted(c for c in self.pushed if c in self.acked)
        if not live:
            return self.round_push()
        src = self.rng.choice(live)
        ref, digest = self.pushed[src]
        r = self.run_killed("pull", lambda: self.d.request("POST", "/v1/checkpoints/pull", json={"ref": ref}))
        self.restart()
        tree = self.acked[src][1]
        if r is not None and r.status_code == 201:
            rec = r.json()
            self.acked[rec["checkpoint_id"]] = (rec["name"], tree)
            self.records[rec["checkpoint_id"]] = rec
        listed = self.check_catalog()
        xfer = self.d.state_dir / "xfer"
        self.check(not xfer.exists() or not any(xfer.iterdir()), "an interrupted pull left files in xfer/")
        for cid, c in listed.items():
            if (c.get("pull_of") or {}).get("digest") == digest and cid not in self.acked \
                    and cid not in self.ephemeral:
                self.check(c["status"] == "active", f"half-pulled checkpoint {cid} is listed")
                self.acked[cid] = (c["name"], tree)
                self.records[cid] = c
                self.check_restores_to(cid, tree)

    def fork_state(self, path):
        """A fork holds each root's copy in DIR/<basename of the root>."""
        return tuple(tree_state(pathlib.Path(path) / r.name) for r in self.roots)

    def is_mount(self, path):
        with open("/proc/self/mountinfo") as f:
            return any(line.split()[4] == str(path) for line in f)

    def check_forks(self, maybe_dir=None):
        """Every listed fork is mounted (overlay) or extracted and holds its tree;
        a fork that is not listed left its dir empty and unmounted; the backend
        keeps no upper of a fork nobody lists."""
        listed = {f["fork_id"]: f for f in self.d.request("GET", "/v1/forks").json()["forks"]}
        for fid, f in listed.items():
            self.check(f.get("mounted") is True and "intent" not in f, f"fork {fid} listed half-made: {f}")
        for fid, (path, tree) in list(self.forks.items()):
            self.check(fid in listed, f"acknowledged fork {fid} lost")
            self.check(self.fork_state(path) == tree, f"fork {fid} does not hold its checkpoint's tree")
        for fid, f in listed.items():
            if fid not in self.forks:  # finished before the kill, answer lost: must be whole
                cid = f["checkpoint_id"]
                self.check(cid in self.acked, f"fork {fid} of unknown checkpoint {cid}")
                self.check(self.fork_state(f["path"]) == self.acked[cid][1], f"unacknowledged fork {fid} is not whole")
                self.forks[fid] = (f["path"], self.acked[cid][1])
        known = {f["path"] for f in listed.values()}
        if maybe_dir is not None and str(maybe_dir) not in known:
            self.check(not self.is_mount(maybe_dir), f"a killed fork left a mount at {maybe_dir}")
            self.check(not any(pathlib.Path(maybe_dir).iterdir()), f"a killed fork left files in {maybe_dir}")
        # os.walk, not glob: the sweeper may remove a temp dir meanwhile
        uppers = {n for top, dirs, _ in os.walk(self.d.state_dir) if os.path.basename(top) == "f"
                  for n in dirs if n.startswith("fk_")}
        self.check(uppers <= set(listed), f"fork uppers nobody lists: {sorted(uppers - set(listed))}")

    def new_fork_dir(self):
        """An empty directory for the next fork."""
        self.fork_dirs += 1
        path = self.d.base / "forks" / f"f{self.fork_dirs}"
        path.mkdir(parents=True)
        return path

    def round_fork(self):
        """Fork an acknowledged checkpoint while ckptd is killed; then delete a
        fork, killed too at times. A fork is whole or absent, never a stray
        mount or half-extracted dir."""
        if not self.acked:
            return self.round_create()
        cid = self.rng.choice(sorted(self.acked))
        path = self.new_fork_dir()
        r = self.run_killed("fork", lambda: self.d.request("POST", f"/v1/checkpoints/{cid}/fork",
                                                           json={"path": str(path)}))
        self.restart()
        if r is not None and r.status_code == 201:
            self.forks[r.json()["fork_id"]] = (str(path), self.acked[cid][1])
        self.check_catalog()
        self.check_forks(maybe_dir=path)
        if not self.forks:
            return
        fid = self.rng.choice(sorted(self.forks))
        fpath = self.forks[fid][0]
        if self.rng.random() < 0.5:
            r = self.run_killed("fork-delete", lambda: self.d.request("DELETE", f"/v1/forks/{fid}"))
            self.restart()
        else:
            r = self.d.request("DELETE", f"/v1/forks/{fid}")
            self.check(r.status_code == 204, f"delete fork {fid}: {r.status_code} {r.text}")
        listed = {f["fork_id"] for f in self.d.request("GET", "/v1/forks").json()["forks"]}
        if fid not in listed:
            del self.forks[fid]
            self.check(not self.is_mount(fpath), f"deleted fork {fid} still mounted")
            self.check(not any(pathlib.Path(fpath).iterdir()), f"deleted fork {fid} left files")
        else:
            self.check(r is None or r.status_code != 204, f"fork {fid} deleted (204) came back")
        self.check_forks()

    def temp_files(self):
        return [str(p) for p in self.d.state_dir.rglob("*") if ".tmp" in p.name]

    def calibrate(self):
        """One uninterrupted operation of each kind: how long they take here."""
        t0 = time.monotonic()
        rec = self.d.create("calibrate")
        self.durations["create"] = time.monotonic() - t0
        self.acked[rec["checkpoint_id"]] = ("calibrate", self.state())
        self.records[rec["checkpoint_id"]] = rec
        self.mutate()
        t0 = time.monotonic()
        self.d.restore(rec["checkpoint_id"])
        self.durations["restore"] = time.monotonic() - t0
        other = self.d.create("calibrate-delete")["checkpoint_id"]
        t0 = time.monotonic()
        self.d.delete(other)
        self.durations["delete"] = time.monotonic() - t0
        self.deleted.add(other)
        blob = self.exports[rec["checkpoint_id"]] = self.d.request(
            "GET", f"/v1/checkpoints/{rec['checkpoint_id']}/export").content
        t0 = time.monotonic()
        imp = self.d.request("POST", "/v1/checkpoints/import", data=blob, headers={"Content-Type": "application/zstd"})
        self.durations["import"] = time.monotonic() - t0
        self.check(imp.status_code == 201, f"import: {imp.status_code} {imp.text}")
        self.acked[imp.json()["checkpoint_id"]] = (imp.json()["name"], self.acked[rec["checkpoint_id"]][1])
        self.records[imp.json()["checkpoint_id"]] = imp.json()
        if self.reg:
            self.calibrate_oci(rec["checkpoint_id"])

    def calibrate_oci(self, cid):
        ref = f"{self.reg.host}/crash/img:calibrate"
        t0 = time.monotonic()
        pushed = self.d.request("POST", f"/v1/checkpoints/{cid}/push", json={"ref": ref})
        self.durations["push"] = time.monotonic() - t0
        self.check(pushed.status_code == 200, f"push: {pushed.status_code} {pushed.text}")
        self.pushed[cid] = (ref, pushed.json()["digest"])
        t0 = time.monotonic()
        pulled = self.d.request("POST", "/v1/checkpoints/pull", json={"ref": ref})
        self.durations["pull"] = time.monotonic() - t0
        self.check(pulled.status_code == 201, f"pull: {pulled.status_code} {pulled.text}")
        self.acked[pulled.json()["checkpoint_id"]] = (pulled.json()["name"], self.acked[cid][1])
        self.records[pulled.json()["checkpoint_id"]] = pulled.json()

    def run(self, kills):
        self.seed_tree()
        self.busy = False
        self.d.start()
        self.calibrate()
        rounds = [self.round_create] * 2 + [self.round_series] * 3 + [self.round_restore] * 4 + \
            [self.round_delete] * 2 + [self.round_import] * 2 + [self.round_fork] * 2 + \
            [self.round_push] * 2 + [self.round_pull] * 2
        while self.kills < kills:
            if self.busy and self.rng.random() < 0.5:
                self.round_background()
            else:
                self.rng.choice(rounds)()
        self.finish()

    def finish(self):
        """After the last round."""
        # Survivors hold their trees (every one was listed with its record at
        # each restart; restoring them all would cost more than the kills, so
        # the newest 10 and 20 more drawn from the seed); a clean restart
        # leaves no temp file.
        by_age = sorted(self.acked, key=lambda c: self.records[c]["created_at"])
        some = by_age[-10:] + self.rng.sample(by_age[:-10], min(20, len(by_age[:-10])))
        for cid in sorted(some):
            self.check_restores_to(cid, self.acked[cid][1])
        self.d.stop()
        self.d.start()
        self.d.stop()
        left = self.temp_files()
        self.check(not left, f"temp files survive a second restart: {left[:5]}")

    def cleanup(self):
        try:
            self.d.cleanup()
        except Exception:
            pass
        if self.reg:
            self.reg.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backend", default="both", choices=["tar", "overlay", "both"])
    ap.add_argument("--kills", type=int, default=300, help="kills per backend")
    ap.add_argument("--seed", type=int, default=None)
    ap.add_argument("--dir", default=None, help="work dir (default: a new temp dir)")
    a = ap.parse_args()
    seed = a.seed if a.seed is not None else random.randrange(1 << 30)
    backends = ["tar", "overlay"] if a.backend == "both" else [a.backend]
    top = pathlib.Path(a.dir or tempfile.mkdtemp(prefix="ckptd-crash-"))
    failed = False
    for b in backends:
        h = Harness(top / b, b, random.Random(seed))
        t0 = time.monotonic()
        try:
            h.run(a.kills)
            verdict = "ok"
        except Broken as e:
            verdict = f"BROKEN: {e}"
            failed = True
        finally:
            h.cleanup()
        print(f"crash[{b}]: seed {seed}: {h.kills} kills ({', '.join(f'{k} {v}' for k, v in sorted(h.counts.items()))};"
              f" {h.series} creates killed after 1-4 others, {h.busy_starts} starts busy),"
              f" {h.checks} invariants checked, {len(h.acked)} checkpoints at the end,"
              f" {time.monotonic() - t0:.0f} s: {verdict}", flush=True)
        if failed:
            print(f"crash[{b}]: log in {h.d.logfile}", flush=True)
            break
    unmount_all(top)
    if not failed and a.dir is None:
        shutil.rmtree(top, ignore_errors=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
