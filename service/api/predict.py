"""POST /api/v1/predict: what one configuration will do on its target (DESIGN §4, "Predict")."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Response
from pydantic import BaseModel, ConfigDict, Field

from service import limits as L
from service.analytics import predict as pr
from service.api.analytics import Evidence, Predicted
from service.api.deps import SessionDep
from service.api.responses import model_response
from service.api.security import READ
from service.schemas import ErrorBody

router = APIRouter(tags=["analytics"])


class PredictRequest(BaseModel):
    """One configuration: run-record fields. The model as model_params (a count, or a size text:
    "8B" names the heatmap's family row and is costed on its recorded model's dims, "8.03B" one
    model) or its dims; the cluster (nodes × gpus_per_node of gpu_type); the layout (a degree left
    out is 1; dp defaults to the world size over tp·pp·cp); the batch (grad_accum_steps, or
    global_batch_tokens). seq_len, gpu_type, framework and precision left out are taken from the
    records as /recommend takes them, and said in `notes`."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model_params: int | str | None = Field(default=None, description="8030261248, or 8B | 1.34B | 8e9")
    num_layers: int | None = Field(default=None, ge=1, le=L.MAX_LAYERS)
    hidden_size: int | None = Field(default=None, ge=1, le=L.MAX_HIDDEN)
    num_heads: int | None = Field(default=None, ge=1, le=L.MAX_HEADS)
    num_kv_heads: int | None = Field(default=None, ge=1, le=L.MAX_HEADS)
    ffn_hidden_size: int | None = Field(default=None, ge=1, le=L.MAX_FFN)
    vocab_size: int | None = Field(default=None, ge=1, le=L.MAX_VOCAB)
    gated_linear_unit: bool | None = Field(default=None, description="gated MLP (SwiGLU, three matrices) or "
                                                                     "GPT's two-matrix GELU")
    seq_len: int | None = Field(default=None, ge=1, le=L.MAX_SEQ_LEN)
    gpu_type: str | None = Field(default=None, max_length=100)
    gpus_per_node: int = Field(default=8, ge=1, le=L.MAX_GPUS_PER_NODE)
    nodes: int = Field(ge=1, le=L.MAX_NODES)
    world_size: int | None = Field(default=None, ge=1, le=L.MAX_GPUS)
    dp: int | None = Field(default=None, ge=1, le=L.MAX_DP)
    tp: int | None = Field(default=None, ge=1, le=L.MAX_TP)
    pp: int | None = Field(default=None, ge=1, le=L.MAX_PP)
    cp: int | None = Field(default=None, ge=1, le=L.MAX_CP)
    ep: int | None = Field(default=None, ge=1, le=L.MAX_EP)
    zero_stage: int | None = Field(default=None, ge=0, le=3)
    micro_batch_size: int | None = Field(default=None, ge=1, le=L.MAX_MICRO_BATCH)
    grad_accum_steps: int | None = Field(default=None, ge=1, le=L.MAX_GRAD_ACCUM)
    global_batch_tokens: int | None = Field(default=None, ge=1, le=L.MAX_TOKENS)
    recompute: Literal["none", "selective", "full"] | None = None
    precision: str | None = Field(default=None, max_length=32)
    framework: str | None = Field(default=None, max_length=200)


class PredictMemory(BaseModel):
    """The memory model's verdict (GiB per GPU) and the probability that it fits."""

    fits: bool | None
    predicted_peak_memory_gib: float
    gpu_memory_gib: float | None
    usable_memory_gib: float | None
    p_fits: float
    recorded_oom_run_id: int | None
    fit_shown_by_run_id: int | None = Field(default=None, description=(
        "a recorded successful run of the same layout with no less memory per GPU (same model, GPU type, "
        "framework, precision; ZeRO, micro-batch, micro-batches in flight, recompute, DP no more "
        "memory-friendly): it shows the configuration fits although the memory model predicts more than "
        "the usable memory"))
    peak_stage: str
    breakdown_gib: dict[str, float]


class PredictedConfig(Predicted):
    """The prediction for the configuration: `breakdown_s` adds up to `step_time_s` (the model's
    terms times the correction the recorded runs of the layout indicate, `anchor_factor` on
    tokens/s); `model_tokens_per_sec_per_gpu` is the model's own figure before it."""

    model_tokens_per_sec_per_gpu: float
    anchor_factor: float


class PredictAnswer(BaseModel):
    target: dict[str, Any]
    config: dict[str, Any]
    global_batch_tokens: int
    predicted: PredictedConfig
    fits: bool | None = Field(description="ran on the target: true; a recorded OOM implies it does not fit: "
                                          "false; else the memory model's verdict (null: GPU memory unknown)")
    memory: PredictMemory
    measured: dict[str, Any] | None = Field(description="this exact configuration's best run on the target")
    evidence: list[Evidence]
    model: dict[str, Any]
    why: str
    notes: list[str]


@router.post("/predict", response_model=PredictAnswer, responses={400: {"model": ErrorBody}, 422: {"model": ErrorBody}},
             dependencies=[READ])
def predict(session: SessionDep, body: PredictRequest) -> Response:
    """What one configuration will do on its target: predicted tokens/s/GPU with its interval, MFU
    (fraction), step time (s) and its breakdown (compute, pipeline bubble, TP, DP/ZeRO and other
    communication, s), peak memory per GPU (GiB) and whether it fits; the recorded runs it rests on
    (`evidence`: model, GPU type, framework, nodes, distance, measured tokens/s); `measured` when
    this very configuration ran on the target; `model`: the fit (GPU type, framework, runs, held-out
    error) and whether the prediction extrapolates, and from what; `notes`: what was assumed.
    The same models as /recommend (service/analytics/predict.py). 422 naming the field for an
    impossible configuration: tp·pp·cp·dp ≠ world size, heads not divisible by TP, fewer layers than
    PP stages, a batch that is not a whole number of micro-batches, an unknown GPU type or a
    precision it has no peak for, a number beyond service/limits.py. 400 when the target cannot be
    completed from the records (e.g. no seq_len given and none recorded)."""
    raw = body.model_dump()
    if isinstance(raw["model_params"], str):
        raw["model_params_text"] = raw.pop("model_params")
        raw["model_params"] = None
    L.check_parallelism({k: v for k, v in raw.items() if k != "model_params_text"})
    if raw["model_params"] is not None:
        L.check_model_params(raw["model_params"])
    return model_response(PredictAnswer, pr.predict(session, raw))
