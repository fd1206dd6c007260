"""Read-only SQL over the runs table (DESIGN §7): the query sees `runs` and nothing else, by construction.

Layer 1, the parser gate (service/analytics/sql_check.py), refuses anything but one SELECT over runs.
Layer 2, here, runs what passed where nothing else exists, so a parser bypass finds nothing to read:

- DuckDB: the query runs on its own connection to an in-memory DuckDB instance that holds nothing
  (one per process and memory limit), never on the service's file. Its only relation is `runs`, a
  TEMP view of that connection alone: the columns the query names, exported from the
  service's file as Arrow (streamed as a RecordBatchReader when the query names runs once and has no
  CTE, else materialised as an Arrow table). api_tokens, alembic_version and every catalog of the real
  file are simply not there. The instance is created with `enable_external_access=false` (no files,
  extensions, network), `python_enable_replacements=false` (no Python variables as tables),
  `memory_limit` = SCALEBOOK_SQL_MEMORY_MB, `threads` = 2 and `lock_configuration=true` (no SET can
  undo any of it), and the query runs inside `BEGIN TRANSACTION READ ONLY`; DuckDB's own parser must
  see exactly one SELECT. repeat/lpad/rpad and the list forms of range/generate_series, which build a
  value in one uninterruptible piece, are shadowed by macros that refuse values over the byte cap
  (`_SIZE_GUARDS`). The connection, with everything it registered, is closed after the query.
- PostgreSQL: the query runs on a connection of its own pool, logged in as the role scalebook_reader
  (migrations 0002 and 0009: LOGIN, owns nothing, member of nothing, SELECT on runs only, read-only by
  default), URL SCALEBOOK_SQL_DATABASE_URL or the service's URL with that user and no password. It runs
  as a server-side cursor (`DECLARE … CURSOR`, one SELECT only) in a `READ ONLY` transaction with
  `statement_timeout` and `work_mem` set. The role cannot `SET ROLE` to anything (it is member of no
  role), so `set_config('role', …)` cannot leave it whatever the service's own user is. System
  catalogs (pg_catalog, information_schema) stay readable as for any PostgreSQL login; the parser gate
  refuses them.
- Both: `status` reads as the API answers it (DESIGN §9): a running run whose last_heartbeat_at is
  before the lost cutoff reads 'lost' — DuckDB: the sandbox's `runs` view REPLACEs status by the CASE;
  PostgreSQL: each reference to runs in the checked tree becomes a subquery with that CASE as status.
- Both: at most SCALEBOOK_SQL_MAX_ROWS rows are read (`truncated: true` when more matched); the
  answer is refused with 400 when it exceeds SCALEBOOK_SQL_MAX_BYTES (counted while it is read, before
  it is built); the SCALEBOOK_SQL_TIMEOUT_S deadline covers the export, the query, the fetch and the
  conversion to JSON. Every error of the user's query — syntax, out of memory, stack depth, timeout,
  too big — is 400 `query_rejected`; only a lost database is 503.
"""

from __future__ import annotations

import json
import re
import threading
import time
import warnings
import weakref
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa

from core.record import LOST, RUNNING
from service.analytics.sql_check import (  # noqa: F401 - re-exported: the public API of user SQL
    MAX_QUERY_CHARS,
    _reject,
    check_and_parse,
    check_query,
    json_safe,
    runs_columns_used,
    runs_references,
    sqlglot_dialect,
)
from service.db import Database
from service.errors import DatabaseUnavailable, QueryRejected, SqlUnavailable
from service.tables import Run

READER_ROLE = "scalebook_reader"
RUN_COLUMNS = [c.name for c in Run.__table__.columns]
_JSON_COLUMNS = {c.name for c in Run.__table__.columns if isinstance(c.type, sa.JSON)}
DEFAULT_MAX_BYTES = 16 * 1024 * 1024
DEFAULT_MEMORY_MB = 512
_SANDBOX_THREADS = 2
_BATCH_ROWS = 1024
_PG_BATCH_ROWS = 128  # FETCH size: the server sends a whole batch at once


def _timeout_error(timeout_s: float) -> QueryRejected:
    return _reject(f"query exceeded the {timeout_s:g} s timeout (SCALEBOOK_SQL_TIMEOUT_S) and was cancelled",
                   value=timeout_s)


