"""Power cuts on a real file system (tests/crash/powercut.py): ckptd's state
dir, roots and forks on xfs on a loop device, shut down without a log flush
at random points of create, restore, delete, import, fork and release, on
both backends. POWERCUT_ROUNDS rounds (default 8; a round cuts each
operation once) from the seed POWERCUT_SEED (default: a random one, printed,
so that a failure replays)."""
import os
import random
import re
import subprocess
import sys

import pytest

from conftest import TOP

ROUNDS = int(os.environ.get("POWERCUT_ROUNDS", "8"))
SEED = int(os.environ.get("POWERCUT_SEED") or random.randrange(1 << 30))
SCRIPT = str(TOP / "tests/crash/powercut.py")


def run(args, timeout):
    return subprocess.run([sys.executable, SCRIPT, *args], capture_output=True, text=True, timeout=timeout)


def test_shutdown_drops_what_was_not_synced(tmp_path):
    """The model: what was fsynced survives the cut, the rest does not."""
    p = run(["--model", "--dir", str(tmp_path)], 120)
    assert p.returncode == 0 and "model: ok" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("backend,fs", [("tar", "xfs"), ("overlay", "ext4")])
def test_rewrite_fdatasynced_before_a_cut(backend, fs, tmp_path):
    """A file rewritten in place and fdatasynced comes back from a cut with
    its new data and its old ctime: a restore still brings the checkpoint's
    data back, a create takes the new data. tar trusted the ctime and
    restored ok over the rewritten data."""
    p = run(["--fdatasync", "--backend", backend, "--fs", fs, "--dir", str(tmp_path)], 180)
    assert p.returncode == 0 and "fdatasync: ok" in p.stdout, p.stdout + p.stderr


@pytest.mark.parametrize("backend", ["overlay", "tar"])
def test_power_cut_on_a_real_disk(backend, tmp_path, capsys):
    with capsys.disabled():
        print(f"\npowercut[{backend}]: seed {SEED}, {ROUNDS} rounds (replay: POWERCUT_SEED={SEED})", flush=True)
    p = run(["--backend", backend, "--rounds", str(ROUNDS), "--seed", str(SEED), "--dir", str(tmp_path)],
            120 + 60 * ROUNDS)
    with capsys.disabled():
        print(p.stdout.strip(), flush=True)
    assert p.returncode == 0, f"POWERCUT_SEED={SEED}\n" + p.stdout + p.stderr
    m = re.search(rf"powercut\[xfs/{backend}\]: seed {SEED}: (\d+) cuts .*: ok$", p.stdout, re.M)
    assert m and int(m.group(1)) >= 7 * ROUNDS, p.stdout
