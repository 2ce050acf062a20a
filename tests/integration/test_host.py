"""Host mode with real runsc: two ckptd --mode host instances sharing one
checkpoint volume (a temp dir), driven over WebSocket with the example client
library (examples/host/sandbox_client.py)."""
import json
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest
import requests
import websocket

from conftest import CKPTD, TOP, free_port, sanitizer_reports

sys.path.insert(0, str(TOP / "examples" / "host"))
from sandbox_client import Sandbox, SandboxError  # noqa: E402

LOCK_TTL = 3


class HostInstance:
    def __init__(self, name, base, volume, bucket=True, **cfg):
        self.name = name
        self.port = free_port()
        self.url = "ws://127.0.0.1:%d" % self.port
        self.http = "http://127.0.0.1:%d" % self.port
        self.state = base / ("state-" + name)
        self.volume = volume
        self.bucket = bucket
        self.cfg = base / ("cfg-" + name + ".json")
        self.cfg.write_text(json.dumps(dict({"lock_ttl_secs": LOCK_TTL, "lock_renew_secs": 1}, **cfg)))
        self.logf = base / ("log-" + name)
        self.proc = None
        self.killed = False  # by kill9: the one death expected
        self.problems = []
        self.binary, self.env = CKPTD, {}  # test_host_failpoints.py: the failpoint build, armed

    @property
    def runsc_root(self):
        return self.state / "sandboxes" / self.name / "runsc"

    def start(self):
        env = dict(os.environ, **self.env)
        env.pop("SANDBOX_CHECKPOINT_BUCKET", None)
        env.pop("SANDBOX_CHECKPOINT_MOUNT_PATH", None)
        if self.bucket:
            env["SANDBOX_CHECKPOINT_BUCKET"] = "test-bucket"
            env["SANDBOX_CHECKPOINT_MOUNT_PATH"] = str(self.volume)
        with open(self.logf, "ab") as log:
            self.proc = subprocess.Popen(
                [self.binary, "--mode", "host", "--listen", "127.0.0.1:%d" % self.port,
                 "--state-dir", str(self.state), "--instance-id", self.name,
                 "--config", str(self.cfg), "-v"], stdout=log, stderr=log, env=env)
        deadline = time.time() + 20
        while time.time() < deadline:
            assert self.proc.poll() is None, self.log()
            try:
                if requests.get(self.http + "/v1/health", timeout=1).status_code == 200:
                    return self
            except requests.RequestException:
                pass
            time.sleep(0.05)
        raise AssertionError("host instance did not come up:\n" + self.log())

    def health(self):
        return requests.get(self.http + "/v1/health", timeout=5).json()

    def runsc_containers(self):
        out = subprocess.run(["runsc", "--root", str(self.runsc_root), "list", "-quiet"],
                             capture_output=True, text=True)
        return [line for line in out.stdout.split() if line]

    def containers(self):
        """Sandbox ids of our containers (named "{sandbox id}.{instance}")."""
        cids = self.runsc_containers()
        assert all(c.endswith("." + self.name) for c in cids), cids
        return [c[:-len(self.name) - 1] for c in cids]

    def stop(self):
        """SIGTERM: the exit status must be 0 (a leak at exit is 23 under
        LeakSanitizer); what went wrong is kept for the fixture to raise."""
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            rc = self.proc.wait(60)
            if rc != 0:
                self.problems.append("%s exited with %s on SIGTERM" % (self.name, rc))
        elif self.proc and self.proc.returncode < 0 and not self.killed:
            self.problems.append("%s died of signal %d" % (self.name, -self.proc.returncode))

    def kill9(self):
        self.killed = True  # the expected death
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def log(self):
        return self.logf.read_text(errors="replace") if self.logf.exists() else ""


@pytest.fixture
def hosts(tmp_path):
    volume = tmp_path / "volume"
    volume.mkdir()
    made = []

    def make(name, bucket=True, mount=None, **cfg):
        h = HostInstance(name, tmp_path, mount or volume, bucket, **cfg).start()
        made.append(h)
        return h

    make.volume = volume
    yield make
    for h in made:
        h.stop()
    for h in made:  # nothing may outlive its instance (the reaper's job after kill -9)
        deadline = time.time() + 20
        while h.runsc_containers() and time.time() < deadline:
            time.sleep(0.2)
        left = h.runsc_containers()
        for c in left:
            subprocess.run(["runsc", "--root", str(h.runsc_root), "delete", "-force", c])
        assert not left, "containers left behind by %s: %s" % (h.name, left)
        assert not h.problems, "\n".join(h.problems) + "\n" + h.log()[-4000:]
        found = sanitizer_reports(h.log())
        assert not found, "\n---\n".join(found)