def _too_big(max_bytes: int) -> QueryRejected:
    return _reject(f"the answer exceeds {max_bytes:,} bytes (SCALEBOOK_SQL_MAX_BYTES): select fewer or smaller "
                   "columns, aggregate, or add a LIMIT", value=max_bytes)


def _first_lines(text: str, n: int = 3) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines()[:n])[:500]


class _Answer:
    """Rows gathered under the row cap, the byte cap and the deadline."""

    def __init__(self, max_rows: int, max_bytes: int, deadline: float, timeout_s: float):
        self.rows: list[list[Any]] = []
        self.max_rows, self.max_bytes = max_rows, max_bytes
        self.deadline, self.timeout_s = deadline, timeout_s
        self.size = 0
        self.truncated = False

    def check_time(self) -> None:
        if time.monotonic() > self.deadline:
            raise _timeout_error(self.timeout_s)

    def add_bytes(self, n: int) -> None:
        self.size += n
        if self.size > self.max_bytes:
            raise _too_big(self.max_bytes)

    def add(self, rows: list[list[Any]]) -> bool:
        """Add JSON-safe rows; False once the row cap is reached (more rows → truncated)."""
        room = self.max_rows - len(self.rows)
        if len(rows) > room:
            rows, self.truncated = rows[:room], True
        self.add_bytes(len(json.dumps(rows, separators=(",", ":"), default=str)) if rows else 0)
        self.rows.extend(rows)
        self.check_time()
        return not self.truncated


# -- execution -----------------------------------------------------------------------------------
def run_query(db: Database, query: str, *, timeout_s: float, max_rows: int, max_bytes: int = DEFAULT_MAX_BYTES,
              memory_mb: int = DEFAULT_MEMORY_MB, reader_url: str | None = None,
              lost_cutoff: datetime | None = None) -> dict[str, Any]:
    """Check and run one read-only query over runs (module docstring). `status` reads as the API answers
    it: a running run whose last heartbeat is before `lost_cutoff` (now − lost_after_s, naive UTC; default
    now − core.lifecycle.DEFAULT_LOST_AFTER_S) reads 'lost' (service/lifecycle.py, `live_runs_sql`).

    Returns {"columns": [str], "rows": [[json value]], "row_count": int, "truncated": bool,
    "elapsed_ms": float (export, execution, fetch and conversion, milliseconds)}. Raises QueryRejected
    (400) for a refused query, an error in it, the timeout or an answer over max_bytes; SqlUnavailable
    (503) when PostgreSQL has no usable reader role; DatabaseUnavailable (503) when the database cannot
    be reached.
    """
    dialect = sqlglot_dialect(db.dialect)
    sql, tree = check_and_parse(query, dialect)
    cutoff = _cutoff(lost_cutoff)
    start = time.perf_counter()
    if dialect == "duckdb":
        columns, answer = _run_duckdb(db, sql, timeout_s, max_rows, max_bytes, memory_mb,
                                      runs_columns_used(tree, RUN_COLUMNS), stream=_streamable(tree), cutoff=cutoff)
    else:
        # only a query that may read `status` needs it derived (a query that never names it runs as written)
        if "status" in runs_columns_used(tree, RUN_COLUMNS):
            sql = _with_read_status(tree, cutoff)
        columns, answer = _run_postgres(db, sql, timeout_s, max_rows, max_bytes, memory_mb, reader_url)
    return {"columns": columns, "rows": answer.rows, "row_count": len(answer.rows), "truncated": answer.truncated,
            "elapsed_ms": round((time.perf_counter() - start) * 1000.0, 3)}


def execute_sandboxed(db: Database, sql: str, *, timeout_s: float, max_rows: int,
                      max_bytes: int = DEFAULT_MAX_BYTES, memory_mb: int = DEFAULT_MEMORY_MB) -> tuple[list[str], list]:
    """Run `sql` in the backend sandbox WITHOUT the parser gate (for tests of the second layer).

    Every run column is exported on DuckDB. Returns (columns, rows) with at most max_rows rows.
    Same errors as run_query.
    """
    if db.is_duckdb:
        columns, answer = _run_duckdb(db, sql, timeout_s, max_rows, max_bytes, memory_mb, RUN_COLUMNS, stream=False,
                                      cutoff=_cutoff(None))
    else:
        columns, answer = _run_postgres(db, sql, timeout_s, max_rows, max_bytes, memory_mb, None)
    return columns, answer.rows


