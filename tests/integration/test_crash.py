"""The crash harness (tests/crash/crash.py) on both backends: CRASH_KILLS kills
each (default 100) from the seed CRASH_SEED (default: a random one, printed,
so that a failure can be replayed with `make check CRASH_SEED=N`).
`make check-crash` runs the long one."""
import os
import random
import re
import subprocess
import sys
import threading
import time

import pytest
import requests

from conftest import TOP, Daemon, tree_state

KILLS = int(os.environ.get("CRASH_KILLS", "100"))
SEED = int(os.environ.get("CRASH_SEED") or random.randrange(1 << 30))


@pytest.mark.parametrize("backend", ["tar", "overlay"])
def test_sigkill_during_operations_keeps_every_promise(backend, tmp_path, capsys):
    with capsys.disabled():
        print(f"\ncrash[{backend}]: seed {SEED}, {KILLS} kills (replay: CRASH_SEED={SEED})", flush=True)
    p = subprocess.run([sys.executable, str(TOP / "tests/crash/crash.py"), "--backend", backend, "--kills",
                        str(KILLS), "--seed", str(SEED), "--dir", str(tmp_path / "crash")],
                       capture_output=True, text=True, timeout=60 + 15 * KILLS)
    with capsys.disabled():
        print(p.stdout.strip(), flush=True)
    assert p.returncode == 0, f"CRASH_SEED={SEED}\n" + p.stdout + p.stderr
    # A round can kill twice (a fork, then at times its delete), so the
    # count may pass KILLS by one.
    m = re.search(rf"crash\[{backend}\]: seed {SEED}: (\d+) kills .*: ok$", p.stdout, re.M)
    assert m and int(m.group(1)) >= KILLS, p.stdout


def roots_state(d):
    return tuple(tree_state(r) for r in d.roots)


def fill(root, tag, n=40):
    for i in range(n):
        sub = root / f"d{i % 4}"
        sub.mkdir(exist_ok=True)
        (sub / f"f{i}.bin").write_bytes(os.urandom(8 << 10) + tag.encode())
    (root / "tag.txt").write_text(tag)


def kill_during(d, fn, delay):
    out = {}

    def go():
        try:
            out["r"] = fn()
        except requests.RequestException:
            pass
    t = threading.Thread(target=go)
    t.start()
    time.sleep(delay)
    d.kill9()
    t.join(60)
    d.start(timeout=60)
    return out.get("r")


@pytest.mark.parametrize("backend", ["tar", "overlay"])
def test_many_roots_are_one_checkpoint(backend, tmp_path):
    """Three roots; creates and restores killed at evenly spread points of
    their measured duration: after the restart all roots come from one
    checkpoint (or are as before), never a mix."""
    d = Daemon(tmp_path / "d", backend=backend, n_roots=3,
               config={"cleanup_interval_secs": 3600, "max_checkpoints": 1000, "default_ttl_secs": 0})
    try:
        for k, r in enumerate(d.roots):
            fill(r, f"a{k}")
        d.start()
        a = d.create("a")["checkpoint_id"]
        sa = roots_state(d)
        for k, r in enumerate(d.roots):
            fill(r, f"b{k}")
        t0 = time.monotonic()
        b = d.create("b")["checkpoint_id"]
        took_create = time.monotonic() - t0
        sb = roots_state(d)
        t0 = time.monotonic()
        d.restore(a)
        took_restore = time.monotonic() - t0
        known = {a: sa, b: sb}
        points = 10
        for i in range(points):
            # a restore from a to b or back, killed at point i
            now = roots_state(d)
            target = b if now == sa else a
            r = kill_during(d, lambda: d.request("POST", f"/v1/checkpoints/{target}/restore", json={}),
                            took_restore * 1.5 * i / points)
            after = roots_state(d)
            assert after in (now, known[target]), f"restore killed at point {i}: the roots are a mix"
            if r is not None and r.status_code == 200 and r.json().get("ok"):
                assert after == known[target], f"acknowledged restore at point {i} undone"
            # a create of changed roots, killed at point i
            for k, root in enumerate(d.roots):
                fill(root, f"c{i}-{k}", n=10)
            sc = roots_state(d)
            r = kill_during(d, lambda: d.request("POST", "/v1/checkpoints", json={"name": f"c{i}"}),
                            took_create * 1.5 * i / points)
            made = [c for c in d.list(name=f"c{i}") if c["status"] == "active"]
            if r is not None and r.status_code == 201:
                assert [c["checkpoint_id"] for c in made] == [r.json()["checkpoint_id"]]
            for c in made:  # whole: every root from that create
                d.restore(c["checkpoint_id"])
                assert roots_state(d) == sc, f"create killed at point {i} holds a mix of roots"
                known[c["checkpoint_id"]] = sc
            d.restore(a)
        for cid, st in known.items():
            d.restore(cid)
            assert roots_state(d) == st, cid
    finally:
        d.cleanup()
