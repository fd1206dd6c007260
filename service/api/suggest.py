"""GET /api/v1/suggest: the configurations to benchmark next for a target (issue 17)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field

from service.analytics import suggest as sg
from service.api.deps import SessionDep
from service.api.responses import model_response
from service.api.security import READ
from service.api.target import TargetDep
from service.schemas import ErrorBody

router = APIRouter(tags=["analytics"])


class SuggestedPrediction(BaseModel):
    """The model's prediction for the target (tokens/s/GPU with its interval, MFU, peak GiB)."""

    tokens_per_sec_per_gpu: float
    mfu: float
    peak_memory_gib: float
    interval: list[float]


class Suggestion(BaseModel):
    config: dict[str, Any]
    predicted: SuggestedPrediction
    expected_improvement: float
    uncertainty_rel: float = Field(description="the prediction's 1σ as a fraction of it")
    exploration: bool = Field(description="the layout was not run near this target")
    why: str
    extrapolation: list[str] = Field(default_factory=list, description="why the prediction extrapolates, and from "
                                     "what (empty: it interpolates); the same reasons as /recommend's candidates")


class Suggestions(BaseModel):
    target: dict[str, Any]
    best_recorded: dict[str, Any] | None
    model: dict[str, Any]
    suggestions: list[Suggestion]
    notes: list[str]


@router.get("/suggest", response_model=Suggestions, responses={400: {"model": ErrorBody}}, dependencies=[READ])
def suggest(
    session: SessionDep,
    target: TargetDep,
    n: Annotated[int, Query(ge=1, le=50)] = 5,
) -> Response:
    """The `n` configurations to benchmark next for the target of /recommend, best first: valid for
    the world size and model, adapted to the target batch, predicted to fit, not ruled out by
    recorded OOMs, not already recorded on this target — ranked by expected improvement over the
    target's best recorded run under the throughput model's prediction and its uncertainty
    (service/analytics/suggest.py). Each: config, predicted (tokens/s/GPU, interval, MFU, peak
    memory), expected_improvement (fraction), why. 400 when the target cannot be read or completed.
    """
    return model_response(Suggestions, sg.suggest(session, target, n=n))
