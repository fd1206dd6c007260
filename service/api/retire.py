"""POST /api/v1/runs/retire and /api/v1/runs/unretire (write scope): runs kept but left out of the
analytics; DELETE /api/v1/runs/{id} and POST /api/v1/runs/delete (admin scope): runs gone."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field

from service import retire as rt
from service.api.deps import DatabaseDep
from service.api.security import ADMIN, WRITE
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


@router.post("/runs/retire", response_model=RetireResult, dependencies=[WRITE],
             responses={400: {"model": ErrorBody}, 422: {"model": ErrorBody}})
def retire_runs(db: DatabaseDep, body: RetireRequest) -> RetireResult:
    """Retire runs: they stay stored and queryable (GET /runs shows `retired_at`, SQL sees them)
    but leave every analytic (heatmap, recommend, suggest, scaling, plan, regressions, the
    throughput fit). E.g. `{"filter": {"source": "nanotron-csv", "pp_min": 2,
    "extra.after_pp_fix": false}, "reason": "before nanotron's pipeline fix"}`."""
    with db.session(write=True) as session:
        ids = rt.retire(session, body.ids, body.filter, body.reason or "")
    return RetireResult(changed=len(ids), ids=ids)


@router.post("/runs/unretire", response_model=RetireResult, dependencies=[WRITE],
             responses={400: {"model": ErrorBody}, 422: {"model": ErrorBody}})
def unretire_runs(db: DatabaseDep, body: RetireRequest) -> RetireResult:
    """Bring retired runs back into the analytics (same selection as /runs/retire)."""
    with db.session(write=True) as session:
        ids = rt.unretire(session, body.ids, body.filter)
    return RetireResult(changed=len(ids), ids=ids)


class DeleteRequest(BaseModel):
    """Which runs to delete: `ids`, or `filter` (as for /runs/retire), or both (both must hold).
    `dry_run`: only count and list them."""

    model_config = ConfigDict(extra="forbid")
    ids: list[int] | None = Field(default=None, max_length=rt.MAX_IDS)
    filter: dict[str, Any] | None = None
    dry_run: bool = False


class DeleteResult(BaseModel):
    """`matched`: the runs the selection chose; `deleted`: how many are gone (0 for a dry run)."""

    matched: int
    deleted: int
    dry_run: bool
    ids: list[int]


@router.delete("/runs/{run_id}", response_model=DeleteResult, dependencies=[ADMIN],
               responses={404: {"model": ErrorBody}})
def delete_run(db: DatabaseDep, run_id: Annotated[int, Path(ge=1)]) -> DeleteResult:
    """Delete one run for good (admin scope): its row is gone from every answer and from SQL.
    404 when no run has this id. To keep a run but leave it out of the analytics, retire it."""
    from service.store import get_run

    with db.session(write=True) as session:
        get_run(session, run_id)  # NotFound (404) when absent
        ids = rt.delete(session, [run_id], None)
    return DeleteResult(matched=len(ids), deleted=len(ids), dry_run=False, ids=ids)


@router.post("/runs/delete", response_model=DeleteResult, dependencies=[ADMIN],
             responses={400: {"model": ErrorBody}, 422: {"model": ErrorBody}})
def delete_runs(db: DatabaseDep, body: DeleteRequest) -> DeleteResult:
    """Delete the chosen runs for good (admin scope): `{"ids": [12, 13]}` or `{"filter":
    {"model_name": "test-junk"}}` — the selection of /runs/retire (column equality,
    `<int column>_min/_max`, `extra.<key>`; neither ids nor a filter is 400, an unknown filter 400
    naming it). `dry_run: true` answers the count and ids
    and deletes nothing (`scalebook delete` asks for confirmation between the two). Retired runs
    are deleted like any other; retiring is the reversible alternative."""
    with db.session(write=not body.dry_run) as session:
        if body.dry_run:
            ids = rt.matching_ids(session, body.ids, body.filter)
            return DeleteResult(matched=len(ids), deleted=0, dry_run=True, ids=ids)
        ids = rt.delete(session, body.ids, body.filter)
    return DeleteResult(matched=len(ids), deleted=len(ids), dry_run=False, ids=ids)
