"""The synchronous client (standard library only).

    from ckptd import Client, NotFound

    sandbox = Client()                      # CKPTD_URL / CKPTD_SOCKET / CKPTD_TOKEN
    cp = sandbox.checkpoint.create("baseline", ttl_secs=3600)
    result = sandbox.checkpoint.restore(cp["checkpoint_id"])

Every create and restore carries an Idempotency-Key (a uuid4 per call), and
is retried with that same key after a timeout, a dropped connection or a 503:
the daemon answers a repeat with the first result, so a retry never makes a
second checkpoint or a second restore.
"""
import http.client
import json
import os
import socket
import time
import urllib.parse
import uuid

from .errors import (CkptdError, CreateFailed, IdempotencyInProgress, NotReachable, OutcomeUnknown,
                     Unavailable, error_from_response)

DEFAULT_URL = "http://127.0.0.1:7070"


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTPConnection over a unix stream socket."""

    def __init__(self, path, timeout=None):
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            if self.timeout is not None:
                sock.settimeout(self.timeout)
            sock.connect(self.unix_path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def _segment(value):
    return urllib.parse.quote(str(value), safe="")


def _fields(**kw):
    """A request body of the members that are set (not None, not False)."""
    return {k: v for k, v in kw.items() if v is not None and v is not False}


def create_body(name, ttl_secs=None, labels=None, async_=False):
    return _fields(name=name, ttl_secs=ttl_secs, labels=labels, **{"async": async_})


def restore_body(force=False, if_expired=None, verify=False):
    return _fields(force=force, if_expired=if_expired, verify=verify)


def push_body(ref, base=True):
    return {"ref": ref} if base else {"ref": ref, "base": False}


def pull_body(ref, roots=None):
    return {"ref": ref, "roots": roots} if roots else {"ref": ref}


def wait_done(rec, deadline):
    """The record if the create is over, None to poll again; raises when it
    failed or the deadline passed."""
    if rec["status"] == "failed":
        err = rec.get("error") if isinstance(rec.get("error"), dict) else {}
        raise CreateFailed(0, err.get("code") or "create_failed", err.get("detail") or "the create failed", body=rec)
    if rec["status"] != "creating":
        return rec
    if deadline is not None and time.monotonic() > deadline:
        raise OutcomeUnknown(0, "timeout", "checkpoint %s still creating" % rec["checkpoint_id"])
    return None


class Checkpoints:
    """client.checkpoint: the calls an agent SDK makes."""

    def __init__(self, client):
        self._c = client

    def create(self, name, ttl_secs=None, labels=None, async_=False, wait=False, idempotency_key=None):
        """A checkpoint record. async_=True answers at once in state
        "creating"; wait=True then polls until it is active (CreateFailed if
        it failed)."""
        body = create_body(name, ttl_secs, labels, async_ or wait)
        rec = self._c.request("POST", "/v1/checkpoints", body, idempotency_key=idempotency_key or str(uuid.uuid4()))
        return self.wait(rec["checkpoint_id"]) if wait else rec

    def wait(self, checkpoint_id, poll=0.1, timeout=None):
        """Poll until the checkpoint is no longer creating; its record."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            done = wait_done(self.get(checkpoint_id), deadline)
            if done:
                return done
            time.sleep(poll)

    def list(self, name=None):
        path = "/v1/checkpoints"
        if name is not None:
            path += "?" + urllib.parse.urlencode({"name": name})
        return self._c.request("GET", path)["checkpoints"]

    def get(self, checkpoint_id):
        return self._c.request("GET", "/v1/checkpoints/" + _segment(checkpoint_id))

    def delete(self, checkpoint_id):
        self._c.request("DELETE", "/v1/checkpoints/" + _segment(checkpoint_id))

    def restore(self, checkpoint_id, force=False, if_expired=None, verify=False, idempotency_key=None):
        return self._c.request("POST", "/v1/checkpoints/%s/restore" % _segment(checkpoint_id),
                               restore_body(force, if_expired, verify),
                               idempotency_key=idempotency_key or str(uuid.uuid4()))

    def push(self, checkpoint_id, ref, base=True, idempotency_key=None):
        """Push a checkpoint to a registry as an OCI image (docs/registry.md):
        {ref, digest, layers, uploaded_bytes, reused_bytes}."""
        return self._c.request("POST", "/v1/checkpoints/%s/push" % _segment(checkpoint_id), push_body(ref, base),
                               idempotency_key=idempotency_key or str(uuid.uuid4()))

    def pull(self, ref, roots=None, idempotency_key=None):
        """A new checkpoint from a registry image; its record carries pull_of."""
        return self._c.request("POST", "/v1/checkpoints/pull", pull_body(ref, roots),
                               idempotency_key=idempotency_key or str(uuid.uuid4()))


