"""The ingest journal: group commit for small writes into an embedded DuckDB file.

Why. DuckDB is a column store: a one-row INSERT into the 57-column `runs` table costs it
~2–3 ms and the commit ~1–1.5 ms (parse, bind, optimise and plan per statement; a WAL write
and fsync per commit; bench/RESULTS.md), so a single POST took 10–14 ms at 10^6 runs against
~4.7 ms on PostgreSQL. DuckDB's cost per row falls a hundredfold in set-based inserts.

What. A request of at most SMALL_REQUEST runs whose run_keys are all new is made durable by
appending it, as one line of JSON, to `<database file>.ingest-journal` and calling fdatasync —
the guarantee DuckDB's own commit gives (acknowledged ⇒ on disk; survives SIGKILL and power
loss) — and is answered from memory. The journaled runs move into `runs` in one set-based
insert (group commit, as PostgreSQL's `commit_delay` or InnoDB's group commit batch the commits
of concurrent transactions) when `flush_rows` of them have gathered, before any other session on
the database opens (so every reader sees every acknowledged run, and every other writer writes
after them), and when the database is closed. Retries of stored keys, conflicts and batches take
the ordinary transactional path (service/store.py) after a flush.

Crash recovery. When the database is opened, lines left by a crash are replayed: their runs
whose run_key is not in `runs` are inserted (a crash between the flush's commit and the
journal's truncation leaves lines that are already stored). A line that cannot be read — the
last one, cut by the crash before its fsync returned, so never acknowledged — is set aside in
`<journal>.rejects` rather than dropped.

Ids. Drawn from `runs_id_seq` up front in blocks of ID_BLOCK. The rest of a block is dropped
whenever another write session opens, so ids still commit in increasing order — what keyset
pagination and the run_configs watermark (service/run_configs.py) rely on. Dropped ids leave
gaps, as any sequence may.

One process owns a DuckDB file (DuckDB locks it), and the journal is taken with flock beside
it. Within the process every `Database` of the file shares one journal and one write lock
(`shared()`).
"""

from __future__ import annotations

import fcntl
import logging
import os
import threading
from collections.abc import Iterable
from datetime import datetime
from pathlib import Path
from typing import Any

import pydantic_core

from service.errors import DatabaseUnavailable

log = logging.getLogger(__name__)

#: requests of at most this many runs may be journaled (larger ones are set-based inserts already)
SMALL_REQUEST = 20
#: journaled runs gathered before they are moved into `runs` (SCALEBOOK_INGEST_JOURNAL_ROWS)
FLUSH_ROWS = 256
#: ids drawn from runs_id_seq per query
ID_BLOCK = 64
SUFFIX = ".ingest-journal"


