"""The examples (Python, TypeScript, shell) run against a real daemon, and the
tree is checked at every restore.

Each example calls CKPTD_AFTER_CREATE_HOOK / CKPTD_AFTER_RESTORE_HOOK with the
checkpoint id; the hooks here pickle tree_state() of the workspace, so a test
can compare the tree right after a restore with the tree when that checkpoint
was taken (and both with what the test knows they must be)."""
import os
import pathlib
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time

import pytest

from conftest import TOP, assert_same_tree, make_full_tree, tree_state

EX = TOP / "examples"
sys.path.insert(0, str(TOP / "clients" / "python"))
import ckptd as ckptd_client  # noqa: E402  (the package under test lives in clients/python)

PY = "/usr/bin/python3"
NODE = shutil.which("node") or "node"
RUNNERS = {
    "python": {"retry": [PY, EX / "python/retry_loop.py"],
               "multi": [PY, EX / "python/multi_step_rollback.py"]},
    "typescript": {"retry": [NODE, EX / "typescript/retry_loop.mjs"],
                   "multi": [NODE, EX / "typescript/multi_step_rollback.mjs"]},
    "shell": {"retry": ["sh", EX / "shell/retry_loop.sh"],
              "multi": ["sh", EX / "shell/multi_step_rollback.sh"]},
}
LANGS = list(RUNNERS)
ID = r"cp_[0-9a-f]{24}"
RESTORED = re.compile(rf"^RESTORED ({ID}) duration_ms=(\d+) ok=true stopped=\[[^\]]*\] "
                      r"started=\[[^\]]*\] failed=\[[^\]]*\]$")
CHECKPOINT = re.compile(rf"^CHECKPOINT ({ID}) name=(\S+) duration_ms=\d+ size_bytes=\d+$")

SNAP = """#!/usr/bin/python3
import os, pickle, sys
sys.path.insert(0, {testdir!r})
from conftest import tree_state
out = os.environ["SNAP_DIR"]
n = len(os.listdir(out))
with open(os.path.join(out, "%03d-%s-%s" % (n, sys.argv[1], sys.argv[2])), "wb") as f:
    pickle.dump(tree_state(os.environ["CKPTD_WORKSPACE"]), f)
"""


class Run:
    """One example run: exit status, report lines, and the hooks' snapshots
    as (kind, checkpoint id, tree_state) in the order they were taken."""

    def __init__(self, proc, snap_dir, attempts_file):
        self.rc = proc.returncode
        self.out = proc.stdout
        self.err = proc.stderr
        self.lines = [ln for ln in proc.stdout.splitlines() if ln]
        self.snaps = []
        for name in sorted(os.listdir(snap_dir)):
            _, kind, cid = name.split("-", 2)
            with open(os.path.join(snap_dir, name), "rb") as f:
                self.snaps.append((kind, cid, pickle.load(f)))
        self.attempts = attempts_file.read_text().strip() if attempts_file.exists() else None

    def matching(self, regex):
        return [m for m in map(regex.match, self.lines) if m]

    def __str__(self):
        return f"exit {self.rc}\nstdout:\n{self.out}\nstderr:\n{self.err}"


@pytest.fixture
def run_example(tmp_path):
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    (hooks / "snap.py").write_text(SNAP.format(testdir=str(pathlib.Path(__file__).parent)))
    for kind in ("create", "restore"):
        h = hooks / f"after-{kind}"
        h.write_text(f'#!/bin/sh\nexec {PY} {hooks / "snap.py"} {kind} "$1"\n')
        h.chmod(0o755)
    count = [0]

    def run(lang, flow, d, env=None, args=(), timeout=120):
        count[0] += 1
        snap_dir = tmp_path / f"snaps{count[0]}"
        snap_dir.mkdir()
        attempts = tmp_path / f"attempts{count[0]}"
        full_env = {k: v for k, v in os.environ.items() if not k.startswith(("CKPTD_", "FLAKY_"))}
        full_env.update(CKPTD_URL=d.url, CKPTD_WORKSPACE=str(d.roots[0]), SNAP_DIR=str(snap_dir),
                        CKPTD_ATTEMPT_FILE=str(attempts),
                        CKPTD_AFTER_CREATE_HOOK=str(hooks / "after-create"),
                        CKPTD_AFTER_RESTORE_HOOK=str(hooks / "after-restore"))
        full_env.update(env or {})
        argv = [str(a) for a in RUNNERS[lang][flow]] + list(args)
        proc = subprocess.run(argv, env=full_env, capture_output=True, text=True, timeout=timeout)
        return Run(proc, snap_dir, attempts)

    return run


