"""Live runs on the server (DESIGN §9): the lifecycle's SQL, the heartbeat, and how a run reads.

The rule is core/lifecycle.py's: a stored `running` run whose `last_heartbeat_at` is older than
`lost_after_s` (setting SCALEBOOK_LOST_AFTER_S) reads as `lost`. Nothing is marked: every reader
derives it with the same cutoff (`now − lost_after_s`), here as SQL conditions and as the answer's
`status`. Finishing an open run (the one change a stored run may receive) is part of the write path,
service/store.py (`store_runs`), since it arrives as a POST /runs with the same run_key.

Server-side API, for the sweeps and the agents' endpoints:
- `open` a run: `store.store_runs(session, [{..., "status": "running", "run_key": K}])` — sets
  `last_heartbeat_at` to now; the same payload again answers the stored run.
- `heartbeat(session, K, now)` — 404 for an unknown key, 409 for a finished run; a lost run is running again.
- finish it: `store.store_runs(session, [{..., "status": <terminal>, "run_key": K}])`.
- `status_condition(status, cutoff)`, `FINISHED`, `read_status_expr(cutoff)`: the SQL forms.
- `present(runs, now, lost_after_s)`: runs as the API answers them, lost ones reading `lost`.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from core.lifecycle import lost_cutoff, read_status
from core.record import LOST, RUNNING
from service.db import locked
from service.errors import Conflict, NotFound
from service.schemas import RunOut
from service.tables import Run

#: the runs analytics read: finished ones (a running or lost run has no result yet). Heatmap counts,
#: recommend, suggest, scaling, plan, regressions and the throughput fit all leave open runs out;
#: those that read `status = 'success'` / `'oom'` only leave them out already.
FINISHED = Run.status != RUNNING


def utcnow() -> datetime:
    """Now as the database stores time: naive UTC."""
    return datetime.now(UTC).replace(tzinfo=None)


def status_condition(status: str, cutoff: datetime) -> sa.ColumnElement[bool]:
    """The SQL condition for "reads as `status`" given the lost cutoff (`now − lost_after_s`, naive UTC):
    running = stored running with a heartbeat at or after the cutoff; lost = stored running with an older
    (or no) heartbeat; any other status = stored as such."""
    if status == RUNNING:
        return sa.and_(Run.status == RUNNING, Run.last_heartbeat_at >= cutoff)
    if status == LOST:
        return sa.and_(Run.status == RUNNING, sa.or_(Run.last_heartbeat_at < cutoff, Run.last_heartbeat_at.is_(None)))
    return Run.status == status


def read_status_expr(cutoff: datetime) -> sa.ColumnElement[str]:
    """`status` as a run reads at the cutoff: a SQL CASE mapping stale running runs to 'lost'."""
    stale = sa.or_(Run.last_heartbeat_at < cutoff, Run.last_heartbeat_at.is_(None))
    return sa.case((sa.and_(Run.status == RUNNING, stale), sa.literal(LOST)), else_=Run.status)


def get_by_key(session: Session, run_key: str, *, for_update: bool = False) -> Run:
    """The run stored under `run_key` (locked FOR UPDATE on PostgreSQL when asked); NotFound otherwise."""
    query = sa.select(Run).where(Run.run_key == run_key)
    run = session.scalars(locked(session, query) if for_update else query).first()
    if run is None:
        raise NotFound(f"no run with run_key {run_key!r}",
                       [{"field": "run_key", "value": run_key, "message": "not found: open it with POST /api/v1/runs "
                                                                          "and status 'running' first"}])
    return run


def heartbeat(session: Session, run_key: str, now: datetime) -> Run:
    """Record that the job of the open run `run_key` is alive at `now` (naive UTC): its
    last_heartbeat_at moves to `now` (a lost run reads as running again). Returns the run.

    Raises NotFound (404) for an unknown run_key, Conflict (409) for a finished run (immutable)."""
    run = get_by_key(session, run_key, for_update=True)
    if run.status != RUNNING:
        raise Conflict(f"run {run_key!r} is finished ({run.status}): a finished run is immutable",
                       [{"field": "run_key", "value": run_key, "message": f"finished as {run.status}"}])
    if run.last_heartbeat_at is None or now > run.last_heartbeat_at:
        run.last_heartbeat_at = now
    return run


def present(runs: Iterable[Any], now: datetime, lost_after_s: float) -> list[Any]:
    """`runs` (Run rows or StoredRun dicts) as the API answers them: a running run past the lost cutoff
    becomes a RunOut reading `lost`; every other run is passed through unchanged (validated later)."""
    out: list[Any] = []
    for run in runs:
        if run.status == RUNNING and read_status(RUNNING, run.last_heartbeat_at, now, lost_after_s) == LOST:
            out.append(RunOut.model_validate(run).model_copy(update={"status": LOST}))
        else:
            out.append(run)
    return out


__all__ = ["FINISHED", "get_by_key", "heartbeat", "lost_cutoff", "present", "read_status_expr",
           "status_condition", "utcnow"]
