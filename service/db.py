"""Engine, the one session context, and schema management (Alembic) for DuckDB and PostgreSQL.

- `Database(url)` owns the engine. DuckDB files are owned by one process; inside it, writes are
  serialised by a lock (DuckDB's optimistic concurrency would otherwise abort concurrent
  appends to the same table), shared by every `Database` of the file.
- `Database.session()` is the only place that commits: it commits on success, rolls back on
  any error and turns driver errors into domain errors (service/errors.py): a unique violation
  is Conflict (409), a lost connection, lock timeout or serialisation failure DatabaseUnavailable
  (503, worth a retry), anything else DatabaseError (500, our bug, logged by the API).
- Durability is the database's own commit; nothing is buffered or cached here.
- `upgrade()` runs the Alembic migrations to head; `check_schema()` raises `StaleSchema` with the
  command that fixes it.
"""

from __future__ import annotations

import contextlib
import operator
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import duckdb_engine
import numpy as np
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.ddl.impl import DefaultImpl
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.dialects import registry
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session

from service.errors import Conflict, DatabaseError, DatabaseUnavailable, ScalebookError, StaleSchema

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


class DuckDBImpl(DefaultImpl):
    """Alembic has no implementation for duckdb-engine's dialect name; registering this subclass
    (at import, before any MigrationContext is built) lets Alembic drive DuckDB like the default
    implementation. DuckDB DDL is not transactional under Alembic's control."""

    __dialect__ = "duckdb"
    transactional_ddl = False


class CachingDuckDBDialect(duckdb_engine.Dialect):
    """duckdb-engine's dialect with SQLAlchemy's compiled-statement cache switched on.

    duckdb-engine sets `supports_statement_cache = False` (a third-party dialect's default until
    it opts in), so every statement was compiled on every execution: ~1–2 ms for a 57-column
    SELECT, more for the analytics aggregates. The dialect compiles with PostgreSQL's compiler,
    which SQLAlchemy caches for its own PostgreSQL dialects; the whole test suite runs on it.
    Registered under the name "duckdb" at import, before any engine is built.
    """

    supports_statement_cache = True


registry.register("duckdb", __name__, "CachingDuckDBDialect")


def alembic_config(url: str) -> Config:
    """An Alembic Config pointing at our migrations, with the URL passed as an attribute
    (so '%' in passwords needs no escaping)."""
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["url"] = url
    return cfg


#: SQLSTATE classes/codes that mean "the database is lost or overloaded; retry later" (PostgreSQL
#: appendix A): connection exceptions (08), serialisation failure and deadlock (40001, 40P01),
#: lock not available (55P03), insufficient resources (53: disk full, out of memory, too many
#: connections), operator intervention (57P01–57P05: shutdown, cannot connect now).
_RETRYABLE_SQLSTATE_PREFIXES = ("08", "40001", "40P01", "55P03", "53", "57P0")
#: DuckDB exception classes of the same kind: I/O, lost connection, a write-write conflict.
_RETRYABLE_DUCKDB = ("IOException", "ConnectionException", "TransactionException")


def is_retryable(exc: DBAPIError) -> bool:
    """True when a driver error says the database is unreachable or busy (worth a client retry),
    False when it is an error in the statement itself (our bug)."""
    if exc.connection_invalidated:
        return True
    orig = exc.orig
    sqlstate = getattr(orig, "sqlstate", None)
    if sqlstate:
        return sqlstate.startswith(_RETRYABLE_SQLSTATE_PREFIXES)
    if type(orig).__name__ in _RETRYABLE_DUCKDB:
        return True
    # psycopg raises OperationalError without a SQLSTATE when it cannot connect at all
    return isinstance(exc, OperationalError) and type(orig).__name__ == "OperationalError"


@contextlib.contextmanager
def _domain_errors() -> Iterator[None]:
    """Database errors as domain errors: unique violations → Conflict (409), a lost or busy
    database → DatabaseUnavailable (503), anything else → DatabaseError (500); domain errors pass
    through."""
    try:
        yield
    except ScalebookError:
        raise
    except IntegrityError as exc:
        if getattr(exc.orig, "sqlstate", None) == "23505" or "unique" in str(exc.orig).lower():
            raise Conflict(f"the database refused the write: {exc.orig}") from exc
        raise DatabaseError(f"database error: {exc.orig}") from exc
    except DBAPIError as exc:
        if is_retryable(exc):
            raise DatabaseUnavailable(f"database unavailable: {exc.orig}") from exc
        raise DatabaseError(f"database error: {exc.orig}") from exc


def _jit_off(dbapi_connection: Any, _record: Any) -> None:
    """`SET jit = off` on each new PostgreSQL connection: at 10^6 runs JIT compiled the heatmap's
    aggregate for almost as long as the query then ran (bench/RESULTS.md, "Measurements behind the
    write and read paths"). A SET, not the `options` startup parameter, so the URL's own options stay and
    PgBouncer (which refuses `options`) works; a server that refuses it keeps its setting."""
    try:
        with dbapi_connection.cursor() as cur:
            cur.execute("SET jit = off")
        dbapi_connection.commit()
    except Exception:  # noqa: BLE001 - a speed setting, never a reason to refuse a connection
        dbapi_connection.rollback()