class FuseVolume:
    """tests/integration/fusefs.py mounted over a backing dir: a volume that can
    stall (freeze), lack link(), or lack allow_other."""

    def __init__(self, backing, mnt, *flags):
        self.mnt = pathlib.Path(mnt)
        self.mnt.mkdir(parents=True, exist_ok=True)
        self.freeze_file = pathlib.Path(str(mnt) + ".frozen")
        self.proc = subprocess.Popen(["/usr/bin/python3", str(pathlib.Path(__file__).parent / "fusefs.py"),
                                      str(backing), str(mnt), "--freeze-file", str(self.freeze_file)] + list(flags))
        deadline = time.time() + 10
        while not os.path.ismount(mnt):
            assert self.proc.poll() is None and time.time() < deadline, "fusefs did not mount"
            time.sleep(0.05)

    def freeze(self):
        self.freeze_file.touch()

    def thaw(self):
        self.freeze_file.unlink(missing_ok=True)

    def stop(self):
        self.thaw()
        subprocess.run(["umount", "-l", str(self.mnt)])
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


@pytest.fixture
def fuse(tmp_path):
    made = []

    def mount(name, *flags):
        v = FuseVolume(tmp_path / "volume", tmp_path / ("fuse-" + name), *flags)
        made.append(v)
        return v

    yield mount
    for v in made:
        v.stop()


def drained(inst, timeout=20):
    """True once inst runs no sandbox and no container. The old owner releases
    the lock before `runsc delete`, so the new owner may be running first."""
    deadline = time.time() + timeout
    while (inst.health()["sandboxes"] or inst.containers()) and time.time() < deadline:
        time.sleep(0.1)
    return inst.health()["sandboxes"] == 0 and inst.containers() == []


def latest(volume, sid):
    """The image the newest `latest.{token}` names, and that token."""
    ckdir = volume / sid / "checkpoints"
    tokens = [int(p.name.split(".")[1]) for p in ckdir.glob("latest.*")]
    assert tokens, list(ckdir.iterdir())
    return (ckdir / ("latest.%d" % max(tokens))).read_text(), max(tokens)


def events_until_close(sb, limit=50):
    out = []
    for _ in range(limit):
        ev = sb.recv_event()
        if ev is None:
            break
        out.append(ev)
    return out


def statuses(evs):
    return [e["status"] for e in evs if e.get("event") == "status_update"]


def errors(evs):
    return [e["message"] for e in evs if e.get("event") == "error"]


def raw_attach(url, sandbox_id):
    sb = Sandbox(websocket.create_connection(url + "/attach/" + sandbox_id, timeout=60))
    sb.sandbox_id = sandbox_id
    return sb


def checkpointed(inst, code="x = 41"):
    """A checkpoint-enabled sandbox with `code` run, checkpointed: its id."""
    sb = Sandbox.create(inst.url, enable_checkpoint=True)
    assert sb.run("python", code).exit_code == 0
    assert sb.checkpoint() == 1000
    return sb.sandbox_id


def test_create_execute_stream(hosts):
    a = hosts("A")
    sb = Sandbox.create(a.url, idle_timeout=60)
    assert sb.statuses == ["SANDBOX_CREATING", "SANDBOX_RUNNING"]
    assert sb.sandbox_id and sb.events[1] == {"event": "sandbox_id", "sandbox_id": sb.sandbox_id}

    # output streams as it is produced: the first line arrives long before the end
    seen = []
    t0 = time.time()
    res = sb.run("python", "import time\nprint('first', flush=True)\ntime.sleep(1.5)\nprint('second')",
                 on_output=lambda k, d: seen.append((time.time() - t0, d)))
    assert res.stdout == "first\nsecond\n" and res.exit_code == 0
    assert seen[0][1].startswith("first") and seen[-1][0] - seen[0][0] > 1.0
    assert [e["event"] for e in res.events][0] == "status_update"

    res = sb.run("bash", "echo world; echo oops >&2; exit 3")
    assert (res.stdout, res.stderr, res.exit_code) == ("world\n", "oops\n", 3)
    res = sb.run("python", "import subprocess; subprocess.run(['echo', 'child']); 1/0")
    assert res.stdout == "child\n" and "ZeroDivisionError" in res.stderr and res.exit_code == 1
    res = sb.run("python", "print('é\\u00e9 ✓')")
    assert res.stdout == "éé ✓\n"
    res = sb.run("ruby", "puts 1")
    assert res.error == "SANDBOX_EXECUTION_ERROR" and "unsupported language" in res.message

    # one execution at a time
    sb.send({"language": "bash", "code": "sleep 1; echo done"})
    sb.send({"language": "bash", "code": "echo second"})
    evs = []
    while not evs or evs[-1].get("status") != "SANDBOX_EXECUTION_DONE":
        evs.append(sb.recv_event())
    assert statuses(evs) == ["SANDBOX_EXECUTION_RUNNING", "SANDBOX_EXECUTION_ERROR", "SANDBOX_EXECUTION_DONE"]
    assert errors(evs) and "".join(e.get("data", "") for e in evs) == "done\n"

    # one client per sandbox
    other = raw_attach(a.url, sb.sandbox_id)
    evs = events_until_close(other)
    assert statuses(evs) == ["SANDBOX_IN_USE"] and other.close_code == 4000
    # the owner's session is unaffected
    assert sb.run("python", "print(6 * 7)").stdout == "42\n"
    assert a.health()["sandboxes"] == 1

    # a sandbox without checkpointing: checkpoint fails and closes with 4000
    sb.send({"action": "checkpoint"})
    evs = events_until_close(sb)
    assert statuses(evs) == ["SANDBOX_CHECKPOINTING", "SANDBOX_CHECKPOINT_ERROR"] and sb.close_code == 4000

    # reattach after the client left: same process, same globals
    sb2 = Sandbox.attach(a.url, sb.sandbox_id)
    assert sb2.statuses == ["SANDBOX_RUNNING"]
    sb2.close()


