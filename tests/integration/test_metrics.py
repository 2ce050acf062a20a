"""GET /metrics: Prometheus text format 0.0.4 that promtool accepts, and
values that follow what the daemon did."""
import os
import re
import shutil
import subprocess

import requests

from test_lifecycle import wait_until_expired

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"
SAMPLE = re.compile(r'^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})? (\S+)$')


def scrape(d):
    r = d.request("GET", "/metrics")
    assert r.status_code == 200, r.text
    assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
    return r.text


def samples(text):
    """{'name{labels}': value} for every sample line."""
    out = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = SAMPLE.match(line)
        assert m, f"not a sample line: {line!r}"
        out[m.group(1) + (m.group(2) or "")] = float(m.group(3))
    return out


def promtool(text):
    return subprocess.run([PROMTOOL, "check", "metrics"], input=text.encode(), capture_output=True, timeout=30)


def test_promtool_is_strict():
    """The check below means something: promtool rejects a broken exposition."""
    bad = "# TYPE x counter\nx{a=\"1\" 3\n"
    assert promtool(bad).returncode != 0


def test_metrics_format_and_values(daemon_factory):
    d = daemon_factory(backend="tar", config={"cleanup_interval_secs": 3600})
    (d.roots[0] / "f").write_bytes(b"data" * 10000)

    first = scrape(d)
    res = promtool(first)
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
    s0 = samples(first)
    version = d.health()["version"]
    assert s0[f'ckptd_build_info{{version="{version}",backend="tar"}}'] == 1
    for h in ("create", "restore"):
        name = f"ckptd_checkpoint_{h}_duration_seconds"
        assert f"# TYPE {name} histogram" in first
        assert s0[f"{name}_count"] == 0
    assert s0['ckptd_checkpoints{state="active"}'] == 0
    assert s0["ckptd_checkpoint_bytes"] == 0

    a = d.create("a")
    b = d.create("b")
    d.restore(a["checkpoint_id"])
    d.delete(b["checkpoint_id"])
    assert d.request("GET", "/v1/checkpoints/cp_000000000000000000000000").status_code == 404
    assert d.request("POST", "/v1/checkpoints", json={"name": ""}).status_code == 400

    text = scrape(d)
    res = promtool(text)
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
    s = samples(text)
    assert s["ckptd_checkpoint_create_duration_seconds_count"] == 2
    assert s['ckptd_checkpoint_create_duration_seconds_bucket{le="+Inf"}'] == 2
    assert s["ckptd_checkpoint_create_duration_seconds_sum"] > 0
    assert s["ckptd_checkpoint_restore_duration_seconds_count"] == 1
    assert s['ckptd_operations_total{op="create",result="success"}'] == 2
    assert s['ckptd_operations_total{op="create",result="error"}'] == 0  # bad input is not an operation
    assert s['ckptd_operations_total{op="restore",result="success"}'] == 1
    assert s['ckptd_operations_total{op="delete",result="success"}'] == 1
    assert s['ckptd_checkpoints{state="active"}'] == 1
    assert s['ckptd_checkpoints{state="creating"}'] == 0
    assert s["ckptd_checkpoint_bytes"] == d.get(a["checkpoint_id"])["size_bytes"] > 0
    assert s['ckptd_http_requests_total{code="201"}'] == 2
    assert s['ckptd_http_requests_total{code="204"}'] == 1
    assert s['ckptd_http_requests_total{code="404"}'] == 1
    assert s['ckptd_http_requests_total{code="400"}'] == 1
    assert s['ckptd_http_requests_total{code="200"}'] >= 3  # health, first scrape, restore

    # buckets are cumulative and end at the count
    buckets = [(k, v) for k, v in s.items() if k.startswith("ckptd_checkpoint_create_duration_seconds_bucket")]
    values = [v for _, v in buckets]
    assert values == sorted(values) and values[-1] == 2


def test_refused_restore_is_not_timed(daemon_factory):
    d = daemon_factory(backend="tar", config={"cleanup_interval_secs": 3600})
    rec = d.create("x", ttl_secs=1)
    wait_until_expired(rec)
    r = d.request("POST", f"/v1/checkpoints/{rec['checkpoint_id']}/restore", json={})
    assert r.status_code == 410 and r.json()["code"] == "checkpoint_expired"
    s = samples(scrape(d))
    assert s['ckptd_operations_total{op="restore",result="success"}'] == 0
    assert s['ckptd_operations_total{op="restore",result="error"}'] == 1  # counted, as a refused delete is
    assert s["ckptd_checkpoint_restore_duration_seconds_count"] == 0
    assert s['ckptd_http_requests_total{code="410"}'] == 1


def test_failed_restores_and_deletes_are_counted_alike(daemon_factory):
    """Whatever the status (404 here), a failed restore counts as a failed
    delete does (issue 16)."""
    d = daemon_factory(backend="tar", config={"cleanup_interval_secs": 3600})
    for _ in range(2):
        assert d.request("POST", "/v1/checkpoints/nope/restore", json={}).status_code == 404
        assert d.request("DELETE", "/v1/checkpoints/nope").status_code == 404
    s = samples(scrape(d))
    assert s['ckptd_operations_total{op="restore",result="error"}'] == 2
    assert s['ckptd_operations_total{op="delete",result="error"}'] == 2


def test_process_metrics(daemon_factory):
    d = daemon_factory(backend="tar", config={"cleanup_interval_secs": 3600})
    text = scrape(d)
    res = promtool(text)
    assert res.returncode == 0, res.stdout.decode() + res.stderr.decode()
    s = samples(text)
    pid = d.proc.pid
    with open(f"/proc/{pid}/status") as f:
        rss_kb = next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    assert 0.5 < s["process_resident_memory_bytes"] / (rss_kb * 1024) < 2
    fds = len(os.listdir(f"/proc/{pid}/fd"))
    assert abs(s["process_open_fds"] - fds) <= 3, (s["process_open_fds"], fds)
    assert s["process_max_fds"] >= 1024
    assert "# TYPE process_cpu_seconds_total counter" in text
    for i in range(30):
        d.create(f"c{i}")
    assert samples(scrape(d))["process_cpu_seconds_total"] > s["process_cpu_seconds_total"]


def test_metrics_token_free(daemon_factory):
    closed = daemon_factory(backend="tar", token="s3cret")
    assert requests.get(closed.url + "/metrics").status_code == 401
    d = daemon_factory(backend="tar", token="s3cret", config={"metrics_token_free": True})
    r = requests.get(d.url + "/metrics")
    assert r.status_code == 200 and "ckptd_build_info" in r.text
    # only /metrics: the API still needs the token
    assert requests.get(d.url + "/v1/checkpoints").status_code == 401
    assert d.request("GET", "/v1/checkpoints").status_code == 200
