"""Typed errors: every failed call raises a CkptdError subclass.

- NotReachable: nothing was sent (connection refused, no such socket, DNS):
  the request certainly did not happen; safe to retry at will.
- OutcomeUnknown: the request was (maybe) sent but no answer came in time, or
  the connection broke mid-answer. The work may have happened. The client
  already retried with the same Idempotency-Key; this is raised when those
  retries ran out.
- ApiError: the daemon answered with an error (problem+json): .status, .code,
  .detail; its subclass follows the code (NotFound, Conflict, Expired, ...).
"""
import json

__all__ = [
    "CkptdError", "NotReachable", "OutcomeUnknown", "ConnectionFailed", "ApiError", "BadRequest",
    "Unauthorized", "LimitReached", "NotFound", "MethodNotAllowed", "Conflict", "IdempotencyInProgress",
    "IdempotencyKeyReused", "Expired", "PayloadTooLarge", "UnsupportedMediaType", "ServerError",
    "Unavailable", "InsufficientStorage", "RegistryFailed", "CreateFailed", "error_from_response",
]


class CkptdError(Exception):
    """Base of every error of this package: status (0 without an answer), code, detail."""

    def __init__(self, status, code, detail, title=None, body=None):
        super().__init__(f"{status} {code}: {detail}" if status else f"{code}: {detail}")
        self.status = status
        self.code = code
        self.detail = detail
        self.title = title
        self.body = body


class NotReachable(CkptdError):
    """ckptd could not be reached: the request was not sent (status 0)."""


ConnectionFailed = NotReachable  # the name the first examples used


class OutcomeUnknown(CkptdError):
    """Sent, but no answer (timeout, connection reset): it may have happened."""


class ApiError(CkptdError):
    """ckptd answered with an error."""


class BadRequest(ApiError):
    pass


class Unauthorized(ApiError):
    pass


class LimitReached(ApiError):
    pass


class NotFound(ApiError):
    pass


class MethodNotAllowed(ApiError):
    pass


class Conflict(ApiError):
    pass


class IdempotencyInProgress(Conflict):
    """The first request with this Idempotency-Key still runs."""


class IdempotencyKeyReused(ApiError):
    """The Idempotency-Key was used for another request (422)."""


class Expired(ApiError):
    pass


class PayloadTooLarge(ApiError):
    pass


class UnsupportedMediaType(ApiError):
    pass


class ServerError(ApiError):
    pass


class Unavailable(ApiError):
    pass


class InsufficientStorage(ApiError):
    pass


class RegistryFailed(ApiError):
    """A push or pull whose registry failed or refused (502): .code says how."""


class CreateFailed(ApiError):
    """An async create ended in state failed (create(..., wait=True))."""


_BY_CODE = {
    "bad_request": BadRequest, "invalid_field": BadRequest, "invalid_idempotency_key": BadRequest,
    "unauthorized": Unauthorized,
    "checkpoint_limit": LimitReached, "forbidden": LimitReached,
    "not_found": NotFound,
    "method_not_allowed": MethodNotAllowed,
    "conflict": Conflict,
    "idempotency_in_progress": IdempotencyInProgress,
    "idempotency_key_reused": IdempotencyKeyReused,
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
    415: UnsupportedMediaType, 422: IdempotencyKeyReused, 500: ServerError, 503: Unavailable,
    502: RegistryFailed, 507: InsufficientStorage,
}


def error_from_response(status, raw):
    """The typed error for a non-2xx answer (problem+json or anything else)."""
    try:
        body = json.loads(raw)
    except ValueError:
        body = None
    if not isinstance(body, dict):
        body = {}
    code = body.get("code") or "http_%d" % status
    detail = body.get("detail") or raw.decode("utf-8", "replace").strip() or "HTTP %d" % status
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status, ApiError)
    return cls(status, code, detail, title=body.get("title"), body=body)
