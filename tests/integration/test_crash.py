"""The crash harness (tests/crash/crash.py) on both backends: CRASH_KILLS kills
each (default 100) from the seed CRASH_SEED (default: a random one, printed,
so that a failure can be replayed with `make check CRASH_SEED=N`).
`make check-crash` runs the long one."""
import os
import random
import re
import subprocess
import sys

import pytest

from conftest import TOP

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
