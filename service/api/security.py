"""Bearer-token authorisation (DESIGN §7).

While no active token exists the API is open (a fresh install on loopback). Once one exists, every
endpoint but /health needs `Authorization: Bearer <token>`: none or unknown → 401, a token whose
scope is below the endpoint's (read < write < admin) → 403. Whether tokens exist is cached for
a second so that the check costs one indexed lookup per request at most.
"""

from __future__ import annotations

import threading
import time
from typing import Annotated

from fastapi import Depends, Header, Request

from service import auth
from service.errors import Forbidden, Unauthorized

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

    def enabled(self, db) -> bool:
        now = time.monotonic()
        with self._lock:
            if now - self._checked < _CACHE_TTL_S:
                return self._enabled
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


def require(scope: str):
    """Dependency factory: the request must carry a token of at least `scope` (when tokens exist)."""

    def check(request: Request, authorization: Annotated[str | None, Header(include_in_schema=False)] = None) -> None:
        db = request.app.state.db
        if not token_state(request).enabled(db):
            return
        if not authorization or not authorization.lower().startswith("bearer "):
            raise Unauthorized("this server requires an API token: send 'Authorization: Bearer <token>' "
                               "(SCALEBOOK_TOKEN for the CLI, client and dashboard)")
        plain = authorization.split(None, 1)[1].strip()
        with db.session() as session:
            token = auth.lookup_token(session, plain)
        if token is None:
            raise Unauthorized("unknown or revoked API token")
        if not auth.scope_allows(token.scope, scope):
            raise Forbidden(f"this token has scope '{token.scope}'; this endpoint needs '{scope}'",
                            [{"field": "scope", "value": token.scope, "message": f"needs {scope}"}])

    return Depends(check)


READ = require("read")
WRITE = require("write")
ADMIN = require("admin")
