"""The asyncio client: the same calls as Client, as coroutines. Standard
library only: each HTTP exchange runs in the loop's default thread executor
over http.client, so it never blocks the event loop.

    from ckptd import AsyncClient

    async def main():
        sandbox = AsyncClient()
        cp = await sandbox.checkpoint.create("baseline", wait=True)   # async create, then poll
        await sandbox.checkpoint.restore(cp["checkpoint_id"])
"""
import asyncio
import json
import time
import urllib.parse
import uuid

from .client import Client, _segment, create_body, pull_body, push_body, restore_body, retryable, wait_done
from .errors import CkptdError, error_from_response


class AsyncCheckpoints:
    def __init__(self, client):
        self._c = client

    async def create(self, name, ttl_secs=None, labels=None, async_=False, wait=False, idempotency_key=None,
                     poll=0.1, wait_timeout=None):
        """With wait=True the daemon is asked for an async create (202) and
        the record is polled until active: a long create then never runs
        into the HTTP timeout."""
        body = create_body(name, ttl_secs, labels, async_ or wait)
        rec = await self._c.request("POST", "/v1/checkpoints", body,
                                    idempotency_key=idempotency_key or str(uuid.uuid4()))
        return await self.wait(rec["checkpoint_id"], poll, wait_timeout) if wait else rec

    async def wait(self, checkpoint_id, poll=0.1, timeout=None):
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            done = wait_done(await self.get(checkpoint_id), deadline)
            if done:
                return done
            await asyncio.sleep(poll)

    async def list(self, name=None):
        path = "/v1/checkpoints"
        if name is not None:
            path += "?" + urllib.parse.urlencode({"name": name})
        return (await self._c.request("GET", path))["checkpoints"]

    async def get(self, checkpoint_id):
        return await self._c.request("GET", "/v1/checkpoints/" + _segment(checkpoint_id))

    async def delete(self, checkpoint_id):
        await self._c.request("DELETE", "/v1/checkpoints/" + _segment(checkpoint_id))

    async def restore(self, checkpoint_id, force=False, if_expired=None, verify=False, idempotency_key=None):
        return await self._c.request("POST", "/v1/checkpoints/%s/restore" % _segment(checkpoint_id),
                                     restore_body(force, if_expired, verify),
                                     idempotency_key=idempotency_key or str(uuid.uuid4()))

    async def push(self, checkpoint_id, ref, base=True, idempotency_key=None):
        return await self._c.request("POST", "/v1/checkpoints/%s/push" % _segment(checkpoint_id),
                                     push_body(ref, base), idempotency_key=idempotency_key or str(uuid.uuid4()))

    async def pull(self, ref, roots=None, idempotency_key=None):
        return await self._c.request("POST", "/v1/checkpoints/pull", pull_body(ref, roots),
                                     idempotency_key=idempotency_key or str(uuid.uuid4()))


class AsyncClient:
    """Same settings and retry rules as Client."""

    def __init__(self, url=None, socket_path=None, token=None, timeout=300.0, retries=3, backoff=0.2):
        self._sync = Client(url, socket_path, token, timeout, retries, backoff)
        self.checkpoint = AsyncCheckpoints(self)

    async def health(self):
        return await self.request("GET", "/v1/health")

    async def request(self, method, path, body=None, idempotency_key=None):
        c = self._sync
        safe = method == "GET" or idempotency_key is not None
        loop = asyncio.get_running_loop()
        attempt = 0
        while True:
            try:
                status, raw = await loop.run_in_executor(None, c.send_once, method, path, body, idempotency_key)
                if not 200 <= status < 300:
                    raise error_from_response(status, raw)
                return json.loads(raw) if raw else None
            except CkptdError as e:
                if attempt >= c.retries or not retryable(e, safe):
                    raise
            await asyncio.sleep(c.backoff * (2 ** attempt))
            attempt += 1