class IngestJournal:
    """The journal of one DuckDB file: the file, the runs not yet moved into `runs` (`pending`,
    {run_key: row dict}, in id order) and a block of reserved ids.

    Every method but `load` must be called with the database's write lock held. `conn` is a
    DuckDB connection of its own (autocommit), used for key lookups and ids only.
    """

    def __init__(self, path: Path, conn: Any, flush_rows: int = FLUSH_ROWS):
        self.path = path
        self.flush_rows = flush_rows
        self.pending: dict[str, dict[str, Any]] = {}
        #: set when a failed append could not be undone: the file may hold a partial line, so
        #: nothing more is appended (writes take the direct path) until the next start replays it
        self.broken = False
        self._conn = conn
        self._ids: list[int] = []
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            os.close(self._fd)
            conn.close()
            raise DatabaseUnavailable(f"{path} is held by another process: one scalebook process owns "
                                      "a DuckDB file (stop the server, or go through its API)") from exc

    # -- recovery -------------------------------------------------------------------------------
    def load(self, datetime_columns: Iterable[str]) -> list[dict[str, Any]]:
        """The runs of the lines on disk (left by a crash), in file order, one per run_key (the
        last line's: an earlier one was a write whose fsync failed, answered with an error).
        Unreadable lines — the last one when a crash cut it — are appended to `<journal>.rejects`
        and skipped, with a warning."""
        with open(self.path, "rb") as fh:
            lines = fh.read().splitlines()
        rows: list[dict[str, Any]] = []
        rejects: list[bytes] = []
        for line in lines:
            if not line.strip():
                continue
            try:
                batch = pydantic_core.from_json(line)
                if not isinstance(batch, list) or not all(isinstance(r, dict) and "run_key" in r for r in batch):
                    raise ValueError("expected a list of runs")
            except ValueError:
                rejects.append(line)
                continue
            for r in batch:
                for name in datetime_columns:
                    if isinstance(r.get(name), str):
                        r[name] = datetime.fromisoformat(r[name])
            rows.extend(batch)
        rows = list({r["run_key"]: r for r in rows}.values())
        if rejects:
            target = self.path.with_name(self.path.name + ".rejects")
            with open(target, "ab") as fh:
                fh.write(b"\n".join(rejects) + b"\n")
            log.warning("ingest journal %s: %d unreadable line(s) (a write cut by a crash, never acknowledged) "
                        "set aside in %s", self.path, len(rejects), target)
        return rows

    # -- the write path -------------------------------------------------------------------------
    def stored(self, keys: list[str]) -> bool:
        """Whether any of `keys` is journaled or stored in `runs`."""
        if any(k in self.pending for k in keys):
            return True
        if len(keys) == 1:
            return self._conn.execute("SELECT 1 FROM runs WHERE run_key = ?", keys).fetchone() is not None
        return self._conn.execute("SELECT 1 FROM runs WHERE run_key = ANY(?) LIMIT 1", [keys]).fetchone() is not None

    def has_ids(self, n: int) -> bool:
        """Whether `n` reserved ids are at hand (next_ids needs no query)."""
        return len(self._ids) >= n

    def next_ids(self, n: int) -> list[int]:
        """`n` fresh ids, increasing; drawn from runs_id_seq ID_BLOCK at a time."""
        while len(self._ids) < n:
            block = self._conn.execute("SELECT nextval('runs_id_seq') FROM range(?)", [max(ID_BLOCK, n)]).fetchall()
            self._ids += sorted(v for (v,) in block)
        out, self._ids = self._ids[:n], self._ids[n:]
        return out

    def drop_ids(self) -> None:
        """Forget the reserved ids (another writer is about to draw later ones)."""
        self._ids = []

    def append(self, rows: list[dict[str, Any]]) -> None:
        """Make `rows` (ids set) durable as one line, then add them to `pending`. Raises
        DatabaseUnavailable when the write or the fsync fails: nothing is acknowledged, and the
        file is cut back to where it was (or, if even that fails, the journal is marked broken)."""
        line = pydantic_core.to_json(rows) + b"\n"
        size = os.lseek(self._fd, 0, os.SEEK_END)
        try:
            written = os.write(self._fd, line)
            if written != len(line):
                raise OSError(f"short write: {written} of {len(line)} bytes")
            os.fdatasync(self._fd)
        except OSError as exc:
            try:
                os.ftruncate(self._fd, size)
            except OSError:
                self.broken = True
                log.error("ingest journal %s: a failed write could not be undone; journaling stops until "
                          "the next start", self.path)
            raise DatabaseUnavailable(f"cannot write the ingest journal {self.path}: {exc}") from exc
        for r in rows:
            self.pending[r["run_key"]] = r

    def clear(self) -> None:
        """After the pending runs were committed to `runs`: empty `pending`, then the file. A file
        that cannot be emptied is only logged: a replay skips runs already stored."""
        self.pending.clear()
        try:
            os.ftruncate(self._fd, 0)
            os.fdatasync(self._fd)
        except OSError as exc:
            log.warning("ingest journal %s: not emptied after a flush (%s); its runs are stored and a "
                        "replay will skip them", self.path, exc)

    def close(self, *, remove: bool) -> None:
        """Release the file (removed when `remove` and nothing is pending) and the connection."""
        if remove and not self.pending:
            self.path.unlink(missing_ok=True)
        os.close(self._fd)
        self._conn.close()


class Shared:
    """What every `Database` of one DuckDB file in this process shares: the write lock and the
    journal (None until opened, or when journaling is off)."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.journal: IngestJournal | None = None
        self.opened = False
        self.users = 0
        self.kept: Any = None  # service.analytics.kept.KeptAggregates, made on first use


_SHARED: dict[str, Shared] = {}
_SHARED_LOCK = threading.Lock()


def shared(key: str) -> Shared:
    """The Shared state of the DuckDB file whose resolved path is `key`, counted as used."""
    with _SHARED_LOCK:
        state = _SHARED.setdefault(key, Shared())
        state.users += 1
        return state


def release(key: str, state: Shared) -> bool:
    """Count one user of `state` gone; True when it was the last (the caller closes the journal)."""
    with _SHARED_LOCK:
        state.users -= 1
        if state.users <= 0:
            if _SHARED.get(key) is state:
                del _SHARED[key]
            return True
        return False


def journal_path(db_path: Path) -> Path:
    return db_path.with_name(db_path.name + SUFFIX)
