"""Host mode's lock backends with real parts: a real etcd (Debian's
etcd-server) for lock_backend "etcd", reached by each instance through a TCP
proxy the test can freeze (a network stall of one instance only), and the
FUSE pass-through volume of test_host.py, which can freeze too.

The soak (racing rounds of stalls and kill -9, for both backends) runs
CKPTD_SOAK_ROUNDS rounds: 3 in `make check`, 50 in `make check-host`."""
import base64
import json
import os
import select
import signal
import socket
import statistics
import subprocess
import threading
import time

import pytest
import requests

from conftest import free_port
from test_host import (LOCK_TTL, Sandbox, checkpointed, checkpointed_then_running, drained, errors,  # noqa: F401
                       events_until_close, fuse, hosts, latest, raw_attach, running, statuses)

SOAK_ROUNDS = int(os.environ.get("CKPTD_SOAK_ROUNDS", "3"))


class Etcd:
    """Debian's etcd on loopback. tls: {"ca", "cert", "key"} serves https
    (and "client": (cert, key) for the test's own requests); args: more flags,
    e.g. --client-cert-auth. The test talks to it through self.http."""

    def __init__(self, tmp, tls=None, args=()):
        self.port, peer = free_port(), free_port()
        self.url = "%s://127.0.0.1:%d" % ("https" if tls else "http", self.port)
        peer_url = "http://127.0.0.1:%d" % peer
        self.http = requests.Session()
        self.http.trust_env = False  # REQUESTS_CA_BUNDLE would replace our CA
        self.argv = ["etcd", "--data-dir", str(tmp / "etcd-data"), "--listen-client-urls", self.url,
                     "--advertise-client-urls", self.url, "--listen-peer-urls", peer_url,
                     "--initial-advertise-peer-urls", peer_url, "--initial-cluster", "default=" + peer_url]
        if tls:
            self.argv += ["--cert-file", tls["cert"], "--key-file", tls["key"]]
            self.http.verify, self.http.cert = tls["ca"], tls.get("client")
        self.argv += list(args)
        self.logf = open(tmp / "etcd.log", "ab")
        self.start()

    def start(self):
        self.proc = subprocess.Popen(self.argv, stdout=self.logf, stderr=self.logf)
        deadline = time.time() + 20
        while True:
            assert self.proc.poll() is None and time.time() < deadline, "etcd did not start"
            try:
                if self.http.post(self.url + "/v3/maintenance/status", json={}, timeout=1).ok:
                    break
            except requests.RequestException:
                pass
            time.sleep(0.1)

    def get(self, key):
        """(value, mod_revision) of key, or None."""
        r = self.http.post(self.url + "/v3/kv/range",
                           json={"key": base64.b64encode(key.encode()).decode()}, timeout=5).json()
        kvs = r.get("kvs") or []
        if not kvs:
            return None
        return base64.b64decode(kvs[0]["value"]).decode(), int(kvs[0]["mod_revision"])

    def lock(self, sid):
        got = self.get("/ckptd/test-bucket/lock/" + sid)
        return (json.loads(got[0])["owner"], got[1]) if got else None

    def restart(self):
        """Stop and start again on the same data: etcd forgets every auth token."""
        self.proc.terminate()
        self.proc.wait(10)
        self.start()

    def stop(self):
        self.proc.send_signal(signal.SIGCONT)
        self.proc.terminate()
        self.proc.wait(10)
        self.logf.close()


