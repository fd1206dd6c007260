"""Read-only SQL over the runs table (DESIGN §7): one SELECT, a timeout and a row cap, on both backends.

Defence in depth; every layer refuses on its own:

1. Parser gate (sqlglot, dialect "duckdb" or "postgres"), `check_query`:
   - exactly one statement whose root is a SELECT / set operation (UNION, INTERSECT, EXCEPT), WITH allowed;
   - no statement or clause node anywhere in the tree that writes, changes state or leaves the database
     (INSERT/UPDATE/DELETE/MERGE/COPY/CREATE/DROP/ALTER/ATTACH/DETACH/INSTALL/LOAD/SET/PRAGMA/CALL/
     EXPORT/IMPORT/VACUUM/CHECKPOINT/... — sqlglot parses unknown statements as `Command`, refused too),
     no SELECT ... INTO, no locking clause (FOR UPDATE/SHARE);
   - every table reference is `runs` or a CTE visible at that point (SQL scoping: a CTE sees only the
     CTEs defined before it, or itself WITH RECURSIVE), never schema-qualified; identifiers are compared
     the PostgreSQL way (unquoted folded to lower case, quoted exact), so `"RUNS"` is refused;
   - table functions only from a small allowlist of pure generators (range, generate_series, unnest);
   - no function whose name matches DENIED_FUNCTIONS (files, settings, sequences, sleeping, SQL executed
     from strings, catalogs, other databases); no schema-qualified function calls.
   `pg_sleep` is *denied* (pg_ prefix): it has no analytic use and only holds a connection; the
   timeout is exercised with a real cross join instead.
   The statement executed is sqlglot's regeneration of the checked tree (comments dropped, unsupported
   syntax an error), re-checked once more, so the database runs exactly what was checked, whatever
   tokenizer differences (comments, quoting, escapes) exist between sqlglot and the server.

2. Execution sandbox per backend, `run_query`:
   - PostgreSQL: its own transaction `SET TRANSACTION READ ONLY`, `SET LOCAL statement_timeout`,
     `search_path` pinned to the schema of `runs`, `SET LOCAL ROLE scalebook_reader` (a NOLOGIN role made by
     migration 0002 with SELECT on runs only), and the query runs as a server-side cursor
     (`DECLARE ... CURSOR FOR`, which accepts one SELECT/VALUES and no data-modifying WITH). Even a
     parser bypass then cannot write (read-only transaction), read api_tokens or files (role privileges).
     Without the role (the migrating user could not create it) the endpoint answers 503 `sql_unavailable`
     naming the statements that create it, rather than run user SQL with the service's own privileges.
     Residual risk: a superuser/CREATEROLE *session* can leave the role with `set_config('role', ...)`,
     so that function is denied by the parser; deploy the service with a non-superuser database user.
   - DuckDB: the service process owns the file, so the query runs on a duplicate connection of the
     service's instance inside `BEGIN TRANSACTION READ ONLY` (DuckDB 2.0 refuses every write there,
     nextval included); DuckDB's own parser must see exactly one SELECT (`extract_statements`); and
     `SET enable_external_access = false` is applied to the instance before the first user query
     (instance-wide and irreversible: no file/extension/network access for anyone in this process;
     the service never needs it — Arrow ingest and checkpoints keep working). `lock_configuration` is
     NOT set: it would also lock the service's own settings, and SET never passes both parsers.
     api_tokens is protected on DuckDB by the parsers alone (same file, same instance).
   - Timeout: PostgreSQL statement_timeout; DuckDB a threading.Timer calling `interrupt()` on the
     query's connection. Both answer 400 query_rejected "query exceeded the N s timeout".
   - Row cap: the result is streamed and `fetchmany(cap + 1)` read; more rows → truncated=true.

Values are made JSON-safe (`json_safe`): datetimes/dates/times → ISO 8601 strings, Decimal → float,
NaN/±inf → null, intervals → seconds, UUID → string, bytes → hex, DuckDB JSON text → parsed JSON.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import threading
import time
import uuid
from decimal import Decimal
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel, ParseError, TokenError, UnsupportedError

from service.db import Database
from service.errors import DatabaseUnavailable, QueryRejected, SqlUnavailable

READER_ROLE = "scalebook_reader"
#: longest query checked: sqlglot's pure-Python tokenizer and parser cost ~0.1 ms per token, paid before
#: any database timeout applies, so the length is capped (realistic analytics queries are far shorter)
MAX_QUERY_CHARS = 10_000
ALLOWED_TABLES = frozenset({"runs"})
#: pure row generators allowed in FROM (sqlglot class keys and plain names)
ALLOWED_TABLE_FUNCTIONS = frozenset({"range", "generate_series", "generateseries", "explodinggenerateseries",
                                     "unnest"})
#: function names (lower case) refused anywhere, as glob patterns ('*' = any characters)
DENIED_FUNCTIONS = (
    "pg_*", "lo_*", "dblink*", "duckdb_*", "pragma_*", "read_*", "sqlite_*", "postgres_*", "mysql_*", "parquet_*",
    "iceberg_*", "delta_*", "ducklake_*", "arrow_*", "txid_*", "json_execute*", "load_*", "install_*", "http_*",
    "current_setting", "set_config", "setseed", "nextval", "currval", "setval", "lastval", "getenv", "getvariable",
    "query", "query_table", "query_table_by_name", "glob", "sniff_csv", "ts_stat", "checkpoint", "force_checkpoint",
    "sleep*", "which_secret", "secret", "to_file", "next_value_for", "system", "shell", "copy*", "export*", "import*",
    "*to_xml*", "xml_*", "write_log", "*_logging", "*_profiling", "*external_resource*", "truncate_*", "python_*",
    "pandas_*", "seq_scan", "dbgen", "dsdgen", "tpch*", "tpcds*", "brin_*", "gin_*", "loread", "lowrite", "currtid*",
    "amvalidate", "*handler", "plpgsql_*", "ri_fkey_*", "unique_key_recheck", "*trigger*", "ts_rewrite",
    "cursor_to_*", "query_to_*", "dsnowball_*",
)
#: tree nodes refused anywhere (statements and clauses that write, lock or leave the database)
_FORBIDDEN_NODES = tuple(getattr(exp, name) for name in (
    "DML", "DDL", "Insert", "Update", "Delete", "Merge", "Copy", "Create", "Drop", "Alter", "Command", "Set", "Pragma",
    "Attach", "Detach", "Install", "Use", "Describe", "Summarize", "Show", "Transaction", "Commit", "Rollback",
    "Analyze", "Grant", "Revoke", "Refresh", "Cache", "Uncache", "LoadData", "TruncateTable", "Comment", "Kill",
    "Export", "Declare", "Into", "Lock", "NextValueFor", "Secret") if hasattr(exp, name))
_GLOB = [re.compile("^" + re.escape(p).replace(r"\*", ".*") + "$") for p in DENIED_FUNCTIONS]
_PLAIN_NAME = re.compile(r"^[a-z_][a-z0-9_$]*$")


def sqlglot_dialect(db_dialect: str) -> str:
    """SQLAlchemy dialect name → sqlglot dialect ("duckdb" | "postgres")."""
    return "postgres" if db_dialect.startswith("postgres") else "duckdb"


def _reject(message: str, **detail: Any) -> QueryRejected:
    return QueryRejected(message, [{"field": "query", "value": detail.get("value"), "message": message}])


def _norm(ident: exp.Expression | None) -> str:
    """PostgreSQL identifier semantics: quoted exact, unquoted lower-cased."""
    if not isinstance(ident, exp.Identifier):
        return ident.name.lower() if ident is not None else ""
    return ident.name if ident.quoted else ident.name.lower()


def _function_names(fn: exp.Func) -> set[str]:
    if isinstance(fn, exp.Anonymous):
        return {fn.name.lower()}
    names = {type(fn).key.lower()}
    try:
        names.update(n.lower() for n in fn.sql_names())
    except Exception:  # noqa: BLE001 - some classes have no sql_names
        pass
    return names


def _denied(name: str) -> bool:
    return any(g.match(name) for g in _GLOB)


def _visible_ctes(table: exp.Table) -> set[str]:
    """CTE names visible where `table` stands: all CTEs of an enclosing query's WITH when the table is
    in the query body; only the earlier siblings (and itself WITH RECURSIVE) when inside a CTE."""
    visible: set[str] = set()
    node: exp.Expr = table
    while node.parent is not None:
        parent = node.parent
        if isinstance(parent, exp.With) and isinstance(node, exp.CTE):
            ctes = list(parent.expressions)
            idx = next(i for i, c in enumerate(ctes) if c is node)
            upto = idx + 1 if parent.args.get("recursive") else idx
            visible.update(_norm(c.args["alias"].this) for c in ctes[:upto] if c.args.get("alias"))
        else:
            for value in parent.args.values():
                if isinstance(value, exp.With) and value is not node:
                    visible.update(_norm(c.args["alias"].this) for c in value.expressions if c.args.get("alias"))
        node = parent
    return visible


def _check_table(table: exp.Table) -> None:
    if table.args.get("db") or table.args.get("catalog"):
        raise _reject(f"'{table.sql()}': schema-qualified names are not allowed; query the table runs",
                      value=table.sql())
    target = table.this
    if isinstance(target, exp.Func):
        names = _function_names(target)
        if names & ALLOWED_TABLE_FUNCTIONS and not any(_denied(n) for n in names):
            return
        raise _reject(f"table function {sorted(names)[0]}() is not allowed: only the runs table (and "
                      f"range/generate_series/unnest) may be queried", value=table.sql())
    if not isinstance(target, exp.Identifier):
        raise _reject(f"'{table.sql()}' is not allowed as a table: only runs may be queried", value=table.sql())
    name = _norm(target)
    if name in ALLOWED_TABLES or name in _visible_ctes(table):
        return
    raise _reject(f"table '{target.sql()}' is not allowed: only the runs table (and CTEs over it) may be queried",
                  value=target.name)


def _check_tree(root: exp.Expr) -> None:
    query = root
    while isinstance(query, (exp.Subquery, exp.Paren)):
        query = query.this
    if not isinstance(query, (exp.Select, exp.SetOperation)):
        kind = type(query).__name__.upper()
        raise _reject(f"only SELECT queries are allowed (got {kind}): no writes, DDL, settings or commands",
                      value=kind)
    for node in root.walk():
        if isinstance(node, _FORBIDDEN_NODES):
            kind = {"Into": "SELECT ... INTO", "Lock": "FOR UPDATE/SHARE locking clause"}.get(
                type(node).__name__, type(node).__name__.upper())
            raise _reject(f"{kind} is not allowed: only read-only SELECT queries over runs", value=kind)
        if isinstance(node, exp.Table):
            _check_table(node)
        elif isinstance(node, exp.Lateral) and isinstance(node.this, exp.Func):  # LATERAL f(...): a table function
            _check_table(exp.Table(this=node.this.copy()))
        elif isinstance(node, exp.Func):
            for name in _function_names(node):
                if _denied(name) or (isinstance(node, exp.Anonymous) and not _PLAIN_NAME.match(name)):
                    raise _reject(f"function {name}() is not allowed in read-only SQL (files, settings, "
                                  "sequences, sleeping, catalogs and other databases are out of reach)", value=name)
        elif isinstance(node, exp.Dot) and isinstance(node.expression, exp.Func):
            raise _reject(f"schema-qualified function '{node.sql()}' is not allowed", value=node.sql())


def check_query(query: str, dialect: str) -> str:
    """Check one user query with sqlglot and return the SQL to execute (sqlglot's regeneration).

    `dialect`: "duckdb" | "postgres". Raises QueryRejected (400) naming what was refused: parse errors,
    more or fewer than one statement, anything but a read-only SELECT over runs (see module docstring),
    queries longer than MAX_QUERY_CHARS or nested too deeply.
    """
    if not query or not query.strip():
        raise _reject("empty query")
    if len(query) > MAX_QUERY_CHARS:
        raise _reject(f"the query is {len(query):,} characters long; at most {MAX_QUERY_CHARS:,} are checked",
                      value=len(query))
    try:
        statements = [s for s in sqlglot.parse(query, read=dialect) if s is not None]
        if len(statements) != 1:
            raise _reject(f"exactly one SQL statement is allowed, got {len(statements)}", value=len(statements))
        _check_tree(statements[0])
        sql = statements[0].sql(dialect=dialect, comments=False, unsupported_level=ErrorLevel.RAISE)
        again = [s for s in sqlglot.parse(sql, read=dialect) if s is not None]
        if len(again) != 1:
            raise _reject("exactly one SQL statement is allowed")
        _check_tree(again[0])
    except (ParseError, TokenError) as exc:
        raise _reject(f"could not parse the query as {dialect} SQL: {str(exc).splitlines()[0][:300]}") from exc
    except UnsupportedError as exc:
        raise _reject(f"the query uses syntax that cannot be checked safely: {str(exc).splitlines()[0][:300]}") from exc
    except RecursionError as exc:
        raise _reject("the query is nested too deeply to be checked") from exc
    return sql


# -- values --------------------------------------------------------------------------------------
def json_safe(value: Any) -> Any:
    """One result value as JSON: ISO 8601 for datetimes, float for Decimal, None for NaN/inf,
    seconds for intervals, str for UUID, hex for bytes; lists and dicts recursively."""
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Decimal):
        return float(value) if value.is_finite() else None
    if isinstance(value, (dt.datetime, dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, dt.timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set)):
        return [json_safe(v) for v in value]
    return str(value)


def _timeout_error(timeout_s: float) -> QueryRejected:
    return _reject(f"query exceeded the {timeout_s:g} s timeout (SCALEBOOK_SQL_TIMEOUT_S) and was cancelled",
                   value=timeout_s)


# -- execution -----------------------------------------------------------------------------------
def run_query(db: Database, query: str, *, timeout_s: float, max_rows: int) -> dict[str, Any]:
    """Check and run one read-only query over runs.

    Returns {"columns": [str], "rows": [[json value]], "row_count": int, "truncated": bool,
    "elapsed_ms": float (execution and fetch, milliseconds)}. Raises QueryRejected (400) for a refused
    query, a database error in it or the timeout; SqlUnavailable (503) when PostgreSQL lacks the
    reader role; DatabaseUnavailable (503) when the database cannot be reached.
    """
    dialect = sqlglot_dialect(db.dialect)
    sql = check_query(query, dialect)
    if dialect == "duckdb":
        columns, rows, elapsed = _run_duckdb(db, sql, timeout_s, max_rows)
    else:
        columns, rows, elapsed = _run_postgres(db, sql, timeout_s, max_rows)
    truncated = len(rows) > max_rows
    rows = rows[:max_rows]
    return {"columns": columns, "rows": rows, "row_count": len(rows), "truncated": truncated,
            "elapsed_ms": round(elapsed * 1000.0, 3)}


def execute_sandboxed(db: Database, sql: str, *, timeout_s: float, max_rows: int) -> tuple[list[str], list[list]]:
    """Run `sql` in the backend sandbox WITHOUT the parser gate (for tests of the second layer).

    Returns (columns, rows) with at most max_rows + 1 rows. Same errors as run_query.
    """
    runner = _run_duckdb if db.is_duckdb else _run_postgres
    columns, rows, _ = runner(db, sql, timeout_s, max_rows)
    return columns, rows


def _run_duckdb(db: Database, sql: str, timeout_s: float, max_rows: int) -> tuple[list[str], list[list], float]:
    import duckdb

    # own connection, same instance; its pooled parent is held until the query is done (DuckDB
    # closes a duplicate() with its parent, and the pool closes surplus connections it gets back)
    parent = db.engine.connect()
    driver = parent.connection.driver_connection
    assert driver is not None  # a checked-out connection has its driver connection
    con = driver.duplicate()
    try:
        if con.execute("SELECT current_setting('enable_external_access')").fetchone()[0]:
            con.execute("SET enable_external_access = false")  # instance-wide, irreversible (see docstring)
        try:
            statements = con.extract_statements(sql)
        except duckdb.Error as exc:
            raise _reject(f"DuckDB cannot parse the query: {_first_lines(str(exc))}") from exc
        if len(statements) != 1 or statements[0].type != duckdb.StatementType.SELECT:
            raise _reject("DuckDB sees more than one statement or not a SELECT; refused")
        con.execute("BEGIN TRANSACTION READ ONLY")
        done = threading.Event()
        timed_out = threading.Event()

        def _interrupt() -> None:
            if not done.is_set():
                timed_out.set()
                con.interrupt()

        timer = threading.Timer(timeout_s, _interrupt)
        start = time.perf_counter()
        timer.start()
        try:
            cur = con.execute(statements[0])
            description = cur.description or []
            raw_rows = cur.fetchmany(max_rows + 1)
        except duckdb.Error as exc:
            if timed_out.is_set() or isinstance(exc, duckdb.InterruptException):
                raise _timeout_error(timeout_s) from exc
            if isinstance(exc, (duckdb.FatalException, duckdb.InternalException)):
                raise DatabaseUnavailable(f"DuckDB failed: {exc}") from exc
            raise _reject(f"the database refused the query: {_first_lines(str(exc))}") from exc
        finally:
            done.set()
            timer.cancel()
        elapsed = time.perf_counter() - start
    finally:
        try:
            con.execute("ROLLBACK")
        except Exception:  # noqa: BLE001 - no transaction open after an early refusal
            pass
        con.close()
        parent.close()
    columns = [d[0] for d in description]
    is_json = [str(d[1]).upper() == "JSON" for d in description]
    rows = [[json_safe(_maybe_json(v) if is_json[i] else v) for i, v in enumerate(r)] for r in raw_rows]
    return columns, rows, elapsed


def _maybe_json(value: Any) -> Any:
    if isinstance(value, str):
        try:
            return json.loads(value)
        except ValueError:
            return value
    return value


_ROLE_HELP = (f"read-only SQL is disabled on this PostgreSQL database: the role {READER_ROLE} is missing or this "
              f"service's user may not use it. Run `scalebook db upgrade` as a user with CREATEROLE, or as a "
              f"superuser: CREATE ROLE {READER_ROLE} NOLOGIN; GRANT SELECT ON runs TO {READER_ROLE}; "
              f"GRANT {READER_ROLE} TO <service user>")


def _run_postgres(db: Database, sql: str, timeout_s: float, max_rows: int) -> tuple[list[str], list[list], float]:
    import psycopg

    timeout_ms = max(1, int(timeout_s * 1000))
    with db.engine.connect() as sa_conn:
        raw = sa_conn.connection.driver_connection
        assert raw is not None  # a checked-out connection has its driver connection
        try:
            with raw.cursor() as cur:
                cur.execute("SET TRANSACTION READ ONLY")
                cur.execute(f"SET LOCAL statement_timeout = {timeout_ms}")
                cur.execute(f"SET LOCAL lock_timeout = {timeout_ms}")
                cur.execute("SELECT quote_ident(current_schema())")
                schema = cur.fetchone()[0]
                if schema:
                    cur.execute("SELECT set_config('search_path', %s, true)", (schema,))
                try:
                    cur.execute(f"SET LOCAL ROLE {READER_ROLE}")
                except (psycopg.errors.InvalidParameterValue, psycopg.errors.InsufficientPrivilege,
                        psycopg.errors.UndefinedObject) as exc:
                    raise SqlUnavailable(_ROLE_HELP, [{"field": "role", "value": READER_ROLE,
                                                       "message": str(exc).strip()}]) from exc
            start = time.perf_counter()
            try:
                with raw.cursor(name="scalebook_user_sql") as cur:
                    cur.execute(sql)
                    raw_rows = cur.fetchmany(max_rows + 1)
                    description = cur.description or []
            except psycopg.errors.QueryCanceled as exc:
                raise _timeout_error(timeout_s) from exc
            except psycopg.OperationalError as exc:
                raise DatabaseUnavailable(f"database error: {_first_lines(str(exc))}") from exc
            except psycopg.Error as exc:
                raise _reject(f"the database refused the query: {_first_lines(str(exc))}") from exc
            elapsed = time.perf_counter() - start
        finally:
            try:
                raw.rollback()  # the transaction was opened on the driver connection, not through SQLAlchemy
            except psycopg.Error:
                sa_conn.invalidate()  # a broken connection must not go back to the pool
    columns = [d.name for d in description]
    return columns, [[json_safe(v) for v in r] for r in raw_rows], elapsed


def _first_lines(text: str, n: int = 3) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines()[:n])[:500]
