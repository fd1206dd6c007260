"""Exception handlers: every error leaves the API in one body shape (schemas.ErrorBody)."""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from service.errors import ScalebookError

log = logging.getLogger("scalebook.api")

_HTTP_CODES = {400: "bad_request", 401: "unauthorized", 403: "forbidden", 404: "not_found",
               405: "method_not_allowed", 409: "conflict", 413: "payload_too_large", 415: "unsupported_media_type",
               422: "validation_error", 429: "too_many_requests", 503: "unavailable"}


def error_response(status: int, code: str, message: str, details: list[dict[str, Any]] | None = None,
                   headers: dict[str, str] | None = None) -> JSONResponse:
    """The one error body: {"error": {"code", "message", "details"}}."""
    return JSONResponse(status_code=status, headers=headers,
                        content={"error": {"code": code, "message": message, "details": details or []}})


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    if isinstance(value, (list, dict)):
        try:
            import json

            json.dumps(value, allow_nan=False)
            return value
        except (TypeError, ValueError):
            pass
    return repr(value)


def install(app: FastAPI) -> None:
    @app.exception_handler(ScalebookError)
    async def _domain(request: Request, exc: ScalebookError) -> JSONResponse:
        if exc.status >= 500:
            log.error("%s %s: %s (%s)", request.method, request.url.path, exc.message, exc.code,
                      exc_info=exc if exc.status == 500 else None)
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        return error_response(exc.status, exc.code, exc.message, exc.details, headers)

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> JSONResponse:
        details = []
        for err in exc.errors():
            loc = [str(p) for p in err.get("loc", ()) if p not in ("body", "query", "path")]
            field = ".".join(loc) or None
            details.append({"field": field, "value": _jsonable(err.get("input")),
                            "message": f"{field}: {err.get('msg')}" if field else err.get("msg", "invalid")})
        msg = details[0]["message"] if details else "invalid request"
        return error_response(422, "validation_error", msg, details)

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> JSONResponse:
        code = _HTTP_CODES.get(exc.status_code, "error")
        return error_response(exc.status_code, code, str(exc.detail), headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _unexpected(_: Request, exc: Exception) -> JSONResponse:
        log.exception("unhandled error")
        return error_response(500, "internal_error", f"internal error: {type(exc).__name__}")