def seeded(d):
    """A full tree plus the data.txt the flaky job deletes; its tree_state."""
    root = d.roots[0]
    make_full_tree(root)
    (root / "data.txt").write_text("precious data\n")
    return tree_state(root)


def check_retry_success(r, d, before):
    assert r.rc == 0, r
    cps = r.matching(CHECKPOINT)
    assert [m.group(2) for m in cps] == ["before-attempt"], r
    cid = cps[0].group(1)
    restores = r.matching(RESTORED)
    assert [m.group(1) for m in restores] == [cid, cid], r
    assert [ln for ln in r.lines if ln.startswith("ATTEMPT")] == \
        ["ATTEMPT 1 failed exit=1", "ATTEMPT 2 failed exit=1", "ATTEMPT 3 ok"], r
    assert r.lines[-1] == "DONE ok", r
    assert r.attempts == "3"
    # The hooks: the tree at the checkpoint, then twice the very same tree.
    assert [(k, c) for k, c, _ in r.snaps] == [("create", cid), ("restore", cid), ("restore", cid)]
    assert_same_tree(before, r.snaps[0][2])
    for _, _, state in r.snaps[1:]:
        assert_same_tree(before, state)
    # After the loop: only the third attempt's changes on top of the checkpoint.
    root = d.roots[0]
    assert sorted(os.listdir(root / "junk")) == ["attempt-3.bin"]
    assert (root / "notes.txt").read_text() == "attempt 3 was here\n"
    assert (root / "result.txt").read_text() == "succeeded on attempt 3\n"
    # the user's data.txt, deleted by the failed attempts, is back and kept
    assert (root / "data.txt").read_text() == "precious data\n"
    after = tree_state(root)
    assert {k: v for k, v in after.items() if k not in ("junk", "junk/attempt-3.bin", "notes.txt", "result.txt")} \
        == before
    assert d.list() == [], "the example deletes its checkpoint"


def check_multi_failure_at_3(r, d, before):
    assert r.rc == 1, r
    cps = r.matching(CHECKPOINT)
    assert [m.group(2) for m in cps] == ["before-prepare", "before-fetch", "before-build"], r
    ids = [m.group(1) for m in cps]
    assert [m.group(1) for m in r.matching(RESTORED)] == [ids[1]], r
    assert "STEP 3 build failed exit=1" in r.lines and r.lines[-1] == "GAVE UP", r
    assert [(k, c) for k, c, _ in r.snaps] == \
        [("create", ids[0]), ("create", ids[1]), ("create", ids[2]), ("restore", ids[1])]
    assert_same_tree(before, r.snaps[0][2])
    at_fetch = r.snaps[1][2]
    assert set(at_fetch) - set(before) == {"app", "app/config.json"}
    assert set(r.snaps[2][2]) - set(before) == {"app", "app/config.json", "app/data", "app/data/input.csv"}
    # Restored to the checkpoint before step 2: step 2's output is gone too.
    assert_same_tree(at_fetch, r.snaps[3][2])
    assert_same_tree(at_fetch, tree_state(d.roots[0]))
    assert d.list() == []


def check_multi_success(r, d, before):
    assert r.rc == 0, r
    assert [m.group(2) for m in r.matching(CHECKPOINT)] == \
        ["before-prepare", "before-fetch", "before-build", "before-test"], r
    assert not r.matching(RESTORED) and r.lines[-1] == "DONE ok", r
    assert [k for k, _, _ in r.snaps] == ["create"] * 4
    assert_same_tree(before, r.snaps[0][2])
    root = d.roots[0]
    assert (root / "app/report.txt").read_text() == "total 60: pass\n"
    assert (root / "app/build/total.txt").read_text().strip() == "60"
    assert d.list() == []


@pytest.mark.parametrize("lang", LANGS)
def test_retry_loop_tar(daemon_factory, run_example, lang):
    d = daemon_factory(backend="tar")
    before = seeded(d)
    check_retry_success(run_example(lang, "retry", d), d, before)


@pytest.mark.parametrize("lang", LANGS)
def test_multi_step_rollback_tar(daemon_factory, run_example, lang):
    d = daemon_factory(backend="tar")
    before = seeded(d)
    check_multi_failure_at_3(run_example(lang, "multi", d), d, before)
    # Same workspace, now every step passes.
    before = tree_state(d.roots[0])
    check_multi_success(run_example(lang, "multi", d, env={"CKPTD_FAIL_STEP": "0"}), d, before)


