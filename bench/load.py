"""Load: wrk against ckptd's GET endpoints while a restore loop runs.

Used by bench/run.py (30 s, `make bench`) and tests/integration/test_load.py
(5 s, `make check`). run_load() returns req/s, p50/p99 latency, the number of
non-2xx answers and socket errors from wrk, and the restores done meanwhile."""
import re
import subprocess
import tempfile
import threading

import requests

# Alternate the two endpoints on every connection.
LUA = """
local paths = {"/v1/health", "/v1/checkpoints"}
local i = 0
request = function()
  i = i + 1
  return wrk.format("GET", paths[i % 2 + 1])
end
"""

UNITS = {"us": 0.001, "ms": 1.0, "s": 1000.0, "m": 60000.0}


def _ms(text):
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m)", text)
    return float(m.group(1)) * UNITS[m.group(2)]


def parse_wrk(out):
    """The figures of `wrk --latency` output."""
    res = {"requests": int(re.search(r"(\d+) requests in", out).group(1)),
           "rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
           "non2xx": 0, "socket_errors": 0}
    for pct, key in (("50", "p50_ms"), ("99", "p99_ms")):
        res[key] = _ms(re.search(rf"^\s+{pct}%\s+(\S+)", out, re.M).group(1))
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        res["non2xx"] = int(m.group(1))
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        res["socket_errors"] = sum(int(x) for x in m.groups())
    return res


class RestoreLoop(threading.Thread):
    """Restores the given checkpoints in turn until stopped; counts failures."""

    def __init__(self, url, cids, headers=None):
        super().__init__(daemon=True)
        self.url, self.cids = url, cids
        self.s = requests.Session()
        self.s.headers.update(headers or {})
        self.stop_ev = threading.Event()
        self.done, self.failed = 0, []

    def run(self):
        i = 0
        while not self.stop_ev.is_set():
            cid = self.cids[i % len(self.cids)]
            i += 1
            try:
                r = self.s.post(f"{self.url}/v1/checkpoints/{cid}/restore", json={}, timeout=120)
                if r.status_code == 200 and r.json().get("ok") is True:
                    self.done += 1
                else:
                    self.failed.append(f"{r.status_code} {r.text[:200]}")
            except requests.RequestException as e:
                self.failed.append(str(e))

    def stop(self):
        self.stop_ev.set()
        self.join(180)


def run_load(url, cids, secs, conns=32, threads=2, token=None):
    """wrk on GET /v1/health and /v1/checkpoints for secs while cids restore in a loop."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    loop = RestoreLoop(url, cids, headers)
    with tempfile.NamedTemporaryFile("w", suffix=".lua") as lua:
        lua.write(LUA)
        lua.flush()
        argv = ["wrk", "--latency", "-t", str(threads), "-c", str(conns), "-d", f"{secs}s", "--timeout", "5s",
                "-s", lua.name]
        for k, v in headers.items():
            argv += ["-H", f"{k}: {v}"]
        loop.start()
        try:
            out = subprocess.run(argv + [url], capture_output=True, text=True, check=True,
                                 timeout=secs + 60).stdout
        finally:
            loop.stop()
    res = parse_wrk(out)
    res.update(restores=loop.done, restore_failures=loop.failed, secs=secs, conns=conns, wrk=out)
    return res


def summary(res):
    return (f"load: {res['rps']:.0f} req/s over {res['secs']} s, {res['conns']} connections, "
            f"p50 {res['p50_ms']:.2f} ms, p99 {res['p99_ms']:.2f} ms, {res['requests']} requests, "
            f"{res['non2xx']} non-2xx, {res['socket_errors']} socket errors, "
            f"{res['restores']} restores meanwhile ({len(res['restore_failures'])} failed)")
