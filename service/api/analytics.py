"""/api/v1/heatmap, /api/v1/heatmap/cell, /api/v1/recommend, /api/v1/health."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

import sqlalchemy as sa
from fastapi import APIRouter, Depends, Query, Response
from pydantic import BaseModel, ConfigDict, Field, create_model

from core.rules import config_label
from service import __version__
from service import limits as L
from service.analytics import heatmap as hm
from service.analytics import recommend as rec
from service.api.deps import DatabaseDep, SessionDep
from service.api.responses import model_response
from service.api.security import READ
from service.api.target import TargetDep
from service.schemas import ErrorBody, Health, RunOut, UtcDatetime
from service.store import naive_utc
from service.tables import Run

router = APIRouter(tags=["analytics"])

Metric = Literal["tokens_per_sec_per_gpu", "mfu"]


#: A cell's best run: the fields of hm.BEST_COLUMNS, each with RunOut's name, type and description
#: (started_at a timezone-aware UTC datetime, as on RunOut), so the two cannot drift apart.
CellBest = create_model(  # type: ignore[call-overload]  # fields built from RunOut at import
    "CellBest",
    __config__=ConfigDict(allow_inf_nan=False),
    __doc__="A heatmap cell's best run, narrowed to its config (DP/TP/PP/CP/EP, ZeRO stage, MBS, GAS, "
            "recompute), hardware, workload and metrics: tokens_per_sec_per_gpu (tokens/s per GPU), "
            "tflops_per_gpu (TFLOP/s per GPU), mfu/hfu and their _derived values (fractions), "
            "peak_memory_gib (GiB per GPU), step_time_s (s). Values equal the stored run's; the whole "
            "run (versions, model dims, extra, error text, fingerprint, ...) is GET /api/v1/runs/{id}.",
    **{name: ((UtcDatetime | None) if name == "started_at" else RunOut.model_fields[name].annotation,
              RunOut.model_fields[name])
       for name in hm.BEST_COLUMNS},
)


class HeatmapCell(BaseModel):
    model_size_class: float
    moe: bool = Field(description="the cell's runs are mixture-of-experts (EP > 1, experts declared, or active "
                                  "parameters known: core.model.is_moe); a MoE and a dense model of one size "
                                  "class are two cells")
    nodes: int
    best: CellBest | None  # type: ignore[valid-type]  # a pydantic model built by create_model
    config_label: str | None
    n_success: int
    n_oom: int
    n_failed: int


class Heatmap(BaseModel):
    metric: Metric
    cells: list[HeatmapCell]


class CellRuns(BaseModel):
    model_size_class: float
    moe: bool | None
    nodes: int
    runs: list[RunOut]


def heatmap_filters(
    gpu_type: Annotated[str | None, Query(max_length=100)] = None,
    seq_len: Annotated[int | None, Query(ge=1)] = None,
    global_batch_tokens: Annotated[int | None, Query(ge=1)] = None,
    framework: Annotated[str | None, Query(max_length=200)] = None,
    precision: Annotated[str | None, Query(max_length=32)] = None,
    started_after: datetime | None = None,
    started_before: datetime | None = None,
    sweep: Annotated[str | None, Query(max_length=200, description="only the runs of this sweep")] = None,
) -> hm.HeatmapFilters:
    """The heatmap's slice from the query string (one copy for /heatmap and /heatmap/cell): runs
    of that GPU type, sequence length (tokens), global batch (tokens), framework and precision,
    started in [started_after, started_before) (ISO 8601; naive times are UTC), of one sweep."""
    return hm.HeatmapFilters(gpu_type=gpu_type, seq_len=seq_len, global_batch_tokens=global_batch_tokens,
                             framework=framework, precision=precision, sweep=sweep,
                             started_after=naive_utc(started_after) if started_after else None,
                             started_before=naive_utc(started_before) if started_before else None)


FiltersDep = Annotated[hm.HeatmapFilters, Depends(heatmap_filters)]


@router.get("/heatmap", response_model=Heatmap, dependencies=[READ])
def heatmap(
    session: SessionDep,
    filters: FiltersDep,
    metric: Metric = "tokens_per_sec_per_gpu",
) -> Response:
    """Best run per (model size class, MoE or dense, nodes) cell (Ultra-Scale Playbook heatmap).

    `{"metric", "cells": [{"model_size_class", "moe", "nodes", "best", "config_label", "n_success", "n_oom",
    "n_failed"}]}`, cells sorted by (model_size_class, moe, nodes). `model_size_class` is in billions of
    parameters (2 significant figures); `moe` keeps a mixture-of-experts model (Qwen3-30B-A3B) and a
    dense one of the same size class (MPT-30B) in two cells. A cell's `best` is the successful run with the highest
    `metric` (tokens/s/GPU, or MFU as a fraction), as a CellBest: its id, config, hardware,
    workload and metrics (tokens/s per GPU, TFLOP/s per GPU, MFU/HFU fractions, peak memory GiB
    per GPU, step time s); the whole run is GET /runs/{id}, the cell's runs GET /heatmap/cell.
    `config_label` is its config as "DP8 TP1 PP1 GAS16 Z1 MBS2". Counts split successful / OOM /
    other failed runs; a cell with only failures has `best: null`.
    """
    cells = hm.heatmap(session, filters, metric)
    return model_response(Heatmap, {"metric": metric, "cells": [
        {**c, "config_label": config_label(c["best"]) if c["best"] else None} for c in cells]})


@router.get("/heatmap/cell", response_model=CellRuns, dependencies=[READ])
def heatmap_cell(
    session: SessionDep,
    model_size_class: Annotated[float, Query(gt=0, allow_inf_nan=False)],
    nodes: Annotated[int, Query(ge=1)],
    filters: FiltersDep,
    metric: Metric = "tokens_per_sec_per_gpu",
    limit: Annotated[int, Query(ge=1, le=1000)] = 500,
    moe: bool | None = None,
) -> Response:
    """Every run of one heatmap cell: successes best first, then failures (same filters as /heatmap).
    `moe`: the cell's `moe` (true: its mixture-of-experts runs, false: its dense ones); left out, both."""
    runs = hm.cell_runs(session, filters, model_size_class, nodes, metric, limit, moe)
    return model_response(CellRuns, {"model_size_class": model_size_class, "moe": moe, "nodes": nodes, "runs": runs})


