"""POST /api/v1/sql: read-only SQL over the runs table (DESIGN §7; service/analytics/sql.py)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from service.analytics import sql as user_sql
from service.api.deps import DatabaseDep, SettingsDep
from service.api.security import READ
from service.lifecycle import lost_cutoff, utcnow
from service.schemas import ErrorBody

router = APIRouter(tags=["sql"])


class SqlQuery(BaseModel):
    """One read-only SELECT over `runs` (DuckDB or PostgreSQL dialect, whichever backend serves)."""

    model_config = ConfigDict(extra="forbid", json_schema_extra={"example": {
        "query": "SELECT nodes, max(tokens_per_sec_per_gpu) AS best FROM runs WHERE status = 'success' "
                 "GROUP BY nodes ORDER BY nodes"}})

    query: str = Field(min_length=1, max_length=100_000)


class SqlResult(BaseModel):
    """Column names, rows as JSON arrays (datetimes ISO 8601, NaN → null), and whether the row cap cut
    the answer (`truncated`); `elapsed_ms` is execution plus fetch time in milliseconds."""

    columns: list[str]
    rows: list[list[Any]]
    row_count: int
    truncated: bool
    elapsed_ms: float


@router.post("/sql", response_model=SqlResult, dependencies=[READ],
             responses={400: {"model": ErrorBody, "description": "query refused, failed or timed out"},
                        503: {"model": ErrorBody, "description": "SQL unavailable (PostgreSQL reader role cannot log "
                                                    "in) or the database is lost"}})
async def run_sql(body: SqlQuery, db: DatabaseDep, settings: SettingsDep) -> JSONResponse:
    """Run one read-only SELECT over the runs table.

    Only `runs` (and CTEs over it) may be read; writes, DDL, settings, file/extension/network access,
    catalogs and other databases are refused with 400 `query_rejected` naming what was refused. The
    query is cancelled after SCALEBOOK_SQL_TIMEOUT_S seconds (400 `query_rejected`, "query exceeded
    the … timeout"), at most SCALEBOOK_SQL_MAX_ROWS rows come back (`truncated: true` when more
    matched), an answer over SCALEBOOK_SQL_MAX_BYTES is refused (400) and the query gets
    SCALEBOOK_SQL_MEMORY_MB of memory (out of memory, stack depth: 400). Column names are the run
    record's (DESIGN §2). `status` reads as GET /runs answers it: a running run whose last heartbeat is
    older than SCALEBOOK_LOST_AFTER_S reads 'lost' (its stored status stays 'running').
    """
    result = await run_in_threadpool(user_sql.run_query, db, body.query,
                                     timeout_s=settings.sql_timeout_s, max_rows=settings.sql_max_rows,
                                     max_bytes=settings.sql_max_bytes, memory_mb=settings.sql_memory_mb,
                                     reader_url=settings.sql_database_url,
                                     lost_cutoff=lost_cutoff(utcnow(), settings.lost_after_s))
    return JSONResponse(content=result)
