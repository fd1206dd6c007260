"""Domain errors. The API turns each into the one error body shape:

    {"error": {"code": "<machine code>", "message": "<human text>", "details": [...]}}
"""

from __future__ import annotations

from typing import Any


class ScalebookError(Exception):
    """Base domain error: `code` is machine-readable, `status` the HTTP status it maps to."""

    code = "error"
    status = 400

    def __init__(self, message: str, details: list[dict[str, Any]] | None = None):
        super().__init__(message)
        self.message = message
        self.details = details or []


class ValidationFailed(ScalebookError):
    """A record broke a type rule or an invariant; details name the field, value and index."""

    code = "validation_error"
    status = 422


class Conflict(ScalebookError):
    """Same run_key, different content (DESIGN §2 idempotency)."""

    code = "conflict"
    status = 409


class NotFound(ScalebookError):
    code = "not_found"
    status = 404


class BadRequest(ScalebookError):
    code = "bad_request"
    status = 400


class Unauthorized(ScalebookError):
    code = "unauthorized"
    status = 401


class Forbidden(ScalebookError):
    code = "forbidden"
    status = 403


class PayloadTooLarge(ScalebookError):
    code = "payload_too_large"
    status = 413


class QueryRejected(ScalebookError):
    """User SQL refused: not read-only, not allowed, too slow."""

    code = "query_rejected"
    status = 400


class DatabaseUnavailable(ScalebookError):
    """The database is unreachable or busy (lost connection, lock timeout, serialisation failure):
    worth a retry, which the push client does."""

    code = "database_unavailable"
    status = 503


class DatabaseError(ScalebookError):
    """Any other error from the database: a bug on our side, not worth a retry. The API logs it
    and answers 500 with the one error body."""

    code = "internal_error"
    status = 500


class StaleSchema(ScalebookError):
    """The database is not at the migrations' head revision."""

    code = "stale_schema"
    status = 503


class SqlUnavailable(ScalebookError):
    """User SQL cannot be served safely on this database (PostgreSQL reader role missing)."""

    code = "sql_unavailable"
    status = 503
