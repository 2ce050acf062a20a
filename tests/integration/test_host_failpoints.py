"""Host mode's crash points (docs/failpoints.md): the failpoint build of
ckptd --mode host names a point before and after each durable step of a
sandbox's checkpoints on the shared volume: the volume lock's writes (take,
generation, renewal, waiter, removal), etcd's lock transactions, runsc's
image synced, `latest.{token}`, metadata.json and the plain `latest`
written, old ones pruned, and the image adopted by a restore.

A traced run of one short workload (two instances A and B on one volume:
create and checkpoint, restore and checkpoint twice, a live handoff to B)
says which instance reaches which point; etcd's points come from the same
workload with lock_backend "etcd". Then, one pair of fresh instances per
point, the instance that reaches it dies there (SIGKILL), and:

- no `latest` file names an image that is not whole on the volume;
- the other instance takes the sandbox over: it restores the acknowledged
  state or the one whose checkpoint was under way, never anything else;
- the fence holds: its checkpoint publishes under a token above every
  token the dead instance wrote, and `latest` names that checkpoint too;
- the killed instance, restarted, runs no copy and restores the sandbox
  back (a retry completes); no temp file is left on the volume.

A host point that no run reaches fails the test."""
import json
import pathlib
import shutil
import subprocess
import time

import pytest
import websocket

from test_failpoints import FP_CKPTD, fp_build
from test_host import HostInstance, Sandbox, SandboxError, latest, raw_attach
from test_host_locks import Etcd

HOST = "host."
ETCD = "host.etcd."


class Died(Exception):
    """The armed instance is gone (killed at its point)."""


class Broken(AssertionError):
    pass


def dead(inst):
    return inst.proc is None or inst.proc.poll() is not None


def x_of(sb):
    """The sandbox's x (each checkpoint of the workload holds another)."""
    res = sb.run("python", "print(x)")
    if res.error or res.exit_code != 0:
        raise Broken(f"x not readable: {res.error} {res.stderr}")
    return int(res.stdout)


