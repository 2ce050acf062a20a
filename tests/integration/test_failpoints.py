"""A crash at every durable step (docs/failpoints.md): the test build of ckptd
(make FAILPOINTS=1 BUILD=build-fp) names a point before and after each rename,
unlink, fsync, mount and record write. A traced run of the workload says which
points each backend reaches; then, one daemon per point, the workload runs with
that point armed until ckptd kills itself there. ckptd restarts without it and
the promises hold:

- every acknowledged checkpoint is listed, active, and restores both roots to
  the trees it was made from (both roots from one checkpoint, never a mix);
- the interrupted operation is whole or absent: a checkpoint it made restores
  exactly, a restore left the roots before or after, a fork is mounted whole or
  gone, an import or a pull left nothing in xfer/, a pulled checkpoint
  restores to the trees pushed;
- an interrupted push or pull, tried again, completes;
- after a second, clean restart no temp file is left in the state dir.

A point that no workload reaches fails the test: a new durable step must come
with a workload that reaches it."""
import atexit
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time

import pytest
import requests

from conftest import TOP, Daemon, free_port, mounts_under, tree_state, unmount_all
from test_registry import Registry

FP_BUILD = pathlib.Path(os.environ.get("CKPTD_FP_BUILD", TOP / "build-fp"))
if not FP_BUILD.is_absolute():
    FP_BUILD = TOP / FP_BUILD
FP_CKPTD = str(FP_BUILD / "ckptd")
# Points only gVisor's overlay reaches (its mountinfo names no upperdir, so
# ckptd records each mount's upper): the check runs them inside runsc do.
GVISOR = "overlay.gvisor."
CONFIG = {"cleanup_interval_secs": 1, "flatten_depth": 2, "tar_chain_max": 2, "default_ttl_secs": 0,
          "max_checkpoints": 1000}


class Died(Exception):
    """ckptd is gone (killed at the armed point)."""


class Broken(AssertionError):
    pass


class FPDaemon(Daemon):
    def argv(self):
        return [FP_CKPTD] + super().argv()[1:]

    def dead(self):
        return self.proc is None or self.proc.poll() is not None


