"""Alembic environment for scalebook: one set of migrations for DuckDB and PostgreSQL.

The URL comes from `config.attributes["url"]` (set by service.db.alembic_config) or
SCALEBOOK_DATABASE_URL. DuckDB has no Alembic dialect implementation of its own: importing
service.db registers one (service.db.DuckDBImpl).
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine, pool

from service import db as _db  # noqa: F401  (registers the DuckDB Alembic implementation)
from service.tables import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("url")
    if url:
        return url
    from service.settings import get_settings

    return get_settings().url


def run_migrations_offline() -> None:
    context.configure(url=_url(), target_metadata=target_metadata, literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = create_engine(_url(), poolclass=pool.NullPool)
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
