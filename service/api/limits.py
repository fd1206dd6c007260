"""Request body size limit as pure ASGI middleware: 413 before the body is parsed.

Checks Content-Length up front and counts streamed (chunked) bodies as they arrive, so an
oversized body is refused without being held in memory.
"""

from __future__ import annotations

import json
import logging

from starlette.requests import ClientDisconnect
from starlette.types import ASGIApp, Message, Receive, Scope, Send

log = logging.getLogger("scalebook.api")


class BodyTooLarge(Exception):
    pass


class BodySizeLimit:
    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = 0
                if length > self.max_bytes:
                    await self._reject(send, length)
                    return
        seen = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            if not started:
                await self._reject(send, seen)
        except ClientDisconnect:  # the client went away mid-body: nobody to answer, not our error
            log.info("client disconnected before its request body was read: %s %s", scope.get("method"),
                     scope.get("path"))

    async def _reject(self, send: Send, size: int) -> None:
        body = json.dumps({"error": {"code": "payload_too_large",
                                     "message": f"request body of {size} bytes exceeds the limit of "
                                                f"{self.max_bytes} bytes "
                                                "(SCALEBOOK_MAX_BODY_BYTES); send fewer runs per request",
                                     "details": [{"field": "body", "value": size, "message": "too large"}]}}).encode()
        await send({"type": "http.response.start", "status": 413,
                    "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})
