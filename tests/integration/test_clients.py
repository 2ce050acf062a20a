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
