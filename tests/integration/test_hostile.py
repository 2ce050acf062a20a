"""Hostile clients against the real daemon (issue 13): slow and flooding
connections, control characters and broken UTF-8 in URLs, HEAD, charsets.
Every refusal is a problem+json body with a code, and refuses without
touching anything."""
import multiprocessing
import resource
import select
import socket
import threading
import time

import pytest
import requests

from test_api import problem


def raw_request(port, data, timeout=5):
    """Send bytes as they are (no client-side quoting) and read to EOF."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        out = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                return out
            out += chunk


def split_response(raw):
    head, _, body = raw.partition(b"\r\n\r\n")
    lines = head.decode("latin1").split("\r\n")
    status = int(lines[0].split()[1])
    headers = {k.strip().lower(): v.strip() for k, v in (l.split(":", 1) for l in lines[1:])}
    return status, headers, body


@pytest.fixture
def d(daemon_factory):
    return daemon_factory(backend="tar")


def test_decoded_nul_or_control_in_path_is_400_and_deletes_nothing(d):
    victim = d.create("victim")
    for path in ("victim%00zzz", "victim%00", "vic%0atim", "victim%7f", "victim%1F"):
        r = d.request("DELETE", f"/v1/checkpoints/{path}")
        problem(r, 400, "invalid_field")
    assert [c["checkpoint_id"] for c in d.list()] == [victim["checkpoint_id"]]
    problem(d.request("POST", "/v1/checkpoints/victim%00/restore", json={}), 400, "invalid_field")
    problem(d.request("GET", "/v1/checkpoints?name=victim%00zzz"), 400, "invalid_field")
    # A raw control byte, not escaped, is refused the same way.
    status, headers, body = split_response(
        raw_request(d.port, b"GET /v1/checkpoints/victim\x01 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    assert status == 400 and headers["content-type"].startswith("application/problem+json"), body
    # and the name still works when asked properly
    assert d.get("victim")["checkpoint_id"] == victim["checkpoint_id"]


@pytest.mark.parametrize("segment", ["%FF", "%C0%AF", "%ED%B7%A9", "ok%F4%90%80%80", "%E2%82"])
def test_path_segment_not_utf8_has_problem_body_with_code(d, segment):
    body = problem(d.request("GET", f"/v1/checkpoints/{segment}"), 400, "invalid_field")
    assert "UTF-8" in body["detail"]
    problem(d.request("GET", f"/v1/checkpoints?name={segment}"), 400, "invalid_field")


def test_valid_utf8_names_still_work(d):
    d.create("ünïcödé ✓")
    r = d.request("GET", "/v1/checkpoints/%C3%BCn%C3%AFc%C3%B6d%C3%A9%20%E2%9C%93")
    assert r.status_code == 200 and r.json()["name"] == "ünïcödé ✓"


def test_head_answers_as_get_without_body(d):
    cp = d.create("h")
    for path in ("/v1/health", "/v1/checkpoints", f"/v1/checkpoints/{cp['checkpoint_id']}"):
        get = d.request("GET", path)
        status, headers, body = split_response(raw_request(
            d.port, f"HEAD {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()))
        assert status == 200 and body == b"", (path, body)
        assert headers["content-type"] == get.headers["Content-Type"]
    status, headers, body = split_response(raw_request(
        d.port, b"HEAD /v1/checkpoints/nope HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"))
    assert status == 404 and body == b""
    r = d.request("PUT", "/v1/health")
    problem(r, 405, "method_not_allowed")
    assert r.headers["Allow"] == "GET, HEAD"
    r = d.request("PATCH", f"/v1/checkpoints/{cp['checkpoint_id']}")
    assert set(r.headers["Allow"].split(", ")) == {"GET", "HEAD", "DELETE"}


@pytest.mark.parametrize("ctype,status", [
    ("application/json; charset=latin1", 415),
    ("application/json; charset=iso-8859-1", 415),
    ("application/json;charset=utf-16", 415),
    ("application/json; charset=utf-8", 201),
    ('application/json; charset="UTF-8"', 201),
    ("application/json", 201),
    ("text/plain", 415),
])
def test_only_utf8_json_bodies(d, ctype, status):
    r = d.request("POST", "/v1/checkpoints", data=b'{"name":"c"}', headers={"Content-Type": ctype})
    if status == 415:
        problem(r, 415, "unsupported_media_type")
        assert d.list() == []
    else:
        assert r.status_code == status, r.text


# --- connections ------------------------------------------------------------

def raise_fd_limit(n):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(n, hard), hard))


def open_from(port, source):
    """A non-blocking connection from a loopback address of its own (127/8 is
    all local), so the per-client limit does not stop the attack."""
    s = socket.socket()
    s.setblocking(False)
    s.bind((source, 0))
    s.connect_ex(("127.0.0.1", port))
    return s


def source_address(i, net=2):
    return f"127.{net}.{i // 250}.{i % 250 + 1}"


class Prober:
    """A well-behaved client asking for health every 50 ms on fresh
    connections; it records each answer's latency and any failure."""

    def __init__(self, url):
        self.url = url
        self.latencies, self.failures = [], []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.run, daemon=True)

    def run(self):
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                r = requests.get(self.url + "/v1/health", timeout=2, headers={"Connection": "close"})
                if r.status_code != 200:
                    self.failures.append(f"status {r.status_code}")
            except requests.RequestException as e:
                self.failures.append(repr(e))
            self.latencies.append(time.monotonic() - t0)
            self.stop.wait(0.05)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc):
        self.stop.set()
        self.thread.join()

    def report(self):
        lat = sorted(self.latencies)
        return (f"{len(lat)} probes, {len(self.failures)} failed, max {lat[-1] * 1000:.0f} ms, "
                f"p50 {lat[len(lat) // 2] * 1000:.0f} ms")


