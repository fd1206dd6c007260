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

#: aggregates kept; the least recently used is dropped beyond this
MAX_ENTRIES = 256


@dataclass
class _Entry:
    """An aggregate current to `watermark`; `n_through` = runs (any kind) with id <= watermark
    when it was set."""

    value: Any = None
    watermark: int = 0
    n_through: int = 0


class KeptAggregates:
    """Aggregates over `runs`, each under a key, kept current by id watermark. Thread-safe: one
    lock around a request's read-and-merge (so no runs are merged twice)."""

    def __init__(self, max_entries: int = MAX_ENTRIES) -> None:
        self._lock = threading.Lock()
        self._entries: OrderedDict[tuple, _Entry] = OrderedDict()
        self._max = max_entries

    def clear(self) -> None:
        """Forget every aggregate (the next request of each aggregates every run again)."""
        with self._lock:
            self._entries.clear()

    def keys(self) -> list[tuple]:
        """The keys kept, least recently used first."""
        with self._lock:
            return list(self._entries)

    def watermark(self, key: tuple) -> int | None:
        """The id the aggregate under `key` is current to; None when none is kept."""
        with self._lock:
            entry = self._entries.get(key)
            return entry.watermark if entry is not None else None

    def get(self, session: Session, key: tuple, aggregate: Callable[[list[sa.ColumnElement]], T],
            merge: Callable[[T | None, T], T]) -> T:
        """The aggregate under `key` as of `session`'s snapshot.

        `aggregate(conds)` computes it over the runs matching `conds` (an id range, as SQL
        conditions on `runs.id` with number literals, which DuckDB prunes row groups by) in
        `session`; `merge(kept, new)` combines a kept value (None at first) with one over later
        runs and may update `kept` in place. Call from read sessions only: runs a session has
        written but not committed would be merged in. Database errors pass through as the
        session raises them; the aggregate is then dropped and computed afresh by the next call.
        """
        with self._lock:
            entry = self._entries.pop(key, None) or _Entry()
            newest, n_runs, n_through = session.connection().execute(sa.select(
                sa.func.max(Run.id), sa.func.count(), sa.func.count().filter(Run.id <= entry.watermark))).one()
            if n_through != entry.n_through:  # runs up to the watermark changed outside scalebook
                entry = _Entry()
            if entry.value is None or (newest is not None and newest > entry.watermark):
                upper = int(newest or 0)
                part = aggregate([Run.id > sa.literal_column(str(int(entry.watermark))),
                                  Run.id <= sa.literal_column(str(upper))])
                entry = _Entry(merge(entry.value, part), upper, n_runs)
            entry.n_through = n_runs  # every run of this snapshot has id <= newest
            self._entries[key] = entry
            while len(self._entries) > self._max:
                self._entries.popitem(last=False)
            return entry.value
