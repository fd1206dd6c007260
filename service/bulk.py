"""The bulk insert and run_key lookup of the write path: the one place (with the user-SQL sandbox)
that knows which backend it runs on.

- DuckDB: the new rows become one Arrow table, inserted set-based by
  `INSERT INTO runs … SELECT … FROM <arrow view> RETURNING run_key, id` (DESIGN §5: ~10^5 rows/s,
  never `executemany`, ~10^3 rows/s). DuckDB writes are serialised by `Database.write_lock`, so
  the keys looked up just before are still new.
- PostgreSQL: one `INSERT INTO runs … SELECT * FROM unnest(<one array per column>) ON CONFLICT
  (run_key) DO NOTHING RETURNING run_key, id` — one statement with one parameter per column
  whatever the batch size, whose plan the server can keep. The arrays are sent in psycopg's binary
  format (`%(name)b`): the text format escapes every element with regular expressions, ~half the
  time of a 1,000-run batch. A key a concurrent writer committed since the
  lookup is skipped, not a unique violation: the caller looks it up again.

Ids come from the `runs_id_seq` default, ingested_at is set by the caller.
"""

from __future__ import annotations

import contextlib
import json
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.orm import Session

from service.tables import Run

#: every column an INSERT names (id comes from the sequence default)
INSERT_COLUMNS = [c for c in Run.__table__.columns if c.name != "id"]
_NAMES = [c.name for c in INSERT_COLUMNS]


def _arrow_type(col: Any) -> pa.DataType:
    t = col.type
    if isinstance(t, sa.BigInteger | sa.Integer):
        return pa.int64()
    if isinstance(t, sa.Double | sa.Float):
        return pa.float64()
    if isinstance(t, sa.DateTime):
        return pa.timestamp("us")
    if isinstance(t, sa.Boolean):
        return pa.bool_()
    return pa.string()


def _pg_array_type(col: Any) -> str:
    t = col.type
    if isinstance(t, sa.BigInteger):
        return "bigint[]"
    if isinstance(t, sa.Integer):
        return "integer[]"
    if isinstance(t, sa.Double | sa.Float):
        return "double precision[]"
    if isinstance(t, sa.DateTime):
        return "timestamp[]"
    if isinstance(t, sa.Boolean):
        return "boolean[]"
    return "text[]"


def arrow_schema(columns: list[Any]) -> pa.Schema:
    """The Arrow schema of table `columns` (SQLAlchemy Column objects) for an insert from an Arrow view."""
    return pa.schema([(c.name, _arrow_type(c)) for c in columns])


_ARROW_SCHEMA = arrow_schema(INSERT_COLUMNS)
#: JSON columns (extra, tags): sent as JSON text, cast to JSON by the insert
_JSON_NAMES = [c.name for c in INSERT_COLUMNS if isinstance(c.type, sa.JSON)]
_SELECT_LIST = ", ".join(f"CAST({n} AS JSON)" if n in _JSON_NAMES else n for n in _NAMES)
_PG_INSERT = (f"INSERT INTO runs ({', '.join(_NAMES)}) "
              f"SELECT {_SELECT_LIST} FROM unnest("
              + ", ".join(f"%({c.name})b::{_pg_array_type(c)}" for c in INSERT_COLUMNS)
              + f") AS t({', '.join(_NAMES)}) ON CONFLICT (run_key) DO NOTHING RETURNING run_key, id")


#: DOUBLE columns: their values are sent as floats (a catalog figure or a derived value may be an int,
#: and PostgreSQL's binary array parameters take one Python type per list)
_FLOAT_NAMES = [c.name for c in INSERT_COLUMNS if isinstance(c.type, sa.Double | sa.Float)]


def _columns(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    data = {name: [r.get(name) for r in rows] for name in _NAMES}
    for name in _JSON_NAMES:
        data[name] = [json.dumps(v) if v is not None else None for v in data[name]]
    for name in _FLOAT_NAMES:
        data[name] = [None if v is None else float(v) for v in data[name]]
    return data


def _driver(session: Session) -> Any:
    return session.connection().connection.driver_connection


def insert(session: Session, rows: list[dict[str, Any]]) -> dict[str, int]:
    """Insert `rows` (validated `runs` rows, ingested_at set, no id) in the session's transaction.

    Returns {run_key: new id} of the rows inserted; on PostgreSQL a row whose run_key a
    concurrent transaction stored first is left out (nothing written for it). Raises
    sqlalchemy.exc.DBAPIError for a driver error (Database.session maps it)."""
    if not rows:
        return {}
    if session.get_bind().dialect.name == "postgresql":
        result = session.connection().exec_driver_sql(_PG_INSERT, _columns(rows))
        return {key: run_id for key, run_id in result}
    raw = _driver(session)
    view = f"_ingest_{uuid.uuid4().hex}"
    # the view's columns are _NAMES in order; extra and tags (JSON text) are cast to JSON by the insert itself
    # (an explicit 54-column select list with CAST cost ~1 ms more per statement to bind)
    sql = f"INSERT INTO runs ({', '.join(_NAMES)}) SELECT * FROM {view} RETURNING run_key, id"
    raw.register(view, pa.table(_columns(rows), schema=_ARROW_SCHEMA))
    try:
        with as_dbapi_error(sql):
            return dict(raw.execute(sql).fetchall())
    finally:
        raw.unregister(view)


def stored_hashes(session: Session, keys: list[str]) -> dict[str, str]:
    """{run_key: content_hash} of those of `keys` already stored: one query.

    DuckDB: `run_key IN (?, ?, …)`, one placeholder per key, on the session's driver connection.
    DuckDB answers an IN list of constants from the ux_runs_run_key index, but `= ANY(<list>)` with
    a hash join over every row (timings: bench/RESULTS.md, "Measurements behind the write and read
    paths"). PostgreSQL: `run_key = ANY(<array>)`, an index scan either way."""
    if not keys:
        return {}
    if session.get_bind().dialect.name == "duckdb":
        sql = f"SELECT run_key, content_hash FROM runs WHERE run_key IN ({', '.join('?' * len(keys))})"
        return dict(_driver(session).execute(sql, keys).fetchall())
    query = sa.select(Run.run_key, Run.content_hash).where(
        Run.run_key == sa.any_(sa.bindparam("keys", keys, type_=sa.ARRAY(sa.String))))
    return {k: h for k, h in session.execute(query).all()}


@contextlib.contextmanager
def as_dbapi_error(statement: str) -> Iterator[None]:
    """Driver errors raised on DuckDB's raw connection (the Arrow insert) as the SQLAlchemy
    exceptions SQLAlchemy's own calls raise, so Database.session maps them alike."""
    try:
        yield
    except sa.exc.DBAPIError:
        raise
    except Exception as exc:
        if type(exc).__module__.split(".")[0] not in ("duckdb", "_duckdb"):
            raise
        raise sa.exc.DBAPIError.instance(statement, None, exc, Exception) from exc
