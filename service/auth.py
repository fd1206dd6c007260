"""API tokens (DESIGN §7): scopes read < write < admin, stored as SHA-256 hashes.

Once any active token exists, every endpoint but /health needs `Authorization: Bearer <token>`:
no token → 401; a token whose scope is too small → 403.
"""

from __future__ import annotations

import hashlib
import secrets
from datetime import UTC, datetime

import sqlalchemy as sa
from sqlalchemy.orm import Session

from service.db import locked
from service.errors import BadRequest, Conflict, NotFound
from service.tables import ApiToken

SCOPES = ("read", "write", "admin")
_RANK = {s: i for i, s in enumerate(SCOPES)}
TOKEN_PREFIX = "sb_"


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def active_token_count(session: Session) -> int:
    """Number of tokens not revoked."""
    return session.scalar(sa.select(sa.func.count()).select_from(ApiToken).where(ApiToken.revoked_at.is_(None))) or 0


def create_token(session: Session, name: str, scope: str) -> tuple[ApiToken, str]:
    """Create a token; returns (row, plain token). The plain token is never stored."""
    if scope not in SCOPES:
        raise BadRequest(f"scope '{scope}' is not one of {', '.join(SCOPES)}",
                         [{"field": "scope", "value": scope, "message": "unknown scope"}])
    plain = TOKEN_PREFIX + secrets.token_urlsafe(32)
    row = ApiToken(name=name, scope=scope, token_hash=hash_token(plain), prefix=plain[:10],
                   created_at=datetime.now(UTC).replace(tzinfo=None))
    session.add(row)
    session.flush()
    return row, plain


def list_tokens(session: Session) -> list[ApiToken]:
    return list(session.scalars(sa.select(ApiToken).order_by(ApiToken.id)))


def revoke_token(session: Session, token_id: int, *, keep_last_admin: bool = False) -> ApiToken:
    """Revoke a token (idempotent). `keep_last_admin` (a server bound beyond loopback): refuse with
    Conflict (409) to revoke the last active admin token, which would leave the server without anyone
    able to manage tokens. The active admin tokens are locked (PostgreSQL FOR UPDATE; DuckDB writes
    are serialised) so two concurrent revocations cannot both pass the check."""
    row = session.get(ApiToken, token_id)
    if row is None:
        raise NotFound(f"no token with id {token_id}", [{"field": "id", "value": token_id, "message": "not found"}])
    if keep_last_admin and row.revoked_at is None and row.scope == "admin":
        query = (sa.select(ApiToken.id).where(ApiToken.scope == "admin", ApiToken.revoked_at.is_(None))
                 .order_by(ApiToken.id))
        admins = list(session.scalars(locked(session, query)))
        if admins == [row.id]:
            raise Conflict(f"token {token_id} is the last active admin token of a server bound beyond loopback: "
                           "create another admin token before revoking it",
                           [{"field": "id", "value": token_id, "message": "last active admin token"}])
    row.revoked_at = row.revoked_at or datetime.now(UTC).replace(tzinfo=None)
    return row


def scope_allows(granted: str, needed: str) -> bool:
    return _RANK[granted] >= _RANK[needed]


def lookup_token(session: Session, plain: str) -> ApiToken | None:
    """The active token matching `plain`, or None."""
    return session.scalar(sa.select(ApiToken).where(ApiToken.token_hash == hash_token(plain),
                                                    ApiToken.revoked_at.is_(None)))