def test_no_bucket_and_unknown_sandbox(hosts):
    a = hosts("A", bucket=False)
    with pytest.raises(SandboxError) as e:
        Sandbox.create(a.url, enable_checkpoint=True)
    assert e.value.status == "SANDBOX_CREATION_ERROR" and e.value.close_code == 4000
    assert "SANDBOX_CHECKPOINT_BUCKET" in e.value.message
    # an unknown sandbox: RESTORING, then NOT_FOUND and 1011
    for inst in (a, hosts("B")):
        sb = raw_attach(inst.url, "sandbox-doesnotexist")
        evs = events_until_close(sb)
        assert statuses(evs) == ["SANDBOX_RESTORING", "SANDBOX_NOT_FOUND"] and sb.close_code == 1011
    # a bad first message
    sb = Sandbox(websocket.create_connection(a.url + "/create", timeout=30))
    sb.ws.send("not json")
    evs = events_until_close(sb)
    assert statuses(evs) == ["SANDBOX_CREATION_ERROR"] and sb.close_code == 4000
    # plain HTTP on a WebSocket route
    assert requests.get(a.http + "/create", timeout=5).status_code == 400


def test_checkpoint_then_restore_on_other_instance(hosts):
    a, b = hosts("A"), hosts("B")
    sb = Sandbox.create(a.url, idle_timeout=120, enable_checkpoint=True)
    assert sb.run("python", "x = 41\nimport os\nopen('/root/note', 'w').write('kept')").exit_code == 0

    # checkpoint during an execution: refused, the connection and the output go on
    sb.send({"language": "python", "code": "import time; time.sleep(1.5); print('still here')"})
    assert sb.recv_event()["status"] == "SANDBOX_EXECUTION_RUNNING"
    sb.send({"action": "checkpoint"})
    evs = []
    while not evs or evs[-1].get("status") != "SANDBOX_EXECUTION_DONE":
        evs.append(sb.recv_event())
    assert statuses(evs) == ["SANDBOX_CHECKPOINTING", "SANDBOX_EXECUTION_IN_PROGRESS_ERROR",
                             "SANDBOX_EXECUTION_DONE"]
    assert errors(evs) == ["Cannot checkpoint while an execution is in progress."]
    assert "".join(e.get("data", "") for e in evs) == "still here\n"

    t0 = time.time()
    assert sb.checkpoint() == 1000
    ckpt_s = time.time() - t0
    assert sb.statuses[-2:] == ["SANDBOX_CHECKPOINTING", "SANDBOX_CHECKPOINTED"]
    vol = hosts.volume / sb.sandbox_id
    image, token = latest(hosts.volume, sb.sandbox_id)
    assert image.startswith("checkpoint_") and (vol / "checkpoints" / image / "checkpoint.img").exists()
    meta = json.loads((vol / "metadata.json").read_text())
    assert meta["idle_timeout"] == 120 and meta["runsc_version"] == a.health()["runsc_version"]
    assert meta["cpu_features"] and meta["created_at"].endswith("Z") and meta["latest"] == image
    assert meta["token"] == token
    # the seed's plain `latest` names the same image, for readers that know no tokens
    assert (vol / "checkpoints" / "latest").read_text() == image
    assert not (hosts.volume / "locks" / (sb.sandbox_id + ".lock")).exists()
    assert a.health()["sandboxes"] == 0 and a.containers() == []

    t0 = time.time()
    sb2 = Sandbox.attach(b.url, sb.sandbox_id)
    restore_s = time.time() - t0
    assert sb2.statuses == ["SANDBOX_RESTORING", "SANDBOX_RUNNING"]
    assert sb2.run("python", "print(x + 1)").stdout == "42\n"
    assert sb2.run("bash", "cat /root/note").stdout == "kept"
    lock = json.loads((hosts.volume / "locks" / (sb.sandbox_id + ".lock")).read_text())
    assert lock["owner"] == "B" and isinstance(lock["timestamp"], int) and lock["token"] > token
    print("checkpoint %.2fs, restore on the other instance %.2fs" % (ckpt_s, restore_s))
    # the next checkpoint (B's) moves `latest` on with the highest token; no temp file stays
    assert sb2.checkpoint() == 1000
    image2, token2 = latest(hosts.volume, sb.sandbox_id)
    assert token2 > token and image2 != image
    assert (vol / "checkpoints" / "latest").read_text() == image2
    assert not [p.name for p in (vol / "checkpoints").iterdir() if ".tmp." in p.name]