def _cutoff(lost_cutoff: datetime | None) -> datetime:
    if lost_cutoff is not None:
        return lost_cutoff
    from core.lifecycle import DEFAULT_LOST_AFTER_S
    from core.lifecycle import lost_cutoff as cutoff_at

    return cutoff_at(datetime.now(UTC).replace(tzinfo=None), DEFAULT_LOST_AFTER_S)


def _status_case(cutoff: datetime) -> str:
    """`status` as it reads (core/lifecycle.py) in SQL both backends take: a running run whose last
    heartbeat is before `cutoff` (or missing) reads 'lost'."""
    return (f"CASE WHEN status = '{RUNNING}' AND (last_heartbeat_at IS NULL OR last_heartbeat_at < "
            f"TIMESTAMP '{cutoff.isoformat(sep=' ')}') THEN '{LOST}' ELSE status END")


def _with_read_status(tree, cutoff: datetime) -> str:
    """The checked query (PostgreSQL) with each reference to the table runs replaced by a subquery over it
    that has every column, `status` as it reads at `cutoff` (a CTE of the user's named runs is left
    alone). PostgreSQL inlines the subquery; the query reads what it read, lost runs reading 'lost'."""
    import sqlglot
    from sqlglot import exp

    from service.analytics.sql_check import _norm, _visible_ctes

    select = ", ".join(f"{_status_case(cutoff)} AS status" if c == "status" else c for c in RUN_COLUMNS)
    for table in list(tree.find_all(exp.Table)):
        if not isinstance(table.this, exp.Identifier) or _norm(table.this) != "runs" or "runs" in _visible_ctes(table):
            continue
        alias = table.args.get("alias")
        alias = alias.copy() if alias is not None else exp.TableAlias(this=exp.to_identifier("runs"))
        table.replace(exp.Subquery(this=sqlglot.parse_one(f"SELECT {select} FROM runs", read="postgres"), alias=alias))
    return tree.sql(dialect="postgres", comments=False)


def _streamable(tree) -> bool:
    """A query that names runs once and has no CTE scans it once: it can read a stream."""
    from sqlglot import exp

    return runs_references(tree) == 1 and not any(True for _ in tree.find_all(exp.CTE))


# -- DuckDB --------------------------------------------------------------------------------------
class _Interrupter:
    """Calls interrupt() on whichever DuckDB connection is working when the deadline passes."""

    def __init__(self, timeout_s: float):
        self._lock = threading.Lock()
        self._con: Any = None
        self.fired = False
        self._timer = threading.Timer(timeout_s, self._fire)
        self._timer.daemon = True

    def watch(self, con: Any) -> None:
        with self._lock:
            self._con = con
            if self.fired and con is not None:
                con.interrupt()

    def _fire(self) -> None:
        with self._lock:
            self.fired = True
            if self._con is not None:
                self._con.interrupt()

    def __enter__(self) -> _Interrupter:
        self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._timer.cancel()
        with self._lock:
            self._con = None


#: DuckDB builds a scalar's value in one piece, without checking for interrupts: repeat('x', 6e8) runs
#: for minutes past any timeout and outside memory_limit. In the sandbox, temporary macros of the same
#: names (which take precedence over the built-ins; the parser refuses the schema-qualified originals)
#: refuse values longer than the answer may be.
_SIZE_GUARDS = (
    "repeat(s, n) AS system.main.repeat(s, CASE WHEN n * length(s) > {cap} THEN error('repeat(): result over "
    "{cap} characters (SCALEBOOK_SQL_MAX_BYTES)') ELSE n END)",
    *(f"{fn}(s, n, p) AS system.main.{fn}(s, CASE WHEN n > {{cap}} THEN error('{fn}(): result over {{cap}} "
      f"characters (SCALEBOOK_SQL_MAX_BYTES)') ELSE n END, p)" for fn in ("lpad", "rpad")),
    *(f"{fn}(a) AS system.main.{fn}(CASE WHEN a > {{cap}} THEN error('{fn}(): list over {{cap}} elements') "
      f"ELSE a END), (a, b) AS system.main.{fn}(a, CASE WHEN b - a > {{cap}} THEN error('{fn}(): list over {{cap}} "
      f"elements') ELSE b END), (a, b, c) AS system.main.{fn}(a, b, c)" for fn in ("range", "generate_series")),
)


