"""Handing out a sweep's configurations (POST /api/v1/sweeps/{name}/next, DESIGN §9, issue 29).

Each call hands out at most one configuration as a lease: a row of sweep_leases and, in the same
transaction, the run opened as `running` under the lease's run_key (the live-run lifecycle,
service/lifecycle.py: the agent heartbeats it and the job — or the agent — finishes it).

What keeps two agents from one configuration is the database, not this process: sweep_leases is unique
on (sweep, config_key, attempt) and on (sweep, slot, attempt), and a lease is written with
`INSERT … ON CONFLICT DO NOTHING` (PostgreSQL and DuckDB alike). Two agents racing for the same
configuration or the same budget slot: one INSERT writes, the other writes nothing (PostgreSQL waits
for the first transaction and then sees its row) and that agent reads the sweep again and takes the
next configuration. `slot` numbers a sweep's configurations 1..budget, so the budget holds under any
number of concurrent API processes too.

Order of hand-out
1. A lease whose run reads `lost` (service/lifecycle: no heartbeat for lost_after_s) is handed out
   again, once: attempt 2 of the same slot and configuration. A lost attempt 2 is not retried (the
   configuration is then reported as lost twice — a job that hangs its machine twice is a result).
2. The budget: with `budget` configurations handed out the sweep is done.
3. The strategy: grid — the next valid combination not handed out, in enumeration order; suggest —
   /suggest's ranking (service/analytics/suggest.py) less the configurations handed out, stopping when
   the best expected improvement is below the sweep's min_expected_improvement (once the target has a
   successful run; service/sweeps.DEFAULT_MIN_EXPECTED_IMPROVEMENT).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from core.lifecycle import DEFAULT_HEARTBEAT_S, lost_cutoff
from core.record import RUNNING
from core.rules import CONFIG_FIELDS, config_label
from service import store
from service import sweeps as sw
from service.analytics import recommend as rec
from service.analytics import suggest as sg
from service.errors import BadRequest, Conflict
from service.tables import Run, Sweep, SweepLease

#: a configuration is handed out at most this many times (once, and once more when its run went lost)
MAX_ATTEMPTS = 2
#: how many times one request re-reads the sweep after losing a race for a configuration or a slot
MAX_RACES = 20


@dataclass
class Done:
    """The sweep has nothing to hand out: `code` (budget | exhausted | converged | no_candidates) and why."""

    code: str
    reason: str


@dataclass
class _Candidate:
    config: dict[str, Any]
    attempt: int
    slot: int
    predicted: dict[str, Any] | None
    expected_improvement: float | None = None


def _state(session: Session, sweep: Sweep, cutoff: datetime) -> tuple[list[SweepLease], dict[str, str]]:
    """The sweep's leases (hand-out order) and {run_key: status as read at `cutoff`} of their runs."""
    leases = list(session.scalars(sa.select(SweepLease).where(SweepLease.sweep == sweep.name)
                                  .order_by(SweepLease.id)))
    rows: Any = session.execute(sa.select(Run.run_key, Run.status, Run.last_heartbeat_at)
                                .where(Run.run_key.in_([lease.run_key for lease in leases]))) if leases else []
    status: dict[str, str] = {}
    for key, st, beat in rows:
        status[key] = "lost" if st == RUNNING and (beat is None or beat < cutoff) else st
    return leases, status


def _relet(leases: list[SweepLease], status: dict[str, str]) -> list[_Candidate]:
    """Configurations whose latest lease's run reads lost, with attempts left: attempt + 1, same slot."""
    latest: dict[str, SweepLease] = {}
    for lease in leases:
        if lease.attempt >= latest.get(lease.config_key, lease).attempt:
            latest[lease.config_key] = lease
    return [_Candidate(dict(lease.config), lease.attempt + 1, lease.slot or 0, lease.predicted)
            for lease in latest.values() if status.get(lease.run_key) == "lost" and lease.attempt < MAX_ATTEMPTS]


def _prediction(prep: rec.Prepared | None, cfg: dict[str, Any]) -> dict[str, Any] | None:
    """The throughput model's figures for a configuration on the sweep's target, None without a model."""
    if prep is None:
        return None
    try:
        p = rec.predicted_for(prep, cfg, rec.anchors_for(prep), rec.layout_distances(prep))
    except ValueError:
        return None
    return {"tokens_per_sec_per_gpu": p["tokens_per_sec_per_gpu"], "mfu": p["mfu"], "interval": p["interval"]}


def _prepared(session: Session, sweep: Sweep) -> rec.Prepared | None:
    try:
        return rec.prepare(session, sw.to_recommend_target(sweep.target))
    except BadRequest:  # nothing recorded to complete the target from, or no model for it: no prediction
        return None


