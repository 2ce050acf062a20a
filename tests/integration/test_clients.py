"""The packaged clients (clients/python, clients/typescript) against a real
daemon: retries after a timeout do not duplicate, "not reachable" is told
apart from "timed out, outcome unknown", the asyncio client creates and
waits, and the TypeScript package type-checks against the spec's types."""
import asyncio
import os
import shutil
import subprocess
import sys
import time

import pytest

from conftest import TOP

sys.path.insert(0, str(TOP / "clients" / "python"))
import ckptd  # noqa: E402

TS = TOP / "clients" / "typescript"
NODE = shutil.which("node") or "node"


def big_tree(root, n=40, size=4 << 20):
    """A tree whose tar create takes long enough to outlast a short client timeout."""
    for i in range(n):
        (root / f"blob{i}.bin").write_bytes(os.urandom(size))


class Counting(ckptd.Client):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.sent = []

    def send_once(self, method, path, body=None, idempotency_key=None):
        self.sent.append((method, idempotency_key))
        try:
            out = super().send_once(method, path, body, idempotency_key)
            self.sent[-1] += (out[0],)
            return out
        except ckptd.CkptdError as e:
            self.sent[-1] += (type(e).__name__,)
            raise


def test_retry_after_timeout_makes_one_checkpoint(daemon_factory):
    d = daemon_factory()
    big_tree(d.roots[0])
    c = Counting(url=d.url, timeout=0.05, retries=60, backoff=0.05)
    cp = c.checkpoint.create("once", ttl_secs=600)
    posts = [s for s in c.sent if s[0] == "POST"]
    assert posts[0][2] == "OutcomeUnknown", posts  # the first answer did not come in time
    assert len({k for _, k, _ in posts}) == 1, "every retry carries the same Idempotency-Key"
    assert posts[-1][2] == 201
    assert [x["checkpoint_id"] for x in d.list()] == [cp["checkpoint_id"]], "no duplicate"
    assert d.get(cp["checkpoint_id"])["status"] == "active"


def test_not_reachable_vs_outcome_unknown(daemon_factory, tmp_path):
    with pytest.raises(ckptd.NotReachable) as e:
        ckptd.Client(url="http://127.0.0.1:9", retries=0).health()
    assert e.value.status == 0 and not isinstance(e.value, ckptd.OutcomeUnknown)
    with pytest.raises(ckptd.NotReachable):
        ckptd.Client(socket_path=str(tmp_path / "none.sock"), retries=1, backoff=0.01).checkpoint.list()

    d = daemon_factory()
    big_tree(d.roots[0])
    c = ckptd.Client(url=d.url, timeout=0.05, retries=0)
    with pytest.raises(ckptd.OutcomeUnknown) as e:
        c.checkpoint.create("maybe", idempotency_key="my-key")
    assert not isinstance(e.value, ckptd.NotReachable) and "may" in e.value.detail
    # The create went on: the same key later answers it, and it is the only one.
    patient = ckptd.Client(url=d.url, timeout=120, retries=30, backoff=0.1)
    cp = patient.checkpoint.create("maybe", idempotency_key="my-key")
    assert [x["checkpoint_id"] for x in d.list()] == [cp["checkpoint_id"]]
    with pytest.raises(ckptd.IdempotencyKeyReused) as e:
        patient.checkpoint.create("other", idempotency_key="my-key")
    assert (e.value.status, e.value.code) == (422, "idempotency_key_reused")
    assert isinstance(e.value, ckptd.ApiError)


def test_async_client_create_wait_restore(daemon_factory):
    d = daemon_factory()
    big_tree(d.roots[0], n=10)
    (d.roots[0] / "f").write_text("one\n")

    async def flow():
        a = ckptd.AsyncClient(url=d.url)
        ticks = 0

        async def ticker():  # the event loop stays free while the client waits
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        t = asyncio.create_task(ticker())
        cp = await a.checkpoint.create("bg", wait=True, poll=0.02)
        t.cancel()
        assert cp["status"] == "active" and ticks > 3
        (d.roots[0] / "f").write_text("two\n")
        r = await a.checkpoint.restore(cp["checkpoint_id"])
        assert r["ok"] and (d.roots[0] / "f").read_text() == "one\n"
        with pytest.raises(ckptd.NotFound):
            await a.checkpoint.get("cp_000000000000000000000000")
        await a.checkpoint.delete(cp["checkpoint_id"])
        return await a.checkpoint.list()

    assert asyncio.run(flow()) == []


def test_python_package_installs_offline(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--system-site-packages", str(venv)], check=True)
    work = tmp_path / "src"
    shutil.copytree(TOP / "clients" / "python", work, ignore=shutil.ignore_patterns("build", "*.egg-info"))
    subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "-q", "--no-build-isolation", "--no-index",
                    str(work)], check=True, cwd=tmp_path)
    out = subprocess.run([str(venv / "bin/python"), "-c", "import ckptd; print(ckptd.__file__, ckptd.AsyncClient)"],
                         check=True, capture_output=True, text=True, cwd=tmp_path)
    assert str(venv) in out.stdout, out.stdout