def test_live_handoff(hosts):
    a, b = hosts("A"), hosts("B")
    sb = Sandbox.create(a.url, enable_checkpoint=True)
    assert sb.run("python", "counter = 7").exit_code == 0
    sid = sb.sandbox_id
    lock = json.loads((hosts.volume / "locks" / (sid + ".lock")).read_text())
    assert lock["owner"] == "A"
    sb.close()

    # B answers RESTORING at once, waits as the lock's waiter; A hands over
    t0 = time.time()
    sb2 = raw_attach(b.url, sid)
    first = sb2.recv_event()
    assert first == {"event": "status_update", "status": "SANDBOX_RESTORING"}
    sb2.wait_status("SANDBOX_RUNNING")
    handoff_s = time.time() - t0
    assert handoff_s < LOCK_TTL + 5
    assert sb2.run("python", "counter += 1; print(counter)").stdout == "8\n"
    assert drained(a)
    assert b.containers() == [sid]
    lock = json.loads((hosts.volume / "locks" / (sid + ".lock")).read_text())
    assert lock["owner"] == "B" and "waiter" not in lock
    print("live handoff A->B %.2fs" % handoff_s)

    # and back again, from B to A
    sb2.close()
    sb3 = Sandbox.attach(a.url, sid)
    assert sb3.run("python", "print(counter)").stdout == "8\n"
    assert drained(b)
    # a third checkpoint: only the newest two images are kept
    assert sb3.checkpoint() == 1000
    ckdir = hosts.volume / sid / "checkpoints"
    images = sorted(p.name for p in ckdir.iterdir() if p.name.startswith("checkpoint_"))
    assert len(images) == 2 and latest(hosts.volume, sid)[0] == images[-1]


def test_kill9_owner_then_takeover(hosts):
    a, b = hosts("A"), hosts("B")
    sid = checkpointed(a, "x = 41")
    sb = Sandbox.attach(a.url, sid)            # running on A again, A holds the lock
    assert sb.run("python", "y = 'lost with A'; print(x)").stdout == "41\n"
    sb.close()
    a.kill9()
    # the reaper removes A's container: no second running copy
    deadline = time.time() + 20
    while a.containers() and time.time() < deadline:
        time.sleep(0.2)
    assert a.containers() == []

    t0 = time.time()
    sb2 = Sandbox.attach(b.url, sid)
    took = time.time() - t0
    assert sb2.statuses == ["SANDBOX_RESTORING", "SANDBOX_RUNNING"]
    res = sb2.run("python", "print(x)\nprint('y' in globals())")
    assert res.stdout == "41\nFalse\n"   # from the latest checkpoint
    lock = json.loads((hosts.volume / "locks" / (sid + ".lock")).read_text())
    assert lock["owner"] == "B"
    print("takeover after kill -9 took %.2fs (lock ttl %ds)" % (took, LOCK_TTL))
    # what A would leave if killed while writing; the new owner's writes sweep it
    torn = [hosts.volume / sid / ".metadata.json.tmp.0badcafe",
            hosts.volume / sid / "checkpoints" / ".latest.tmp.12345678"]
    for p in torn:
        p.write_text("{torn")
    assert sb2.checkpoint() == 1000
    assert [p for p in torn if p.exists()] == []
    sb2.close()


def slow_runsc(tmp_path, verb):
    """A runsc_path wrapper: once armed, the next `runsc VERB` (run or
    restore) marks that it started, waits, runs runsc, and marks its end."""
    arm, mark, done = tmp_path / "arm", tmp_path / "mark", tmp_path / "done"
    wrapper, runsc = tmp_path / "slow-runsc", shutil.which("runsc")
    wrapper.write_text(
        "#!/bin/sh\n"
        f'case " $* " in *" {verb} "*) if rm "{arm}" 2>/dev/null; then\n'
        f'  : > "{mark}"; sleep 4; "{runsc}" "$@"; rc=$?; : > "{done}"; exit $rc\n'
        "fi;; esac\n"
        f'exec "{runsc}" "$@"\n')
    wrapper.chmod(0o755)
    return wrapper, arm, mark, done


