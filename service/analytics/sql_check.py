"""The parser gate of user SQL (DESIGN §7): one read-only SELECT over `runs`, checked with sqlglot.

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

2. Execution sandbox per backend: service/analytics/sql.py.

Values are made JSON-safe (`json_safe`): datetimes/dates/times → ISO 8601 strings, Decimal → float,
NaN/±inf → null, intervals → seconds, UUID → string, bytes → hex, DuckDB JSON text → parsed JSON.
"""

from __future__ import annotations

import datetime as dt
import math
import re
import uuid
from decimal import Decimal
from typing import Any

import sqlglot
from sqlglot import exp
from sqlglot.errors import ErrorLevel, ParseError, TokenError, UnsupportedError

from service.errors import QueryRejected

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


def _norm(ident: exp.Expr | None) -> str:
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
            # a CTE sees itself only WITH RECURSIVE and only from the recursive branch of its UNION:
            # elsewhere (no UNION, or in the anchor) DuckDB resolves its name to the real table of that
            # name, which is how `WITH RECURSIVE api_tokens AS (SELECT * FROM api_tokens)` read tokens
            upto = idx + 1 if parent.args.get("recursive") and _in_recursive_branch(table, node) else idx
            visible.update(_norm(c.args["alias"].this) for c in ctes[:upto] if c.args.get("alias"))
        else:
            for value in parent.args.values():
                if isinstance(value, exp.With) and value is not node:
                    visible.update(_norm(c.args["alias"].this) for c in value.expressions if c.args.get("alias"))
        node = parent
    return visible


def _in_recursive_branch(table: exp.Table, cte: exp.CTE) -> bool:
    """Whether `table` sits in the recursive term (right-hand side) of the UNION that is `cte`'s body."""
    body = cte.this
    if not isinstance(body, exp.Union):
        return False
    node: exp.Expr | None = table
    while node is not None and node is not body:
        if node is body.expression:
            return True
        node = node.parent
    return False


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
    Same as `check_and_parse(query, dialect)[0]`; see there."""
    return check_and_parse(query, dialect)[0]


def check_and_parse(query: str, dialect: str) -> tuple[str, exp.Expr]:
    """Check one user query with sqlglot; return (the SQL to execute: sqlglot's regeneration, its tree).

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
        tree = again[0]
    except (ParseError, TokenError) as exc:
        raise _reject(f"could not parse the query as {dialect} SQL: {str(exc).splitlines()[0][:300]}") from exc
    except UnsupportedError as exc:
        raise _reject(f"the query uses syntax that cannot be checked safely: {str(exc).splitlines()[0][:300]}") from exc
    except RecursionError as exc:
        raise _reject("the query is nested too deeply to be checked") from exc
    return sql, tree


def runs_columns_used(tree: exp.Expr, run_columns: list[str]) -> list[str]:
    """The columns of `runs` a checked query may read: every run column named anywhere in it (a
    superset: names are matched whatever table or alias qualifies them), or all of them when the query
    has a `*` (other than count(*)), a COLUMNS(...) expression or a column named like a table, CTE or
    alias (DuckDB reads a table name as its whole row). Never empty: `id` when no column is named."""
    names = {_norm(i) for i in tree.find_all(exp.Identifier)}
    relations = {_norm(t.this) for t in tree.find_all(exp.Table) if isinstance(t.this, exp.Identifier)}
    relations |= {_norm(a.this) for a in tree.find_all(exp.TableAlias) if isinstance(a.this, exp.Identifier)}
    for star in tree.find_all(exp.Star):
        if not isinstance(star.parent, exp.Count):
            return list(run_columns)
    for col in tree.find_all(exp.Column):
        if _norm(col.this) in relations or isinstance(col.this, exp.Star):
            return list(run_columns)
    if any("columns" in _function_names(f) for f in tree.find_all(exp.Func)):
        return list(run_columns)
    lowered = {n.lower() for n in names}
    used = [c for c in run_columns if c in lowered]
    return used or ["id"]


def runs_references(tree: exp.Expr) -> int:
    """How many times `runs` is named as a table in a checked query."""
    return sum(1 for t in tree.find_all(exp.Table) if isinstance(t.this, exp.Identifier) and _norm(t.this) == "runs")


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


