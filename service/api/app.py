"""The FastAPI application factory.

`create_app(db=None, settings=None)`: when `db` is None the lifespan opens the database named by
the settings and runs `Database.prepare()` (wait, migrate an embedded DuckDB, refuse a stale
PostgreSQL schema) before serving.
"""

from __future__ import annotations

from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi.middleware.cors import CORSMiddleware
from fastapi.openapi.utils import get_openapi

from service import __version__
from service.api import (
    analytics,
    docs,
    errors,
    live,
    memory,
    planning,
    predict,
    retire,
    runs,
    sql,
    suggest,
    sweeps,
    tokens,
)
from service.api.guards import RequestGuard, parse_origins
from service.api.limits import BodySizeLimit
from service.api.strict import reject_unknown_query
from service.db import Database
from service.schemas import ErrorBody, RunIn, RunOut, StoredRuns
from service.settings import Settings, get_settings

API_PREFIX = "/api/v1"


def create_app(db: Database | None = None, settings: Settings | None = None) -> FastAPI:
    """Build the app. Pass `db` to serve an already prepared database (tests, bench)."""
    settings = settings or get_settings()

    @asynccontextmanager
    async def lifespan(app: FastAPI):
        owned = db is None
        database = db or Database(settings.url)
        if owned:
            database.prepare()
        app.state.db = database
        try:
            yield
        finally:
            if owned:
                database.dispose()

    app = FastAPI(
        title="scalebook",
        version=__version__,
        summary="Results database for distributed LLM-training benchmark sweeps.",
        lifespan=lifespan,
        docs_url=None, redoc_url=None,  # served from local assets below (api/docs.py): no CDN
        responses={422: {"model": ErrorBody}, 400: {"model": ErrorBody}},
        dependencies=[Depends(reject_unknown_query)],  # unknown GET query parameters -> 422 (api/strict.py)
    )
    app.state.settings = settings
    if db is not None:
        app.state.db = db
    errors.install(app)
    docs.install(app)
    app.add_middleware(BodySizeLimit, max_bytes=settings.max_body_bytes)
    app.include_router(retire.router, prefix=API_PREFIX)
    origins = parse_origins(settings.cors_origins)
    app.add_middleware(RequestGuard, allowed_origins=origins)  # 415 non-JSON bodies, 403 foreign origins
    if origins:
        app.add_middleware(CORSMiddleware, allow_origins=sorted(origins), allow_methods=["GET", "POST", "DELETE"],
                           allow_headers=["Authorization", "Content-Type", "Prefer"])
    app.include_router(live.router, prefix=API_PREFIX)
    app.include_router(runs.router, prefix=API_PREFIX)
    app.include_router(analytics.router, prefix=API_PREFIX)
    app.include_router(suggest.router, prefix=API_PREFIX)
    app.include_router(sweeps.router, prefix=API_PREFIX)
    app.include_router(memory.router, prefix=API_PREFIX)
    app.include_router(predict.router, prefix=API_PREFIX)
    app.include_router(planning.router, prefix=API_PREFIX)
    app.include_router(sql.router, prefix=API_PREFIX)
    app.include_router(tokens.router, prefix=API_PREFIX)

    def custom_openapi():
        if app.openapi_schema:
            return app.openapi_schema
        schema = get_openapi(title=app.title, version=app.version, summary=app.summary, routes=app.routes)
        components = schema.setdefault("components", {}).setdefault("schemas", {})
        run_in = RunIn.model_json_schema(ref_template="#/components/schemas/{model}")
        components.update(run_in.pop("$defs", {}))
        components["RunIn"] = run_in
        for model in (RunOut, StoredRuns):
            sch = model.model_json_schema(ref_template="#/components/schemas/{model}")
            components.update(sch.pop("$defs", {}))
            components.setdefault(model.__name__, sch)
        app.openapi_schema = schema
        return schema

    app.openapi = custom_openapi  # type: ignore[method-assign]  # FastAPI's documented override
    return app