@pytest.mark.parametrize("verb", ["run", "restore"])
def test_kill9_while_runsc_creates(hosts, tmp_path, verb):
    # ckptd dies while its `runsc run` (or restore) still creates the
    # container: the orphan finishes later, and its container must not outlive
    # the dead instance; the restarted instance reuses the container id
    # ("{sandbox}.A") and no late delete of the old reaper may hit it.
    wrapper, arm, mark, done = slow_runsc(tmp_path, verb)
    a = hosts("A", runsc_path=str(wrapper))
    sid = checkpointed(a, "x = 41") if verb == "restore" else None
    if sid:  # the client is gone: the sandbox stops, the next attach restores it
        deadline = time.time() + 20
        while a.containers() and time.time() < deadline:
            time.sleep(0.2)
    arm.write_text("")
    ws = websocket.create_connection(a.url + ("/attach/" + sid if sid else "/create"), timeout=60)
    if not sid:
        ws.send(json.dumps({"enable_checkpoint": True}))
    deadline = time.time() + 30
    while not mark.exists() and time.time() < deadline:
        time.sleep(0.05)
    assert mark.exists(), "runsc %s never started" % verb
    a.kill9()
    ws.close()
    a.start()  # waits for the old reaper, which waits for the orphaned runsc
    deadline = time.time() + 60
    while not done.exists() and time.time() < deadline:
        time.sleep(0.1)
    assert done.exists(), "the orphaned runsc %s never ended" % verb
    deadline = time.time() + 20
    while a.containers() and time.time() < deadline:
        time.sleep(0.2)
    assert a.containers() == [], "a container of the dead instance outlived it"
    if sid:  # the same container id again, on the restarted instance
        sb = Sandbox.attach(a.url, sid)
        assert a.containers() == [sid]
        time.sleep(3)  # an old reaper still at work would remove it by now
        assert a.containers() == [sid]
        assert sb.run("python", "print(x)").stdout == "41\n"
        sb.close()


def test_restore_errors(hosts):
    a, b = hosts("A"), hosts("B")
    sid = checkpointed(a)
    meta_path = hosts.volume / sid / "metadata.json"
    meta = json.loads(meta_path.read_text())

    def attach_fails(expect):
        sb = raw_attach(b.url, sid)
        evs = events_until_close(sb)
        assert statuses(evs) == ["SANDBOX_RESTORING", "SANDBOX_RESTORE_ERROR"], evs
        assert sb.close_code == 4000
        assert not (hosts.volume / "locks" / (sid + ".lock")).exists()
        assert b.containers() == []
        msg = errors(evs)[0]
        for word in expect:
            assert word in msg, msg
        return msg

    meta_path.write_text(json.dumps(dict(meta, runsc_version="0.0~19990101.0")))
    attach_fails(["0.0~19990101.0", meta["runsc_version"]])

    meta_path.write_text(json.dumps(dict(meta, cpu_features=meta["cpu_features"] + ["fakefeat1", "fakefeat2"])))
    attach_fails(["fakefeat1", "fakefeat2"])

    meta_path.write_text(json.dumps(meta))
    img = hosts.volume / sid / "checkpoints" / meta["latest"] / "checkpoint.img"
    good = img.read_bytes()
    img.write_bytes(b"garbage" * 1000)
    msg = attach_fails(["runsc restore"])
    # the client gets a short reason; the log has runsc's message and its log file
    assert len(msg) < 300, msg
    logged = [line for line in b.log().splitlines() if "restore failed" in line]
    assert logged and "runsc log '%s/logs/%s.log'" % (b.state / "sandboxes" / "B", sid) in logged[-1], b.log()
    assert (b.state / "sandboxes" / "B" / "logs" / (sid + ".log")).exists()

    img.write_bytes(good)
    sb = Sandbox.attach(b.url, sid)
    assert sb.run("python", "print(x)").stdout == "41\n"
    sb.close()


