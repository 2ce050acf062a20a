"""ckptd: a client for ckptd's HTTP API (checkpoint and restore a sandbox's
filesystem), standard library only. Client is synchronous, AsyncClient is
for asyncio; both send an Idempotency-Key with every create and restore and
retry safely on timeouts, dropped connections and 503. Errors: see
ckptd.errors (NotReachable, OutcomeUnknown, ApiError and its subclasses)."""
from .aio import AsyncClient
from .client import DEFAULT_URL, Client
from .errors import *  # noqa: F401,F403
from .errors import __all__ as _errors

__all__ = ["Client", "AsyncClient", "DEFAULT_URL"] + list(_errors)
__version__ = "0.1.0"