def fp_build():
    """The failpoint flavour of ckptd, built (or brought up to date) here."""
    # BUILD as `make check-failpoints` spells it: the objects' header
    # dependencies (.d files) name their targets that way.
    build = os.path.relpath(FP_BUILD, TOP)
    p = subprocess.run(["make", "-s", "-C", str(TOP), "FAILPOINTS=1", f"BUILD={build}", f"{build}/ckptd"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    out = subprocess.run([FP_CKPTD, "--list-failpoints"], capture_output=True, text=True, check=True).stdout
    return out.split()


_REGISTRY = []
_SOURCES = {}


def registry():
    """One docker-registry (plain HTTP, no auth) on a loopback port for the
    whole module: push and pull need one, and a start costs a second."""
    if not _REGISTRY:
        reg = Registry(tempfile.mkdtemp(prefix="fp-registry-"), auth=None)
        atexit.register(shutil.rmtree, reg.base, True)
        atexit.register(reg.stop)
        _REGISTRY.append(reg)
    return _REGISTRY[0]


def source_image(backend):
    """An image pushed once per backend by another daemon (another machine),
    so a pull fetches every blob into a cache that holds none of them.
    Returns (ref, its two root paths, their trees)."""
    if backend not in _SOURCES:
        reg = registry()
        base = pathlib.Path(tempfile.mkdtemp(prefix=f"fp-source-{backend}-"))
        d = FPDaemon(base, backend=backend, n_roots=2, config={"registry_insecure": [reg.host]})
        try:
            for k, root in enumerate(d.roots):
                (root / "pulled").mkdir()
                (root / "pulled" / "a.txt").write_text(f"source root {k}\n")
                (root / "blob.bin").write_bytes(os.urandom(16 << 10))
            d.start()
            cid = d.create("src")["checkpoint_id"]
            ref = f"{reg.host}/fp/src-{backend}:src"
            r = d.request("POST", f"/v1/checkpoints/{cid}/push", json={"ref": ref})
            assert r.status_code == 200, r.text
            _SOURCES[backend] = (ref, [str(r) for r in d.roots], [tree_state(r) for r in d.roots])
            d.stop()
        finally:
            d.cleanup()
            unmount_all(base)
            shutil.rmtree(base, ignore_errors=True)
    return _SOURCES[backend]


class Run:
    """One daemon over two roots, driven through the workload; what it
    acknowledged is kept to check after the kill."""

    def __init__(self, base, backend, env, short=False):
        # Overlay tracks changes from 2,000 entries on, and only a tracked
        # create makes delta layers: track_changes "always" (ckptd.json(5))
        # tracks these small roots too. short: creates and restores only,
        # no registry (the gVisor pass: it has no network).
        config = {**CONFIG} if short else {**CONFIG, "registry_insecure": [registry().host]}
        self.short = short
        if backend == "overlay":
            config["track_changes"] = "always"
        # CKPTD_FAILPOINT=NAME:N@K arms only the Kth start of the workload
        # (0: the first): each restart counts its hits from 0 again. Without
        # @K every start is armed (a point first reached after a restart).
        self.arm, _, at = env.get("CKPTD_FAILPOINT", "").partition("@")
        self.arm_at, self.starts = int(at) if at else None, 0
        self.base_env = {k: v for k, v in env.items() if k != "CKPTD_FAILPOINT"}
        self.d = FPDaemon(base, backend=backend, n_roots=2, config=config, env=self.env_for(0))
        self.backend = backend
        self.acked = {}  # cid -> trees of both roots
        self.deleted = set()
        self.pending = None  # the operation under way: (kind, details)
        self.forks = {}  # fid -> (path, trees)
        self.gen = 0

    def env_for(self, start):
        armed = {"CKPTD_FAILPOINT": self.arm} if self.arm and self.arm_at in (None, start) else {}
        return {**self.base_env, **armed}

    # ---- the roots ----
    def trees(self):
        return [tree_state(r) for r in self.d.roots]

    def seed(self):
        for k, root in enumerate(self.d.roots):
            (root / "sub").mkdir()
            for i in range(6):
                (root / "sub" / f"f{i}.txt").write_text(f"root {k} file {i}\n" * (i + 1))
            (root / "top.bin").write_bytes(os.urandom(32 << 10))
            os.symlink("top.bin", root / "link")

    def mutate(self):
        self.gen += 1
        for k, root in enumerate(self.d.roots):
            (root / "sub" / f"g{self.gen}.txt").write_text(f"gen {self.gen} root {k}\n")
            with open(root / "sub" / "f0.txt", "a") as f:
                f.write(f"gen {self.gen}\n")
            old = root / "sub" / f"f{self.gen % 6}.txt"
            if self.gen % 3 == 0 and old.exists():
                old.unlink()
            (root / f"d{self.gen}").mkdir()
            (root / f"d{self.gen}" / "x").write_bytes(os.urandom(4096))

    # ---- requests that may meet a dead daemon ----
    def call(self, method, path, **kw):
        if self.d.dead():
            raise Died()
        try:
            r = self.d.request(method, path, timeout=60, **kw)
        except requests.RequestException:
            raise Died()
        if self.d.dead():  # answered, then killed by background work
            self.d.proc.wait()
        return r

    def expect(self, r, status, what):
        if r.status_code != status:
            if self.d.dead():
                raise Died()
            raise Broken(f"{what}: {r.status_code} {r.text}")
        return r

    # ---- the workload: each step reaches some durable steps ----
    def create(self, name, **fields):
        self.mutate()
        trees = self.trees()
        self.pending = ("create", name, trees)
        r = self.expect(self.call("POST", "/v1/checkpoints", json={"name": name, **fields}), 201, f"create {name}")
        cid = r.json()["checkpoint_id"]
        self.acked[cid] = trees
        self.pending = None
        return cid

    def step_start(self, tries=3):
        self.d.start(wait=False)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.d.dead():
                if tries > 1 and self.d.lost_port():
                    # free_port's port taken meanwhile by another test
                    self.d.port = free_port()
                    self.d.url = f"http://127.0.0.1:{self.d.port}"
                    return self.step_start(tries - 1)
                raise Died()
            try:
                r = requests.get(self.d.url + "/v1/health", timeout=2)
                if r.status_code == 200 and r.json().get("status") != "preparing" and self.d.ours(r.json()):
                    return
            except requests.RequestException:
                pass
            time.sleep(0.02)
        raise Broken("ckptd not ready")

    def start_checked(self):
        """A start that must work (no point armed)."""
        try:
            self.step_start()
        except Died:
            raise Broken(f"ckptd exited at start: {self.d.log()[-2000:]}")

    def step_restore(self, cid):
        self.mutate()
        before = self.trees()
        self.pending = ("restore", cid, before)
        r = self.expect(self.call("POST", f"/v1/checkpoints/{cid}/restore", json={}), 200, f"restore {cid}")
        if r.json().get("ok") is not True:
            raise Broken(f"restore {cid}: {r.text}")
        self.pending = None
        if self.trees() != self.acked[cid]:
            raise Broken(f"acknowledged restore of {cid} does not hold its trees")

    def step_delete(self, cid):
        self.pending = ("delete", cid)
        self.expect(self.call("DELETE", f"/v1/checkpoints/{cid}"), 204, f"delete {cid}")
        del self.acked[cid]
        self.deleted.add(cid)
        self.pending = None

    def step_fork(self, cid):
        base = self.d.base / "fork"
        base.mkdir()
        self.pending = ("fork", cid, base)
        r = self.expect(self.call("POST", f"/v1/checkpoints/{cid}/fork", json={"path": str(base)}), 201,
                        f"fork {cid}")
        fid = r.json()["fork_id"]
        self.forks[fid] = cid
        self.pending = ("fork-delete", fid)
        self.expect(self.call("DELETE", f"/v1/forks/{fid}"), 204, f"delete fork {fid}")
        del self.forks[fid]
        self.pending = None

    def step_import(self, cid):
        r = self.expect(self.call("GET", f"/v1/checkpoints/{cid}/export"), 200, f"export {cid}")
        self.pending = ("import", cid)
        r = self.expect(self.call("POST", "/v1/checkpoints/import", data=r.content,
                                  headers={"Content-Type": "application/zstd"}), 201, f"import {cid}")
        self.acked[r.json()["checkpoint_id"]] = self.acked[cid]
        self.pending = None

    def step_push(self, cid):
        self.pending = ("push", cid)
        ref = f"{registry().host}/fp/{self.backend}-{id(self)}:pushed"
        self.expect(self.call("POST", f"/v1/checkpoints/{cid}/push", json={"ref": ref}), 200, f"push {cid}")
        self.pending = None

    def pull_body(self):
        ref, roots, _ = source_image(self.backend)
        return {"ref": ref, "roots": {src: str(dst) for src, dst in zip(roots, self.d.roots)}}

    def step_pull(self):
        self.pending = ("pull",)
        r = self.expect(self.call("POST", "/v1/checkpoints/pull", json=self.pull_body()), 201, "pull")
        self.acked[r.json()["checkpoint_id"]] = source_image(self.backend)[2]
        self.pending = None

    def step_expire(self):
        cid = self.create("short", ttl_secs=1)
        self.pending = ("expire", cid)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            r = self.call("GET", f"/v1/checkpoints/{cid}")
            if r.status_code == 404:
                del self.acked[cid]
                self.pending = None
                return
            time.sleep(0.1)
        raise Broken(f"{cid} did not expire")

    def step_release(self, drop=False):
        self.pending = ("release", self.trees(), drop)
        self.expect(self.call("POST", "/v1/roots/release", json={"drop_checkpoints": drop}), 200, "release")
        if drop:
            self.deleted |= set(self.acked)
            self.acked = {}
        self.pending = None

    def step_restart(self):
        """A clean stop and a start: the next start adopts the released roots."""
        if self.d.dead():
            raise Died()
        self.d.proc.terminate()
        if self.d.proc.wait(60) == -9:  # killed at a point on its way out
            raise Died()
        self.d.proc = None
        self.starts += 1
        self.d.env = self.env_for(self.starts)
        self.step_start()

    def workload(self):
        """Steps in an order that reaches each point early."""
        cps = []
        yield "start", lambda: (self.seed(), self.step_start())
        if self.short:
            yield from self.short_workload(cps)
            return
        yield "create full", lambda: cps.append(self.create("c1"))
        yield "create delta", lambda: cps.append(self.create("c2"))
        yield "create (flatten, compact)", lambda: cps.append(self.create("c3"))
        yield "restore", lambda: self.step_restore(cps[0])
        yield "create after restore", lambda: cps.append(self.create("c4"))
        yield "delete one a later one reads", lambda: self.step_delete(cps[0])
        yield "delete its last reader", lambda: self.step_delete(cps[1])
        yield "fork", lambda: self.step_fork(cps[2])
        yield "import", lambda: self.step_import(cps[2])
        yield "push", lambda: self.step_push(cps[2])
        yield "pull", self.step_pull
        yield "expire", self.step_expire
        yield "release keeping the base", self.step_release
        yield "adopt after release", self.step_restart
        yield "restore after adoption", lambda: self.step_restore(cps[3])
        yield "release keeping layers", self.step_release
        yield "adopt again", self.step_restart
        yield "release dropping checkpoints", lambda: self.step_release(drop=True)
        yield "adopt once more", self.step_restart
        yield "settle", lambda: time.sleep(2)

    def short_workload(self, cps):
        """Each mount a create or a restore makes, and a restart's."""
        yield "create full", lambda: cps.append(self.create("c1"))
        yield "create delta", lambda: cps.append(self.create("c2"))
        yield "restore", lambda: self.step_restore(cps[0])
        yield "create after restore", lambda: cps.append(self.create("c3"))
        yield "adopt after a restart", self.step_restart
        yield "restore after restart", lambda: self.step_restore(cps[1])

    # ---- after the kill ----
    def listed(self):
        r = self.d.request("GET", "/v1/checkpoints", params={"limit": 1000})
        assert r.status_code == 200, r.text
        return {c["checkpoint_id"]: c for c in r.json()["checkpoints"]}

    def restore_check(self, cid, trees, what, expiring=False):
        expiring = expiring or (self.pending and self.pending[0] == "expire" and self.pending[1] == cid)
        r = self.d.request("POST", f"/v1/checkpoints/{cid}/restore", json={"force": True} if expiring else {})
        if expiring and r.status_code == 404:  # the restarted sweeper finished it
            return
        if r.status_code != 200 or r.json().get("ok") is not True:
            raise Broken(f"{what}: restore of {cid}: {r.status_code} {r.text}")
        if self.trees() != trees:
            raise Broken(f"{what}: {cid} does not restore both roots to the trees it was made from")

    def restart(self, then=None):
        """Start after the kill. then: a point armed for this start (a crash
        during recovery), after which a clean start follows. Returns the
        points this start reached before it was ready."""
        self.d.proc = None
        self.d.env = {"CKPTD_FAILPOINT": then} if then else {"CKPTD_FAILPOINT_TRACE": "1"}
        mark = len(self.d.log())
        try:
            self.step_start()
            if then:  # background work of the start may reach it
                deadline = time.monotonic() + 10
                while not self.d.dead() and time.monotonic() < deadline:
                    time.sleep(0.05)
        except Died:
            pass
        log = self.d.log()[mark:]
        if then:
            if f"failpoint kill {then}\n" not in log:
                raise Broken(f"the start after the kill did not reach {then}")
            self.d.proc.wait(30)
            self.d.proc = None
            self.d.env = {}
            self.start_checked()
        return {line.split()[2] for line in log.splitlines() if line.startswith("failpoint hit ")}

    def check_after_kill(self):
        kind = self.pending[0] if self.pending else None
        now = self.trees()
        if kind == "restore":
            cid, before = self.pending[1], self.pending[2]
            if now not in (before, self.acked[cid]):
                raise Broken(f"a killed restore of {cid} left the roots mixed")
        elif kind == "release":
            if now != self.pending[1]:
                raise Broken("a killed release changed what the roots show")
            if self.pending[2]:  # dropping: each checkpoint whole or gone
                self.acked = {c: t for c, t in self.acked.items() if c in self.listed()}
        listed = self.listed()
        for cid, c in listed.items():
            if c["status"] != "active":
                raise Broken(f"{cid} is '{c['status']}' after a restart")
        for cid in self.acked:
            if cid not in listed and not (kind in ("expire", "delete") and cid == self.pending[1]):
                raise Broken(f"acknowledged checkpoint {cid} lost")
        for cid in self.deleted:
            if cid in listed:
                raise Broken(f"deleted checkpoint {cid} came back")
        xfer = self.d.state_dir / "xfer"
        if xfer.exists() and any(xfer.iterdir()):
            raise Broken("an interrupted import or pull left files in xfer/")
        self.check_forks()
        # Whatever is listed is whole: acknowledged ones hold their trees, an
        # unacknowledged one (the interrupted create or import) the trees it
        # was made from.
        for cid in listed:
            if cid in self.acked:
                trees = self.acked[cid]
            elif kind == "create" and listed[cid]["name"] == self.pending[1]:
                trees = self.pending[2]
                if listed[cid]["name"] == "short":  # step_expire's, with a TTL of 1 s
                    self.restore_check(cid, trees, "after the kill", expiring=True)
                    continue
            elif kind == "import" and listed[cid].get("import_of") == self.pending[1]:
                trees = self.acked[self.pending[1]]
            elif kind == "pull" and listed[cid].get("pull_of"):
                trees = source_image(self.backend)[2]
            else:
                raise Broken(f"{cid} ('{listed[cid]['name']}') is listed but nobody made it")
            self.restore_check(cid, trees, "after the kill")
        self.check_retry(kind)

    def check_retry(self, kind):
        """An interrupted push or pull, tried again on the restarted daemon,
        completes (what the crash left in the blob cache is usable)."""
        if kind == "push":
            cid = self.pending[1]
            ref = f"{registry().host}/fp/{self.backend}-{id(self)}:retried"
            r = self.d.request("POST", f"/v1/checkpoints/{cid}/push", json={"ref": ref})
            if r.status_code != 200:
                raise Broken(f"a retried push of {cid}: {r.status_code} {r.text}")
        elif kind == "pull":
            r = self.d.request("POST", "/v1/checkpoints/pull", json=self.pull_body())
            if r.status_code != 201:
                raise Broken(f"a retried pull: {r.status_code} {r.text}")
            self.restore_check(r.json()["checkpoint_id"], source_image(self.backend)[2], "a retried pull")

    def check_forks(self):
        r = self.d.request("GET", "/v1/forks")
        assert r.status_code == 200, r.text
        forks = r.json()["forks"]
        for f in forks:
            if f.get("mounted") is not True or "intent" in f:
                raise Broken(f"fork {f['fork_id']} listed half-made: {f}")
            cid = f["checkpoint_id"]
            paths = [pathlib.Path(p) for p in f["paths"]]
            if [tree_state(p) for p in paths] != self.acked[cid]:
                raise Broken(f"fork {f['fork_id']} is not whole")
        if not forks and self.pending and self.pending[0] in ("fork", "fork-delete"):
            base = self.d.base / "fork"
            if mounts_under(base):
                raise Broken(f"a killed fork left mounts: {mounts_under(base)}")
            left = [str(p) for p in base.rglob("*") if not p.is_dir()]
            if left:
                raise Broken(f"a killed fork left files: {left[:5]}")

    def check_no_temp(self):
        self.d.stop()
        self.start_checked()
        self.d.stop()
        left = [str(p) for p in self.d.state_dir.rglob("*") if ".tmp" in p.name]
        if left:
            raise Broken(f"temp files survive a second restart: {left[:5]}")


def run_workload(run, until_dead, steps=None):
    """Run the steps; with until_dead, stop at the first step that meets a
    dead daemon. Returns the name of that step (None: it never died).
    steps: a list to append (step name, points it reached) to (traced runs)."""
    for name, step in run.workload():
        mark = len(run.d.log())
        try:
            step()
        except Died:
            return name
        finally:
            if steps is not None:
                steps.append((name, hits(run.d.log()[mark:])))
        if until_dead and run.d.dead():
            return name
    return None


def hits(log):
    return [line.split()[2] for line in log.splitlines() if line.startswith("failpoint hit ")]


def trace(base, backend, short=False):
    """Which points a workload reaches on this backend, step by step, from a
    run that kills nothing."""
    run = Run(base, backend, {"CKPTD_FAILPOINT_TRACE": "1"}, short)
    steps = []
    try:
        died = run_workload(run, False, steps)
        assert died is None, f"the traced run died in step {died}:\n{run.d.log()[-3000:]}"
        run.d.stop()
    finally:
        run.d.cleanup()
    return set(hits(run.d.log())), steps


def later_hits(steps):
    """NAME:N for each later step that reaches a point again: the first hit
    of a shared point (the catalog, a layer's publication) comes early; these
    crash the later operations in it too. NAME:N@K for a step of the Kth
    restart (Run arms only that ckptd)."""
    seen, counts, out, start = set(), {}, [], 0
    for name, reached in steps:
        if name.startswith("adopt"):  # a new ckptd: its hits count from 0
            counts, start = {}, start + 1
        for p in dict.fromkeys(reached):
            if p in seen:
                out.append(f"{p}:{counts.get(p, 0) + 1}" + (f"@{start}" if start else ""))
        seen.update(reached)
        for p in reached:
            counts[p] = counts.get(p, 0) + 1
    return out


def crash_at(base, backend, point, then=None, short=False):
    """Kill ckptd at point, restart (killed again at then, if given), check
    the promises. Returns the points the restart reached."""
    run = Run(base, backend, {"CKPTD_FAILPOINT": point}, short)
    try:
        step = run_workload(run, True)
        if step is None:  # background work still to come
            deadline = time.monotonic() + 10
            while not run.d.dead() and time.monotonic() < deadline:
                time.sleep(0.05)
        log = run.d.log()
        if f"failpoint kill {point.partition(':')[0].partition('@')[0]}\n" not in log:
            raise Broken(f"not reached (died: {run.d.dead()})")
        if run.d.proc is not None:
            run.d.proc.wait(30)
            if run.d.proc.returncode != -9:
                raise Broken(f"exit {run.d.proc.returncode}, not SIGKILL")
        reached = run.restart(then)
        run.check_after_kill()
        run.check_no_temp()
        return reached
    finally:
        run.d.cleanup()


def gvisor_inside(base, points):
    """In runsc do: the short workload traced on gVisor's overlay, then a
    crash at each hit of points (few: each costs about a second here).
    Prints one line RESULT {reached, runs, failures}."""
    reached, steps = trace(base / "trace", "overlay", short=True)
    failures, runs = [], 0
    later = [p for p in later_hits(steps) if p.partition(":")[0] in points]
    for point in sorted(set(points) & reached) + later:
        runs += 1
        try:
            crash_at(base / f"p{runs}", "overlay", point, short=True)
        except (Broken, AssertionError, RuntimeError) as e:
            failures.append(f"gvisor {point}: {e}")
            print(f"failpoint BROKEN: {failures[-1]}", flush=True)
        unmount_all(base / f"p{runs}")
    print("RESULT " + json.dumps({"reached": sorted(reached), "runs": runs, "failures": failures}), flush=True)


def gvisor_pass(points):
    """The gVisor-only points, crashed inside `runsc --network=none do` as
    test_environments.py runs ckptd there: the state dir and the roots on a
    tmpfs of the sandbox (gVisor's overlay backend needs one)."""
    tmp = "/var/tmp/ckptd-fp-gvisor"  # in the sandbox's own root overlay
    inner = (f"mkdir -p {tmp} && mount -t tmpfs tmpfs {tmp} && TMPDIR={tmp} CKPTD_FP_BUILD={FP_BUILD} "
             f"{sys.executable} {pathlib.Path(__file__).resolve()} gvisor {tmp}/fp " + " ".join(points))
    p = subprocess.run(["runsc", "--network=none", "do", "/bin/sh", "-c", inner], capture_output=True,
                       text=True, timeout=1200)
    res = [line for line in p.stdout.splitlines() if line.startswith("RESULT ")]
    assert p.returncode == 0 and res, f"gVisor pass: rc {p.returncode}\n{p.stdout[-3000:]}\n{p.stderr[-2000:]}"
    return json.loads(res[-1][len("RESULT "):])


def test_every_failpoint_is_crash_safe(tmp_path):
    points = fp_build()
    assert len(points) == len(set(points)) and len(points) > 50, points
    t0 = time.monotonic()
    traced = {b: trace(tmp_path / f"trace-{b}", b) for b in ("tar", "overlay")}
    reached = {b: traced[b][0] for b in traced}
    unknown = (reached["tar"] | reached["overlay"]) - set(points)
    assert not unknown, f"hit but not listed: {sorted(unknown)}"
    failures, runs, in_recovery = [], 0, {}

    def one(b, point, then=None):
        nonlocal runs
        runs += 1
        base = tmp_path / b / f"p{runs}"
        try:
            hits = crash_at(base, b, point, then)
        except (Broken, AssertionError, RuntimeError) as e:
            failures.append(f"{b} {point}{' then ' + then if then else ''}: {e} (log: {base / 'ckptd.log'})")
            print(f"failpoint BROKEN: {failures[-1]}", flush=True)
            return set()
        unmount_all(base)
        return hits

    for b in ("tar", "overlay"):
        for point in sorted(reached[b]):
            for h in one(b, point):
                in_recovery.setdefault(h, (b, point))
    # Points only a restart after a crash reaches (finishing an interrupted
    # restore, removing what a half-made create left): a crash there too.
    # host mode's points: test_host_failpoints.py crashes them (two instances, runsc)
    missed = {p for p in points if not p.startswith("host.")} - reached["tar"] - reached["overlay"]
    second = sorted(p for p in missed if p in in_recovery)
    for p in second:
        b, first = in_recovery[p]
        one(b, first, then=p)
    missed -= set(second)
    gvisor = sorted(p for p in missed if p.startswith(GVISOR))
    if gvisor:
        out = gvisor_pass(gvisor)
        runs += out["runs"]
        failures += out["failures"]
        missed -= set(out["reached"])
    # CKPTD_FP_EVERY_STEP=1 (make check-failpoints FP_EVERY_STEP=1): also each
    # later step's first hit of a point reached before (about 500 more crashes).
    every = os.environ.get("CKPTD_FP_EVERY_STEP") == "1"
    for b in ("tar", "overlay") if every else ():
        for point in later_hits(traced[b][1]):
            one(b, point)
    print(f"failpoints: {len(points)} points; the workload reaches {len(reached['tar'])} on tar, "
          f"{len(reached['overlay'])} on overlay, recovery {len(second)} more, gVisor {len(gvisor)}; {runs} crashes "
          f"in {time.monotonic() - t0:.0f} s, {len(failures)} broken", flush=True)
    assert not missed, f"no workload reaches these failpoints: {sorted(missed)}"
    assert not failures, "\n".join(failures)


# Between a create's record temp file and its rename (catalog_write):
# the one syncfs that makes the new layers and the record durable together.
RECORD_SYNC = ["catalog.put.syncfs.before", "catalog.put.syncfs.after", "catalog.put.commit.before"]


def layer_files(d):
    """Each root's layers and their records (l/, rec/), temp ones left out."""
    st = d.state_dir / "overlay" / "r"
    return sorted(str(p.relative_to(st)) for sub in ("l", "rec") for p in st.glob(f"*/{sub}/*")
                  if not p.name.startswith("."))


@pytest.mark.parametrize("point", RECORD_SYNC)
def test_create_killed_at_its_record_sync(point, tmp_path):
    """A delta create killed before its record is renamed: no record is
    listed after the restart, its layers are swept (none is left that
    nothing names), and the next create and restores are exact."""
    fp_build()
    # hit 1 is the first create's (a full layer), hit 2 the delta's; only
    # the first start is armed
    run = Run(tmp_path, "overlay", {"CKPTD_FAILPOINT": f"{point}:2@0"}, short=True)
    d = run.d
    try:
        run.seed()
        run.start_checked()
        first = run.create("first")
        layers = layer_files(d)
        assert layers, "the first create made no layer"
        with pytest.raises(Died):
            run.create("killed")
        assert d.proc.wait(30) == -9 and f"failpoint kill {point}\n" in d.log(), d.log()[-2000:]
        live = run.trees()
        run.restart()
        assert [c["checkpoint_id"] for c in d.list()] == [first]
        assert not [p.name for p in (d.state_dir / "catalog").iterdir() if ".tmp" in p.name]
        assert layer_files(d) == layers  # the killed create's layers and their records swept
        assert run.trees() == live  # the roots keep what was written
        after = run.create("after")
        for cid in (first, after):
            rep = d.restore(cid, verify=True)
            assert rep["ok"] is True and rep["verified"] is True, rep
            assert run.trees() == run.acked[cid], cid
    finally:
        d.cleanup()
        unmount_all(tmp_path)


if __name__ == "__main__":  # one point by hand: test_failpoints.py BACKEND POINT DIR [THEN]
    if sys.argv[1] == "gvisor":  # gvisor_pass's inside: test_failpoints.py gvisor DIR POINT...
        gvisor_inside(pathlib.Path(sys.argv[2]), sys.argv[3:])
        sys.exit(0)
    fp_build()
    reached = crash_at(pathlib.Path(sys.argv[3]), sys.argv[1], sys.argv[2], (sys.argv[4:] or [None])[0])
    print("ok; the restart reached:", " ".join(sorted(reached)))
