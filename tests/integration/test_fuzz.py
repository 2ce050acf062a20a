"""A short libFuzzer pass over every target in tests/fuzz (clang, ASan+UBSan):
each starts from its seed corpus, which holds the regression inputs of past
crashes, and runs FUZZ_CHECK_SECS seconds. A crash, a sanitizer report or a
broken property (the targets abort) fails the target's test. `make fuzz` runs
longer passes."""
import os
import pathlib
import re
import subprocess

import pytest

from conftest import TOP

SECS = int(os.environ.get("FUZZ_CHECK_SECS", "10"))
FUZZ_BUILD = TOP / os.environ.get("FUZZ_BUILD", "build-fuzz")
TARGETS = sorted(p.stem[len("fuzz_"):] for p in (TOP / "tests/fuzz").glob("fuzz_*.c"))


@pytest.fixture(scope="module")
def built():
    r = subprocess.run(["make", "-s", "-j2", "-C", str(TOP), f"FUZZ_BUILD={FUZZ_BUILD}", "fuzz-build"],
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return FUZZ_BUILD


def test_every_target_has_a_seed_corpus():
    assert len(TARGETS) >= 6, TARGETS
    for t in TARGETS:
        assert any((TOP / "tests/fuzz/corpus" / t).iterdir()), f"no seeds for {t}"


@pytest.mark.parametrize("target", TARGETS)
def test_fuzz_target(built, target, tmp_path):
    seeds = TOP / "tests/fuzz/corpus" / target
    # New inputs go to a temp dir: the seed corpus in the tree is only read.
    r = subprocess.run([str(built / f"fuzz_{target}"), f"-max_total_time={SECS}", "-timeout=10",
                        "-rss_limit_mb=2048", "-max_len=65536", f"-artifact_prefix={tmp_path}/",
                        str(tmp_path), str(seeds)], capture_output=True, text=True, timeout=SECS + 120,
                       errors="replace")  # the targets' logs may print raw bytes of an input
    crashes = [p.name for p in tmp_path.iterdir() if p.name.startswith(("crash-", "leak-", "timeout-", "oom-"))]
    report = "\n".join(line for line in r.stderr.splitlines()
                       if re.search(r"ERROR|runtime error|SUMMARY|Base64|#[0-9] ", line))[-4000:]
    assert r.returncode == 0 and not crashes, f"{target}: {crashes}\n{report}"
    runs = re.findall(r"Done (\d+) runs", r.stderr)
    # The seeds alone are replayed first; a pass that ran fewer inputs than
    # that did not fuzz.
    assert runs and int(runs[-1]) >= len(list(seeds.iterdir())), r.stderr[-2000:]