#: the sandbox instances, one per memory limit: an in-memory DuckDB holding nothing, its configuration
#: locked at creation. Each query gets a connection of its own (`cursor()`, ~4 ms instead of ~30-130 ms
#: for a new instance); what it registers or creates is TEMP, visible to that connection only and gone
#: when it closes. A fatal error drops the instance (the next query makes a new one).
_instances: dict[int, Any] = {}
_instances_lock = threading.Lock()


def _sandbox(memory_mb: int, max_bytes: int):
    """A fresh connection to the sandbox instance for `memory_mb`, with the size-guard macros."""
    import duckdb

    with _instances_lock:
        instance = _instances.get(memory_mb)
        if instance is None:
            instance = _instances[memory_mb] = duckdb.connect(":memory:", config={
                "enable_external_access": False, "python_enable_replacements": False,
                "autoinstall_known_extensions": False, "autoload_known_extensions": False,
                "memory_limit": f"{memory_mb}MB", "threads": _SANDBOX_THREADS, "lock_configuration": True})
        con = instance.cursor()
    for macro in _SIZE_GUARDS:
        con.execute("CREATE TEMP MACRO " + macro.format(cap=max_bytes))
    return con


def _drop_sandbox(memory_mb: int) -> None:
    with _instances_lock:
        instance = _instances.pop(memory_mb, None)
    if instance is not None:
        instance.close()


#: how each backend names a column the query uses and `runs` lacks
_UNKNOWN_COLUMN = (re.compile(r'Referenced column "([^"]+)" not found'),            # DuckDB's binder
                   re.compile(r'column (?:[A-Za-z_][\w$]*\.)?"?([^"\s]+?)"? does not exist'))  # PostgreSQL 42703


def nearest_columns(name: str, n: int = 3, cutoff: float = 0.6) -> list[str]:
    """The run columns nearest to a mistyped `name`: difflib's ratio against the whole column name
    or, discounted, against one of its underscore-separated words (`modle` → model_name,
    model_params, model_size_class; `nodse` → nodes), best first; at most `n`, each within 0.03 of
    the best and at least `cutoff`."""
    from difflib import SequenceMatcher

    name = name.lower()

    def score(col: str) -> float:
        whole = SequenceMatcher(None, name, col).ratio()
        words = max((SequenceMatcher(None, name, w).ratio() for w in col.split("_") if len(w) > 2), default=0.0)
        return max(whole, 0.85 * words)

    scored = sorted(((score(c), c) for c in RUN_COLUMNS), key=lambda sc: (-sc[0], sc[1]))
    best = scored[0][0] if scored else 0.0
    return [c for sc, c in scored[:n] if sc >= max(cutoff, best - 0.03)]


def unknown_column(message: str) -> QueryRejected | None:
    """The error for a query naming a column `runs` does not have, when the database's `message`
    says so: it names the column and the nearest columns of the WHOLE runs table (difflib), not the
    database's "candidate bindings" — on DuckDB the sandbox holds only the columns the query names,
    so those candidates were the query's own other columns. None for any other error."""
    for pattern in _UNKNOWN_COLUMN:
        found = pattern.search(message)
        if found:
            name = found.group(1)
            near = nearest_columns(name)
            hint = f"; did you mean {' or '.join(repr(c) for c in near)}?" if near else \
                f"; the columns of runs: {', '.join(RUN_COLUMNS)}"
            return _reject(f"runs has no column {name!r}{hint}", value=name)
    return None


def _duckdb_error(exc: Exception, interrupter: _Interrupter, timeout_s: float, memory_mb: int) -> Exception:
    import duckdb

    if isinstance(exc, duckdb.FatalException):
        _drop_sandbox(memory_mb)  # a fatal error invalidates the instance; the service's file is untouched
    if interrupter.fired or isinstance(exc, duckdb.InterruptException):
        return _timeout_error(timeout_s)
    if isinstance(exc, duckdb.OutOfMemoryException):
        return _reject(f"the query ran out of its memory (SCALEBOOK_SQL_MEMORY_MB): {_first_lines(str(exc))}")
    return unknown_column(str(exc)) or _reject(f"the database refused the query: {_first_lines(str(exc))}")


