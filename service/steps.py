"""Step series of live runs (DESIGN §9): store a batch of steps, read a run's series, thin it to its
bound, and fill a finishing run's headline from its steady-state steps (core/steps.py's rules).

Functions take a Session and never commit (the API opens `db.session(write=True)`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.orm import Session

from core import steps as rules
from core.record import RUNNING
from service import lifecycle
from service.errors import Conflict
from service.tables import RunStep

_COLUMNS = [c.name for c in RunStep.__table__.columns]


def store_steps(session: Session, run_key: str, steps: Sequence[Mapping[str, Any]], now: datetime,
                max_steps: int) -> dict[str, Any]:
    """Store `steps` (validated StepIn dumps: step plus any of core.steps.STEP_METRICS, recorded_at naive
    UTC) of the run `run_key`, once each: a step number already stored keeps its first figures (a retry
    or the spool's replay changes nothing). An open run's last_heartbeat_at moves to `now` (steps are a
    sign of life; a lost run is running again). Beyond `max_steps` stored steps the series is thinned
    (`thin`). Returns {"run_id", "received", "created", "thinned"}.

    Raises NotFound (404) for an unknown run_key; Conflict (409) for new steps of a finished run (its
    series ended with it; steps it already holds are answered as a replay)."""
    run = lifecycle.get_by_key(session, run_key, for_update=True)
    numbers = sorted({int(s["step"]) for s in steps})
    if run.status != RUNNING:
        known = set(session.scalars(sa.select(RunStep.step).where(RunStep.run_id == run.id,
                                                                   RunStep.step.in_(numbers))))
        missing = [n for n in numbers if n not in known]
        if missing:
            raise Conflict(f"run {run_key!r} is finished ({run.status}): it takes no new steps",
                           [{"field": "steps", "value": missing[:20], "message": "steps of a finished run"}])
        return {"run_id": run.id, "received": len(steps), "created": 0, "thinned": 0}
    created = 0
    if steps:
        rows = [{**{k: s.get(k) for k in _COLUMNS}, "run_id": run.id, "received_at": now} for s in steps]
        # (one multi-row INSERT … ON CONFLICT DO NOTHING: duckdb-engine compiles PostgreSQL's construct too)
        stmt = pg_insert(RunStep).values(rows).on_conflict_do_nothing(index_elements=["run_id", "step"])
        created = len(session.execute(stmt.returning(RunStep.step)).all())
    if run.last_heartbeat_at is None or now > run.last_heartbeat_at:
        run.last_heartbeat_at = now
    thinned = thin(session, run.id, max_steps)
    return {"run_id": run.id, "received": len(steps), "created": created, "thinned": thinned}


def thin(session: Session, run_id: int, max_steps: int) -> int:
    """Keep a run's series within `max_steps`: when it holds more, every second stored step is deleted
    (by rank in step order; the first and the last stay), until it fits — the series keeps its whole span
    at an even, coarser spacing (as W&B and MLflow sample long histories for plots). Returns how many
    steps were deleted."""
    numbers = list(session.scalars(sa.select(RunStep.step).where(RunStep.run_id == run_id).order_by(RunStep.step)))
    dropped: list[int] = []
    while len(numbers) > max_steps:
        keep = numbers[::2] if len(numbers) % 2 else [*numbers[:-1:2], numbers[-1]]
        dropped += sorted(set(numbers) - set(keep))
        numbers = keep
    for start in range(0, len(dropped), 1000):
        chunk = dropped[start:start + 1000]
        session.execute(sa.delete(RunStep).where(RunStep.run_id == run_id, RunStep.step.in_(chunk)))
    return len(dropped)


def read_steps(session: Session, run_id: int) -> list[dict[str, Any]]:
    """The run's stored steps in step order, as {column: value} dicts without run_id."""
    rows = session.execute(sa.select(RunStep).where(RunStep.run_id == run_id).order_by(RunStep.step)).scalars()
    return [{c: getattr(r, c) for c in _COLUMNS if c != "run_id"} for r in rows]


def last_steps(session: Session, run_ids: Sequence[int]) -> dict[int, dict[str, Any]]:
    """{run_id: its highest-numbered stored step} for the runs that have one (the Live view)."""
    if not run_ids:
        return {}
    top = (sa.select(RunStep.run_id, sa.func.max(RunStep.step).label("step"))
           .where(RunStep.run_id.in_(list(run_ids))).group_by(RunStep.run_id).subquery())
    rows = session.scalars(sa.select(RunStep).join(top, sa.and_(RunStep.run_id == top.c.run_id,
                                                                RunStep.step == top.c.step)))
    return {r.run_id: {c: getattr(r, c) for c in _COLUMNS if c != "run_id"} for r in rows}


def with_headline(session: Session, run_id: int, record: dict[str, Any]) -> dict[str, Any]:
    """`record` (a finishing run's reported fields) with the headline its steady-state steps give
    (core.steps.headline) for each headline field it does not report; each one filled is named in
    extra.derived_fields, and extra.headline_from_steps says from how many steps and by which rule.
    A record that reports every headline field, or a run without enough steps, is returned as it is."""
    wanted = [f for f in (*rules.MEDIAN_HEADLINE, "peak_memory_gib") if record.get(f) is None]
    if not wanted:
        return record
    series = read_steps(session, run_id)
    found = {k: v for k, v in rules.headline(series).items() if k in wanted}
    if not found:
        return record
    extra = dict(record.get("extra") or {})
    extra["derived_fields"] = sorted(set(extra.get("derived_fields") or []) | set(found))
    warm = rules.warmup_steps(len(series))
    extra["headline_from_steps"] = {"fields": sorted(found), "steps": len(series), "warmup_steps": warm,
                                    "rule": rules.WARMUP_RULE}
    return {**record, **found, "extra": extra}
