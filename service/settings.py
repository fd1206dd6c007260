"""Service settings, read from `SCALEBOOK_*` environment variables (pydantic-settings).

The embedded default is a DuckDB file at `$SCALEBOOK_DATA_DIR/scalebook.duckdb`, where
`SCALEBOOK_DATA_DIR` defaults to `~/.local/share/scalebook`. Unsafe combinations fail at start-up
(see `check_bind`), not at the first request.
"""

from __future__ import annotations

import ipaddress
from functools import lru_cache
from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from core.lifecycle import DEFAULT_LOST_AFTER_S


def default_data_dir() -> Path:
    return Path.home() / ".local" / "share" / "scalebook"


class Settings(BaseSettings):
    """All service settings. Environment prefix `SCALEBOOK_`."""

    model_config = SettingsConfigDict(env_prefix="SCALEBOOK_", extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir)
    database_url: str | None = None
    #: largest accepted request body, bytes
    max_body_bytes: int = 16 * 1024 * 1024
    #: most runs in one POST /api/v1/runs
    max_batch_runs: int = 1000
    #: user SQL: statement timeout, seconds, and row cap
    sql_timeout_s: float = 5.0
    sql_max_rows: int = 10_000
    #: user SQL: largest answer (the rows as JSON), bytes; larger answers are refused with 400
    sql_max_bytes: int = Field(default=16 * 1024 * 1024, ge=1024, le=1 << 30)
    #: user SQL: memory for the query (DuckDB memory_limit of the sandbox; PostgreSQL work_mem), MiB
    sql_memory_mb: int = Field(default=512, ge=16, le=1 << 20)
    #: user SQL on PostgreSQL: URL of the login role that may SELECT runs only (migration 0009);
    #: default: the service's URL with the user scalebook_reader and no password
    sql_database_url: str | None = None
    #: origins (scheme://host[:port]) allowed to send cross-origin requests, comma-separated; none by default
    cors_origins: str = ""
    #: allow binding beyond loopback without tokens
    insecure: bool = False
    #: the address the API is bound to (`scalebook serve --host` sets it): beyond loopback the API is
    #: never open without tokens (unless `insecure`) and its last admin token cannot be revoked
    host: str = "127.0.0.1"
    #: live runs: a running run whose last heartbeat is older than this reads as `lost` (core/lifecycle.py), seconds
    lost_after_s: float = Field(default=DEFAULT_LOST_AFTER_S, gt=0, le=30 * 24 * 3600)
    #: live runs: the most steps kept per run (POST /runs/{run_key}/steps); older steps beyond it are thinned
    max_steps_per_run: int = Field(default=10_000, ge=10, le=1_000_000)

    @field_validator("max_batch_runs", "max_body_bytes", "sql_max_rows")
    @classmethod
    def _positive(cls, v: int, info) -> int:
        caps = {"max_batch_runs": 100_000, "max_body_bytes": 1 << 30, "sql_max_rows": 1_000_000}
        if not 0 < v <= caps[info.field_name]:
            raise ValueError(f"must be in 1..{caps[info.field_name]}, got {v}")
        return v

    @field_validator("sql_timeout_s")
    @classmethod
    def _timeout(cls, v: float) -> float:
        if not 0 < v <= 300:
            raise ValueError(f"must be in (0, 300] seconds, got {v}")
        return v

    @field_validator("database_url")
    @classmethod
    def _scheme(cls, v: str | None) -> str | None:
        if v and not v.startswith(("duckdb:///", "postgres://", "postgresql://", "postgresql+psycopg://")):
            raise ValueError(f"unsupported database URL scheme in {v.split('://')[0]!r}: use duckdb:///path or "
                             "postgresql://user@host/db")
        return v

    @property
    def url(self) -> str:
        """The SQLAlchemy URL in use: SCALEBOOK_DATABASE_URL or the DuckDB file in data_dir."""
        if self.database_url:
            return normalise_url(self.database_url)
        return f"duckdb:///{self.data_dir / 'scalebook.duckdb'}"


def normalise_url(url: str) -> str:
    """Accept `postgres://`/`postgresql://` and pin the psycopg 3 driver."""
    for prefix in ("postgres://", "postgresql://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


def is_loopback(host: str) -> bool:
    """True for localhost / 127.0.0.0/8 / ::1 only. "" (every interface to uvicorn), 0.0.0.0, ::
    and any other name or address are not loopback."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def public_bind(settings: Settings) -> bool:
    """Whether the API is bound beyond loopback without --insecure: then it must never be open."""
    return not is_loopback(settings.host) and not settings.insecure


@lru_cache
def get_settings() -> Settings:
    return Settings()
