"""A small client for ckptd's HTTP API (v1), standard library only.

    from ckptd_client import Client, NotFound

    sandbox = Client()                      # CKPTD_URL / CKPTD_SOCKET / CKPTD_TOKEN
    cp = sandbox.checkpoint.create("baseline", ttl_secs=3600)
    ...
    result = sandbox.checkpoint.restore(cp["checkpoint_id"])
    print(result["restore_duration_ms"], result["started_services"])

Every failed call raises a CkptdError subclass chosen from the problem+json
"code" the daemon sends (falling back to the HTTP status), so callers can
catch exactly what they expect: NotFound, Expired, LimitReached, ...
"""
import http.client
import json
import os
import socket
import urllib.parse

__all__ = [
    "Client", "CkptdError", "ConnectionFailed", "BadRequest", "Unauthorized",
    "LimitReached", "NotFound", "MethodNotAllowed", "Conflict", "Expired",
    "PayloadTooLarge", "UnsupportedMediaType", "ServerError", "Unavailable",
    "InsufficientStorage",
]

DEFAULT_URL = "http://127.0.0.1:7070"


class CkptdError(Exception):
    """An error answer from ckptd: HTTP status, stable machine code, human detail."""

    def __init__(self, status, code, detail, title=None, body=None):
        super().__init__(f"{status} {code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.title = title
        self.body = body


class ConnectionFailed(CkptdError):
    """The daemon could not be reached at all (status 0)."""


class BadRequest(CkptdError):
    pass


class Unauthorized(CkptdError):
    pass


class LimitReached(CkptdError):
    pass


class NotFound(CkptdError):
    pass


class MethodNotAllowed(CkptdError):
    pass


class Conflict(CkptdError):
    pass


class Expired(CkptdError):
    pass


class PayloadTooLarge(CkptdError):
    pass


class UnsupportedMediaType(CkptdError):
    pass


class ServerError(CkptdError):
    pass


class Unavailable(CkptdError):
    pass


class InsufficientStorage(CkptdError):
    pass


_BY_CODE = {
    "bad_request": BadRequest, "invalid_field": BadRequest,
    "unauthorized": Unauthorized,
    "checkpoint_limit": LimitReached,
    "not_found": NotFound,
    "method_not_allowed": MethodNotAllowed,
    "conflict": Conflict,
    "checkpoint_expired": Expired, "gone": Expired,
    "body_too_large": PayloadTooLarge,
    "unsupported_media_type": UnsupportedMediaType,
    "internal": ServerError,
    "unavailable": Unavailable,
    "insufficient_storage": InsufficientStorage,
}

_BY_STATUS = {
    400: BadRequest, 401: Unauthorized, 403: LimitReached, 404: NotFound,
    405: MethodNotAllowed, 409: Conflict, 410: Expired, 413: PayloadTooLarge,
    415: UnsupportedMediaType, 500: ServerError, 503: Unavailable,
    507: InsufficientStorage,
}


def error_from_response(status, raw):
    """Build the typed error for a non-2xx answer (problem+json or anything else)."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {}
    code = body.get("code") or "http_%d" % status
    detail = body.get("detail") or raw.decode("utf-8", "replace").strip() or "HTTP %d" % status
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status, CkptdError)
    return cls(status, code, detail, title=body.get("title"), body=body)


class UnixHTTPConnection(http.client.HTTPConnection):
    """HTTPConnection that connects to a unix stream socket instead of TCP."""

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


class Checkpoints:
    """client.checkpoint: the calls an agent SDK makes."""

    def __init__(self, client):
        self._c = client

    def create(self, name, ttl_secs=None, labels=None):
        body = {"name": name}
        if ttl_secs is not None:
            body["ttl_secs"] = ttl_secs
        if labels is not None:
            body["labels"] = labels
        return self._c.request("POST", "/v1/checkpoints", body)

    def list(self, name=None):
        path = "/v1/checkpoints"
        if name is not None:
            path += "?" + urllib.parse.urlencode({"name": name})
        return self._c.request("GET", path)["checkpoints"]

    def get(self, checkpoint_id):
        return self._c.request("GET", "/v1/checkpoints/" + _segment(checkpoint_id))

    def delete(self, checkpoint_id):
        self._c.request("DELETE", "/v1/checkpoints/" + _segment(checkpoint_id))

    def restore(self, checkpoint_id, force=False, if_expired=None):
        body = {}
        if force:
            body["force"] = True
        if if_expired is not None:
            body["if_expired"] = if_expired
        return self._c.request("POST", "/v1/checkpoints/%s/restore" % _segment(checkpoint_id), body)


def _segment(value):
    return urllib.parse.quote(str(value), safe="")


class Client:
    """Connection settings come from the arguments, else from CKPTD_URL,
    CKPTD_SOCKET and CKPTD_TOKEN. A socket path wins over a URL."""

    def __init__(self, url=None, socket_path=None, token=None, timeout=300.0):
        env = os.environ
        self.socket_path = socket_path or (None if url else env.get("CKPTD_SOCKET")) or None
        self.url = url or env.get("CKPTD_URL") or DEFAULT_URL
        self.token = token if token is not None else env.get("CKPTD_TOKEN") or None
        self.timeout = timeout
        self.checkpoint = Checkpoints(self)

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

    def request(self, method, path, body=None):
        """One call; returns the decoded JSON answer (None for 204)."""
        conn, prefix = self._connection()
        headers = {"Accept": "application/json"}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        if self.token:
            headers["Authorization"] = "Bearer " + self.token
        try:
            conn.request(method, prefix + path, body=data, headers=headers)
            resp = conn.getresponse()
            raw = resp.read()
        except (OSError, http.client.HTTPException) as e:
            where = self.socket_path or self.url
            raise ConnectionFailed(0, "connection_failed", "cannot reach ckptd at %s: %s" % (where, e)) from e
        finally:
            conn.close()
        if not 200 <= resp.status < 300:
            raise error_from_response(resp.status, raw)
        return json.loads(raw) if raw else None