class Proxy:
    """A TCP forwarder to etcd for one instance: freeze() holds every byte,
    as a frozen network link would, without closing anything."""

    def __init__(self, target_port):
        self.target = target_port
        self.srv = socket.socket()
        self.srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.srv.bind(("127.0.0.1", 0))
        self.srv.listen(64)
        self.url = "http://127.0.0.1:%d" % self.srv.getsockname()[1]
        self.frozen = threading.Event()
        self.done = False
        threading.Thread(target=self.accept, daemon=True).start()

    def accept(self):
        while not self.done:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            try:
                u = socket.create_connection(("127.0.0.1", self.target))
            except OSError:
                c.close()
                continue
            threading.Thread(target=self.pump, args=(c, u), daemon=True).start()

    def pump(self, a, b):
        try:
            while not self.done:
                if self.frozen.is_set():
                    time.sleep(0.05)
                    continue
                rd, _, _ = select.select([a, b], [], [], 0.05)
                for s in rd:
                    data = s.recv(65536)
                    if not data:
                        return
                    (b if s is a else a).sendall(data)
        except OSError:
            pass
        finally:
            a.close()
            b.close()

    def freeze(self):
        self.frozen.set()

    def thaw(self):
        self.frozen.clear()

    def stop(self):
        self.done = True
        self.thaw()
        self.srv.close()


@pytest.fixture
def etcd(tmp_path):
    e = Etcd(tmp_path)
    proxies = []

    def proxy():
        p = Proxy(e.port)
        proxies.append(p)
        return p

    e.proxy = proxy
    yield e
    for p in proxies:
        p.stop()
    e.stop()


def etcd_host(hosts, etcd, name, proxy=None, mount=None, **cfg):
    return hosts(name, mount=mount, lock_backend="etcd", etcd_endpoints=[(proxy or etcd).url], **cfg)


def test_config_rejects_a_bad_lock_backend(hosts, tmp_path):
    from conftest import CKPTD
    cfg = tmp_path / "bad.json"
    for bad, says in (({"lock_backend": "zookeeper"}, "lock_backend must be"),
                      ({"etcd_endpoints": "http://x"}, "etcd_endpoints must be a list")):
        cfg.write_text(json.dumps(bad))
        out = subprocess.run([CKPTD, "--mode", "host", "--config", str(cfg), "--check-config"],
                             capture_output=True, text=True)
        assert out.returncode != 0 and says in out.stderr + out.stdout, out


def test_etcd_unreachable_is_refused_at_start(hosts, tmp_path):
    with pytest.raises(AssertionError) as e:
        hosts("A", lock_backend="etcd", etcd_endpoints=["http://127.0.0.1:%d" % free_port()])
    assert "no etcd answers" in str(e.value)


def test_etcd_create_attach_handoff(etcd, hosts):
    a, b = etcd_host(hosts, etcd, "A"), etcd_host(hosts, etcd, "B")
    h = a.health()
    assert h["lock_backend"] == "etcd" and h["lock_method"] is None and h["checkpointing"] is True
    sb = Sandbox.create(a.url, enable_checkpoint=True)
    assert sb.run("python", "counter = 7").exit_code == 0
    sid = sb.sandbox_id
    owner, token = etcd.lock(sid)
    assert owner == "A"
    assert not (hosts.volume / "locks" / (sid + ".lock")).exists()  # locks are in etcd only
    sb.close()

    times = []
    for rnd, (src, dst) in enumerate([(a, b), (b, a), (a, b)]):
        t0 = time.time()
        sb2 = raw_attach(dst.url, sid)
        assert sb2.recv_event() == {"event": "status_update", "status": "SANDBOX_RESTORING"}
        sb2.wait_status("SANDBOX_RUNNING")
        times.append(time.time() - t0)
        assert sb2.run("python", "counter += 1; print(counter)").stdout == "%d\n" % (8 + rnd)
        owner, new_token = etcd.lock(sid)
        assert owner == dst.name and new_token > token  # the fencing token grows
        # the new owner adopted the handoff's image under its own token
        assert latest(hosts.volume, sid)[1] == new_token
        token = new_token
        assert etcd.get("/ckptd/test-bucket/wait/" + sid) is None
        assert drained(src)
        sb2.close()
    print("etcd live handoffs: %s s" % ", ".join("%.2f" % t for t in times))