def test_idle_timeout(hosts):
    a = hosts("A")
    keep = Sandbox.create(a.url, idle_timeout=1, enable_checkpoint=True)
    assert keep.run("python", "z = 'idle'").exit_code == 0
    gone = Sandbox.create(a.url, idle_timeout=1)
    keep.close()
    gone.close()
    deadline = time.time() + 90  # two checkpoints on a loaded machine
    while a.health()["sandboxes"] and time.time() < deadline:
        time.sleep(0.2)
    assert a.health()["sandboxes"] == 0 and a.containers() == []
    # checkpointed and released: attach restores it; the other was destroyed
    assert latest(hosts.volume, keep.sandbox_id)[0].startswith("checkpoint_")
    sb = Sandbox.attach(a.url, keep.sandbox_id)
    assert sb.run("python", "print(z)").stdout == "idle\n"
    sb.close()
    sb = raw_attach(a.url, gone.sandbox_id)
    evs = events_until_close(sb)
    assert statuses(evs) == ["SANDBOX_RESTORING", "SANDBOX_NOT_FOUND"] and sb.close_code == 1011


def test_handoff_while_a_client_is_still_attached(hosts):
    # an affinity miss: the old connection to A looks alive, the client reconnects to B
    a, b = hosts("A"), hosts("B")
    old = Sandbox.create(a.url, enable_checkpoint=True)
    assert old.run("python", "v = 'moved'").exit_code == 0
    new = Sandbox.attach(b.url, old.sandbox_id)
    assert new.statuses == ["SANDBOX_RESTORING", "SANDBOX_RUNNING"]
    evs = events_until_close(old)
    assert statuses(evs) == ["SANDBOX_CHECKPOINTED"] and old.close_code == 1000
    assert new.run("python", "print(v)").stdout == "moved\n"
    assert drained(a) and b.containers() == [old.sandbox_id]
    new.close()