def _run_duckdb(db: Database, sql: str, timeout_s: float, max_rows: int, max_bytes: int, memory_mb: int,
                columns: list[str], *, stream: bool, cutoff: datetime) -> tuple[list[str], _Answer]:
    import duckdb

    answer = _Answer(max_rows, max_bytes, time.monotonic() + timeout_s, timeout_s)
    status = "status" in columns
    if status and "last_heartbeat_at" not in columns:  # what `status` reads as depends on it
        columns = [*columns, "last_heartbeat_at"]
    select = "SELECT " + ", ".join(f'"{c}"' for c in columns) + " FROM runs"
    with _Interrupter(timeout_s) as interrupter:
        # the service's connection exports the runs relation; its pooled parent is held until the
        # query is done (DuckDB closes a duplicate() with its parent)
        parent = db.engine.connect()
        service_con = parent.connection.driver_connection
        assert service_con is not None
        source = service_con.duplicate()
        sandbox = _sandbox(memory_mb, max_bytes)
        try:
            interrupter.watch(source)
            try:
                relation = source.sql(select)
                runs = relation.to_arrow_reader(_BATCH_ROWS) if stream else relation.to_arrow_table()
                interrupter.watch(sandbox)
                sandbox.register("runs_arrow", runs)
                replaced = [f"CAST({c} AS JSON) AS {c}" for c in columns if c in _JSON_COLUMNS]
                if status:
                    replaced.append(f"{_status_case(cutoff)} AS status")
                replace = f" REPLACE ({', '.join(replaced)})" if replaced else ""
                sandbox.execute(f"CREATE TEMP VIEW runs AS SELECT *{replace} FROM runs_arrow")
                statements = sandbox.extract_statements(sql)
            except duckdb.Error as exc:
                raise _duckdb_error(exc, interrupter, timeout_s, memory_mb) from exc
            if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
                raise _reject("DuckDB sees more than one statement or not a SELECT; refused")
            try:
                sandbox.execute("BEGIN TRANSACTION READ ONLY")
                result = sandbox.sql(sql)
                names = list(result.columns)
                is_json = [str(t).upper() == "JSON" for t in result.types]
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    reader = result.to_arrow_reader(_BATCH_ROWS)
                for batch in reader:
                    answer.add_bytes(batch.nbytes)  # bounded before any Python object is built
                    cols = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
                    rows = [[json_safe(_maybe_json(v) if is_json[i] else v) for i, v in enumerate(r)]
                            for r in zip(*cols)] if cols else [[] for _ in range(batch.num_rows)]
                    answer.size -= batch.nbytes  # counted again as JSON by add()
                    if not answer.add(rows):
                        break
            except duckdb.Error as exc:
                raise _duckdb_error(exc, interrupter, timeout_s, memory_mb) from exc
        finally:
            interrupter.watch(None)
            sandbox.close()
            source.close()
            parent.close()
    return names, answer


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except (ValueError, RecursionError):  # nested deeper than Python parses: answered as text
            return value
    return value


# -- PostgreSQL ----------------------------------------------------------------------------------
_ROLE_HELP = (f"read-only SQL is disabled on this PostgreSQL database: the service cannot log in as {READER_ROLE} "
              f"(missing, NOLOGIN, or a password is needed). Run `scalebook db upgrade` as a user with CREATEROLE "
              f"(set SCALEBOOK_SQL_READER_PASSWORD to give it a password), or as a superuser: CREATE ROLE "
              f"{READER_ROLE} LOGIN; GRANT SELECT ON runs TO {READER_ROLE}; then point "
              f"SCALEBOOK_SQL_DATABASE_URL at it")

#: the reader pools, one per Database, closed with it (weakly keyed: no pool outlives its Database)
_readers: weakref.WeakKeyDictionary[Database, sa.Engine] = weakref.WeakKeyDictionary()
_readers_lock = threading.Lock()


def reader_url(db: Database, configured: str | None = None) -> str:
    """The reader role's URL: `configured` (SCALEBOOK_SQL_DATABASE_URL) or the service's URL with the
    user READER_ROLE and no password."""
    if configured:
        from service.settings import normalise_url

        return normalise_url(configured)
    return db.engine.url.set(username=READER_ROLE, password=None).render_as_string(hide_password=False)