@pytest.mark.parametrize("lang", LANGS)
def test_multi_step_first_step_fails_restores_nothing(daemon_factory, run_example, lang):
    d = daemon_factory(backend="tar")
    before = seeded(d)
    r = run_example(lang, "multi", d, env={"CKPTD_FAIL_STEP": "1"})
    assert r.rc == 1, r
    assert not r.matching(RESTORED), r
    assert "NO-RESTORE no checkpoint before the previous step" in r.lines, r
    assert [k for k, _, _ in r.snaps] == ["create"]
    assert_same_tree(before, r.snaps[0][2])
    assert (d.roots[0] / "app/partial.tmp").exists(), "nothing rolled back the failed first step"


def test_python_examples_overlay(daemon_factory, run_example):
    d = daemon_factory(backend="overlay")
    assert d.health()["backend"] == "overlay"
    before = seeded(d)
    check_retry_success(run_example("python", "retry", d), d, before)
    before = tree_state(d.roots[0])
    check_multi_failure_at_3(run_example("python", "multi", d), d, before)


def test_retry_loop_gives_up_after_three_attempts(daemon_factory, run_example):
    d = daemon_factory(backend="tar")
    before = seeded(d)
    r = run_example("python", "retry", d, env={"FLAKY_FAILURES": "5"})
    assert r.rc == 1, r
    assert [ln for ln in r.lines if ln.startswith("ATTEMPT")][-1] == "ATTEMPT 3 failed exit=1"
    assert len(r.matching(RESTORED)) == 2 and r.lines[-1] == "GAVE UP after 3 attempts", r
    for _, _, state in r.snaps:
        assert_same_tree(before, state)
    assert sorted(os.listdir(d.roots[0] / "junk")) == ["attempt-3.bin"], "no restore after the last attempt"
    assert r.attempts == "3"


@pytest.fixture
def sock_dir():
    path = tempfile.mkdtemp(prefix="ckex-", dir="/tmp")  # short: sun_path holds 108 bytes
    yield pathlib.Path(path)
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("lang", LANGS)
def test_retry_loop_over_unix_socket_with_token(daemon_factory, run_example, sock_dir, lang):
    sock = sock_dir / "s.sock"
    d = daemon_factory(backend="tar", token="tok-examples", extra_args=["--listen", f"unix:{sock}"])
    before = seeded(d)
    # A dead URL proves the socket is what the example uses.
    env = {"CKPTD_SOCKET": str(sock), "CKPTD_TOKEN": "tok-examples", "CKPTD_URL": "http://127.0.0.1:9"}
    check_retry_success(run_example(lang, "retry", d, env=env), d, before)
    after = tree_state(d.roots[0])
    env["CKPTD_TOKEN"] = "wrong"
    r = run_example(lang, "retry", d, env=env)
    assert r.rc == 2 and "unauthorized" in r.err and not r.snaps, r
    assert_same_tree(after, tree_state(d.roots[0]))


# --- the Python client library itself ---------------------------------------

def test_client_typed_errors(daemon_factory):
    d = daemon_factory(backend="tar")
    c = ckptd_client.Client(url=d.url)
    with pytest.raises(ckptd_client.NotFound) as e:
        c.checkpoint.get("cp_000000000000000000000000")
    assert (e.value.status, e.value.code) == (404, "not_found") and e.value.detail
    with pytest.raises(ckptd_client.NotFound):
        c.checkpoint.restore("cp_000000000000000000000000")
    with pytest.raises(ckptd_client.BadRequest) as e:
        c.checkpoint.create("bad", ttl_secs="soon")
    assert e.value.status == 400 and e.value.code == "invalid_field"
    with pytest.raises(ckptd_client.ConnectionFailed) as e:
        ckptd_client.Client(url="http://127.0.0.1:9").health()
    assert e.value.status == 0 and isinstance(e.value, ckptd_client.CkptdError)