def test_two_instances_on_one_machine(hosts, tmp_path):
    # Another runsc on this machine runs a container named after the sandbox
    # (what an older instance did): runsc names its control socket after the
    # container id, so B's restore would fail with "address already in use".
    a, b = hosts("A"), hosts("B")
    sid = checkpointed(a, "x = 5")
    root, bundle = tmp_path / "other-root", tmp_path / "other-bundle"
    bundle.mkdir()
    (bundle / "config.json").write_text(json.dumps({
        "ociVersion": "1.0.2", "process": {"user": {"uid": 0, "gid": 0}, "args": ["/bin/sleep", "600"],
                                           "env": ["PATH=/usr/bin:/bin"], "cwd": "/"},
        "root": {"path": "/", "readonly": False}, "hostname": "other",
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "linux": {"namespaces": [{"type": t} for t in ("pid", "network", "ipc", "uts", "mount")]}}))
    other = ["runsc", "--root", str(root), "--overlay", "--network=none"]
    subprocess.run(other + ["run", "-detach", "-bundle", str(bundle), sid], check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        sb = Sandbox.attach(b.url, sid)
        assert sb.run("python", "print(x)").stdout == "5\n"
        assert b.runsc_containers() == [sid + ".B"]
        sb.close()
        # and back to A while B's container is still being deleted: no clash either
        sb = Sandbox.attach(a.url, sid)
        assert sb.run("python", "print(x + 1)").stdout == "6\n"
        sb.close()
    finally:
        subprocess.run(other + ["delete", "-force", sid])


def test_start_sweeps_locks_a_killed_remover_left_aside(hosts):
    """A remover moves a lock aside (.ID.stale.HEX) before it removes it or
    puts it back. Killed in between, it left the file for good. A start
    removes those no owner has written for twice the lock's ttl + margin,
    and keeps a young one (its remover may still be at work)."""
    locks = hosts.volume / "locks"
    locks.mkdir()
    old = locks / ".sandbox-0a1b2c3d4e5f60718293a4b5.stale.0123456789abcdef"
    young = locks / ".sandbox-0a1b2c3d4e5f60718293a4b6.stale.fedcba9876543210"
    other = locks / ".sandbox-0a1b2c3d4e5f60718293a4b7.stale.not-hex-at-all!"
    for f in (old, young, other):
        f.write_text('{"owner": "gone", "timestamp": 1, "token": 1}')
    hour_ago = time.time() - 3600
    for f in (old, other):
        os.utime(f, (hour_ago, hour_ago))
    a = hosts("A")
    assert not old.exists(), a.log()
    assert young.exists() and other.exists()
    assert "removed 1 lock file(s) a killed remover left aside" in a.log()


def test_fuse_volume_without_allow_other(fuse, hosts):
    fa, fb = fuse("A"), fuse("B")
    a, b = hosts("A", mount=fa.mnt), hosts("B", mount=fb.mnt)
    # found at start, from the mount's options: said in health and the log
    problem = b.health()["checkpoint_volume_problem"]
    assert "allow_other" in problem and str(fb.mnt) in problem, problem
    assert "mounted without allow_other" in b.log()
    sid = checkpointed(a, "x = 3")
    sb = raw_attach(b.url, sid)
    evs = events_until_close(sb)
    assert statuses(evs) == ["SANDBOX_RESTORING", "SANDBOX_RESTORE_ERROR"], evs
    assert "allow_other" in errors(evs)[0], errors(evs)
    # the same volume mounted with allow_other restores
    fc = fuse("C", "--allow-other")
    c = hosts("C", mount=fc.mnt)
    assert c.health()["checkpoint_volume_problem"] is None
    assert hosts("D").health()["checkpoint_volume_problem"] is None   # not FUSE at all
    sb = Sandbox.attach(c.url, sid)
    assert sb.run("python", "print(x)").stdout == "3\n"
    sb.close()


def checkpointed_then_running(a):
    """A sandbox on a whose checkpoint has n = 1 and whose live copy has n = 2."""
    sid = checkpointed(a, "n = 1")
    sb = Sandbox.attach(a.url, sid)
    assert sb.run("python", "n = 2").exit_code == 0
    return sid, sb


def test_lock_probe_on_a_volume_without_link(fuse, hosts):
    # a bucket-like volume: no link(); O_EXCL still refuses a second create
    fa, fb = fuse("A", "--allow-other", "--no-link"), fuse("B", "--allow-other", "--no-link")
    a, b = hosts("A", mount=fa.mnt), hosts("B", mount=fb.mnt)
    assert a.health()["lock_method"] == "excl" and a.health()["checkpointing"] is True
    sb = Sandbox.create(a.url, enable_checkpoint=True)
    assert sb.run("python", "x = 'no link'").exit_code == 0
    lock = json.loads((hosts.volume / "locks" / (sb.sandbox_id + ".lock")).read_text())
    assert lock["owner"] == "A" and lock["token"] >= 1
    sb2 = Sandbox.attach(b.url, sb.sandbox_id)   # live handoff through O_EXCL locks
    assert sb2.run("python", "print(x)").stdout == "no link\n"
    sb2.close()
    # no rename() over an existing file: lock updates cannot be atomic, so
    # checkpointing is refused at start, with the reason
    fc = fuse("C", "--allow-other", "--no-rename-over")
    c = hosts("C", mount=fc.mnt)
    h = c.health()
    assert h["lock_method"] == "none" and h["checkpointing"] is False
    assert "rename" in h["checkpointing_refused"] and "checkpointing refused" in c.log()
    with pytest.raises(SandboxError) as e:
        Sandbox.create(c.url, enable_checkpoint=True)
    assert e.value.status == "SANDBOX_CREATION_ERROR" and "no safe lock method" in e.value.message
    assert Sandbox.create(c.url).run("bash", "echo ok").stdout == "ok\n"  # sandboxes still run


def test_owner_stops_by_its_clock_when_the_volume_stalls(fuse, hosts):
    # A's volume freezes: its renewals block. A must stop executing by its own
    # clock (lease = ttl after its last renewal) while the volume is still
    # frozen; B takes over after ttl + margin; nothing A finishes later counts.
    fa = fuse("A", "--allow-other")
    a, b = hosts("A", mount=fa.mnt), hosts("B")
    margin = a.health()["lock_margin_secs"]
    sid, sb = checkpointed_then_running(a)
    # a long execution that ticks: it must stop when A's lease ends
    ticks = []
    sb.send({"language": "python", "code": "import time\nfor i in range(600):\n print(i, flush=True); time.sleep(0.1)"})
    assert sb.recv_event()["status"] == "SANDBOX_EXECUTION_RUNNING"
    try:
        fa.freeze()
        frozen_at = time.time()
        while True:
            ev = sb.recv_event()
            if ev is None or ev.get("event") != "stdout":
                break
            ticks.append(time.time())
        stopped_after = ticks[-1] - frozen_at
        assert stopped_after < LOCK_TTL + 1.5, stopped_after
        deadline = time.time() + 5
        while a.runsc_containers() and time.time() < deadline:
            time.sleep(0.1)
        state = subprocess.run(["runsc", "--root", str(a.runsc_root), "list"], capture_output=True, text=True)
        assert a.runsc_containers() == [], state.stdout  # gone while the volume is still frozen
        # the client was told: no CHECKPOINTED, no silent success
        # B takes over (ttl + margin after A's last renewal) and restores n = 1
        t0 = time.time()
        sb2 = Sandbox.attach(b.url, sid)
        took = time.time() - frozen_at
        assert took >= LOCK_TTL + margin - 1.5, took
        assert sb2.run("python", "print(n)").stdout == "1\n"
        lock = json.loads((hosts.volume / "locks" / (sid + ".lock")).read_text())
        assert lock["owner"] == "B"
        print("A stopped %.2fs after the freeze; B running %.2fs after it (restore %.2fs)"
              % (stopped_after, took, time.time() - t0))
    finally:
        fa.thaw()
    # A's stalled renewal finds the lock taken; nothing of A becomes latest
    assert drained(a)
    image, token = latest(hosts.volume, sid)
    assert token == lock["token"]
    assert "lease lost" in a.log()
    assert sb2.run("python", "n += 1; print(n)").stdout == "2\n"
    sb2.close()


def test_checkpoint_under_a_lost_lease_is_not_acknowledged(fuse, hosts):
    fa = fuse("A", "--allow-other")
    a, b = hosts("A", mount=fa.mnt), hosts("B")
    sid, sb = checkpointed_then_running(a)
    try:
        fa.freeze()
        sb.send({"action": "checkpoint"})        # blocks on the frozen volume
        sb2 = Sandbox.attach(b.url, sid)          # B takes over meanwhile
        assert sb2.run("python", "print(n)").stdout == "1\n"
    finally:
        fa.thaw()
    evs = events_until_close(sb)
    assert "SANDBOX_CHECKPOINTED" not in statuses(evs), evs
    assert statuses(evs)[-1] == "SANDBOX_CHECKPOINT_ERROR" and sb.close_code == 4000, evs
    assert any("lost ownership" in m for m in errors(evs)), evs
    image, token = latest(hosts.volume, sid)
    # A's renewal, blocked on the frozen volume, may land after the thaw and
    # rewrite the lock with A's older token; B puts its own back when it next
    # looks (clobbered_by_older), so the lock names B's generation again
    # within a renewal period, and A, stopping, leaves it alone (its release
    # removes only its own generation). A never writes latest: the newest is B's.
    lock = hosts.volume / "locks" / (sid + ".lock")

    def lock_token():  # None while a rename through FUSE has the name aside
        try:
            return json.loads(lock.read_text())["token"]
        except FileNotFoundError:
            return None

    deadline = time.time() + 3 * LOCK_TTL
    while lock_token() != token and time.time() < deadline:
        time.sleep(0.1)
    assert lock_token() == token, (a.log(), b.log())
    assert latest(hosts.volume, sid) == (image, token)
    out = sb2.run("python", "print(n)")
    if out.stdout != "1\n":
        print("A:", a.log(), "B:", b.log(), "run:", vars(out), sep="\n")
    assert out.stdout == "1\n"
    assert "lease lost" not in b.log()   # B kept its sandbox throughout
    sb2.close()


def test_sigterm_does_not_hang_on_a_frozen_volume(fuse, hosts):
    # Shutdown checkpoints the sandboxes; on a frozen volume it gives up after
    # no progress for ttl + margin + 5 s, says what it abandoned, and lets the
    # reaper remove the containers. The process itself can only exit once the
    # FUSE daemon answers: Linux waits uninterruptibly for a FUSE request
    # already handed to the daemon (systemd's SIGKILL cannot end it either).
    fa = fuse("A", "--allow-other")
    a, b = hosts("A", mount=fa.mnt), hosts("B")
    margin = a.health()["lock_margin_secs"]
    sid, sb = checkpointed_then_running(a)
    try:
        fa.freeze()
        t0 = time.time()
        a.proc.send_signal(signal.SIGTERM)
        while "abandoned" not in a.log() and time.time() - t0 < 2 * (LOCK_TTL + margin + 5) + 10:
            time.sleep(0.2)
        took = time.time() - t0
        assert "abandoned" in a.log() and sid in a.log().split("abandoned")[0][-300:], a.log()
        # killed at the lease's end by the watchdog (pidfd): no longer running,
        # whatever the volume does. Removing it (`runsc delete`, by the watchdog
        # or by the reaper once ckptd closes its pipe) can wait on the frozen
        # volume: seen listed as stopped until the thaw.
        deadline = time.time() + LOCK_TTL + margin + 5
        while running(a) and time.time() < deadline:
            time.sleep(0.2)
        assert running(a) == set(), a.log()
        print("SIGTERM with a frozen volume: gave up on the volume after %.1fs" % took)
    finally:
        fa.thaw()
    a.proc.wait(20)   # and exits once the volume answers
    deadline = time.time() + 20
    while a.runsc_containers() and time.time() < deadline:
        time.sleep(0.2)
    assert a.runsc_containers() == [], a.log()   # removed once the volume answers
    sb2 = Sandbox.attach(b.url, sid)
    assert sb2.run("python", "print(n)").stdout == "1\n"
    sb2.close()


def running(inst):
    out = subprocess.run(["runsc", "--root", str(inst.runsc_root), "list", "-format=json"],
                         capture_output=True, text=True).stdout
    return {c["id"].rsplit(".", 1)[0] for c in json.loads(out or "[]") or [] if c.get("status") == "running"}


# The stall rounds (volume and etcd locks, with kill -9) are in test_host_locks.py.
