"""Request guards as pure ASGI middleware (DESIGN §7): JSON bodies only, no cross-site writes.

- A POST, PUT or PATCH whose body is not `application/json` (or `application/<x>+json`) is refused
  with 415 before it is read. Browsers send `text/plain`, form and multipart bodies cross-site
  without a preflight; with this rule no such "simple" request reaches an endpoint.
- A request that carries an `Origin` header (browsers add it to cross-origin requests, and to every
  POST) is refused with 403 unless the origin is the server's own (scheme://Host of the request) or
  listed in SCALEBOOK_CORS_ORIGINS (comma-separated `scheme://host[:port]`). Programs (the CLI, the
  push client, the dashboard's server side) send no Origin and are not affected. Listed origins also
  get CORS headers and preflight answers (Starlette's CORSMiddleware, installed by the app factory).
"""

from __future__ import annotations

import json

from starlette.types import ASGIApp, Receive, Scope, Send

_BODY_METHODS = {"POST", "PUT", "PATCH"}


def parse_origins(value: str) -> frozenset[str]:
    """SCALEBOOK_CORS_ORIGINS → the set of allowed origins (lower case, no trailing slash)."""
    return frozenset(o.strip().rstrip("/").lower() for o in value.split(",") if o.strip())


def _is_json(content_type: str) -> bool:
    media = content_type.split(";", 1)[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class RequestGuard:
    """415 for non-JSON bodies, 403 for foreign origins (module docstring)."""

    def __init__(self, app: ASGIApp, allowed_origins: frozenset[str] = frozenset()):
        self.app = app
        self.allowed = allowed_origins

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: dict[bytes, str] = {}
        for name, value in scope.get("headers", ()):
            headers.setdefault(name, value.decode("latin-1"))
        origin = headers.get(b"origin")
        if origin is not None and not self._origin_ok(origin, scope, headers.get(b"host", "")):
            await _refuse(send, 403, "forbidden",
                          f"cross-origin request from {origin!r} refused: "
                          "list it in SCALEBOOK_CORS_ORIGINS to allow it",
                          "Origin", origin)
            return
        method = scope.get("method", "GET").upper()
        if method in _BODY_METHODS:
            content_type = headers.get(b"content-type")
            length = headers.get(b"content-length", "0").strip()
            has_body = length not in ("", "0") or b"transfer-encoding" in headers
            if (content_type is not None or has_body) and not _is_json(content_type or ""):
                await _refuse(send, 415, "unsupported_media_type",
                              f"request bodies must be JSON: send 'Content-Type: application/json' "
                              f"(got {content_type or 'none'!r})", "Content-Type", content_type)
                return
        await self.app(scope, receive, send)

    def _origin_ok(self, origin: str, scope: Scope, host: str) -> bool:
        origin = origin.strip().rstrip("/").lower()
        if origin in self.allowed or "*" in self.allowed:
            return True
        scheme = scope.get("scheme", "http")
        return bool(host) and origin == f"{scheme}://{host.strip().lower()}"


async def _refuse(send: Send, status: int, code: str, message: str, field: str, value: str | None) -> None:
    body = json.dumps({"error": {"code": code, "message": message,
                                 "details": [{"field": field, "value": value, "message": message}]}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
