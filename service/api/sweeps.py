"""/api/v1/sweeps: named searches for one target's best configuration (issue 29; service/sweeps.py)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, ConfigDict, Field

from service import limits as L
from service import sweeps as sw
from service.api.deps import DatabaseDep, SessionDep
from service.api.responses import model_response
from service.api.security import READ, WRITE
from service.schemas import ErrorBody, UtcDatetime

router = APIRouter(tags=["sweeps"])

SweepName = Path(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


class SweepTarget(BaseModel):
    """What the sweep searches a configuration for: the model (size or dims), the cluster, the batch."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)
    model_name: str | None = Field(default=None, max_length=200)
    model_params: str | int | None = Field(default=None, description="8B | 1.34B | 8030261248; or give the dims")
    num_layers: int | None = Field(default=None, ge=1, le=L.MAX_LAYERS)
    hidden_size: int | None = Field(default=None, ge=1, le=L.MAX_HIDDEN)
    num_heads: int | None = Field(default=None, ge=1, le=L.MAX_HEADS)
    num_kv_heads: int | None = Field(default=None, ge=1, le=L.MAX_HEADS)
    ffn_hidden_size: int | None = Field(default=None, ge=1, le=L.MAX_FFN)
    vocab_size: int | None = Field(default=None, ge=1, le=L.MAX_VOCAB)
    gated_linear_unit: bool | None = None
    nodes: int = Field(ge=1, le=L.MAX_NODES)
    gpus_per_node: int = Field(default=8, ge=1, le=L.MAX_GPUS_PER_NODE)
    gpu_type: str | None = Field(default=None, max_length=100)
    seq_len: int | None = Field(default=None, ge=1, le=L.MAX_SEQ_LEN)
    global_batch_tokens: int | None = Field(default=None, ge=1, le=L.MAX_TOKENS)
    framework: str | None = Field(default=None, max_length=200)
    precision: str | None = Field(default=None, max_length=32)


class SweepIn(BaseModel):
    """A sweep: `grid` lists values of dp/tp/pp/cp/ep/zero_stage/micro_batch_size/recompute (every valid
    combination is run); `suggest` hands out /suggest's expected-improvement choice one at a time."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, json_schema_extra={"example": {
        "name": "llama-1b-1node", "strategy": "grid", "budget": 6,
        "target": {"model_params": "1.34B", "nodes": 1, "gpus_per_node": 8, "gpu_type": "H100",
                   "seq_len": 4096, "global_batch_tokens": 1048576},
        "grid": {"tp": [1, 2], "micro_batch_size": [1, 2, 4]}}})
    name: str = Field(min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    strategy: Literal["grid", "suggest"]
    target: SweepTarget
    budget: int = Field(ge=1, le=100_000, description="configurations handed out, at most")
    grid: dict[str, list[int | str]] | None = None
    min_expected_improvement: float | None = Field(
        default=None, ge=0, lt=1, description="suggest: stop when no configuration's expected improvement reaches "
                                              f"this fraction of the best so far (default "
                                              f"{sw.DEFAULT_MIN_EXPECTED_IMPROVEMENT}: Jones et al. 1998)")
    description: str | None = Field(default=None, max_length=2000)


class SweepBest(BaseModel):
    id: int
    run_key: str
    config: dict[str, Any]
    label: str
    tokens_per_sec_per_gpu: float | None
    mfu: float | None
    peak_memory_gib: float | None
    step_time_s: float | None


class SweepRun(BaseModel):
    id: int
    run_key: str
    status: str
    config: dict[str, Any]
    label: str
    attempt: int | None
    leased_at: UtcDatetime | None
    tokens_per_sec_per_gpu: float | None
    predicted_tokens_per_sec_per_gpu: float | None = Field(description="the model's figure when handed out")
    mfu: float | None
    peak_memory_gib: float | None
    error_class: str | None


class BestSoFar(BaseModel):
    n: int = Field(description="the run's place in hand-out order (1 = first)")
    run_id: int
    tokens_per_sec_per_gpu: float | None


class SweepOut(BaseModel):
    """A sweep's definition and progress (counts by status, best so far, runs, what is left)."""

    name: str
    strategy: str
    budget: int
    target: dict[str, Any]
    grid: dict[str, list[Any]] | None
    min_expected_improvement: float | None
    description: str | None
    created_at: UtcDatetime
    counts: dict[str, int]
    handed_out: int
    budget_left: int
    left: int | None = Field(description="grid: configurations not yet handed out; suggest: null")
    best: SweepBest | None
    best_over_time: list[BestSoFar]
    runs: list[SweepRun]


class SweepList(BaseModel):
    sweeps: list[SweepOut]


@router.post("/sweeps", response_model=SweepOut, status_code=201, dependencies=[WRITE],
             responses={200: {"model": SweepOut, "description": "already stored with the same definition"},
                        409: {"model": ErrorBody}, 422: {"model": ErrorBody}})
def create_sweep(db: DatabaseDep, body: SweepIn) -> Response:
    """Create a sweep. Idempotent: the same name and definition answers the stored sweep (200); the
    same name with another definition is 409. 422 for a bad target or grid, or a grid with no valid
    combination for the target (the answer names the field)."""
    with db.session(write=True) as session:
        sweep, created = sw.create(session, body.name, body.strategy, body.target.model_dump(), body.budget,
                                   body.grid, body.min_expected_improvement, body.description)
        out = sw.progress(session, sweep)
    return model_response(SweepOut, out, 201 if created else 200)


@router.get("/sweeps", response_model=SweepList, dependencies=[READ])
def list_sweeps(session: SessionDep) -> Response:
    """Every sweep, newest first, with its progress (`runs` left empty: GET /sweeps/{name} lists them)."""
    return model_response(SweepList, {"sweeps": sw.list_sweeps(session)})


@router.get("/sweeps/{name}", response_model=SweepOut, dependencies=[READ], responses={404: {"model": ErrorBody}})
def get_sweep(session: SessionDep, name: str = SweepName) -> Response:
    """One sweep: its definition, counts by status, `best` (the best successful run with its figures),
    `best_over_time`, its runs in hand-out order (predicted vs measured), `left`, `budget_left`."""
    return model_response(SweepOut, sw.progress(session, sw.get(session, name)))

