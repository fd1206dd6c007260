"""POST /api/v1/memory: predicted peak memory per GPU for a config, and whether it fits."""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter
from pydantic import BaseModel, ConfigDict, Field, field_validator

from service import limits as L
from service.analytics.memory import estimate_memory
from service.api.security import READ
from service.errors import ValidationFailed
from service.schemas import ErrorBody, finite_json

router = APIRouter(tags=["analytics"])


class MemoryRequest(BaseModel):
    """Run-record fields that size memory. Give model_params or the dims (num_layers,
    hidden_size, num_heads, vocab_size …); seq_len and micro_batch_size size the activations."""

    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)

    model_params: int | None = Field(default=None, ge=1, le=L.MAX_MODEL_PARAMS)
    num_layers: int | None = Field(default=None, ge=1, le=L.MAX_LAYERS)
    hidden_size: int | None = Field(default=None, ge=1, le=L.MAX_HIDDEN)
    num_heads: int | None = Field(default=None, ge=1, le=L.MAX_HEADS)
    num_kv_heads: int | None = Field(default=None, ge=1, le=L.MAX_HEADS)
    ffn_hidden_size: int | None = Field(default=None, ge=1, le=L.MAX_FFN)
    vocab_size: int | None = Field(default=None, ge=1, le=L.MAX_VOCAB)
    seq_len: int | None = Field(default=None, ge=1, le=L.MAX_SEQ_LEN)
    dp: int = Field(default=1, ge=1, le=L.MAX_DP)
    tp: int = Field(default=1, ge=1, le=L.MAX_TP)
    pp: int = Field(default=1, ge=1, le=L.MAX_PP)
    cp: int = Field(default=1, ge=1, le=L.MAX_CP)
    ep: int = Field(default=1, ge=1, le=L.MAX_EP)
    zero_stage: int = Field(default=0, ge=0, le=3)
    micro_batch_size: int = Field(default=1, ge=1, le=L.MAX_MICRO_BATCH)
    grad_accum_steps: int | None = Field(default=None, ge=1, le=L.MAX_GRAD_ACCUM)
    recompute: Literal["none", "selective", "full"] = "none"
    precision: str = Field(default="bf16", max_length=32)
    gpu_type: str | None = Field(default=None, max_length=100)
    framework: str | None = Field(default=None, max_length=200,
                                  description="nanotron | megatron | torchtitan …; framework buffers differ")
    gpu_memory_gib: float | None = Field(default=None, gt=0, le=1e6, description="overrides the catalog's memory")
    extra: dict[str, Any] | None = Field(default=None, description="e.g. accumulate_grad_in_fp32, tp_mode")

    _finite_extra = field_validator("extra")(classmethod(lambda cls, v: finite_json(v)))


class MemoryAnswer(BaseModel):
    """GiB per GPU. `predicted_peak_memory_gib` is the step's peak (what must fit);
    `predicted_post_backward_gib` is the peak after forward/backward (gradient sync + optimizer
    step), which is what nanotron's bench CSV reports as `Mem Alloc (GB)` (it resets the peak
    counter after the backward pass)."""

    predicted_peak_memory_gib: float
    predicted_post_backward_gib: float
    gpu_memory_gib: float | None
    usable_memory_gib: float | None
    fits: bool | None
    breakdown: dict[str, float]
    assumptions: list[str]
    peak_stage: str
    peak_phase: str


@router.post("/memory", response_model=MemoryAnswer, responses={422: {"model": ErrorBody}}, dependencies=[READ])
def memory(body: MemoryRequest) -> MemoryAnswer:
    """Predicted peak memory per GPU (GiB, allocator fragmentation and CUDA context included) with
    its breakdown, and whether it fits in the GPU's usable memory.

    Model (service/analytics/memory.py): bf16 params 2Ψ + grads 2Ψ + fp32 master 4Ψ + Adam 8Ψ
    (+ 4Ψ fp32 grad accumulation), sharded by ZeRO stage over DP and divided by TP/PP (Ultra-Scale
    Playbook; Rajbhandari et al. 2019); activations per Korthikanti et al. 2022 (arXiv 2205.05198),
    with 1F1B keeping up to PP micro-batches in flight. 422 names the field when the estimate is
    impossible (e.g. neither model_params nor dims) or a number is beyond service/limits.py
    (e.g. pp > num_layers, tp > num_heads, a degree above its maximum).
    """
    run = body.model_dump(exclude={"gpu_memory_gib"})
    L.check_parallelism(run)
    try:
        est = estimate_memory(run, body.gpu_memory_gib)
    except ValueError as exc:
        msg = str(exc)
        field = msg.split(":", 1)[0] if ":" in msg else None
        raise ValidationFailed(msg, [{"field": field, "value": run.get(field) if field else None,
                                      "message": msg}]) from exc
    return MemoryAnswer(predicted_peak_memory_gib=est.predicted_peak_memory_gib,
                        predicted_post_backward_gib=est.optimizer_step_gib, gpu_memory_gib=est.gpu_memory_gib,
                        usable_memory_gib=est.usable_memory_gib, fits=est.fits, breakdown=est.breakdown,
                        assumptions=est.assumptions, peak_stage=est.peak_stage, peak_phase=est.peak_phase)
