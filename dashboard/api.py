"""HTTP client of the scalebook API for the dashboard (no Streamlit here).

The dashboard reads only through the API, so it behaves the same on DuckDB and PostgreSQL and
never opens the database file that the API process owns. Configuration comes from the
environment, like the CLI:

- ``SCALEBOOK_API_URL`` (default ``http://127.0.0.1:8000``): where the API is served;
- ``SCALEBOOK_TOKEN``: sent as ``Authorization: Bearer <token>`` when set.

Failures become three exceptions with messages a user can act on:

- :class:`ApiDown`: nothing answers at the URL (connection refused, DNS, timeout);
- :class:`Unauthorized`: 401/403 (the server has tokens and ours is missing, unknown or too weak);
- :class:`ApiError`: any other error answer, carrying the API's error body
  ``{"error": {"code", "message", "details"}}``.
"""

from __future__ import annotations

import os
import threading
from collections import OrderedDict
from datetime import date, datetime
from typing import Any

import httpx

DEFAULT_API_URL = "http://127.0.0.1:8000"
API_PREFIX = "/api/v1"


def api_url() -> str:
    """The API base URL: SCALEBOOK_API_URL or http://127.0.0.1:8000, without a trailing slash."""
    return (os.environ.get("SCALEBOOK_API_URL") or DEFAULT_API_URL).rstrip("/")


def api_token() -> str | None:
    """SCALEBOOK_TOKEN, or None when unset or empty."""
    return os.environ.get("SCALEBOOK_TOKEN") or None


class DashboardApiError(Exception):
    """Base class of the client's errors; ``str(exc)`` is the message to show the user."""


class ApiDown(DashboardApiError):
    """The API is not reachable at the configured URL."""

    def __init__(self, url: str, reason: str = ""):
        self.url = url
        self.reason = reason
        super().__init__(f"the scalebook API at {url} is not reachable — start it with `scalebook serve` "
                         f"(or point SCALEBOOK_API_URL at a running one){f' [{reason}]' if reason else ''}")


class Unauthorized(DashboardApiError):
    """401 or 403: a token is needed, unknown, revoked or of too small a scope."""

    def __init__(self, status: int, message: str):
        self.status = status
        self.message = message
        hint = ("set SCALEBOOK_TOKEN to an API token (create one with `scalebook token create --scope read`) "
                "and restart the dashboard")
        if status == 403:
            hint = "set SCALEBOOK_TOKEN to a token with a larger scope and restart the dashboard"
        super().__init__(f"the API refused the request (HTTP {status}: {message}): {hint}")


class ApiError(DashboardApiError):
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


def _error_from(resp: httpx.Response, path: str) -> DashboardApiError:
    try:
        body = resp.json()
    except ValueError:
        body = None
    err = body.get("error") if isinstance(body, dict) and isinstance(body.get("error"), dict) else {}
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


#: the write endpoints of retiring (the `model` helper's API); the one place to adjust their shape
RETIRE_PATH = "/runs/retire"
UNRETIRE_PATH = "/runs/unretire"


def retire_runs(ids: list[int], reason: str, token: str | None = None) -> Any:
    """Retire runs: ``POST /api/v1/runs/retire {"ids": [...], "reason": "..."}`` (a write token).

    A retired run stays stored and visible in the Runs page, but the heatmap, recommendations and
    fits leave it out. ``token`` overrides SCALEBOOK_TOKEN for this one request (a write token typed
    into the page). Raises ApiError (e.g. 404 for an unknown id, 400 for an empty reason),
    Unauthorized (401/403 without a write token) or ApiDown."""
    if not ids:
        raise ValueError("no run ids to retire")
    if not reason.strip():
        raise ValueError("a reason is required to retire runs")
    return Client(token=token).post(RETIRE_PATH, {"ids": [int(i) for i in ids], "reason": reason.strip()})


def unretire_runs(ids: list[int], token: str | None = None) -> Any:
    """Un-retire runs: ``POST /api/v1/runs/unretire {"ids": [...]}`` (a write token); errors as
    :func:`retire_runs`."""
    if not ids:
        raise ValueError("no run ids to un-retire")
    return Client(token=token).post(UNRETIRE_PATH, {"ids": [int(i) for i in ids]})
