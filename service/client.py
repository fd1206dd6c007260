"""The HTTP client of the scalebook API for the CLI and the dashboard (httpx; imports nothing else of
service, so the dashboard can use it without the server's dependencies).

The training side has its own client, ingest/client.py: standard library only (training
environments are fragile), with retries, a spool and exactly-once replays — a push must never fail
a job, where a CLI command or a page should fail at once and say why. Both read the same
configuration (ingest.client.api_url / api_token):

- ``SCALEBOOK_API_URL`` (default ``http://127.0.0.1:8000``): where the API is served;
- ``SCALEBOOK_TOKEN``: sent as ``Authorization: Bearer <token>`` when set.

Failures become three exceptions (base :class:`ClientError`) with messages a user can act on:

- :class:`ApiDown`: nothing answers at the URL (connection refused, DNS, timeout);
- :class:`Unauthorized`: 401/403 (the server has tokens and ours is missing, unknown or too weak);
- :class:`ApiError`: any other error answer, carrying the API's error body
  ``{"error": {"code", "message", "details"}}``.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from datetime import date, datetime
from typing import Any

import httpx

from ingest.client import DEFAULT_API_URL, api_token, api_url

__all__ = ["API_PREFIX", "DEFAULT_API_URL", "ApiDown", "ApiError", "Client", "ClientError", "Unauthorized",
           "api_token", "api_url", "clean_params"]

API_PREFIX = "/api/v1"


class ClientError(Exception):
    """Base class of the client's errors; ``str(exc)`` is the message to show the user."""


class ApiDown(ClientError):
    """The API is not reachable at the configured URL."""

    def __init__(self, url: str, reason: str = ""):
        self.url = url
        self.reason = reason
        super().__init__(f"cannot reach the scalebook API at {url}{f' ({reason})' if reason else ''}: start it with "
                         "`scalebook serve` or point SCALEBOOK_API_URL at a running one")


class Unauthorized(ClientError):
    """401 or 403: a token is needed, unknown, revoked or of too small a scope."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.message = message
        hint = "set SCALEBOOK_TOKEN to an API token (create one with `scalebook token create --scope read`)"
        if status == 403:
            hint = "set SCALEBOOK_TOKEN to a token with a larger scope"
        super().__init__(f"the API refused the request (HTTP {status}: {message}): {hint}")


class ApiError(ClientError):
    """An error answer other than 401/403, with the fields of the API's error body."""

    def __init__(self, status: int, code: str, message: str, details: list[dict[str, Any]] | None = None,
                 path: str = ""):
        self.status = status
        self.code = code
        self.message = message
        self.details = details or []
        self.path = path
        super().__init__(f"HTTP {status} {code}: {message}")

    @property
    def endpoint_missing(self) -> bool:
        """True when the server has no such route (an older API): not a 'no data' 404."""
        return self.status in (404, 405) and self.message in ("Not Found", "Method Not Allowed")


def _param(value: Any) -> Any:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (datetime, date)):
        return value.isoformat()
    return value


def clean_params(params: dict[str, Any]) -> dict[str, Any]:
    """Query parameters without None/empty values; dates as ISO 8601, booleans as true/false."""
    return {k: _param(v) for k, v in params.items() if v is not None and v != ""}


def _error_from(resp: httpx.Response, path: str) -> ClientError:
    try:
        body = resp.json()
    except ValueError:
        body = None
    err: dict[str, Any] = {}
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
    message = err.get("message") or (resp.text[:300] if resp.text else resp.reason_phrase)
    if resp.status_code in (401, 403):
        return Unauthorized(resp.status_code, message)
    return ApiError(resp.status_code, err.get("code") or "error", message, err.get("details") or [], path)


_POOL: OrderedDict[tuple[str, str | None, float], httpx.Client] = OrderedDict()
_POOL_LOCK = threading.Lock()
_POOL_SIZE = 8


def _http(url: str, token: str | None, timeout: float) -> httpx.Client:
    """A shared connection pool per (URL, token, timeout): creating an httpx.Client costs ~0.5 s
    (it loads the CA bundle), far more than a request to a local API."""
    key = (url, token, timeout)
    with _POOL_LOCK:
        client = _POOL.get(key)
        if client is None or client.is_closed:
            headers = {"Authorization": f"Bearer {token}"} if token else {}
            client = _POOL[key] = httpx.Client(base_url=url, headers=headers, timeout=timeout)
            while len(_POOL) > _POOL_SIZE:
                _POOL.popitem(last=False)[1].close()
        _POOL.move_to_end(key)
        return client


class Client:
    """Synchronous client: ``Client().get("/heatmap", metric="mfu")`` returns the decoded JSON body."""

    def __init__(self, url: str | None = None, token: str | None = None, timeout: float = 30.0):
        self.url = (url or api_url()).rstrip("/")
        self.token = token if token is not None else api_token()
        self.timeout = timeout

    def request(self, method: str, path: str, *, params: dict[str, Any] | None = None,
                json: Any = None) -> Any:
        """Send one request to ``/api/v1{path}``; the JSON body, or one of this module's errors."""
        try:
            resp = _http(self.url, self.token, self.timeout).request(
                method, f"{API_PREFIX}{path}", params=clean_params(params or {}), json=json)
        except httpx.TimeoutException as exc:
            raise ApiDown(self.url, f"no answer within {self.timeout:.0f} s ({type(exc).__name__})") from exc
        except httpx.TransportError as exc:
            raise ApiDown(self.url, type(exc).__name__) from exc
        if resp.status_code >= 400:
            raise _error_from(resp, path)
        try:
            return resp.json()
        except ValueError as exc:
            raise ApiError(resp.status_code, "bad_response", f"the API answered non-JSON: {resp.text[:200]}",
                           path=path) from exc

    def get(self, path: str, **params: Any) -> Any:
        """GET with query parameters (None values are left out)."""
        return self.request("GET", path, params=params)

    def post(self, path: str, payload: Any) -> Any:
        """POST a JSON body."""
        return self.request("POST", path, json=payload)

    def health(self) -> dict[str, Any]:
        """GET /health: {"status", "backend", "schema_revision", "runs", "version"} (no token needed)."""
        return self.get("/health")

    def retire(self, reason: str, ids: list[int] | None = None, filter: dict[str, Any] | None = None) -> Any:
        """Take runs out of every analytic: ``POST /runs/retire {"ids"?, "filter"?, "reason"}`` (a
        write token) -> ``{"changed", "ids"}``. A retired run stays stored and listed. Raises
        ValueError for no selection or an empty reason; ApiError (404 unknown id, 400 bad filter),
        Unauthorized or ApiDown."""
        if not reason.strip():
            raise ValueError("a reason is required to retire runs")
        return self.post("/runs/retire", {**_selection(ids, filter), "reason": reason.strip()})

    def unretire(self, ids: list[int] | None = None, filter: dict[str, Any] | None = None) -> Any:
        """Put retired runs back: ``POST /runs/unretire {"ids"?, "filter"?}`` (a write token) ->
        ``{"changed", "ids"}``; errors as :meth:`retire`."""
        return self.post("/runs/unretire", _selection(ids, filter))


def _selection(ids: list[int] | None, filter: dict[str, Any] | None) -> dict[str, Any]:
    """The runs a retire/unretire request names: ids and/or a filter (ValueError when neither)."""
    if not ids and not filter:
        raise ValueError("no runs selected: give run ids or a filter")
    body: dict[str, Any] = {}
    if ids:
        body["ids"] = [int(i) for i in ids]
    if filter:
        body["filter"] = filter
    return body