def trickle(socks, seconds, every):
    """Slowloris: a byte of a never-ending header on every open socket."""
    deadline = time.monotonic() + seconds
    first = True
    while time.monotonic() < deadline:
        for s in socks:
            try:
                s.send(b"GET /v1/health HTTP/1.1\r\n" if first else b"X")
            except OSError:
                pass
        first = False
        time.sleep(every)


def count_closed(socks, wait=0.5):
    """How many sockets the server closed (EOF or reset), polled all at once."""
    poller = select.poll()
    by_fd = {s.fileno(): s for s in socks}
    for fd in by_fd:
        poller.register(fd, select.POLLIN)
    closed = 0
    for fd, _ in poller.poll(wait * 1000):
        try:
            closed += by_fd[fd].recv(100) == b""
        except (ConnectionResetError, BrokenPipeError):
            closed += 1
        except BlockingIOError:
            pass
    return closed


def attack(port, n, net, seconds, every, conn):
    """In a process of its own, so the prober never waits for our GIL: open
    n connections (about 1,000 a second), trickle header bytes, and report
    how many the server closed."""
    raise_fd_limit(2 * n + 256)
    socks = []
    for i in range(n):
        socks.append(open_from(port, source_address(i, net)))
        if i % 100 == 99:
            time.sleep(0.1)
    trickle(socks, seconds, every)
    conn.send(count_closed(socks))
    for s in socks:
        s.close()


def run_attack(d, n, net, seconds, every=0.5):
    ours, theirs = multiprocessing.Pipe()
    proc = multiprocessing.get_context("fork").Process(target=attack, args=(d.port, n, net, seconds, every, theirs))
    with Prober(d.url) as p:
        proc.start()
        closed = ours.recv() if ours.poll(seconds + 60) else None
        proc.join(10)
    return p, closed


