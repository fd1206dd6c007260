"""The target of a "what worked / what if" question, and its completion from the records.

A target is what the user plans (Target: model size, nodes × GPUs, optionally seq_len, batch, dims,
framework, precision). What it leaves out is completed from the recorded configurations
(complete_target: GPU type, seq_len, precision, the model's dims, global batch, framework), each
completion said in the notes, into a CompletedTarget — the one object the recommender, /suggest
and /predict cost configurations for. `distance` is how far a recorded configuration is from it:
|ln(size/size*)| + |ln(nodes/nodes*)| + |ln(seq/seq*)| + hardware (0 same GPU type, 0.5 same
vendor, 1 otherwise).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any

import numpy as np
from sqlalchemy.orm import Session

from core import hardware
from core.model import model_size_class, resolve_shape
from core.record import parse_param_count
from service.analytics import on_target
from service.analytics.on_target import DIM_FIELDS
from service.errors import BadRequest


def parse_model_params(value: str | int | float) -> int:
    """A target's model size: core.record.parse_param_count ('8B', '1.34B', '8e9', 8030261248; a
    bare number below 10,000 is billions: '8' -> 8e9). Raises BadRequest naming model_params."""
    try:
        return parse_param_count(value)
    except ValueError as exc:
        raise BadRequest(f"model_params: {exc}",
                         [{"field": "model_params", "value": value, "message": str(exc)}]) from None


@dataclass
class Target:
    """What the user plans: model size (params; `family`: the size as asked names the heatmap's
    family row, on_target.names_family, not one size class), nodes × gpus_per_node of gpu_type,
    seq_len, batch, the model's dims and MLP shape (gated_linear_unit: SwiGLU-style three matrices,
    or GPT's two), the framework and precision it is costed for. What is left out is completed
    from the records (complete_target)."""

    model_params: int
    nodes: int
    gpus_per_node: int = 8
    gpu_type: str | None = None
    seq_len: int | None = None
    global_batch_tokens: int | None = None
    num_layers: int | None = None
    hidden_size: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    ffn_hidden_size: int | None = None
    vocab_size: int | None = None
    gated_linear_unit: bool | None = None
    framework: str | None = None
    precision: str | None = None
    family: bool = False

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def hw_penalty(target_gpu: str | None, gpu: str | None) -> float:
    """0 same GPU type (or none asked), 0.5 same vendor, 1 otherwise."""
    if not target_gpu or gpu == target_gpu:
        return 0.0
    a, b = hardware.lookup(target_gpu), hardware.lookup(gpu)
    return 0.5 if a and b and a.vendor == b.vendor else 1.0


def distance(row: dict[str, Any], size_class: float | None, nodes: int, seq: int | None, gpu: str | None) -> float:
    """Distance of a recorded configuration row from the target (module docstring)."""
    return distances([row], size_class, nodes, seq, gpu)[0]


def distances(rows: list[dict[str, Any]], size_class: float | None, nodes: int, seq: int | None,
              gpu: str | None) -> list[float]:
    """distance() of each row, as arrays: |ln ratio| of size class, nodes and seq_len (0 where either side
    is unknown or 0) plus hw_penalty, rounded to 4 decimals (Python's round, per row)."""
    def log_ratio(key: str, value: float | None) -> Any:
        if not value:
            return 0.0
        col = np.array([r.get(key) for r in rows], dtype=float)  # None → NaN
        known = np.isfinite(col) & (col != 0)
        return np.where(known, np.abs(np.log(np.where(known, col, value) / value)), 0.0)

    penalty = {g: hw_penalty(gpu, g) for g in {r.get("gpu_type") for r in rows}}
    hw = np.array([penalty[r.get("gpu_type")] for r in rows], dtype=float)
    total = log_ratio("model_size_class", size_class) + log_ratio("nodes", nodes) + log_ratio("seq_len", seq) + hw
    return [round(d, 4) for d in np.broadcast_to(total, (len(rows),)).tolist()]


def ranked_rows(rows: list[dict[str, Any]], size_class: float | None, nodes: int, seq: int | None,
                gpu: str | None) -> list[dict[str, Any]]:
    """The rows nearest first (distance(), then more runs first; stable)."""
    d = distances(rows, size_class, nodes, seq, gpu)
    return [rows[i] for i in sorted(range(len(rows)), key=lambda i: (d[i], -rows[i]["n_runs"]))]


@dataclass
class CompletedTarget:
    """The target with what it left out completed (complete_target), as the configurations are
    costed for: model size (params) and its size class (billions, core.model.model_size_class),
    nodes × gpus_per_node of gpu_type (catalog name), seq_len (tokens), precision (canonical), the
    model's dims (DIM_FIELDS; None where neither given nor recorded: inferred when costed), its MLP
    shape, the global batch (tokens; None when /predict's configuration sets it) and the framework.
    flash_attention: only the benches set it (None: FlashAttention assumed)."""

    model_params: int
    nodes: int
    gpus_per_node: int
    gpu_type: str
    seq_len: int
    precision: str
    num_layers: int | None = None
    hidden_size: int | None = None
    num_heads: int | None = None
    num_kv_heads: int | None = None
    ffn_hidden_size: int | None = None
    vocab_size: int | None = None
    gated_linear_unit: bool | None = None
    size_class: float | None = None
    global_batch_tokens: int | None = None
    framework: str | None = None
    flash_attention: bool | None = None

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node

    def field_value(self, name: str) -> Any:
        """The value of field `name`; None when there is no such field (a name read off a message)."""
        return getattr(self, name) if name in {f.name for f in fields(self)} else None

    def shape_record(self) -> dict[str, Any]:
        """The model's fields as a run record (core.model.resolve_shape reads them)."""
        return {f: getattr(self, f) for f in ("model_params", *DIM_FIELDS, "gated_linear_unit")}

    def body(self) -> dict[str, Any]:
        """The completed target as the answers show it (size_class as model_size_class, world_size)."""
        shown = [f.name for f in fields(self) if f.name not in ("size_class", "flash_attention")]
        return {**{f: getattr(self, f) for f in shown}, "model_size_class": self.size_class,
                "world_size": self.world_size}

def _most_recorded(rows: list[dict[str, Any]], key: str, where: Any = None) -> Any:
    """The value of `key` with the most recorded successful runs among configuration rows (ties: the
    smaller value as text), None when no row has one."""
    counts: dict[Any, int] = {}
    for r in rows:
        if r.get(key) is not None and (where is None or where(r)):
            counts[r[key]] = counts.get(r[key], 0) + int(r["n_runs"] or 1)
    return min(counts, key=lambda v: (-counts[v], str(v))) if counts else None


def _target_gpu(target: Target, rows: list[dict[str, Any]], notes: list[str]) -> str:
    """The target's GPU type: the catalog name of the one given, else the GPU type with the most
    recorded successful runs (the heatmap's default slice), said in the notes."""
    if target.gpu_type:
        return hardware.canonical_gpu_type(target.gpu_type) or target.gpu_type
    gpu = _most_recorded(rows, "gpu_type")
    if gpu is None:
        raise BadRequest("no recorded run to take the GPU type from: pass gpu_type",
                         [{"field": "gpu_type", "value": None, "message": "required without recorded runs"}])
    notes.append(f"gpu_type not given: {gpu}, the GPU type with the most recorded runs")
    return str(gpu)


def _target_seq(target: Target, rows: list[dict[str, Any]], gpu: str, notes: list[str]) -> int:
    """The target's sequence length: the one given, else the one most recorded on its GPU type (the
    slice the heatmap is drawn on), else the nearest recorded configuration's; said in the notes."""
    if target.seq_len:
        return target.seq_len
    seq = _most_recorded(rows, "seq_len", lambda r: r["gpu_type"] == gpu)
    if seq is not None:
        notes.append(f"seq_len not given: {seq}, the sequence length most recorded on {gpu}")
        return int(seq)
    size_class = model_size_class(target.model_params)
    ranked = ranked_rows(rows, size_class, target.nodes, None, gpu)
    if not ranked or ranked[0]["seq_len"] is None:
        raise BadRequest("seq_len is needed (no recorded run to take it from)",
                         [{"field": "seq_len", "value": None, "message": "required"}])
    notes.append(f"seq_len not given: {ranked[0]['seq_len']}, the nearest recorded configuration's")
    return int(ranked[0]["seq_len"])


def _recorded_model(target: Target, cell: on_target.Cell, found: on_target.Measured,
                    rows: list[dict[str, Any]], gpu: str, seq: int) -> tuple[dict[str, Any], str] | None:
    """The recorded model the answer is costed on when the target gives no dims: that of the first
    run measured on the target (found.runs, dims from it or from another record of the same model);
    else the recorded model with dims nearest in size to the one asked within the cell's size (family
    or size class), nearest configuration first. (row with model_params and dims, where from) or None."""
    def nearest(candidates: list[dict[str, Any]]) -> dict[str, Any] | None:
        size_class = model_size_class(target.model_params)
        d = dict(zip(map(id, candidates), distances(candidates, size_class, target.nodes, seq, gpu)))
        return min(candidates, key=lambda r: (abs(math.log((r["model_params"] or target.model_params)
                                                           / target.model_params)),
                                              d[id(r)], -r["n_runs"], r["first_id"]), default=None)

    if found.runs:
        run = found.runs[0]
        model = {"model_params": run["model_params"] or int((run["model_size_class"] or 0) * 1e9) or None,
                 **{f: run[f] for f in DIM_FIELDS}, "gated_linear_unit": run.get("gated_linear_unit")}
        where = (f"the model of run #{run['run_id']} ({run['model_name'] or run['label']}), the first measured "
                 "on this target")
        if not run["hidden_size"]:
            same = nearest([r for r in rows if r["hidden_size"] and r["model_params"] == run["model_params"]])
            if same is not None:
                model.update({f: same[f] for f in DIM_FIELDS}, gated_linear_unit=same.get("gated_linear_unit"))
                where += f" (dims as recorded with run #{same['first_id']})"
        return model, where
    inside = [r for r in rows if r["hidden_size"] and cell.holds(r["model_size_class"])]
    pick = nearest(inside)
    if pick is None:
        return None
    return ({"model_params": pick["model_params"], **{f: pick[f] for f in DIM_FIELDS},
             "gated_linear_unit": pick.get("gated_linear_unit")},
            f"the recorded {on_target.size_label(pick['model_params'], pick['model_size_class'])} model "
            f"(run #{pick['first_id']}), the nearest in {cell.size_text()} that records its dims")


def complete_target(session: Session, target: Target, rows: list[dict[str, Any]], notes: list[str], *,
                    need_batch: bool = True,
                    measured_limit: int = 10) -> tuple[CompletedTarget, on_target.Cell, on_target.Measured]:
    """The target with what it leaves out completed, each completion said in `notes`: GPU type
    (_target_gpu), seq_len (_target_seq), precision, the runs measured on the target
    (service/analytics/on_target.py), the model (the dims given, else the recorded model's:
    _recorded_model; what neither gives is inferred from model_params as the memory and throughput
    models do: _inferred_dims_note), the global batch (the recorded model's run on the target, else
    the nearest recorded configuration's; not when `need_batch` is False) and the framework.
    Returns (the completed target, the cell, what was measured on it). Raises BadRequest naming
    the field that cannot be completed."""
    gpu = _target_gpu(target, rows, notes)
    seq = _target_seq(target, rows, gpu, notes)
    asked_class = model_size_class(target.model_params)
    # the rows nearest the target (ranked_rows), ranked when a completion asks for them: only those the records
    # do not answer on the target itself do (most targets' GPU has a bf16 peak and runs measured on it)
    precision = _precision(target, functools.cache(lambda: ranked_rows(rows, asked_class, target.nodes, seq, gpu)),
                           gpu, notes)
    given = {f: getattr(target, f) for f in DIM_FIELDS}
    cell = on_target.Cell(target.model_params, target.family, target.nodes, target.gpus_per_node, gpu, seq,
                          {k: v for k, v in given.items() if v})
    found = on_target.measured(session, cell, precision=precision, limit=measured_limit)
    ctx = CompletedTarget(model_params=target.model_params, nodes=target.nodes, gpus_per_node=target.gpus_per_node,
                          gpu_type=gpu, seq_len=seq, precision=precision, **given,
                          gated_linear_unit=target.gated_linear_unit)
    recorded = None if any(given.values()) else _recorded_model(target, cell, found, rows, gpu, seq)
    if recorded is not None:
        model, where = recorded
        for k, v in model.items():
            if k != "gated_linear_unit" and (k != "model_params" or v):
                setattr(ctx, k, v)
        if ctx.gated_linear_unit is None:
            ctx.gated_linear_unit = model.get("gated_linear_unit")
        dims = ", ".join(f"{f} {getattr(ctx, f):,}" for f in DIM_FIELDS if getattr(ctx, f))
        notes.append(f"costed on {where}: {on_target.size_label(ctx.model_params, None)} parameters"
                     + (f", {dims}" if dims else ", dims not recorded"))
    ctx.size_class = size_class = model_size_class(ctx.model_params)
    _inferred_dims_note(ctx, "the target leaves out" if any(given.values()) else "the records leave out"
                        if recorded else "neither given nor recorded", notes)
    ranked = functools.cache(lambda: ranked_rows(rows, size_class, target.nodes, seq, gpu))
    ctx.global_batch_tokens = target.global_batch_tokens
    if target.global_batch_tokens is None and need_batch:
        ctx.global_batch_tokens = _target_batch(found, ranked, notes)
    ctx.framework = fw = _target_framework(target, found, rows, ranked, gpu, notes)
    own = [r["precision"] for r in rows if r["gpu_type"] == gpu and r["framework"] == fw]
    # (no run of the framework on the GPU at all: the fit comes from elsewhere and says so, model.reason)
    if target.precision and own and precision not in own:
        notes.append(f"no successful run of {fw} on {gpu} in {precision} is recorded: the throughput model carries "
                     f"what it fitted in other precisions to the {precision} peak (an extrapolation)")
    return ctx, cell, found


def _inferred_dims_note(ctx: CompletedTarget, source: str, notes: list[str]) -> None:
    """What the target's model leaves out is inferred from model_params, as the memory and
    throughput models do (core.model.resolve_shape): said in `notes` (`source`: why the dims are
    missing), so that the answer is read for those dims."""
    if all(getattr(ctx, f) for f in DIM_FIELDS):
        return
    inferred: list[str] = []
    try:
        resolve_shape(ctx.shape_record(), inferred)
    except ValueError:
        inferred = []
    inferred = [n for n in inferred if not n.startswith("dims give")]  # a check, not an inference
    if inferred:
        notes.append(f"model dims {source}, inferred from model_params {ctx.model_params:,}: "
                     + "; ".join(inferred) + " — pass your model's dims (num_layers, hidden_size, ...) to be "
                     "costed on them")


def _target_batch(found: on_target.Measured, ranked: Callable[[], list[dict[str, Any]]], notes: list[str]) -> int:
    """The global batch (tokens) of the first run measured on the target, else of the nearest recorded
    configuration; BadRequest when neither gives one."""
    for run in found.runs[:1]:
        if run["global_batch_tokens"]:
            notes.append(f"global_batch_tokens not given: {run['global_batch_tokens']:,}, run "
                         f"#{run['run_id']}'s (measured on this target)")
            return int(run["global_batch_tokens"])
    if ranked():
        n = ranked()[0]
        gbt = n["dp"] * n["micro_batch_size"] * n["grad_accum_steps"] * n["seq_len"] if n["dp"] else None
        if gbt:
            notes.append(f"global_batch_tokens not given: {gbt:,}, the nearest recorded configuration's")
            return int(gbt)
    raise BadRequest("global_batch_tokens is needed (no recorded run to take it from)",
                     [{"field": "global_batch_tokens", "value": None, "message": "required"}])


def _precision(target: Target, ranked: Callable[[], list[dict[str, Any]]], gpu: str | None, notes: list[str]) -> str:
    """The precision the target is costed in: the one given (canonical name; BadRequest when the
    catalog has no peak for it on the GPU); else bf16, mixed-precision training's matmul precision,
    where the catalog has a bf16 peak for the GPU; else the precision of the nearest recorded
    configuration on that GPU (e.g. fp16 on V100), said in the notes."""
    if target.precision:
        precision = hardware.canonical_precision(target.precision)
        if precision is None or (hardware.lookup(gpu) is not None and not hardware.peak_tflops(gpu, precision)):
            raise BadRequest(f"precision '{target.precision}': the hardware catalog has no {precision or 'such'} "
                             f"peak for {gpu}",
                             [{"field": "precision", "value": target.precision,
                               "message": f"no peak FLOP/s for {gpu} at this precision"}])
        return precision
    if gpu is None or hardware.peak_tflops(gpu, "bf16"):
        notes.append("costed in bf16 (the question names no precision)")
        return "bf16"
    on_gpu = [r for r in ranked() if r["gpu_type"] == gpu and hardware.peak_tflops(gpu, r["precision"])]
    if on_gpu:
        notes.append(f"costed in {on_gpu[0]['precision']}: the catalog has no bf16 peak for {gpu}; the nearest "
                     "recorded configuration on it ran in that precision")
        return str(on_gpu[0]["precision"])
    notes.append(f"no configuration can be costed: the catalog has no bf16 peak for {gpu} and no run on it "
                 "recorded a precision it has a peak for")
    return "bf16"


def resolve_framework(name: str, rows: list[dict[str, Any]], notes: list[str]) -> str:
    """A framework as the user writes it ("nemo", "Megatron") read as a recorded framework name:
    the one equal to it ignoring case, else the one containing it (the most recorded when several
    do, the others named in the notes); a name nothing recorded matches is kept as given (its fit
    is then carried from other runs or the prior, which the answer's model says)."""
    counts: dict[str, int] = {}
    for r in rows:
        if r["framework"]:
            counts[r["framework"]] = counts.get(r["framework"], 0) + int(r["n_runs"] or 1)
    wanted = name.strip().lower()
    exact = [f for f in counts if f.lower() == wanted]
    if exact:
        return exact[0]
    containing = sorted((f for f in counts if wanted and wanted in f.lower()), key=lambda f: (-counts[f], f))
    if not containing:
        notes.append(f"framework '{name}': no successful run of it is recorded")
        return name.strip()
    notes.append(f"framework '{name}' read as '{containing[0]}'"
                 + (f" (the most recorded of {', '.join(containing)})" if len(containing) > 1 else ""))
    return containing[0]


def _target_framework(target: Target, found: on_target.Measured, rows: list[dict[str, Any]],
                      ranked: Callable[[], list[dict[str, Any]]], gpu: str | None, notes: list[str]) -> str | None:
    """The framework the target is costed for: the one given (resolve_framework); else that of the
    first run measured on the target when the records hold configurations of it to fit on; else
    that of the nearest recorded configurations (on the target GPU when it has any)."""
    if target.framework:
        return resolve_framework(target.framework, rows, notes)
    for run in found.runs[:1]:
        if run["framework"] and any(r["framework"] == run["framework"] for r in rows):
            notes.append(f"framework: {run['framework']} (run #{run['run_id']}'s, measured on this target)")
            return str(run["framework"])
    on_gpu = [r for r in ranked() if r["gpu_type"] == gpu] or ranked()
    if not on_gpu:
        return None
    fw = on_gpu[0]["framework"]
    notes.append(f"framework: {fw} (the nearest recorded configurations')")
    return fw