class Client:
    """Connection settings come from the arguments, else CKPTD_URL, CKPTD_SOCKET
    and CKPTD_TOKEN (a socket path wins over a URL).

    timeout: seconds to wait for one answer (a create of a large tree can take
    a while). retries: how many times a call is sent again after a timeout, a
    dropped connection, a 503 or a 409 idempotency_in_progress, with
    backoff seconds doubling from `backoff`. Reads are retried too; DELETE is
    retried only when the request could not be sent."""

    def __init__(self, url=None, socket_path=None, token=None, timeout=300.0, retries=3, backoff=0.2):
        env = os.environ
        self.socket_path = socket_path or (None if url else env.get("CKPTD_SOCKET")) or None
        self.url = url or env.get("CKPTD_URL") or DEFAULT_URL
        self.token = token if token is not None else env.get("CKPTD_TOKEN") or None
        self.timeout = timeout
        self.retries = retries
        self.backoff = backoff
        self.checkpoint = Checkpoints(self)

    @property
    def where(self):
        return self.socket_path or self.url

    def health(self):
        return self.request("GET", "/v1/health")

    def _connection(self):
        if self.socket_path:
            return UnixHTTPConnection(self.socket_path, timeout=self.timeout), ""
        u = urllib.parse.urlsplit(self.url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise ValueError("ckptd URL must be http(s)://HOST[:PORT]: %r" % self.url)
        cls = http.client.HTTPSConnection if u.scheme == "https" else http.client.HTTPConnection
        return cls(u.hostname, u.port, timeout=self.timeout), u.path.rstrip("/")

    def send_once(self, method, path, body=None, idempotency_key=None):
        """One attempt: (status, raw body), or NotReachable / OutcomeUnknown."""
        conn, prefix = self._connection()
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        if idempotency_key:
            headers["Idempotency-Key"] = idempotency_key
        try:
            try:
                conn.connect()
            except (OSError, http.client.HTTPException) as e:
                raise NotReachable(0, "not_reachable", "cannot reach ckptd at %s: %s" % (self.where, e)) from e
            try:
                conn.request(method, prefix + path, body=data, headers=headers)
                resp = conn.getresponse()
                return resp.status, resp.read()
            except socket.timeout as e:
                raise OutcomeUnknown(0, "timeout", "no answer from ckptd at %s within %ss: the %s may "
                                     "still happen" % (self.where, self.timeout, method)) from e
            except (OSError, http.client.HTTPException) as e:
                raise OutcomeUnknown(0, "connection_lost", "connection to ckptd at %s lost before the answer: "
                                     "%s" % (self.where, e)) from e
        finally:
            conn.close()

    def request(self, method, path, body=None, idempotency_key=None):
        """One call with its retries; the decoded JSON answer (None for 204)."""
        safe = method == "GET" or idempotency_key is not None
        attempt = 0
        while True:
            try:
                status, raw = self.send_once(method, path, body, idempotency_key)
                if not 200 <= status < 300:
                    raise error_from_response(status, raw)
                return json.loads(raw) if raw else None
            except CkptdError as e:
                if attempt >= self.retries or not retryable(e, safe):
                    raise
            time.sleep(self.backoff * (2 ** attempt))
            attempt += 1


def retryable(e, safe):
    """Whether sending the call again can help and cannot do the work twice."""
    if isinstance(e, NotReachable):
        return True
    if isinstance(e, (OutcomeUnknown, Unavailable, IdempotencyInProgress)):
        return safe
    return False
