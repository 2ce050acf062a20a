"""A short pass of the crash harness (tests/crash/crash.py) on both backends;
`make check-crash` runs the long one."""
import re
import subprocess
import sys

import pytest

from conftest import TOP


@pytest.mark.parametrize("backend", ["tar", "overlay"])
def test_sigkill_during_operations_keeps_every_promise(backend, tmp_path):
    p = subprocess.run([sys.executable, str(TOP / "tests/crash/crash.py"), "--backend", backend, "--kills", "25",
                        "--seed", "1", "--dir", str(tmp_path / "crash")], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    # A fork round kills twice (the fork, then at times its delete), so the
    # count may pass 25 by one.
    m = re.search(rf"crash\[{backend}\]: seed 1: (\d+) kills .*: ok$", p.stdout, re.M)
    assert m and int(m.group(1)) >= 25, p.stdout