class Database:
    """One database: its engine, dialect, write lock and schema helpers."""

    def __init__(self, url: str, *, echo: bool = False):
        self.url = url
        #: closed with the engine by dispose(): pools opened for this database elsewhere (user SQL's reader)
        self._also_dispose: list[Any] = []
        file: Path | None = None
        if url.startswith("duckdb:///"):
            path = url.removeprefix("duckdb:///").split("?", 1)[0]
            if path and path != ":memory:":
                file = Path(path).expanduser()
                file.parent.mkdir(parents=True, exist_ok=True)
        kwargs: dict = {"echo": echo}
        if url.startswith("postgresql"):
            kwargs.update(pool_size=10, max_overflow=20, pool_pre_ping=True)
        self.engine = sa.create_engine(url, **kwargs)
        if url.startswith("postgresql"):
            sa.event.listen(self.engine, "connect", _jit_off)
        self.dialect = self.engine.dialect.name  # "duckdb" | "postgresql"
        self._write_lock: threading.RLock | None = (
            _file_lock(str(file.resolve()) if file is not None else "") if self.is_duckdb else None)

    @property
    def is_duckdb(self) -> bool:
        return self.dialect == "duckdb"

    @property
    def single_process(self) -> bool:
        """True when one process must own the database (an embedded DuckDB file): `scalebook serve
        --workers N` is then refused."""
        return self.is_duckdb

    @property
    def write_lock(self) -> contextlib.AbstractContextManager:
        """The lock that serialises writes (DuckDB; a no-op context on PostgreSQL)."""
        return self._write_lock if self._write_lock is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def session(self, *, write: bool = False) -> Iterator[Session]:
        """Yield a Session; commit on success, roll back on error. `write=True` holds the write
        lock (DuckDB) for the whole transaction.

        Raises Conflict on unique violations, DatabaseUnavailable on a lost or busy database,
        DatabaseError on any other database error; domain errors raised inside pass through after
        the rollback.
        """
        with self.write_lock if write else contextlib.nullcontext():
            with self._transaction() as session:
                yield session

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[Session]:
        with _domain_errors(), Session(self.engine, expire_on_commit=False) as session:
            try:
                yield session
                session.commit()
            except BaseException:
                session.rollback()
                raise

    # -- schema -------------------------------------------------------------------------
    def upgrade(self, revision: str = "head") -> None:
        """Run Alembic migrations up to `revision` (default head)."""
        with self._write_lock or contextlib.nullcontext():
            command.upgrade(alembic_config(self.url), revision)

    def current_revision(self) -> str | None:
        with self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def head_revision(self) -> str:
        head = ScriptDirectory.from_config(alembic_config(self.url)).get_current_head()
        assert head is not None  # the migrations have one head
        return head

    def check_schema(self) -> None:
        """Raise StaleSchema unless the database is at the migrations' head."""
        current, head = self.current_revision(), self.head_revision()
        if current != head:
            raise StaleSchema(
                f"database schema is at revision {current or '<empty>'}, the code needs {head}: "
                f"run `scalebook db upgrade` (with SCALEBOOK_DATABASE_URL set to this database)"
            )

    def wait_until_ready(self, timeout_s: float = 60.0) -> None:
        """Poll until the database accepts connections (for containers starting together)."""
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with self.engine.connect() as conn:
                    conn.execute(sa.text("SELECT 1"))
                return
            except OperationalError as exc:
                if time.monotonic() > deadline:
                    raise DatabaseUnavailable(f"database not reachable after {timeout_s:.0f}s: {exc.orig}") from exc
                time.sleep(1.0)

    def prepare(self, *, auto_upgrade: bool | None = None) -> None:
        """The one start-up step: wait for the database, migrate an embedded one, check the schema.

        PostgreSQL is not migrated implicitly (several API processes may share it): a stale
        schema raises StaleSchema naming `scalebook db upgrade`.
        """
        self.wait_until_ready()
        if auto_upgrade is None:
            auto_upgrade = self.is_duckdb
        if auto_upgrade:
            self.upgrade()
        self.check_schema()

    def dispose(self) -> None:
        """Close the engine's connections, and those of the pools registered with `dispose_with`."""
        for other in self._also_dispose:
            other.dispose()
        self._also_dispose.clear()
        self.engine.dispose()

    def dispose_with(self, engine: Any) -> None:
        """Close `engine` (anything with a dispose()) when this database is disposed: the PostgreSQL
        reader pool of user SQL held its logins (a role limited to 16) until garbage collection."""
        self._also_dispose.append(engine)