class Slice(BaseModel):
    """One GPU type and sequence length: the runs recorded in it (every status), its successes, and
    how many distinct node counts have a successful run."""

    gpu_type: str
    seq_len: int
    runs: int
    successes: int
    node_counts: int


class Slices(BaseModel):
    slices: list[Slice]


@router.get("/heatmap/slices", response_model=Slices, dependencies=[READ])
def heatmap_slices(
    session: SessionDep,
    filters: FiltersDep,
    model_size_class: Annotated[float | None, Query(gt=0, allow_inf_nan=False)] = None,
    most: Literal["runs", "nodes"] = "runs",
) -> Response:
    """The comparable slices (one GPU type, one sequence length) of the runs the filters choose,
    the one to show first first: `most=runs` the most-recorded (the heatmap's default slice in the
    dashboard and `scalebook heatmap`), `most=nodes` the most node counts with a success, then runs
    (a scaling curve). `{"slices": [{"gpu_type", "seq_len", "runs", "successes", "node_counts"}]}`."""
    return model_response(Slices, {"slices": hm.slices(session, filters, model_size_class, most)})


class Predicted(BaseModel):
    """The throughput and memory models' prediction for the target (a prediction, not a measurement)."""

    tokens_per_sec_per_gpu: float
    mfu: float
    peak_memory_gib: float
    interval: list[float]
    step_time_s: float
    breakdown_s: dict[str, float]
    bandwidth_source: str | None


class Evidence(BaseModel):
    """A recorded configuration a candidate rests on: its first run, model, hardware, distance."""

    run_id: int
    model_size_class: float | None
    model_params: int | None
    gpu_type: str | None
    framework: str | None
    nodes: int | None
    config: dict[str, Any]
    n_runs: int
    measured_tokens_per_sec_per_gpu: float | None
    distance: float


class Candidate(BaseModel):
    config: dict[str, Any]
    origin: Literal["recorded on this target", "predicted"]
    global_batch_tokens: int
    predicted: Predicted
    measured: dict[str, Any] | None
    evidence: list[Evidence]
    memory: dict[str, Any]
    why: str
    extrapolates: bool = Field(default=False, description="the prediction extrapolates (reasons: extrapolation)")
    extrapolation: list[str] = Field(default_factory=list, description="why it extrapolates, and from what: a "
                                     "prior or carried fit; a node count, model size or seq_len outside the fitted "
                                     "runs'; no recorded run of the exact layout within the support distance; a "
                                     "layout family never recorded (the model alone)")
    evidence_distance: float | None = Field(default=None, description="distance (|ln ratio| of size, nodes and "
                                            "seq_len, plus the hardware) to the nearest recorded run of this exact "
                                            "layout; null: never recorded")
    supported: bool = Field(default=False, description="a recorded run of this exact layout lies within the support "
                                                       "distance (2.0): an unsupported layout's interval reaches "
                                                       "far lower, and it ranks by that lower end")


