"""Bearer-token authorisation (DESIGN §7).

While no active token exists the API is open (a fresh install on loopback) — except on a server bound
beyond loopback without --insecure, which answers 401 until a token exists. Once one exists, every
endpoint but /health needs `Authorization: Bearer <token>`: none, malformed or unknown → 401, a token
whose scope is below the endpoint's (read < write < admin) → 403. Whether tokens exist is cached for
a second so that the check costs one indexed lookup per request at most.
"""

from __future__ import annotations

import threading
import time
from typing import Annotated

from fastapi import Depends, Header, Request
from starlette.concurrency import run_in_threadpool

from service import auth
from service.errors import Forbidden, Unauthorized
from service.settings import public_bind

_CACHE_TTL_S = 1.0


class TokenState:
    """Per-app cache of 'are tokens enabled'."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._checked = 0.0
        self._enabled = False

    def invalidate(self) -> None:
        with self._lock:
            self._checked = 0.0

    def cached(self) -> bool | None:
        """The cached answer, or None when it is older than the TTL."""
        with self._lock:
            return self._enabled if time.monotonic() - self._checked < _CACHE_TTL_S else None

    def enabled(self, db) -> bool:
        """Whether any active token exists (one COUNT at most per TTL; blocking)."""
        cached = self.cached()
        if cached is not None:
            return cached
        now = time.monotonic()
        with db.session() as session:
            enabled = auth.active_token_count(session) > 0
        with self._lock:
            self._enabled, self._checked = enabled, now
        return enabled


def token_state(request: Request) -> TokenState:
    state = getattr(request.app.state, "tokens", None)
    if state is None:
        state = request.app.state.tokens = TokenState()
    return state


def _lookup(db, plain: str):
    with db.session() as session:
        return auth.lookup_token(session, plain)


def bearer_token(authorization: str | None) -> str | None:
    """The token of an `Authorization: Bearer <token>` header, or None when the header is missing or
    malformed (another scheme, no token, whitespace or control characters inside, over 512 characters)."""
    if not authorization:
        return None
    scheme, _, token = authorization.partition(" ")
    token = token.strip(" ")
    if scheme.lower() != "bearer" or not token or len(token) > 512 or not token.isascii() \
            or not all(33 <= ord(c) < 127 for c in token):
        return None
    return token


def require(scope: str):
    """Dependency factory: the request must carry a token of at least `scope` (when tokens exist)."""

    async def check(request: Request,
                    authorization: Annotated[str | None, Header(include_in_schema=False)] = None) -> None:
        # async, with the database calls in the thread pool: an open server (the cached answer
        # says no tokens) costs no thread hop per request
        db = request.app.state.db
        state = token_state(request)
        enabled = state.cached()
        if enabled is None:
            enabled = await run_in_threadpool(state.enabled, db)
        if not enabled:
            settings = request.app.state.settings
            if public_bind(settings):  # tokens removed under a running public server: closed, never open
                raise Unauthorized(f"this server is bound to {settings.host!r} beyond loopback and has no active API "
                                   "token: create one with `scalebook token create --scope admin --direct`")
            return
        plain = bearer_token(authorization)
        if plain is None:
            raise Unauthorized("this server requires an API token: send 'Authorization: Bearer <token>' "
                               "(SCALEBOOK_TOKEN for the CLI, client and dashboard)")
        token = await run_in_threadpool(_lookup, db, plain)
        if token is None:
            raise Unauthorized("unknown or revoked API token")
        if not auth.scope_allows(token.scope, scope):
            raise Forbidden(f"this token has scope '{token.scope}'; this endpoint needs '{scope}'",
                            [{"field": "scope", "value": token.scope, "message": f"needs {scope}"}])

    return Depends(check)


READ = require("read")
WRITE = require("write")
ADMIN = require("admin")