_FILE_LOCKS: dict[str, threading.RLock] = {}
_FILE_LOCKS_GUARD = threading.Lock()


def locked(session: Session, query: sa.Select) -> sa.Select:
    """`query` with SELECT … FOR UPDATE where the backend has row locks (PostgreSQL). DuckDB has
    no FOR UPDATE; its writes are already serialised by `Database.write_lock`, one writer a file."""
    return query if session.get_bind().dialect.name == "duckdb" else query.with_for_update()


def fetch_rows(session: Session, sql: str) -> list[tuple]:
    """Every row of the plain SQL `sql` as tuples, in the session's transaction, through the driver's
    cursor (DuckDB's fetchall, psycopg's): SQLAlchemy fetches DuckDB rows one at a time (~5× slower for
    thousands of rows) and builds a Row per row on PostgreSQL (~1.5×)."""
    raw: Any = session.connection().connection.driver_connection
    return list(raw.execute(sql).fetchall())


def fetch_ordered(session: Session, sql: str, order_by: Sequence[str]) -> list[tuple]:
    """fetch_rows of the plain SQL `sql` (no ORDER BY of its own) — the same tuples of Python values — ordered
    by its selected columns named in `order_by`, each ascending (strings by code point, whatever the
    database's collation), NULLs last. DuckDB: its fetchnumpy, column by column (~3× faster than its
    fetchall for thousands of rows), ordered by numpy's lexsort (stable; several times faster than DuckDB's
    ORDER BY of many columns or Python's sorts); PostgreSQL: its fetchall sorted by stable sorts, last column
    first (an ORDER BY of the same columns cost the server more wall time than the sorts cost here)."""
    raw: Any = session.connection().connection.driver_connection
    if session.get_bind().dialect.name != "duckdb":
        cur = raw.execute(sql)
        fetched = list(cur.fetchall())
        names = [d[0] for d in cur.description]
        for i in reversed([names.index(c) for c in order_by]):
            value = operator.itemgetter(i)
            if None in map(value, fetched):  # NULLs last: the others sorted by value, then the NULLs in their order
                known = [r for r in fetched if r[i] is not None]
                known.sort(key=value)
                fetched = known + [r for r in fetched if r[i] is None]
            else:
                fetched.sort(key=value)
        return fetched
    fetched_cols = raw.execute(sql).fetchnumpy()
    cols = list(fetched_cols.values())
    if not len(cols[0]):
        return []
    keys: list[Any] = []  # lexsort's last key sorts first: per column its NULLs last, then its values
    for name in reversed(order_by):
        nulls = np.ma.getmaskarray(fetched_cols[name])
        data = np.ma.getdata(fetched_cols[name])
        if data.dtype == object:  # strings: their rank among the column's (Python's code-point order)
            values, is_null = data.tolist(), nulls.tolist()
            rank = {v: i for i, v in enumerate(sorted({v for v, m in zip(values, is_null) if not m}))}
            data = np.array([0 if m else rank[v] for v, m in zip(values, is_null)])
        elif nulls.any():
            data = np.where(nulls, 0, data)
        keys += [data, nulls]
    order = np.lexsort(keys)
    return list(zip(*(col[order].tolist() for col in cols)))


def fetch_select(session: Session, query: sa.Select) -> tuple[list[str], list[tuple]]:
    """(column keys, every row as tuples) of the SQLAlchemy `query`, in the session's transaction, through
    the driver's cursor as fetch_rows: compiled for the session's backend (IN lists expanded), its bound
    values passed as the driver's parameters. For queries of plain columns (numbers, text, booleans): no
    SQLAlchemy type processing is applied to the values read (JSON or dates would come back raw)."""
    conn = session.connection()
    compiled = query.compile(dialect=conn.dialect, compile_kwargs={"render_postcompile": True})
    params = compiled.params
    args: Any = tuple(params[name] for name in compiled.positiontup or ()) if compiled.positional else params
    raw: Any = conn.connection.driver_connection
    return list(query.selected_columns.keys()), list(raw.execute(str(compiled), args).fetchall())


def json_list_contains(session: Session, column: Any, value: str) -> sa.ColumnElement[bool]:
    """The condition "the JSON list of strings in `column` holds `value`" (whole elements) on the
    session's backend: PostgreSQL's jsonb containment (`@>`), DuckDB's json_contains."""
    literal = sa.cast(sa.literal(value), sa.Text)
    if session.get_bind().dialect.name == "postgresql":
        return sa.cast(column, sa.dialects.postgresql.JSONB).op("@>")(sa.func.jsonb_build_array(literal))
    return sa.func.json_contains(column, sa.func.to_json(literal))


def _file_lock(key: str) -> threading.RLock:
    """The write lock of a DuckDB file, shared by every Database of that file in this process
    ("" — in-memory — gets a lock of its own)."""
    if not key:
        return threading.RLock()
    with _FILE_LOCKS_GUARD:
        return _FILE_LOCKS.setdefault(key, threading.RLock())