class MeasuredMemory(BaseModel):
    """The memory model's prediction for a measured run's own configuration (GiB per GPU)."""

    predicted_peak_memory_gib: float
    usable_memory_gib: float | None
    fits: bool | None = Field(description="true/false: the model's verdict; null: the GPU's memory is unknown, "
                                          "or the fields the run does not record decide it (fits_with)")
    disagrees: bool = Field(description="the run succeeded though the memory model says it does not fit under "
                                        "any setting of the fields it does not record: the record wins")
    fits_with: str | None = Field(default=None, description="when it does not fit as assumed: the least "
                                  "memory-saving setting of the unrecorded ZeRO stage / recompute under which it "
                                  "fits, e.g. 'ZeRO-1'")
    assumed: list[str] = Field(description="what the memory model took for fields the run does not record")


class MeasuredRun(BaseModel):
    """A configuration measured on the target (its best run): what ran, labelled with its exact
    model size, framework and precision; tokens/s per GPU, MFU (fraction), peak memory GiB as recorded."""

    run_id: int
    label: str
    model_name: str | None
    model_params: int | None
    model_size_class: float | None
    num_layers: int | None
    hidden_size: int | None
    num_heads: int | None
    num_kv_heads: int | None
    ffn_hidden_size: int | None
    vocab_size: int | None
    gated_linear_unit: bool | None
    framework: str | None
    precision: str | None
    seq_len: int | None
    gpus_per_node: int | None
    config: dict[str, Any]
    global_batch_tokens: int | None
    tokens_per_sec_per_gpu: float | None
    mfu: float | None
    peak_memory_gib: float | None
    n_runs: int
    source: str | None
    memory: MeasuredMemory | None


class Recommendation(BaseModel):
    target: dict[str, Any]
    model: dict[str, Any]
    measured_on_target: list[MeasuredRun]
    cell: dict[str, Any] | None
    candidates: list[Candidate]
    notes: list[str]
    counts: dict[str, int]


@router.get("/recommend", response_model=Recommendation, responses={400: {"model": ErrorBody}},
            dependencies=[READ])
def recommend(
    session: SessionDep,
    target: TargetDep,
    k: Annotated[int, Query(ge=1, le=L.MAX_K)] = 5,
    metric: Metric = "tokens_per_sec_per_gpu",
) -> Response:
    """"What worked on `nodes` nodes for a `model_params` model?" (DESIGN §4).

    First `measured_on_target`: up to `k` runs measured on the target's heatmap cell
    (service/analytics/on_target.py) — the size family of a round size ("8B": the 7–8B row), or
    the size class of a precise one, narrowed by the dims given; the same nodes, GPUs per node, GPU
    type and seq_len; every framework and precision, each labelled; the precision the answer is
    costed in first, then the model nearest the size asked, then the best (tokens/s/GPU, MFU, id);
    each with the memory model's verdict for its own configuration (`memory.disagrees`: it ran
    though the model says it does not fit — the record wins, and `notes` say so). `cell`: its
    success / OOM / failure counts and successes at other sequence lengths.

    Then `candidates`: the layouts NOT run on the target, best first by the throughput model's
    prediction FOR THE TARGET (service/analytics/recommend.py, throughput.py), costed on the dims
    given, else on the recorded model's (that of the first measured run), in the `framework` and
    `precision` given (else the measured run's framework and bf16): valid layouts adapted exactly
    to the world size and global batch, filtered by the memory model and recorded OOMs, ranked by
    the lower end of the predicted interval times the probability that the layout fits
    (`memory.p_fits`). Each has `predicted` (tokens/s/GPU, MFU, peak memory, interval), `evidence`
    (the recorded runs it rests on, with model, GPU type, framework, distance). `model`: the fit
    used (status fitted/prior, runs fitted on, held-out error). `notes`: every completion of the
    target (GPU type, seq_len, dims, batch, framework, precision) and where it came from. 400 when
    the target cannot be read or completed (e.g. a precision the GPU has no peak for). 422 naming
    the field for a number beyond service/limits.py.
    """
    return model_response(Recommendation, rec.recommend(session, target, k=k, metric=metric, skip_recorded=True))


@router.get("/health", response_model=Health, tags=["health"])
def health(db: DatabaseDep, session: SessionDep) -> Health:
    """Liveness and readiness: backend, schema revision and number of stored runs."""
    return Health(status="ok", backend=db.dialect, schema_revision=db.current_revision(),
                  runs=session.scalar(sa.select(sa.func.count()).select_from(Run)) or 0, version=__version__)
