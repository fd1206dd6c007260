"""Cached reads of the API for the pages (Streamlit's st.cache_data, short TTL).

Every cached function takes the base URL and token as arguments so that two dashboards (or two
tests) pointing at different APIs never share entries. Errors are raised, never cached.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from service.client import Client, api_token, api_url

#: seconds a GET answer is reused: short, so a sweep's new runs show up on the next interaction
TTL_S = 30
HEALTH_TTL_S = 5
#: seconds the filter choices (distinct values per field, one SQL query) are reused: they change
#: only when a new GPU type, model size, … is recorded, so a little longer than a GET answer
OPTIONS_TTL_S = 120


def _key(params: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    return tuple(sorted((k, v) for k, v in params.items() if v is not None and v != ""))


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=500)
def _cached_get(url: str, token: str | None, path: str, params: tuple[tuple[str, Any], ...]) -> Any:
    return Client(url, token).get(path, **dict(params))


@st.cache_data(ttl=HEALTH_TTL_S, show_spinner=False, max_entries=20)
def _cached_health(url: str, token: str | None) -> dict[str, Any]:
    return Client(url, token).health()


@st.cache_data(ttl=OPTIONS_TTL_S, show_spinner=False, max_entries=20)
def _cached_options(url: str, token: str | None) -> dict[str, Any]:
    from dashboard.logic import options as opt

    return opt.from_sql(Client(url, token).post("/sql", {"query": opt.options_sql()}))


def options() -> dict[str, Any]:
    """The filter choices (dashboard.logic.options.from_sql), cached for OPTIONS_TTL_S seconds."""
    return _cached_options(api_url(), api_token())


def get(path: str, **params: Any) -> Any:
    """GET ``/api/v1{path}`` through the cache (None parameters are dropped)."""
    return _cached_get(api_url(), api_token(), path, _key(params))


def get_fresh(path: str, **params: Any) -> Any:
    """GET ``/api/v1{path}`` without the cache: the Live page, whose answer changes every heartbeat."""
    return Client(api_url(), api_token()).get(path, **dict(_key(params)))


@st.cache_data(ttl=TTL_S, show_spinner=False, max_entries=50)
def _cached_post(url: str, token: str | None, path: str, payload_json: str) -> Any:
    import json

    return Client(url, token).post(path, json.loads(payload_json))


def post_cached(path: str, payload: Any) -> Any:
    """POST a read-only query (e.g. /sql) through the GET cache (same TTL): a page's own queries only."""
    import json

    return _cached_post(api_url(), api_token(), path, json.dumps(payload, sort_keys=True))


def post(path: str, payload: Any) -> Any:
    """POST, never cached (SQL queries, memory checks)."""
    return Client().post(path, payload)


def health() -> dict[str, Any]:
    """GET /health, cached for a few seconds."""
    return _cached_health(api_url(), api_token())


def clear() -> None:
    """Forget every cached answer (the Refresh button)."""
    _cached_get.clear()
    _cached_health.clear()
    _cached_options.clear()
    _cached_post.clear()


def all_runs(max_runs: int | None = 20_000, page_size: int = 1000,
             **params: Any) -> tuple[list[dict[str, Any]], int]:
    """Follow the cursor of GET /runs up to ``max_runs`` (None: every matching run); returns
    (runs, total matching)."""
    runs: list[dict[str, Any]] = []
    cursor = None
    total = 0
    while True:
        page = get("/runs", limit=page_size, cursor=cursor, **params)
        runs.extend(page["runs"])
        total = page.get("total", len(runs))
        cursor = page.get("next_cursor")
        if not cursor or (max_runs is not None and len(runs) >= max_runs):
            return runs[:max_runs], total