# --- the TypeScript package --------------------------------------------------

def npm_ready():
    if not (TS / "node_modules" / ".bin" / "tsc").exists():
        subprocess.run(["npm", "ci", "--prefer-offline", "--no-audit", "--no-fund"], cwd=TS, check=True,
                       capture_output=True, timeout=600)


def test_typescript_types_match_the_spec_and_typecheck(tmp_path):
    npm_ready()
    gen = tmp_path / "api.d.ts"
    subprocess.run([str(TS / "node_modules/.bin/openapi-typescript"), str(TOP / "api/openapi.yaml"),
                    "--default-non-nullable", "false", "-o", str(gen)], cwd=TS, check=True, capture_output=True,
                   timeout=300)
    assert gen.read_text() == (TS / "src/api.d.ts").read_text(), \
        "clients/typescript/src/api.d.ts is stale: run `npm run gen-types` in clients/typescript"
    out = subprocess.run([str(TS / "node_modules/.bin/tsc"), "--strict", "--noEmit", "-p", "."], cwd=TS,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout + out.stderr


TS_FLOW = """
import { Client, NotReachable, OutcomeUnknown, IdempotencyKeyReused, ApiError } from %(mod)r
const url = process.env.CKPTD_URL
const out = {}
try { await new Client({ url: 'http://127.0.0.1:9', retries: 0 }).health() } catch (e) {
  out.unreachable = [e instanceof NotReachable, e instanceof OutcomeUnknown, e.status] }
try { await new Client({ url, timeoutMs: 50, retries: 0 }).checkpoint.create({ name: 'maybe', idempotencyKey: 'ts-key' }) }
catch (e) { out.unknown = [e instanceof OutcomeUnknown, e instanceof NotReachable, e.code] }
const patient = new Client({ url, retries: 60, backoffMs: 50 })
out.maybe = (await patient.checkpoint.create({ name: 'maybe', idempotencyKey: 'ts-key' })).checkpoint_id
try { await patient.checkpoint.create({ name: 'other', idempotencyKey: 'ts-key' }) } catch (e) {
  out.reused = [e instanceof IdempotencyKeyReused, e instanceof ApiError, e.status, e.code] }
const hasty = new Client({ url, timeoutMs: 50, retries: 60, backoffMs: 50 })
out.once = (await hasty.checkpoint.create({ name: 'once' })).checkpoint_id
const waited = await patient.checkpoint.create({ name: 'bg', wait: true, pollMs: 20 })
out.bg = [waited.status, waited.checkpoint_id]
console.log(JSON.stringify(out))
"""


def test_typescript_client_retries_and_errors(daemon_factory, tmp_path):
    d = daemon_factory()
    big_tree(d.roots[0])
    script = tmp_path / "flow.mjs"
    script.write_text(TS_FLOW % {"mod": str(TS / "src/index.js")})
    p = subprocess.run([NODE, str(script)], env=dict(os.environ, CKPTD_URL=d.url), capture_output=True,
                       text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    import json
    out = json.loads(p.stdout)
    assert out["unreachable"] == [True, False, 0]
    assert out["unknown"] == [True, False, "timeout"]
    assert out["reused"] == [True, True, 422, "idempotency_key_reused"]
    assert out["bg"][0] == "active"
    names = {}
    for c in d.list():
        names.setdefault(c["name"], []).append(c["checkpoint_id"])
    # the timed-out create went on and was answered by key; the retried one made one checkpoint
    assert names == {"maybe": [out["maybe"]], "once": [out["once"]], "bg": [out["bg"][1]]}


def test_shell_client_key_and_timeout(daemon_factory):
    """The shell client sends a key with its POSTs and tells a timeout (4)
    from an unreachable daemon (3)."""
    d = daemon_factory()
    big_tree(d.roots[0])
    lib = TOP / "examples/shell/ckptd.sh"
    env = dict(os.environ, CKPTD_URL=d.url, CKPTD_RETRIES="0", CKPTD_IDEMPOTENCY_KEY="sh-key")

    def sh(script, **extra):
        return subprocess.run(["sh", "-c", f". {lib}\n{script}"], env=dict(env, **extra), capture_output=True,
                              text=True, timeout=120)

    p = sh("ckptd_create slow", CKPTD_TIMEOUT="0.05")
    assert p.returncode == 4 and "code=timeout" in p.stderr, p.stderr
    p = sh('out=$(ckptd_create slow) && printf %s "$out" | ckptd_json checkpoint_id')  # no timeout: same key answers the first create
    for _ in range(100):
        if p.returncode == 0:
            break
        assert "idempotency_in_progress" in p.stderr, p.stderr
        time.sleep(0.1)
        p = sh('out=$(ckptd_create slow) && printf %s "$out" | ckptd_json checkpoint_id')
    assert [c["checkpoint_id"] for c in d.list()] == [p.stdout.strip()]
    p = sh("ckptd_health", CKPTD_URL="http://127.0.0.1:9")
    assert p.returncode == 3 and "code=not_reachable" in p.stderr, p.stderr
