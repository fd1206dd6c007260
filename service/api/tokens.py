"""/api/v1/tokens: create, list and revoke API tokens (DESIGN §7). Every endpoint needs ADMIN.

While no active token exists the API is open (service/api/security.py), so the first token — an
admin token, normally — can be created over the API of a fresh install on loopback. The plain
token is returned once, at creation; only its SHA-256 hash and a short prefix are stored. After a
create or a revoke the app's "are tokens enabled" cache is invalidated, so the change applies to
the very next request.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Request
from pydantic import BaseModel, ConfigDict, Field, field_validator
from starlette.concurrency import run_in_threadpool

from service import auth
from service.api.deps import DatabaseDep
from service.api.security import ADMIN, token_state
from service.schemas import ErrorBody
from service.settings import public_bind

router = APIRouter(tags=["tokens"])

Scope = Literal["read", "write", "admin"]


class TokenCreate(BaseModel):
    """What to create: a name (free text, for people) and a scope (read < write < admin)."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)

    name: str = Field(default="token", min_length=1, max_length=200, description="free text, e.g. 'ci-push'")
    scope: Scope = Field(description="read: GET endpoints; write: also POST runs; admin: also tokens")


def _utc(value: datetime | None) -> datetime | None:
    """Stored timestamps are naive UTC; answer them with their offset (RFC 3339 'date-time')."""
    return value.replace(tzinfo=UTC) if value is not None and value.tzinfo is None else value


class TokenInfo(BaseModel):
    """A stored token without its secret: `prefix` is the first 10 characters of the plain token.
    Times are UTC."""

    model_config = ConfigDict(from_attributes=True)

    id: int
    name: str
    scope: Scope
    prefix: str
    created_at: datetime
    revoked_at: datetime | None = None

    _aware = field_validator("created_at", "revoked_at")(_utc)


class TokenCreated(BaseModel):
    """The created token; `token` is the plain secret, shown this once and never again."""

    id: int
    name: str
    scope: Scope
    token: str
    prefix: str
    created_at: datetime

    _aware = field_validator("created_at")(_utc)


class TokenList(BaseModel):
    tokens: list[TokenInfo]


_AUTH_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "no or unknown token (once tokens exist)"},
    403: {"model": ErrorBody, "description": "token scope below admin"}}


@router.post("/tokens", status_code=201, response_model=TokenCreated, dependencies=[ADMIN],
             responses={**_AUTH_ERRORS, 422: {"model": ErrorBody}})
async def create_token(body: TokenCreate, request: Request, db: DatabaseDep) -> TokenCreated:
    """Create a token of `scope`; the answer carries the plain token (send it as
    `Authorization: Bearer <token>`, or set SCALEBOOK_TOKEN for the CLI, client and dashboard).
    It is shown once: store it now. Creating the first token turns authentication on."""

    def _create() -> TokenCreated:
        with db.session(write=True) as session:
            row, plain = auth.create_token(session, body.name, body.scope)
            return TokenCreated(id=row.id, name=row.name, scope=body.scope, token=plain, prefix=row.prefix,
                                created_at=row.created_at)

    created = await run_in_threadpool(_create)
    token_state(request).invalidate()
    return created


@router.get("/tokens", response_model=TokenList, dependencies=[ADMIN], responses=_AUTH_ERRORS)
def list_tokens(db: DatabaseDep) -> TokenList:
    """Every token, active and revoked, oldest first; never the secret or its hash."""
    with db.session() as session:
        return TokenList(tokens=[TokenInfo.model_validate(t) for t in auth.list_tokens(session)])


@router.delete("/tokens/{token_id}", response_model=TokenInfo, dependencies=[ADMIN],
               responses={**_AUTH_ERRORS, 404: {"model": ErrorBody, "description": "no token with this id"},
                          409: {"model": ErrorBody, "description": "the last admin token of a public server"}})
async def revoke_token(token_id: Annotated[int, Path(ge=1, le=2**63 - 1)], request: Request,
                       db: DatabaseDep) -> TokenInfo:
    """Revoke a token (idempotent: revoking a revoked token keeps its first `revoked_at`).
    Requests with it get 401 from then on. On loopback, revoking the last active token opens the API
    again; a server bound beyond loopback (without --insecure) refuses to revoke its last active admin
    token (409) and never opens."""
    keep_last_admin = public_bind(request.app.state.settings)

    def _revoke() -> TokenInfo:
        with db.session(write=True) as session:
            return TokenInfo.model_validate(auth.revoke_token(session, token_id, keep_last_admin=keep_last_admin))

    info = await run_in_threadpool(_revoke)
    token_state(request).invalidate()
    return info
