"""Retired runs: kept and queryable, left out of every analytic (issue 16 item 4); and deleted
runs: gone for good (issue 30 item 13, admin scope), chosen the same way.

A run is retired by setting runs.retired_at (UTC, naive as every stored timestamp) and
runs.retired_reason; un-retiring clears both. Runs are chosen by ids, or by a filter: equality on
the run-record columns GET /api/v1/runs filters on (service/store.FILTER_COLUMNS), `<column>_min` /
`<column>_max` bounds on the integer ones, and `extra.<key>` equality on a key of the run's extra
JSON (e.g. {"source": "nanotron-csv", "pp_min": 2, "extra.after_pp_fix": false}: the nanotron runs
with a pipeline made before nanotron's pipeline-engine fix).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from service import run_cells, run_configs
from service.errors import BadRequest
from service.store import FILTER_COLUMNS
from service.tables import Run, RunStep

_INT_COLUMNS = ("nodes", "gpus_per_node", "world_size", "seq_len", "dp", "tp", "pp", "cp", "ep", "zero_stage",
                "micro_batch_size", "grad_accum_steps", "model_params", "global_batch_tokens")
MAX_IDS = 100_000


def _bad(field: str, value: Any, message: str) -> BadRequest:
    return BadRequest(f"{field}: {message}", [{"field": field, "value": value, "message": message}])


def conditions(ids: list[int] | None, filters: dict[str, Any] | None) -> list[sa.ColumnElement]:
    """SQL conditions choosing the runs (module docstring). Raises BadRequest naming an unknown
    filter, a value of the wrong type, or neither ids nor a filter (retiring everything by
    accident is refused)."""
    conds: list[sa.ColumnElement] = []
    if ids:
        if len(ids) > MAX_IDS:
            raise _bad("ids", len(ids), f"at most {MAX_IDS:,} ids per request")
        conds.append(Run.id.in_(ids))
    for name, value in (filters or {}).items():
        if name.startswith("extra."):
            key = name[len("extra."):]
            if not key:
                raise _bad(name, value, "extra.<key> needs a key")
            elem = Run.extra[key]
            if isinstance(value, bool):
                conds.append(elem.as_boolean() == value)
            elif isinstance(value, (int, float)):
                conds.append(elem.as_float() == float(value))
            elif isinstance(value, str):
                conds.append(elem.as_string() == value)
            else:
                raise _bad(name, value, "must be a boolean, number or string")
        elif name.endswith(("_min", "_max")) and name[:-4] in _INT_COLUMNS:
            if not isinstance(value, int) or isinstance(value, bool):
                raise _bad(name, value, "must be an integer")
            col = getattr(Run, name[:-4])
            conds.append(col >= value if name.endswith("_min") else col <= value)
        elif name in FILTER_COLUMNS:
            if isinstance(value, (dict, list)) or value is None:
                raise _bad(name, value, "must be a single value")
            conds.append(getattr(Run, name) == value)
        else:
            raise _bad(name, value, "unknown filter (a run column, <int column>_min/_max, or extra.<key>)")
    if not conds:
        raise _bad("filter", None, "give ids or a non-empty filter")
    return conds


def retire(session: Session, ids: list[int] | None, filters: dict[str, Any] | None, reason: str) -> list[int]:
    """Retire the chosen runs that are not retired yet; returns their ids (ascending).
    Raises BadRequest for an empty reason or a bad selection."""
    if not reason or not reason.strip():
        raise _bad("reason", reason, "a reason is required")
    conds = conditions(ids, filters)
    chosen = list(session.scalars(sa.select(Run.id).where(*conds, Run.retired_at.is_(None)).order_by(Run.id)))
    if chosen:
        now = datetime.now(UTC).replace(tzinfo=None)
        with run_configs.refreshing(session, [Run.id.in_(chosen)]), run_cells.refreshing(session, [Run.id.in_(chosen)]):
            session.execute(sa.update(Run).where(*conds, Run.retired_at.is_(None))
                            .values(retired_at=now, retired_reason=reason.strip()))
    return chosen


def unretire(session: Session, ids: list[int] | None, filters: dict[str, Any] | None) -> list[int]:
    """Clear retired_at/retired_reason of the chosen retired runs; returns their ids (ascending)."""
    conds = conditions(ids, filters)
    chosen = list(session.scalars(sa.select(Run.id).where(*conds, Run.retired_at.is_not(None)).order_by(Run.id)))
    if chosen:
        with run_configs.refreshing(session, [Run.id.in_(chosen)]), run_cells.refreshing(session, [Run.id.in_(chosen)]):
            session.execute(sa.update(Run).where(*conds, Run.retired_at.is_not(None))
                            .values(retired_at=None, retired_reason=None))
    return chosen


def matching_ids(session: Session, ids: list[int] | None, filters: dict[str, Any] | None) -> list[int]:
    """The ids (ascending) of the runs the selection chooses, retired or not. Raises BadRequest
    as :func:`conditions`."""
    return list(session.scalars(sa.select(Run.id).where(*conditions(ids, filters)).order_by(Run.id)))


def delete(session: Session, ids: list[int] | None, filters: dict[str, Any] | None) -> list[int]:
    """Delete the chosen runs (rows gone: nothing keeps them, no analytic or SQL sees them again);
    returns their ids (ascending). Raises BadRequest as :func:`conditions` (an empty selection is
    refused: deleting everything by accident is not possible)."""
    chosen = matching_ids(session, ids, filters)
    if chosen:
        with run_configs.refreshing(session, [Run.id.in_(chosen)]), run_cells.refreshing(session, [Run.id.in_(chosen)]):
            session.execute(sa.delete(Run).where(*conditions(ids, filters), Run.id.in_(chosen)))
        session.execute(sa.delete(RunStep).where(RunStep.run_id.in_(chosen)))  # a live run's series goes with it
    return chosen