def test_client_calls_and_expiry(daemon_factory):
    d = daemon_factory(backend="tar")
    root = d.roots[0]
    (root / "f").write_text("one\n")
    c = ckptd_client.Client(url=d.url)
    keep = c.checkpoint.create("keep", labels={"who": "examples"})
    short = c.checkpoint.create("short", ttl_secs=1)
    assert short["expires_at"] and keep["labels"] == {"who": "examples"}
    assert [cp["checkpoint_id"] for cp in c.checkpoint.list()] == [short["checkpoint_id"], keep["checkpoint_id"]]
    assert [cp["checkpoint_id"] for cp in c.checkpoint.list(name="keep")] == [keep["checkpoint_id"]]
    assert c.checkpoint.get(keep["checkpoint_id"])["name"] == "keep"
    (root / "f").write_text("two\n")
    time.sleep(1.3)
    with pytest.raises(ckptd_client.Expired) as e:
        c.checkpoint.restore(short["checkpoint_id"])
    assert (e.value.status, e.value.code) == (410, "checkpoint_expired")
    assert (root / "f").read_text() == "two\n", "a refused restore changes nothing"
    res = c.checkpoint.restore(short["checkpoint_id"], force=True)
    assert res["ok"] and res["ttl_expired"] and res["restored_from_checkpoint"]
    assert isinstance(res["restore_duration_ms"], int) and (root / "f").read_text() == "one\n"
    c.checkpoint.delete(keep["checkpoint_id"])
    with pytest.raises(ckptd_client.NotFound):
        c.checkpoint.delete(keep["checkpoint_id"])


def test_client_token_and_unix_socket(daemon_factory, sock_dir, monkeypatch):
    sock = sock_dir / "s.sock"
    d = daemon_factory(backend="tar", token="s3cret", extra_args=["--listen", f"unix:{sock}"])
    with pytest.raises(ckptd_client.Unauthorized) as e:
        ckptd_client.Client(url=d.url, token="").checkpoint.list()
    assert (e.value.status, e.value.code) == (401, "unauthorized")
    with pytest.raises(ckptd_client.Unauthorized):
        ckptd_client.Client(url=d.url, token="wrong").checkpoint.list()
    c = ckptd_client.Client(socket_path=str(sock), token="s3cret")
    cp = c.checkpoint.create("via-socket")
    assert c.checkpoint.list()[0]["checkpoint_id"] == cp["checkpoint_id"]
    # From the environment alone.
    monkeypatch.setenv("CKPTD_SOCKET", str(sock))
    monkeypatch.setenv("CKPTD_TOKEN", "s3cret")
    monkeypatch.setenv("CKPTD_URL", "http://127.0.0.1:9")
    env_client = ckptd_client.Client()
    assert env_client.checkpoint.restore(cp["checkpoint_id"])["ok"]
    env_client.checkpoint.delete(cp["checkpoint_id"])
    assert env_client.checkpoint.list() == []


def test_typescript_and_shell_errors(daemon_factory, tmp_path):
    """The other two clients report the problem+json code as well."""
    d = daemon_factory(backend="tar")
    script = tmp_path / "t.mjs"
    script.write_text(
        f"import {{ Client, NotFound, Expired }} from {str(TOP / 'clients/typescript/src/index.js')!r}\n"
        "const c = new Client()\n"
        "try { await c.checkpoint.get('cp_000000000000000000000000') } catch (e) {\n"
        "  console.log(e instanceof NotFound, e.status, e.code) }\n"
        "const cp = await c.checkpoint.create({ name: 'short', ttl_secs: 1 })\n"
        "await new Promise((r) => setTimeout(r, 1300))\n"
        "try { await c.checkpoint.restore(cp.checkpoint_id) } catch (e) {\n"
        "  console.log(e instanceof Expired, e.status, e.code) }\n"
        "const r = await c.checkpoint.restore(cp.checkpoint_id, { if_expired: 'fresh' })\n"
        "console.log(r.ok, r.restored_from_checkpoint)\n")
    env = dict(os.environ, CKPTD_URL=d.url)
    out = subprocess.run([NODE, str(script)], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split("\n")[:3] == ["true 404 not_found", "true 410 checkpoint_expired", "true false"], \
        out.stdout + out.stderr
    sh = (f". {EX / 'shell/ckptd.sh'}\n"
          "ckptd_get cp_000000000000000000000000; echo \"rc=$?\"\n"
          "id=$(ckptd_create from-sh | ckptd_json checkpoint_id)\n"
          "ckptd_restore \"$id\" | CKPTD_JSON=sed ckptd_json ok\n"
          "ckptd_get \"$id\" | CKPTD_JSON=sed ckptd_json name\n"
          "ckptd_delete \"$id\" && echo deleted\n")
    out = subprocess.run(["sh", "-c", sh], env=env, capture_output=True, text=True, timeout=60)
    assert out.stdout.split("\n")[:4] == ["rc=1", "true", "from-sh", "deleted"], out.stdout + out.stderr
    assert "status=404 code=not_found" in out.stderr