def test_etcd_kill9_owner_then_takeover(etcd, hosts):
    a, b = etcd_host(hosts, etcd, "A"), etcd_host(hosts, etcd, "B")
    sid = checkpointed(a, "x = 41")
    sb = Sandbox.attach(a.url, sid)
    assert sb.run("python", "y = 1; print(x)").stdout == "41\n"
    sb.close()
    a.kill9()
    t0 = time.time()
    sb2 = Sandbox.attach(b.url, sid)
    took = time.time() - t0
    margin = b.health()["lock_margin_secs"]
    assert took >= LOCK_TTL + margin - 1.5, took  # the lease (ttl + margin) had to run out
    assert sb2.run("python", "print(x, 'y' in globals())").stdout == "41 False\n"
    assert etcd.lock(sid)[0] == "B"
    print("etcd takeover after kill -9: %.2fs (ttl %ds + margin %ds)" % (took, LOCK_TTL, margin))
    sb2.close()


def test_etcd_owner_cut_off_stops_by_its_clock(etcd, hosts):
    # A loses etcd (its link freezes): A's keepalives stall, its watchdog kills
    # the sandbox ttl after the last one, by A's clock; etcd drops the lease
    # after ttl + margin and B takes over. Never two running copies.
    pa = etcd.proxy()
    a, b = etcd_host(hosts, etcd, "A", pa), etcd_host(hosts, etcd, "B")
    margin = a.health()["lock_margin_secs"]
    sid, sb = checkpointed_then_running(a)
    sb.send({"language": "python", "code": "import time\nfor i in range(600):\n print(i, flush=True); time.sleep(0.1)"})
    assert sb.recv_event()["status"] == "SANDBOX_EXECUTION_RUNNING"
    ticks = []
    try:
        pa.freeze()
        frozen_at = time.time()
        while True:
            ev = sb.recv_event()
            if ev is None or ev.get("event") != "stdout":
                break
            ticks.append(time.time())
        stopped_after = ticks[-1] - frozen_at
        assert stopped_after < LOCK_TTL + 1.5, stopped_after
        sb2 = Sandbox.attach(b.url, sid)
        took = time.time() - frozen_at
        assert ticks[-1] < time.time() - 0.5
        assert took >= LOCK_TTL + margin - 1.5, took
        assert sid not in running(a)
        assert sb2.run("python", "print(n)").stdout == "1\n"
        print("etcd: A stopped %.2fs after its link froze; B running %.2fs after it" % (stopped_after, took))
    finally:
        pa.thaw()
    assert drained(a)
    assert etcd.lock(sid)[0] == "B" and "lease lost" in a.log()
    sb2.close()


def test_etcd_checkpoint_under_a_lost_lease_is_not_acknowledged(etcd, fuse, hosts):
    # A's whole link freezes (etcd and volume) while it checkpoints; B takes
    # over; when the link comes back A must answer an error, not CHECKPOINTED,
    # and latest stays B's.
    pa, fa = etcd.proxy(), fuse("A", "--allow-other")
    a, b = etcd_host(hosts, etcd, "A", pa, mount=fa.mnt), etcd_host(hosts, etcd, "B")
    sid, sb = checkpointed_then_running(a)
    try:
        pa.freeze()
        fa.freeze()
        sb.send({"action": "checkpoint"})
        sb2 = Sandbox.attach(b.url, sid)
        assert sb2.run("python", "print(n)").stdout == "1\n"
        assert sb2.checkpoint() == 1000
        b_token = latest(hosts.volume, sid)[1]
    finally:
        fa.thaw()
        pa.thaw()
    evs = events_until_close(sb)
    assert "SANDBOX_CHECKPOINTED" not in statuses(evs), evs
    assert any("lost ownership" in m for m in errors(evs)), evs
    time.sleep(1)
    assert latest(hosts.volume, sid)[1] == b_token
    sb3 = Sandbox.attach(b.url, sid)
    assert sb3.run("python", "print(n)").stdout == "1\n"
    sb3.close()


