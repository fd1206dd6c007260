"""POST /api/v1/runs/retire and /api/v1/runs/unretire (write scope)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field

from service import retire as rt
from service.api.deps import DatabaseDep
from service.api.security import WRITE
from service.schemas import ErrorBody

router = APIRouter(tags=["runs"])


class RetireRequest(BaseModel):
    """Which runs: `ids`, or `filter` (column equality, `<int column>_min`/`_max`,
    `extra.<key>` equality), or both (both must hold); `reason` is required to retire."""

    model_config = ConfigDict(extra="forbid")
    ids: list[int] | None = Field(default=None, max_length=rt.MAX_IDS)
    filter: dict[str, Any] | None = None
    reason: str | None = Field(default=None, max_length=2000)


class RetireResult(BaseModel):
    """The runs whose state changed (already retired / not retired runs are left as they are)."""

    changed: int
    ids: list[int]


def _forget_kept(db: DatabaseDep) -> None:
    """A DuckDB file's kept aggregates follow new run ids only: a retirement changes old runs."""
    kept = getattr(db, "kept", None)
    if kept is not None:
        kept.clear()


@router.post("/runs/retire", response_model=RetireResult, dependencies=[WRITE],
             responses={400: {"model": ErrorBody}, 422: {"model": ErrorBody}})
def retire_runs(db: DatabaseDep, body: RetireRequest) -> RetireResult:
    """Retire runs: they stay stored and queryable (GET /runs shows `retired_at`, SQL sees them)
    but leave every analytic (heatmap, recommend, suggest, scaling, plan, regressions, the
    throughput fit). E.g. `{"filter": {"source": "nanotron-csv", "pp_min": 2,
    "extra.after_pp_fix": false}, "reason": "before nanotron's pipeline fix"}`."""
    with db.session(write=True) as session:
        ids = rt.retire(session, body.ids, body.filter, body.reason or "")
    _forget_kept(db)
    return RetireResult(changed=len(ids), ids=ids)


@router.post("/runs/unretire", response_model=RetireResult, dependencies=[WRITE],
             responses={400: {"model": ErrorBody}, 422: {"model": ErrorBody}})
def unretire_runs(db: DatabaseDep, body: RetireRequest) -> RetireResult:
    """Bring retired runs back into the analytics (same selection as /runs/retire)."""
    with db.session(write=True) as session:
        ids = rt.unretire(session, body.ids, body.filter)
    _forget_kept(db)
    return RetireResult(changed=len(ids), ids=ids)
