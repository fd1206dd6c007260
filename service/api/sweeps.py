"""/api/v1/sweeps: named searches for one target's best configuration (issue 29; service/sweeps.py)."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Path, Response
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from service import lifecycle
from service import limits as L
from service import sweep_leases as sl
from service import sweeps as sw
from service.api.deps import DatabaseDep, SessionDep, SettingsDep
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
    name: str = Field(min_length=1, max_length=160, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
                      description="letters, digits, . _ -; the sweep's run keys are NAME:SLOT")
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
def create_sweep(db: DatabaseDep, settings: SettingsDep, body: SweepIn) -> Response:
    """Create a sweep. Idempotent: the same name and definition answers the stored sweep (200); the
    same name with another definition is 409. 422 for a bad target or grid, or a grid with no valid
    combination for the target (the answer names the field)."""
    with db.session(write=True) as session:
        sweep, created = sw.create(session, body.name, body.strategy, body.target.model_dump(), body.budget,
                                   body.grid, body.min_expected_improvement, body.description)
        out = sw.progress(session, sweep, lost_after_s=settings.lost_after_s)
    return model_response(SweepOut, out, 201 if created else 200)


@router.get("/sweeps", response_model=SweepList, dependencies=[READ])
def list_sweeps(session: SessionDep, settings: SettingsDep) -> Response:
    """Every sweep, newest first, with its progress (`runs` left empty: GET /sweeps/{name} lists them)."""
    return model_response(SweepList, {"sweeps": sw.list_sweeps(session, settings.lost_after_s)})


@router.get("/sweeps/{name}", response_model=SweepOut, dependencies=[READ], responses={404: {"model": ErrorBody}})
def get_sweep(session: SessionDep, settings: SettingsDep, name: str = SweepName) -> Response:
    """One sweep: its definition, counts by status, `best` (the best successful run with its figures),
    `best_over_time`, its runs in hand-out order (predicted vs measured), `left`, `budget_left`."""
    return model_response(SweepOut, sw.progress(session, sw.get(session, name), lost_after_s=settings.lost_after_s))



class NextIn(BaseModel):
    """Who asks (host:pid or any label; stored with the lease), optional."""

    model_config = ConfigDict(extra="forbid")
    agent: str | None = Field(default=None, max_length=200)


class Lease(BaseModel):
    """A configuration handed to an agent: the run `run_key` is open (`running`); heartbeat it
    (POST /runs/{run_key}/heartbeat) at least every `lost_after_s` and finish it (POST /runs, same
    run_key, a finished status). A lease whose run reads `lost` is handed out once more (`attempt` 2)."""

    sweep: str
    run_key: str
    run_id: int
    attempt: int
    slot: int = Field(description="the budget slot, 1..budget")
    config: dict[str, Any]
    label: str
    run: dict[str, Any] = Field(description="the opened run record: the sweep's target and the configuration")
    predicted: dict[str, Any] | None = Field(description="the model's tokens/s/GPU, MFU and interval, if any")
    expected_improvement: float | None
    lost_after_s: float
    heartbeat_s: float


_DONE = {"description": "nothing left to hand out; the header `Sweep-Done` says why (budget, exhausted, "
                        "converged, no_candidates) and `Sweep-Done-Reason` in words",
         "headers": {"Sweep-Done": {"schema": {"type": "string"}}, "Sweep-Done-Reason": {"schema": {"type": "string"}}}}


@router.post("/sweeps/{name}/next", response_model=Lease, dependencies=[WRITE],
             responses={204: _DONE, 404: {"model": ErrorBody}, 409: {"model": ErrorBody}})
async def next_configuration(db: DatabaseDep, settings: SettingsDep, name: str = SweepName,
                             body: NextIn | None = None) -> Response:
    """The sweep's next configuration as a lease (service/sweep_leases.py): a lost lease once more first,
    then — within the budget — grid: the next valid combination; suggest: the highest expected
    improvement. Any number of agents may ask at once: the database hands each configuration to one
    (unique lease rows, INSERT … ON CONFLICT DO NOTHING). 204 when the sweep is done, with the reason in
    the `Sweep-Done` / `Sweep-Done-Reason` headers; 404 for an unknown sweep."""

    def lease() -> Response:
        now = lifecycle.utcnow()
        with db.session(write=True) as session:
            out = sl.next_lease(session, sw.get(session, name), now=now, lost_after_s=settings.lost_after_s,
                                agent=body.agent if body else None)
        if isinstance(out, sl.Done):
            return Response(status_code=204, headers={"Sweep-Done": out.code,
                                                      "Sweep-Done-Reason": out.reason.encode("ascii", "replace")
                                                      .decode("ascii")})
        return model_response(Lease, out)

    return await run_in_threadpool(lease)