def soak(hosts, fuse, etcd, backend, rounds):
    """Racing rounds between two instances: each round the owner runs a
    ticking execution from an unacknowledged state while the other instance's
    client attaches; the owner is cut off (volume, and etcd link, frozen) or
    killed with -9 (every third round). Checked all along: never two running
    runsc containers for the sandbox, never the old owner's execution ticking
    after the new owner runs, no acknowledged checkpoint lost."""
    fa, fb = fuse("A", "--allow-other"), fuse("B", "--allow-other")
    px = {}
    if backend == "etcd":
        px = {"A": etcd.proxy(), "B": etcd.proxy()}
        # 6 s leases: at load 13 a 3 s lease through the proxy ran out
        # under the new owner, which then rightly refused to checkpoint
        a = etcd_host(hosts, etcd, "A", px["A"], mount=fa.mnt, lock_ttl_secs=2 * LOCK_TTL)
        b = etcd_host(hosts, etcd, "B", px["B"], mount=fb.mnt, lock_ttl_secs=2 * LOCK_TTL)
    else:
        a, b = hosts("A", mount=fa.mnt), hosts("B", mount=fb.mnt)
    fz = {"A": fa, "B": fb}
    sid = checkpointed(a, "n = 0")
    both, stop = [], threading.Event()

    def monitor():
        while not stop.is_set():
            if sid in running(a) and sid in running(b):
                both.append(time.time())
            time.sleep(0.05)

    t = threading.Thread(target=monitor)
    t.start()
    takeovers, overlaps = [], []
    try:
        owner, other = a, b
        for rnd in range(rounds):
            sb = Sandbox.attach(owner.url, sid)
            assert sb.run("python", "n += 1").exit_code == 0
            assert sb.checkpoint() == 1000   # acknowledged: n == rnd + 1 from now on
            sb = Sandbox.attach(owner.url, sid)
            assert sb.run("python", "n += 100").exit_code == 0   # never acknowledged
            ticks = []
            sb.send({"language": "python",
                     "code": "import time\nfor i in range(900):\n print(i, flush=True); time.sleep(0.1)"})

            def tick(sb=sb, ticks=ticks):
                while True:
                    ev = sb.recv_event()
                    if ev is None or ev.get("event") != "stdout":
                        return
                    ticks.append(time.time())

            tt = threading.Thread(target=tick)
            tt.start()
            time.sleep(0.3)
            kill = rnd % 3 == 2
            t0 = time.time()
            if kill:
                owner.kill9()
            else:
                fz[owner.name].freeze()
                if px:
                    px[owner.name].freeze()
            try:
                sb2 = Sandbox.attach(other.url, sid)
                ran = time.time()
                takeovers.append(ran - t0)
                assert sb2.run("python", "print(n)").stdout == "%d\n" % (rnd + 1), rnd
                if ticks and ticks[-1] >= ran:
                    overlaps.append((rnd, ticks[-1] - ran))
                assert sb2.checkpoint() == 1000
            finally:
                fz[owner.name].thaw()
                if px:
                    px[owner.name].thaw()
            tt.join(60)
            if kill:
                owner.start()
            assert drained(owner)
            owner, other = other, owner
    finally:
        stop.set()
        t.join()
    med, mx = statistics.median(takeovers), max(takeovers)
    print("soak %s: %d rounds, takeover median %.2fs max %.2fs, two running copies %d, "
          "overlapping executions %d" % (backend, rounds, med, mx, len(both), len(overlaps)))
    assert not both, "two running copies at %s" % both
    assert not overlaps, "the old owner executed after the new one ran: %s" % overlaps


@pytest.mark.parametrize("backend", ["volume", "etcd"])
def test_soak_stalls_and_kill9_one_live_copy_no_acked_checkpoint_lost(backend, etcd, fuse, hosts):
    soak(hosts, fuse, etcd, backend, SOAK_ROUNDS)