class Pair:
    """Instances A and B over one volume, driven through the workload; what
    was acknowledged is kept to check after the kill."""

    def __init__(self, base, env_a, env_b, etcd=None):
        base.mkdir(parents=True)
        self.volume = base / "volume"
        self.volume.mkdir()
        cfg = {"lock_backend": "etcd", "etcd_endpoints": [etcd.url]} if etcd else {}
        self.a = HostInstance("A", base, self.volume, **cfg)
        self.b = HostInstance("B", base, self.volume, **cfg)
        for inst, env in ((self.a, env_a), (self.b, env_b)):
            inst.binary, inst.env = FP_CKPTD, env
        self.etcd = etcd
        self.sid = None
        self.acked = None  # x in the last acknowledged checkpoint
        self.pending = None  # x in the checkpoint under way

    def instances(self):
        return (self.a, self.b)

    # ---- the workload ----
    def step_create(self):
        sb = Sandbox._connect(self.a.url + "/create", 60, None)
        try:
            sb.send({"enable_checkpoint": True})
            sb.wait_status("SANDBOX_RUNNING")
        finally:
            self.sid = sb.sandbox_id
        self.checkpoint(sb, 1)

    def checkpoint(self, sb, x):
        assert sb.run("python", f"x = {x}").exit_code == 0
        self.pending = x
        if sb.checkpoint() != 1000:
            raise Broken(f"checkpoint of x = {x} not acknowledged")
        self.acked, self.pending = x, None

    def step_again(self, x):
        sb = Sandbox.attach(self.a.url, self.sid)
        if x_of(sb) != self.acked:
            raise Broken(f"the restore does not hold x = {self.acked}")
        self.checkpoint(sb, x)

    def step_handoff(self):
        """Running on A, attached at B: B waits, A checkpoints and hands over."""
        sb = Sandbox.attach(self.a.url, self.sid)
        assert sb.run("python", "x = 4").exit_code == 0
        sb.close()
        self.pending = 4
        sb2 = raw_attach(self.b.url, self.sid)
        sb2.wait_status("SANDBOX_RUNNING")
        if x_of(sb2) != 4:
            raise Broken("the handoff lost x = 4")
        self.acked, self.pending = 4, None
        sb2.close()

    def workload(self):
        yield "create, checkpoint", self.step_create
        yield "restore, checkpoint", lambda: self.step_again(2)
        yield "restore, checkpoint, prune", lambda: self.step_again(3)
        yield "live handoff", self.step_handoff

    def run(self, armed=None):
        """The steps, up to the one that meets armed dead (None: all)."""
        self.a.start()
        self.b.start()
        for name, step in self.workload():
            try:
                step()
            except (SandboxError, websocket.WebSocketException, OSError, AssertionError) as e:
                if armed is not None and self.wait_dead(armed):
                    return name
                raise Broken(f"step {name}: {e!r}")
            if armed is not None and dead(armed):
                return name
        return None

    def wait_dead(self, inst, timeout=10):
        deadline = time.monotonic() + timeout
        while not dead(inst) and time.monotonic() < deadline:
            time.sleep(0.05)
        return dead(inst)

    # ---- after the kill ----
    def ckdir(self):
        return self.volume / (self.sid or "-") / "checkpoints"

    def check_latest_whole(self):
        """Every latest file names an image runsc finished; the highest
        token that exists, or 0."""
        top = 0
        for p in self.ckdir().glob("latest*") if self.ckdir().exists() else ():
            if ".tmp." in p.name:
                continue
            image = self.ckdir() / p.read_text()
            if not (image / "checkpoint.img").is_file() or (image / "checkpoint.img").stat().st_size == 0:
                raise Broken(f"{p.name} names {image.name}, not a whole image")
            if p.name != "latest":
                top = max(top, int(p.name.split(".")[1]))
        return top

    def lock(self):
        """(owner, token) of the sandbox's lock, or None."""
        if self.etcd:
            return self.etcd.lock(self.sid) if self.sid else None
        p = self.volume / "locks" / f"{self.sid}.lock"
        try:
            lk = json.loads(p.read_text())
        except (OSError, ValueError):
            return None
        return lk["owner"], lk["token"]

    def takeover(self, s, dead_top, dead_token):
        """s takes the sandbox over and checkpoints it again."""
        kept = {v for v in (self.acked, self.pending) if v is not None}
        if not dead_top and not (self.ckdir() / "latest").exists():
            if self.acked is not None:
                raise Broken(f"acknowledged x = {self.acked} lost: no latest on the volume")
            self.acked = None  # nothing was published: a new sandbox
            sb = Sandbox.create(s.url, enable_checkpoint=True)
            self.sid = sb.sandbox_id
            self.checkpoint(sb, 5)
            return
        x = self.attach_checkpoint(s, kept)
        if x not in kept:
            raise Broken(f"the takeover restored x = {x}, not one of {sorted(kept)}")
        image, token = latest(self.volume, self.sid)
        if token < dead_top or token <= dead_token:
            raise Broken(f"{s.name} published under token {token}: the volume had {dead_top}, "
                         f"the killed owner's lock {dead_token}")
        if (self.ckdir() / "latest").read_text() != image:
            raise Broken("the plain latest does not name the newest checkpoint")

    def attach_checkpoint(self, inst, kept):
        """Attach at inst, read x, checkpoint it: x. A waiter the killed
        instance recorded makes the owner hand the sandbox over meanwhile
        (to nobody): the client is told the sandbox is busy or in use, and
        tries again, as a client would."""
        deadline = time.monotonic() + 60  # the handoff's runsc checkpoint takes seconds
        while True:
            try:
                sb = Sandbox.attach(inst.url, self.sid)
                x = x_of(sb)
                if x in kept:
                    self.checkpoint(sb, x)
                return x
            except SandboxError as e:
                if time.monotonic() > deadline or not ("busy" in str(e) or "SANDBOX_IN_USE" in str(e)):
                    raise
                time.sleep(0.5)
            except AssertionError:  # the handoff closed the connection mid-way
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.5)

    def check_after_kill(self, killed):
        other = self.b if killed is self.a else self.a
        killed.killed = True
        killed.proc.wait(30)
        if killed.proc.returncode != -9:
            raise Broken(f"{killed.name} exited {killed.proc.returncode}, not SIGKILL")
        dead_top = self.check_latest_whole()
        lock = self.lock()
        dead_token = lock[1] if lock and lock[0] == killed.name else 0
        killed.env = {}
        killed.start()
        if dead(other):
            other.env = {}
            other.start()
        self.takeover(other, dead_top, dead_token)
        deadline = time.monotonic() + 20  # the reaper removes the killed one's copy
        while killed.containers() and time.monotonic() < deadline:
            time.sleep(0.2)
        if killed.containers():
            raise Broken(f"{killed.name} still runs {killed.containers()} after its restart")
        x = self.attach_checkpoint(killed, {self.acked})  # and back to the restarted one
        if x != self.acked:
            raise Broken(f"the restarted {killed.name} does not restore x = {self.acked}")
        return self.check_no_temp()

    def check_no_temp(self):
        """The sandbox dirs hold no temp file: each write there sweeps them.
        A lock file moved aside (.ID.stale.*) by a killed remover stays in
        locks/: another instance's aside may be in flight there, so nothing
        removes them yet (docs/failpoints.md). They are only counted."""
        left = [str(p.relative_to(self.volume)) for p in self.volume.rglob("*")
                if ".tmp." in p.name and p.parent.name != "locks"]
        if left:
            raise Broken(f"temp files left on the volume: {left}")
        return [p.name for p in (self.volume / "locks").glob(".*")]

    def close(self):
        for inst in self.instances():
            inst.stop()
        for inst in self.instances():
            deadline = time.monotonic() + 20
            while inst.runsc_containers() and time.monotonic() < deadline:
                time.sleep(0.2)
            for c in inst.runsc_containers():
                subprocess.run(["runsc", "--root", str(inst.runsc_root), "delete", "-force", c])


