"""Engine, the one session context, and schema management (Alembic) for DuckDB and PostgreSQL.

- `Database(url)` owns the engine. DuckDB files are owned by one process; inside it, writes are
  serialised by a lock (DuckDB's optimistic concurrency would otherwise abort concurrent
  appends to the same table), shared by every `Database` of the file.
- `Database.session()` is the only place that commits: it commits on success, rolls back on
  any error and turns driver errors into domain errors (service/errors.py).
- A DuckDB file has an ingest journal (service/journal.py): small writes are group-committed.
  `session()` first moves journaled runs into `runs` (`flush()`), so every session sees every
  acknowledged run; `prepare()` replays what a crash left; `dispose()` flushes.
- `upgrade()` runs the Alembic migrations to head; `check_schema()` raises `StaleSchema` with the
  command that fixes it.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import duckdb_engine
import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.ddl.impl import DefaultImpl
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError
from sqlalchemy.dialects import registry
from sqlalchemy.orm import Session

from service import journal as ingest_journal
from service.analytics.kept import KeptAggregates
from service.errors import Conflict, DatabaseUnavailable, ScalebookError, StaleSchema

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


@contextlib.contextmanager
def _domain_errors() -> Iterator[None]:
    """Database errors as domain errors: unique violations → Conflict, connection and other
    driver errors → DatabaseUnavailable; domain errors pass through."""
    try:
        yield
    except ScalebookError:
        raise
    except IntegrityError as exc:
        raise Conflict(f"the database refused the write: {exc.orig}") from exc
    except OperationalError as exc:
        raise DatabaseUnavailable(f"database error: {exc.orig}") from exc
    except DBAPIError as exc:
        raise DatabaseUnavailable(f"database error: {exc.orig}") from exc


class Database:
    """One database: its engine, dialect, write lock and schema helpers."""

    def __init__(self, url: str, *, echo: bool = False, journal_rows: int = ingest_journal.FLUSH_ROWS):
        """`journal_rows`: DuckDB files only — journaled runs gathered before a flush into `runs`
        (SCALEBOOK_INGEST_JOURNAL_ROWS); 0 writes every request straight into DuckDB."""
        self.url = url
        self._file: Path | None = None
        if url.startswith("duckdb:///"):
            path = url.removeprefix("duckdb:///").split("?", 1)[0]
            if path and path != ":memory:":
                self._file = Path(path).expanduser()
                self._file.parent.mkdir(parents=True, exist_ok=True)
        kwargs: dict = {"echo": echo}
        if url.startswith("postgresql"):
            kwargs.update(pool_size=10, max_overflow=20, pool_pre_ping=True)
        self.engine = sa.create_engine(url, **kwargs)
        self.dialect = self.engine.dialect.name  # "duckdb" | "postgresql"
        self._journal_rows = journal_rows
        self._key = str(self._file.resolve()) if self._file is not None else ""
        self._shared = ingest_journal.shared(self._key) if self._file is not None else None
        self._write_lock: threading.RLock | None = (
            self._shared.lock if self._shared is not None else threading.RLock() if self.is_duckdb else None)

    @property
    def is_duckdb(self) -> bool:
        return self.dialect == "duckdb"

    @property
    def write_lock(self) -> contextlib.AbstractContextManager:
        """The lock that serialises writes (DuckDB; a no-op context on PostgreSQL)."""
        return self._write_lock if self._write_lock is not None else contextlib.nullcontext()

    @contextlib.contextmanager
    def session(self, *, write: bool = False, flush: bool = True) -> Iterator[Session]:
        """Yield a Session; commit on success, roll back on error.

        On a DuckDB file the journaled runs are moved into `runs` first (see `flush`), so the
        session sees every acknowledged run; a read session that does not read runs (the token
        check) may pass `flush=False`. Raises Conflict on unique violations,
        DatabaseUnavailable on connection errors; domain errors raised inside pass through after
        the rollback.
        """
        journal = self.journal
        with self.write_lock if write else contextlib.nullcontext():
            if journal is not None:
                if journal.pending and (flush or write):
                    self.flush()
                if write:
                    journal.drop_ids()  # this session may draw ids: later ones than any reserved
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

    @contextlib.contextmanager
    def autocommit(self) -> Iterator[sa.Connection]:
        """PostgreSQL: a pooled Connection in autocommit mode, for a write that is one statement
        (its own transaction: no BEGIN or COMMIT round trips). Errors as `session` raises them."""
        with _domain_errors(), self.engine.connect() as conn:
            yield conn.execution_options(isolation_level="AUTOCOMMIT")

    # -- schema -------------------------------------------------------------------------
    def upgrade(self, revision: str = "head") -> None:
        """Run Alembic migrations up to `revision` (default head)."""
        with self._write_lock or contextlib.nullcontext():
            command.upgrade(alembic_config(self.url), revision)

    def current_revision(self) -> str | None:
        with self.engine.connect() as conn:
            return MigrationContext.configure(conn).get_current_revision()

    def head_revision(self) -> str:
        return ScriptDirectory.from_config(alembic_config(self.url)).get_current_head()

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
        _ = self.journal  # opens a DuckDB file's ingest journal, replaying what a crash left

    # -- the ingest journal (DuckDB files) -------------------------------------------------------
    @property
    def journal(self) -> ingest_journal.IngestJournal | None:
        """The file's ingest journal, opened on first use (replaying what a crash left); None on
        PostgreSQL, in-memory DuckDB, or with journal_rows=0 once the leftovers are replayed."""
        shared = self._shared
        if shared is None or shared.opened:
            return shared.journal if shared is not None else None
        with shared.lock:
            if not shared.opened:
                shared.journal = self._open_journal()
                shared.opened = True
        return shared.journal

    @property
    def kept(self) -> KeptAggregates | None:
        """The file's analytics aggregates kept in memory and current by id watermark
        (service/analytics/kept.py: the heatmap, the recommender's evidence and recorded OOMs),
        shared by every Database of the file in this process; None on PostgreSQL and in-memory
        DuckDB, which aggregate on every request."""
        shared = self._shared
        if shared is None:
            return None
        if shared.kept is None:
            with shared.lock:
                if shared.kept is None:
                    shared.kept = KeptAggregates()
        return shared.kept

    def _open_journal(self) -> ingest_journal.IngestJournal | None:
        path = ingest_journal.journal_path(self._file)
        leftover = path.exists() and path.stat().st_size > 0
        if self._journal_rows <= 0 and not leftover:
            return None
        # a connection of its own, taken out of the pool: the pool closes surplus connections (and
        # DuckDB closes a duplicate() with its parent), the journal needs one for its lifetime
        fairy = self.engine.raw_connection()
        own = fairy.driver_connection
        fairy.detach()
        journal = ingest_journal.IngestJournal(path, own, self._journal_rows)
        if leftover:
            from service import store

            try:
                rows = journal.load(store.DATETIME_COLUMNS)
                if rows:
                    with self._transaction() as session:
                        replayed = store.insert_journaled(session, rows, skip_stored=True)
                    ingest_journal.log.warning("ingest journal %s: %d of %d run(s) replayed into runs after an "
                                               "unclean stop", path, replayed, len(rows))
                journal.clear()
            except BaseException:
                journal.close(remove=False)  # kept for the next attempt; the file lock released
                raise
        if self._journal_rows <= 0:
            journal.close(remove=True)
            return None
        return journal

    def flush(self) -> int:
        """Move the journaled runs into `runs` in one transaction (group commit); returns how
        many. On failure they stay journaled (durable) and the error is raised."""
        journal = self.journal
        if journal is None or not journal.pending:
            return 0
        from service import store

        with self.write_lock:
            rows = list(journal.pending.values())
            if not rows:
                return 0
            with self._transaction() as session:
                store.insert_journaled(session, rows)
            journal.clear()
            return len(rows)

    def dispose(self) -> None:
        """Flush the journal (kept on disk if that fails), release it, close the engine."""
        shared = self._shared
        if shared is not None:
            try:
                if shared.opened:
                    self.flush()
            except Exception as exc:  # noqa: BLE001 - closing goes on; the runs stay journaled on disk
                ingest_journal.log.warning("ingest journal not flushed at close (replayed at the next start): %s",
                                           getattr(exc, "message", exc))
            self._shared = None
            if ingest_journal.release(self._key, shared) and shared.journal is not None:
                with shared.lock:  # no writer of this process is inside the journal while it closes
                    shared.journal.close(remove=True)
                    shared.journal = None
        self.engine.dispose()
