"""/api/v1/scaling, /api/v1/plan and /api/v1/regressions (DESIGN §4)."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from pydantic import BaseModel, Field

from core.model import model_size_class
from service import limits as L
from service.analytics import planner, regressions, scaling
from service.analytics.target import parse_model_params
from service.api.deps import SessionDep
from service.api.security import READ
from service.api.target import model_query
from service.schemas import ErrorBody, UtcDatetime
from service.store import naive_utc

router = APIRouter(tags=["planning"])

_ERRORS: dict[int | str, dict[str, Any]] = {400: {"model": ErrorBody}, 404: {"model": ErrorBody}}


class ScalingPoint(BaseModel):
    nodes: int
    world_size: int
    tokens_per_sec_per_gpu: float | None
    aggregate_tokens_per_sec: float | None
    mfu: float | None
    value: float
    efficiency: float | None
    speedup: float | None
    best_run_id: int
    config: dict[str, Any]


class AmdahlFit(BaseModel):
    serial_fraction: float
    serial_fraction_stderr: float | None
    r2: float | None
    max_speedup: float | None
    nodes_at_50pct_efficiency: float | None
    n_points: int
    base_nodes: int
    method: str


class Scaling(BaseModel):
    model_size_class: float
    metric: Literal["tokens_per_sec_per_gpu", "mfu"]
    gpu_type: str | None
    seq_len: int | None
    points: list[ScalingPoint]
    amdahl: AmdahlFit | None
    amdahl_reason: str | None
    notes: list[str]


@router.get("/scaling", response_model=Scaling, responses=_ERRORS, dependencies=[READ])
def get_scaling(
    session: SessionDep,
    model_params: Annotated[str, Query(min_length=1, max_length=40, description="size: 8B | 1.34B | 8e9")],
    gpu_type: Annotated[str | None, Query(max_length=100)] = None,
    seq_len: Annotated[int | None, Query(ge=1, le=L.MAX_SEQ_LEN)] = None,
    metric: Literal["tokens_per_sec_per_gpu", "mfu"] = "tokens_per_sec_per_gpu",
) -> Scaling:
    """Scaling of one model size class over node counts, with an Amdahl's-law fit.

    Points: the best successful run per node count (highest `metric`), its per-GPU tokens/s, aggregate
    tokens/s (× world size), `efficiency` (per-GPU metric relative to the smallest node count) and
    `speedup` (aggregate metric relative to it). `amdahl`: serial fraction s of
    speedup(n) = 1/(s + (1−s)/n), n = nodes / base_nodes (Amdahl 1967), fitted by least squares, with
    its standard error, R², the asymptotic `max_speedup` 1/s and `nodes_at_50pct_efficiency`;
    null with `amdahl_reason` when fewer than two node counts were measured. 404 when the size class
    has no successful run.
    """
    params = parse_model_params(model_params)
    L.check_model_params(params)
    size_class = model_size_class(params)
    assert size_class is not None  # parse_model_params returns a positive count
    return Scaling(**scaling.scaling(session, size_class, gpu_type=gpu_type, seq_len=seq_len, metric=metric))


class Plan(BaseModel):
    model_params: int
    model_size_class: float | None
    tokens: int
    days: float
    gpu_type: str | None
    gpus_per_node: int
    mfu: float
    mfu_source: str
    mfu_run: dict[str, Any] | None
    peak_tflops: float
    peak_source: str
    flops_per_token: float = Field(description="training FLOPs per token the MFU counts")
    flops_formula: str = Field(description="what flops_per_token counts: '6·N' (a given MFU) or "
                                           "'6·N + 12·L·h·s' (the throughput model's predicted MFU)")
    total_flops: float
    gpus_exact: float
    gpus: int = Field(description="GPUs the compute needs: ceil(gpus_exact)")
    nodes: int = Field(description="ceil(gpus / gpus_per_node)")
    gpus_booked: int = Field(description="nodes × gpus_per_node: a cluster is booked in whole nodes")
    gpu_hours: float = Field(description="gpus_booked × 24 × days")
    gpu_hours_compute: float
    formula: str
    efficiency: dict[str, Any] | None
    notes: list[str]


@router.get("/plan", response_model=Plan, responses=_ERRORS, dependencies=[READ])
def get_plan(
    session: SessionDep,
    model_params: Annotated[str, Query(min_length=1, max_length=40, description="3B | 1.34B | 8e9")],
    tokens: Annotated[str, Query(min_length=1, max_length=40, description="11T | 1e12 | 500B | 15000000000")],
    days: Annotated[float, Query(gt=0, le=L.MAX_DAYS, allow_inf_nan=False)],
    model: Annotated[dict, Depends(model_query)],
    gpu_type: Annotated[str | None, Query(max_length=100)] = None,
    mfu: Annotated[float | None, Query(gt=0, le=1, allow_inf_nan=False, description="fraction: 0.30")] = None,
    peak_tflops: Annotated[
        float | None, Query(gt=0, le=L.MAX_PEAK_TFLOPS, allow_inf_nan=False, description="dense TFLOP/s/GPU")
    ] = None,
    gpus_per_node: Annotated[int, Query(ge=1, le=L.MAX_GPUS_PER_NODE)] = 8,
) -> Plan:
    """GPUs to train `model_params` on `tokens` in `days`: GPUs = FLOPs per token · tokens /
    (peak · MFU · time) — 6·N per token for a given `mfu` (Kaplan et al. 2020), 6·N + 12·L·h·s
    (PaLM appendix B) for the MFU the throughput model predicts (`flops_formula` says which).

    MFU is `mfu` or the throughput model's prediction for the target (`mfu_source` says which); the
    peak is `peak_tflops` or the hardware catalog's dense figure for `gpu_type` (`peak_source` names
    the entry and its source). Answers the GPUs the compute needs (ceil), the nodes, the GPUs booked
    in whole nodes and their GPU-hours, and the Amdahl-predicted efficiency at that scale when a
    scaling fit exists. SmolLM3: 3B, 11T tokens, 28 days, 720 TFLOP/s, MFU 0.30 → 379 GPUs, 48 nodes,
    384 GPUs booked. A predicted MFU is predicted for the `framework`, `precision` and model dims
    given (else the records'; `precision` is also the peak's, default the MFU's: bf16).
    """
    L.check_model_params(parse_model_params(model_params))
    shape = {k: v for k, v in model.items() if k != "precision"}
    return Plan(**planner.plan(session, model_params=model_params, tokens=tokens, days=days, gpu_type=gpu_type,
                               mfu=mfu, peak_tflops=peak_tflops, gpus_per_node=gpus_per_node,
                               precision=model["precision"], shape=shape))


class RegressionFlag(BaseModel):
    run_id: int
    name: str | None
    started_at: UtcDatetime | None
    value: float
    baseline_median: float
    mad: float
    n_history: int
    z: float | None
    drop_pct: float | None
    method: Literal["robust_z", "relative_drop"]
    fingerprint: str
    history_run_ids: list[int]
    config: dict[str, Any]


class Regressions(BaseModel):
    metric: str
    threshold: float
    min_history: int
    min_drop: float
    since: UtcDatetime | None
    fingerprints_checked: int
    runs_checked: int
    flags: list[RegressionFlag]


@router.get("/regressions", response_model=Regressions, responses=_ERRORS, dependencies=[READ])
def get_regressions(
    session: SessionDep,
    metric: Literal["tokens_per_sec_per_gpu", "mfu", "tflops_per_gpu"] = "tokens_per_sec_per_gpu",
    threshold: Annotated[float, Query(gt=0, le=100, allow_inf_nan=False)] = 3.5,
    min_history: Annotated[int, Query(ge=2, le=1000)] = 3,
    since: datetime | None = None,
    min_drop: Annotated[float, Query(gt=0, lt=1, allow_inf_nan=False)] = 0.10,
    window: Annotated[int, Query(ge=2, le=10_000)] = 200,
    limit: Annotated[int, Query(ge=1, le=5000)] = 500,
) -> Regressions:
    """Successful runs far below the earlier runs of their fingerprint (same config, hardware, versions).

    Flagged when the robust z = (x − median)/(1.4826·MAD) of the history is below −`threshold`
    (Iglewicz & Hoaglin 1993); when the history's MAD is 0, when x is more than `min_drop` below the
    median. `since` judges only runs started at or after it. Flags carry the value, baseline median,
    MAD, history size, z, drop in percent, fingerprint and config, largest drop first.
    """
    return Regressions(**regressions.find_regressions(
        session, metric=metric, threshold=threshold, min_history=min_history,
        since=naive_utc(since) if since else None, min_drop=min_drop, window=max(window, min_history), limit=limit))