def test_slowloris_does_not_lock_out_and_is_cut_at_the_header_deadline(daemon_factory):
    d = daemon_factory(backend="tar", config={"header_timeout_secs": 2})
    # 255 connections, a header byte every 0.5 s: faster than any idle timeout
    p, closed = run_attack(d, 255, net=2, seconds=5)
    print("slowloris, 255 connections:", p.report())
    assert not p.failures, p.report()
    assert max(p.latencies) < 1.0, p.report()
    # Past the header deadline, however they trickle, they are gone.
    assert closed == 255


def test_flood_of_2000_connections_does_not_lock_out(daemon_factory):
    d = daemon_factory(backend="tar")
    p, closed = run_attack(d, 2000, net=3, seconds=4, every=1.0)
    print("flood, 2000 connections:", p.report(), f"closed by ckptd: {closed}")
    # Not locked out: every probe answered, 95% within a second. The slowest
    # ones fall in the opening burst and pass a second only when the 2 shared
    # cores are loaded far beyond them (load average > 10 seen).
    assert not p.failures, p.report()
    lat = sorted(p.latencies)
    assert lat[int(len(lat) * 0.95)] < 1.0 and lat[-1] < 2.0, p.report()
    # Past 3/4 of the 1024 slots, the oldest waiting connections made room.
    assert closed >= 2000 - 768


def test_one_address_is_capped(daemon_factory):
    raise_fd_limit(4096)
    d = daemon_factory(backend="tar", config={"max_connections_per_client": 8})
    socks = [open_from(d.port, "127.4.0.1") for _ in range(40)]
    try:
        time.sleep(0.5)
        trickle(socks, 0.5, 0.2)
        open_ = len(socks) - count_closed(socks)
        assert open_ <= 8, open_
        assert requests.get(d.url + "/v1/health", timeout=1).status_code == 200
    finally:
        for s in socks:
            s.close()


def attack_one_address(port, n, seconds, every, conn):
    """n connections from 127.0.0.1, every client's address in a sandbox:
    open them all, say so, then trickle header bytes for `seconds`, opening
    again (up to 20 a round) those the server closed. Reports how many it
    found closed in all."""
    raise_fd_limit(2 * n + 256)
    socks = [open_from(port, "127.0.0.1") for _ in range(n)]
    fresh = set(range(n))  # no byte sent yet: the request line comes first
    time.sleep(0.5)
    closed = count_closed(socks)
    conn.send("open")
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        reopened = 0
        for i, s in enumerate(socks):
            try:
                s.send(b"GET /v1/health HTTP/1.1\r\n" if i in fresh else b"X")
                fresh.discard(i)
                continue
            except BlockingIOError:
                continue
            except OSError:
                pass
            if reopened < 20:
                s.close()
                socks[i] = open_from(port, "127.0.0.1")
                fresh.add(i)
                reopened += 1
                closed += 1
        time.sleep(every)
    conn.send(closed)
    for s in socks:
        s.close()


def test_slow_clients_on_one_address_never_lock_out_a_request(daemon_factory):
    # In a sandbox every client is 127.0.0.1: 300 connections trickling
    # headers from it must not make max_connections_per_client (64) refuse
    # the next well-formed request. The oldest of that address's connections
    # still waiting for headers make room, as past the global limit. The
    # header deadline (10 s) is longer than the attack: it is not what helps.
    d = daemon_factory(backend="tar")
    ours, theirs = multiprocessing.Pipe()
    proc = multiprocessing.get_context("fork").Process(target=attack_one_address,
                                                        args=(d.port, 300, 5, 0.5, theirs))
    proc.start()
    try:
        assert ours.poll(60) and ours.recv() == "open"
        with Prober(d.url) as p:  # fresh health requests for as long as they trickle
            closed = ours.recv() if ours.poll(60) else None
    finally:
        proc.join(10)
    print("300 slow connections from 127.0.0.1:", p.report(), f"closed by ckptd: {closed}")
    assert len(p.latencies) >= 5 and not p.failures, p.report()
    # the address kept at most 64 of them at a time
    assert closed is not None and closed >= 300 - 64, closed