def _reader_engine(db: Database, configured: str | None) -> sa.Engine:
    with _readers_lock:
        engine = _readers.get(db)
        if engine is None:
            engine = sa.create_engine(reader_url(db, configured), pool_size=2, max_overflow=4, pool_pre_ping=True,
                                      pool_recycle=600, connect_args={
                                          "options": "-c default_transaction_read_only=on", "connect_timeout": 10})
            _readers[db] = engine
            weakref.finalize(db, engine.dispose)
            db.dispose_with(engine)  # closed by db.dispose() too, not only when db is collected
        return engine


def _pg_error(exc: Exception, timeout_s: float) -> Exception:
    import psycopg

    state = getattr(exc, "sqlstate", None) or ""
    if isinstance(exc, psycopg.errors.QueryCanceled):
        return _timeout_error(timeout_s)
    if state.startswith("53") and state != "53300" or state.startswith("54"):
        # 53xxx insufficient resources (out of memory, disk full by temp files), 54xxx program limits
        # (stack depth, statement too complex): the user's query did it; 53300 too many connections is overload
        return _reject(f"the query exceeded a database limit: {_first_lines(str(exc))}")
    if isinstance(exc, psycopg.OperationalError):
        return DatabaseUnavailable(f"database error: {_first_lines(str(exc))}")
    return (unknown_column(str(exc)) if state == "42703" else None) or \
        _reject(f"the database refused the query: {_first_lines(str(exc))}")


def _run_postgres(db: Database, sql: str, timeout_s: float, max_rows: int, max_bytes: int, memory_mb: int,
                  configured_url: str | None) -> tuple[list[str], _Answer]:
    import psycopg

    answer = _Answer(max_rows, max_bytes, time.monotonic() + timeout_s, timeout_s)
    timeout_ms = max(1, int(timeout_s * 1000))
    work_mem_kb = max(64, memory_mb * 1024 // 4)  # a plan has several sort/hash nodes, each gets work_mem
    engine = _reader_engine(db, configured_url)
    try:
        sa_conn = engine.connect()
    except sa.exc.OperationalError as exc:
        text = str(exc.orig)
        if any(m in text for m in ("authentication", "password", "role", "not permitted to log in")):
            raise SqlUnavailable(_ROLE_HELP, [{"field": "role", "value": READER_ROLE,
                                               "message": _first_lines(text)}]) from exc
        raise DatabaseUnavailable(f"database error: {_first_lines(text)}") from exc
    with sa_conn:
        raw = sa_conn.connection.driver_connection
        assert raw is not None
        try:
            with raw.cursor() as cur:
                cur.execute("SET TRANSACTION READ ONLY")
                cur.execute(f"SET LOCAL statement_timeout = {timeout_ms}")
                cur.execute(f"SET LOCAL lock_timeout = {timeout_ms}")
                cur.execute(f"SET LOCAL work_mem = {work_mem_kb}")
                # whatever URL is configured, user SQL never runs as a role that can see more than runs
                cur.execute("SELECT current_user, r.rolsuper OR r.rolcreaterole OR r.rolbypassrls, "
                            "has_table_privilege('api_tokens', 'SELECT') FROM pg_roles r "
                            "WHERE r.rolname = current_user")
                user, powerful, sees_tokens = cur.fetchone()
                if (user != READER_ROLE and not configured_url) or powerful or sees_tokens:
                    raise SqlUnavailable(_ROLE_HELP, [{
                        "field": "role", "value": user,
                        "message": "user SQL must run as a role that may read runs only",
                    }])
            try:
                with raw.cursor(name="scalebook_user_sql") as cur:
                    cur.execute(sql)
                    description = cur.description or []
                    while True:
                        chunk = cur.fetchmany(_PG_BATCH_ROWS)
                        if not chunk or not answer.add([[json_safe(v) for v in r] for r in chunk]):
                            break
            except psycopg.Error as exc:
                raise _pg_error(exc, timeout_s) from exc
        finally:
            try:
                raw.rollback()  # the transaction was opened on the driver connection, not through SQLAlchemy
            except psycopg.Error:
                sa_conn.invalidate()  # a broken connection must not go back to the pool
    return [d.name for d in description], answer
