"""Live runs (DESIGN §9): heartbeats, step series and the Live view's list. A run is opened and finished
through POST /api/v1/runs (status `running`, then a finished status, same run_key); service/lifecycle.py
and service/steps.py hold the rules."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Response
from pydantic import BaseModel, ConfigDict, Field, model_validator
from starlette.concurrency import run_in_threadpool

from core import steps as step_rules
from core.record import LOST, RUNNING
from service import lifecycle, store
from service import steps as step_store
from service.api.deps import DatabaseDep, SessionDep, SettingsDep
from service.api.responses import model_response
from service.api.security import READ, WRITE
from service.schemas import ErrorBody, RunOut, Status, StepFigures, StepIn, StepOut, UtcDatetime

router = APIRouter(tags=["live runs"])

RunKey = Annotated[str, Path(min_length=1, max_length=200, description="the run's run_key (as opened)")]
MAX_STEPS_PER_REQUEST = 1000


class HeartbeatIn(StepFigures):
    """A heartbeat's body: `{}`, or the latest step's figures (then `step` is required, and the step is
    stored as POST …/steps would store it)."""

    step: int | None = Field(default=None, ge=0, le=2**63 - 1,
                             description="the latest optimizer step, when figures are sent")

    @model_validator(mode="after")
    def _step_with_figures(self) -> HeartbeatIn:
        if self.step is None and any(getattr(self, k) is not None for k in step_rules.STEP_METRICS):
            raise ValueError("a heartbeat with a step's figures names its step")
        return self


class Heartbeat(BaseModel):
    """The open run after its heartbeat."""

    id: int
    run_key: str
    status: Status = Field(description="`running` (a lost run that heartbeats is running again)")
    last_heartbeat_at: UtcDatetime
    lost_after_s: float = Field(description="the run reads `lost` when no heartbeat comes for this long (seconds)")


class StepsIn(BaseModel):
    """`{"steps": [...]}`: up to 1,000 steps of one run."""

    model_config = ConfigDict(extra="forbid")
    steps: list[StepIn] = Field(max_length=MAX_STEPS_PER_REQUEST)


class StepsStored(BaseModel):
    """How a batch of steps was stored: `created` new, the rest already held; `thinned`: older steps
    deleted to keep the run within SCALEBOOK_MAX_STEPS_PER_RUN."""

    run_id: int
    received: int
    created: int
    thinned: int


class StepSummary(BaseModel):
    """What the series says (core/steps.py): the warm-up rule, the steady-state headline (medians;
    peak memory: maximum), step-time jitter (coefficient of variation, a fraction) and the straggler
    steps (slow outliers by the modified z-score > 3.5)."""

    steps: int
    warmup_steps: int
    steady_steps: int
    headline: dict[str, float]
    jitter_step_time: float | None
    stragglers: list[int]
    rule: str


class RunSteps(BaseModel):
    """A run's stored series in step order, and its summary."""

    run_id: int
    run_key: str
    status: Status
    steps: list[StepOut]
    summary: StepSummary


class LiveRun(BaseModel):
    """An open run on the Live view: the run, and its last stored step (null before the first)."""

    run: RunOut
    last_step: StepOut | None


class LiveRuns(BaseModel):
    """The open runs, running and lost, most recently heard from first."""

    runs: list[LiveRun]
    lost_after_s: float


_ERRORS: dict[int | str, dict[str, Any]] = {
    404: {"model": ErrorBody, "description": "no run with this run_key"},
    409: {"model": ErrorBody, "description": "the run is finished (immutable)"},
    422: {"model": ErrorBody}}


@router.post("/runs/{run_key:path}/heartbeat", response_model=Heartbeat, dependencies=[WRITE], responses=_ERRORS)
async def post_heartbeat(run_key: RunKey, db: DatabaseDep, settings: SettingsDep,
                         body: HeartbeatIn | None = None) -> Heartbeat:
    """The job of an open run (opened with POST /runs, `status: running`) is alive: its
    `last_heartbeat_at` becomes now. Send one at least every lost_after_s (SCALEBOOK_LOST_AFTER_S,
    default 300 s; the agents send one every 30 s): without it the run reads `lost` — derived when read,
    nothing is marked. The body is `{}` or the latest step's figures (stored as a step). 404 for an
    unknown run_key, 409 for a finished run."""

    def beat() -> Heartbeat:
        now = lifecycle.utcnow()
        with db.session(write=True) as session:
            run = lifecycle.heartbeat(session, run_key, now)
            if body is not None and body.step is not None:
                step_store.store_steps(session, run_key, [body.model_dump()], now, settings.max_steps_per_run)
            return Heartbeat(id=run.id, run_key=run.run_key, status=RUNNING,
                             last_heartbeat_at=run.last_heartbeat_at or now, lost_after_s=settings.lost_after_s)

    return await run_in_threadpool(beat)


@router.post("/runs/{run_key:path}/steps", response_model=StepsStored, dependencies=[WRITE], responses=_ERRORS)
async def post_steps(run_key: RunKey, body: StepsIn, db: DatabaseDep, settings: SettingsDep) -> StepsStored:
    """Store a batch of an open run's steps (each once: a step number already stored is kept as it was,
    so retries and the spool's replay store nothing twice). Steps are a sign of life, as a heartbeat.
    At most SCALEBOOK_MAX_STEPS_PER_RUN (default 10,000) are kept per run: beyond it the series is thinned
    evenly (every second step, first and last kept). 404 unknown run_key; 409 new steps of a finished run."""

    def put() -> StepsStored:
        with db.session(write=True) as session:
            return StepsStored(**step_store.store_steps(session, run_key, [s.model_dump() for s in body.steps],
                                                        lifecycle.utcnow(), settings.max_steps_per_run))

    return await run_in_threadpool(put)


@router.get("/runs/{run_id}/steps", response_model=RunSteps, dependencies=[READ],
            responses={404: {"model": ErrorBody}})
def get_steps(run_id: int, session: SessionDep, settings: SettingsDep) -> Response:
    """A run's step series (step order) and its summary: warm-up rule, steady-state headline, jitter,
    stragglers. A run without steps answers an empty series."""
    run = lifecycle.present([store.get_run(session, run_id)], lifecycle.utcnow(), settings.lost_after_s)[0]
    series = step_store.read_steps(session, run_id)
    summary = step_rules.summarize(series)
    summary.pop("last")
    return model_response(RunSteps, {"run_id": run.id, "run_key": run.run_key, "status": run.status,
                                     "steps": series, "summary": summary})


@router.get("/live", response_model=LiveRuns, dependencies=[READ])
def live_runs(session: SessionDep, settings: SettingsDep,
              status: Annotated[str | None, Query(pattern=f"^({RUNNING}|{LOST})$",
                                                  description="running or lost only; both when absent")] = None,
              limit: Annotated[int, Query(ge=1, le=1000)] = 200) -> Response:
    """The open runs (running and lost; `status` narrows), most recently heard from first, each with its
    last stored step: the dashboard's Live view."""
    now = lifecycle.utcnow()
    runs = store.open_runs(session, lifecycle.lost_cutoff(now, settings.lost_after_s), status, limit)
    last = step_store.last_steps(session, [r.id for r in runs])
    shown = lifecycle.present(runs, now, settings.lost_after_s)
    return model_response(LiveRuns, {"runs": [{"run": r, "last_step": last.get(r.id)} for r in shown],
                                     "lost_after_s": settings.lost_after_s})