def hits(inst):
    return {line.split()[2] for line in inst.log().splitlines() if line.startswith("failpoint hit host.")}


def trace(base, etcd):
    trace_env = {"CKPTD_FAILPOINT_TRACE": "1"}
    pair = Pair(base, trace_env, trace_env, etcd)
    try:
        pair.run()
        return hits(pair.a), hits(pair.b)
    finally:
        pair.close()


def crash_at(base, point, on_b, etcd):
    """Kill A (or B) at point, restart it, check the promises."""
    armed = {"CKPTD_FAILPOINT": point}
    pair = Pair(base, {} if on_b else armed, armed if on_b else {}, etcd)
    try:
        killed = pair.b if on_b else pair.a
        step = pair.run(killed)
        if step is None:  # background work (a renewal) still to come
            pair.wait_dead(killed)
        if f"failpoint kill {point}\n" not in killed.log():
            raise Broken(f"not reached (died: {dead(killed)})")
        return pair.check_after_kill(killed)
    finally:
        pair.close()


@pytest.fixture(scope="module")
def etcd_server(tmp_path_factory):
    e = Etcd(tmp_path_factory.mktemp("etcd"))
    yield e
    e.stop()


def test_every_host_failpoint_is_crash_safe(tmp_path, etcd_server):
    points = [p for p in fp_build() if p.startswith(HOST)]
    t0 = time.monotonic()
    on_a, on_b = trace(tmp_path / "trace", None)
    etcd_a, etcd_b = trace(tmp_path / "trace-etcd", etcd_server)
    failures, runs, aside = [], 0, {}
    todo = [(p, False, None) for p in sorted(on_a) if not p.startswith(ETCD)]
    todo += [(p, True, None) for p in sorted(on_b - on_a) if not p.startswith(ETCD)]
    todo += [(p, p not in etcd_a, etcd_server) for p in sorted((etcd_a | etcd_b)) if p.startswith(ETCD)]
    for point, b, etcd in todo:
        runs += 1
        base = tmp_path / f"p{runs}"
        try:
            left = crash_at(base, point, b, etcd)
            if left:
                aside[point] = left
        except (Broken, AssertionError, SandboxError, OSError, websocket.WebSocketException) as e:
            failures.append(f"{point} on {'B' if b else 'A'}{' (etcd)' if etcd else ''}: {e} (logs in {base})")
            print(f"host failpoint BROKEN: {failures[-1]}", flush=True)
            continue
        shutil.rmtree(base, ignore_errors=True)
    missed = set(points) - {p for p, _, _ in todo}
    print(f"host failpoints: {len(points)} points, {runs} crashes in {time.monotonic() - t0:.0f} s, "
          f"{len(failures)} broken; lock files left aside in locks/: {aside}", flush=True)
    assert not missed, f"no workload reaches these host failpoints: {sorted(missed)}"
    assert not failures, "\n".join(failures)


if __name__ == "__main__":  # one point by hand: test_host_failpoints.py POINT DIR [a|b] [etcd]
    import sys
    fp_build()
    (pathlib.Path(sys.argv[2]) / "etcd").mkdir(parents=True, exist_ok=True)
    server = Etcd(pathlib.Path(sys.argv[2]) / "etcd") if "etcd" in sys.argv[3:] else None
    try:
        left = crash_at(pathlib.Path(sys.argv[2]) / "run", sys.argv[1], "b" in sys.argv[3:], server)
        print("ok; left in locks/:", left)
    finally:
        if server:
            server.stop()
