"""Live runs (DESIGN §9): POST /api/v1/runs/{run_key}/heartbeat. A run is opened and finished through
POST /api/v1/runs (status `running`, then a finished status, same run_key); service/lifecycle.py."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Path
from pydantic import BaseModel, ConfigDict, Field
from starlette.concurrency import run_in_threadpool

from service import lifecycle
from service.api.deps import DatabaseDep, SettingsDep
from service.api.security import WRITE
from service.schemas import ErrorBody, Status, UtcDatetime

router = APIRouter(tags=["live runs"])

RunKey = Annotated[str, Path(min_length=1, max_length=200, description="the run's run_key (as opened)")]


class HeartbeatIn(BaseModel):
    """A heartbeat's body: `{}`."""

    model_config = ConfigDict(extra="forbid")


class Heartbeat(BaseModel):
    """The open run after its heartbeat."""

    id: int
    run_key: str
    status: Status = Field(description="`running` (a lost run that heartbeats is running again)")
    last_heartbeat_at: UtcDatetime
    lost_after_s: float = Field(description="the run reads `lost` when no heartbeat comes for this long (seconds)")


@router.post("/runs/{run_key:path}/heartbeat", response_model=Heartbeat, dependencies=[WRITE],
             responses={404: {"model": ErrorBody, "description": "no run with this run_key"},
                        409: {"model": ErrorBody, "description": "the run is finished (immutable)"},
                        422: {"model": ErrorBody}})
async def post_heartbeat(run_key: RunKey, db: DatabaseDep, settings: SettingsDep,
                         body: HeartbeatIn | None = None) -> Heartbeat:
    """The job of an open run (opened with POST /runs, `status: running`) is alive: its
    `last_heartbeat_at` becomes now. Send one at least every lost_after_s (SCALEBOOK_LOST_AFTER_S,
    default 300 s; the agents send one every 30 s): without it the run reads `lost` — derived when read,
    nothing is marked. 404 for an unknown run_key, 409 for a finished run."""

    def beat() -> Heartbeat:
        now: datetime = lifecycle.utcnow()
        with db.session(write=True) as session:
            run = lifecycle.heartbeat(session, run_key, now)
            return Heartbeat(id=run.id, run_key=run.run_key, status="running",
                             last_heartbeat_at=run.last_heartbeat_at or now, lost_after_s=settings.lost_after_s)

    return await run_in_threadpool(beat)