def _fresh(session: Session, sweep: Sweep, taken: set[str], slot: int) -> list[_Candidate] | Done:
    """The strategy's next configurations (best first; several, so a lost race can take the next)."""
    if sweep.strategy == "grid":
        left = [c for c in sw.grid_configs(sweep.target, sweep.grid or {}) if config_label(c) not in taken]
        if not left:
            return Done("exhausted", f"every valid combination of the grid has been handed out ({len(taken)})")
        prep = _prepared(session, sweep)
        return [_Candidate(c, 1, slot, _prediction(prep, c)) for c in left[:1]] + \
            [_Candidate(c, 1, slot, None) for c in left[1:MAX_RACES]]
    answer = sg.suggest(session, sw.to_recommend_target(sweep.target), n=min(50, len(taken) + 5))
    left = [s for s in answer["suggestions"] if config_label(s["config"]) not in taken]
    if not left:
        notes = "; ".join(answer.get("notes") or [])
        return Done("no_candidates", "no configuration is left that is valid, predicted to fit and not yet run"
                    + (f" ({notes})" if notes else ""))
    best = answer.get("best_recorded")
    threshold = sweep.min_expected_improvement or 0.0
    top = left[0]
    if best is not None and top["expected_improvement"] < threshold:
        return Done("converged", f"no configuration is expected to improve on the best run so far "
                                 f"({best['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU, run {best['id']}) by "
                                 f"{100 * threshold:g} % or more: the most is {100 * top['expected_improvement']:.2f} %"
                                 " (expected improvement, Jones et al. 1998)")
    return [_Candidate(s["config"], 1, slot, {k: s["predicted"][k] for k in ("tokens_per_sec_per_gpu", "mfu",
                                                                            "interval")},
                       s["expected_improvement"]) for s in left]


def _open_record(sweep: Sweep, cand: _Candidate, run_key: str, agent: str | None, now: datetime) -> dict[str, Any]:
    """The run opened for a lease: the sweep's target and the configuration, status running, started now
    (the job's own finish may state when it started)."""
    target = sweep.target
    run = {k: target.get(k) for k in sw.TARGET_FIELDS}
    run.update({k: cand.config[k] for k in CONFIG_FIELDS})
    run.update({"run_key": run_key, "name": f"{sweep.name} {config_label(cand.config)}", "source": "sweep",
                "started_at": now.isoformat(),
                "sweep": sweep.name, "status": RUNNING,
                "extra": {"sweep_attempt": cand.attempt, "sweep_slot": cand.slot,
                          **({"agent": agent} if agent else {})}})
    return {k: v for k, v in run.items() if v is not None}


def next_lease(session: Session, sweep: Sweep, *, now: datetime, lost_after_s: float,
               agent: str | None = None) -> dict[str, Any] | Done:
    """Hand out the sweep's next configuration (module docstring) in the session's transaction.

    Returns {"sweep", "run_key", "run_id", "attempt", "slot", "config" (CONFIG_FIELDS), "run" (the
    opened record: target and configuration), "label", "predicted" ({tokens_per_sec_per_gpu, mfu,
    interval} or None), "expected_improvement" (suggest) , "lost_after_s", "heartbeat_s"} or Done.
    Raises Conflict when MAX_RACES races in a row were lost (the caller may ask again)."""
    cutoff = lost_cutoff(now, lost_after_s)
    for _ in range(MAX_RACES):
        leases, status = _state(session, sweep, cutoff)
        taken = {lease.config_key for lease in leases}
        found = _relet(leases, status)
        if not found:
            if len(taken) >= sweep.budget:
                return Done("budget", f"the budget is spent: {len(taken)} of {sweep.budget} configurations "
                                      "handed out")
            fresh = _fresh(session, sweep, taken, max((lease.slot or 0 for lease in leases), default=0) + 1)
            if isinstance(fresh, Done):
                return fresh
            found = fresh
        for cand in found:
            key = config_label(cand.config)
            run_key = f"{sweep.name}:{cand.slot}" + (f".{cand.attempt}" if cand.attempt > 1 else "")
            row = session.execute(
                insert(SweepLease).values(sweep=sweep.name, config_key=key, attempt=cand.attempt, slot=cand.slot,
                                          run_key=run_key, config=cand.config, predicted=cand.predicted,
                                          leased_at=now, agent=agent)
                .on_conflict_do_nothing().returning(SweepLease.id)).first()
            if row is None:  # another agent took this configuration or this slot: look again
                break
            record = _open_record(sweep, cand, run_key, agent, now)
            (run,), _, _ = store.store_runs(session, [record])
            return {"sweep": sweep.name, "run_key": run_key, "run_id": run.id, "attempt": cand.attempt,
                    "slot": cand.slot, "config": {k: cand.config[k] for k in CONFIG_FIELDS},
                    "label": key,
                    "run": {k: v for k, v in record.items() if k not in ("status", "extra", "started_at")},
                    "predicted": cand.predicted, "expected_improvement": cand.expected_improvement,
                    "lost_after_s": lost_after_s, "heartbeat_s": min(DEFAULT_HEARTBEAT_S, lost_after_s / 4)}
    raise Conflict(f"sweep {sweep.name!r}: lost {MAX_RACES} races for a configuration in a row; ask again",
                   [{"field": "name", "value": sweep.name, "message": "too many concurrent agents; retry"}])
