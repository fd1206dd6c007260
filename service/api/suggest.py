"""GET /api/v1/suggest: the configurations to benchmark next for a target (issue 17)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field

from service.analytics import recommend as rec
from service.analytics import suggest as sg
from service.api.deps import SessionDep
from service.api.responses import model_response
from service.api.security import READ
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


class Suggestions(BaseModel):
    target: dict[str, Any]
    best_recorded: dict[str, Any] | None
    model: dict[str, Any]
    suggestions: list[Suggestion]
    notes: list[str]


@router.get("/suggest", response_model=Suggestions, responses={400: {"model": ErrorBody}}, dependencies=[READ])
def suggest(
    session: SessionDep,
    model_params: Annotated[str, Query(min_length=1, max_length=40, description="8B | 1.34B | 8e9 | 8030261248")],
    nodes: Annotated[int, Query(ge=1, le=100_000)],
    gpus_per_node: Annotated[int, Query(ge=1, le=1024)] = 8,
    gpu_type: Annotated[str | None, Query(max_length=100)] = None,
    seq_len: Annotated[int | None, Query(ge=1, le=10_000_000)] = None,
    global_batch_tokens: Annotated[int | None, Query(ge=1, le=10**12)] = None,
    num_layers: Annotated[int | None, Query(ge=1, le=10_000)] = None,
    hidden_size: Annotated[int | None, Query(ge=1, le=1_000_000)] = None,
    num_heads: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    num_kv_heads: Annotated[int | None, Query(ge=1, le=100_000)] = None,
    ffn_hidden_size: Annotated[int | None, Query(ge=1, le=10_000_000)] = None,
    vocab_size: Annotated[int | None, Query(ge=1, le=100_000_000)] = None,
    n: Annotated[int, Query(ge=1, le=50)] = 5,
) -> Response:
    """The `n` configurations to benchmark next for the target of /recommend, best first: valid for
    the world size and model, adapted to the target batch, predicted to fit, not ruled out by
    recorded OOMs, not already recorded on this target — ranked by expected improvement over the
    target's best recorded run under the throughput model's prediction and its uncertainty
    (service/analytics/suggest.py). Each: config, predicted (tokens/s/GPU, interval, MFU, peak
    memory), expected_improvement (fraction), why. 400 when the target cannot be read or completed.
    """
    target = rec.Target(model_params=rec.parse_model_params(model_params), nodes=nodes, gpus_per_node=gpus_per_node,
                        gpu_type=gpu_type, seq_len=seq_len, global_batch_tokens=global_batch_tokens,
                        num_layers=num_layers, hidden_size=hidden_size, num_heads=num_heads,
                        num_kv_heads=num_kv_heads, ffn_hidden_size=ffn_hidden_size, vocab_size=vocab_size)
    return model_response(Suggestions, sg.suggest(session, target, n=n))
