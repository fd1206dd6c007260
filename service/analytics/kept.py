"""Aggregates over `runs` kept in memory on a DuckDB file: aggregate once, then only new runs.

At 10^6 runs the analytics' scans cost DuckDB tens of ms per request (the heatmap's two aggregate
scans and its 436 scattered best rows ~50 ms; the recommender's evidence and OOM scans ~25 ms),
though between two requests only a handful of runs, often none, arrive. Every aggregate kept
here merges exactly over disjoint sets of runs (counts add, a best run is the better of two best
runs, sets unite, top-k lists merge). So each one is kept with the id watermark it is current
to, and a request aggregates only the runs past it (`id > watermark`, which DuckDB's zone maps
on `id` narrow to the newest row groups) and merges them in: the materialised-aggregate technique
of service/run_configs.py, held in memory instead of a table.

Why this is exact on a DuckDB file, and only there:
- runs are insert-only through scalebook, and ids commit in increasing order: one process owns
  the file, its writes are serialised by Database.write_lock, and the ingest journal is flushed
  before any session opens (the invariant run_configs' watermark and keyset pagination rely on);
- the aggregates live in the process that owns the file (Database's per-file shared state), so
  no other process writes behind their back while they exist.
PostgreSQL has concurrent writers whose ids can commit out of order; it aggregates on every
request (from its indexes) and never uses this.

A guard against changes made outside scalebook (SQL deleting runs while the server runs, which
scalebook itself never does): every request compares the number of runs up to the watermark with
the number there were when it was set, and aggregates from scratch when they differ.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import sqlalchemy as sa
from sqlalchemy.orm import Session

from service.tables import Run

T = TypeVar("T")

#: aggregates kept per kind (the key's first element: "heatmap", "evidence", "ooms"); the least
#: recently used of a kind is dropped beyond this, so one kind cannot push out another
MAX_ENTRIES = 128


@dataclass(frozen=True)
class _Entry:
    """An aggregate current to `watermark`; `n_through` = runs (any kind) with id <= watermark
    when it was set. Never changed once made: a request that reads it keeps a consistent value."""

    value: Any = None
    watermark: int = 0
    n_through: int = 0


class KeptAggregates:
    """Aggregates over `runs`, each under a key, kept current by id watermark. Thread-safe: a lock
    per key around a request's read-and-merge (so no runs are merged twice), and no lock is held
    while waiting for a database connection."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._lock = threading.Lock()  # guards the dicts below, never held during SQL
        self._entries: dict[Any, OrderedDict[tuple, _Entry]] = {}
        self._key_locks: dict[tuple, threading.Lock] = {}
        self._max = max_entries

    def clear(self) -> None:
        """Forget every aggregate (the next request of each aggregates every run again)."""
        with self._lock:
            self._entries.clear()

    def keys(self) -> list[tuple]:
        """The keys kept, per kind least recently used first."""
        with self._lock:
            return [key for kind in self._entries.values() for key in kind]

    def watermark(self, key: tuple) -> int | None:
        """The id the aggregate under `key` is current to; None when none is kept."""
        with self._lock:
            entry = self._entries.get(key[0], {}).get(key)
            return entry.watermark if entry is not None else None

    def get(self, session: Session, key: tuple, aggregate: Callable[[list[sa.ColumnElement]], T],
            merge: Callable[[T | None, T], T]) -> T:
        """The aggregate under `key` (a tuple whose first element names its kind) as of
        `session`'s snapshot.

        `aggregate(conds)` computes it over the runs matching `conds` (an id range, as SQL
        conditions on `runs.id` with number literals, which DuckDB prunes row groups by) in
        `session`; `merge(kept, new)` returns the combination of a kept value (None at first)
        with one over later runs, as a new value: `kept` may be in use by other requests and
        must not be changed. Call from read sessions only: runs a session has written but not
        committed would be merged in. Database errors pass through as the session raises them;
        the kept aggregate is then unchanged.

        A session whose snapshot is older than the kept aggregate (a concurrent request moved it
        on after this session's first read) gets a full aggregate of its own snapshot, and the
        kept one stays.
        """
        conn = session.connection()  # before any lock: never wait for a pooled connection holding one
        with self._lock:
            key_lock = self._key_locks.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                entry = self._entries.get(key[0], {}).get(key) or _Entry()
            newest, n_runs, n_through = conn.execute(sa.select(
                sa.func.max(Run.id), sa.func.count(), sa.func.count().filter(Run.id <= entry.watermark))).one()
            newest = int(newest or 0)
            if newest < entry.watermark:  # an older snapshot (or the newest runs deleted outside)
                return merge(None, aggregate(self._id_range(0, newest)))
            if n_through != entry.n_through:  # runs up to the watermark changed outside scalebook
                entry = _Entry()
            value = entry.value
            if value is None or newest > entry.watermark:
                value = merge(value, aggregate(self._id_range(entry.watermark, newest)))
            self._put(key, _Entry(value, newest, n_runs))  # every run of this snapshot has id <= newest
            return value

    @staticmethod
    def _id_range(after: int, through: int) -> list[sa.ColumnElement]:
        """`after < runs.id <= through` with the bounds as number literals."""
        return [Run.id > sa.literal_column(str(int(after))), Run.id <= sa.literal_column(str(int(through)))]

    def _put(self, key: tuple, entry: _Entry) -> None:
        with self._lock:
            kind = self._entries.setdefault(key[0], OrderedDict())
            kind[key] = entry
            kind.move_to_end(key)
            while len(kind) > self._max:
                old, _ = kind.popitem(last=False)
                self._key_locks.pop(old, None)
