""""What worked on N nodes for an xB model?" — configurations ranked by the throughput model's
prediction FOR THE TARGET (DESIGN §4, "Recommendation").

Per request, from the `runs` table only (the database is the only state):
1. The recorded configurations (successful, not retired runs, aggregated per configuration:
   service/analytics/throughput.load_configs) and the recorded OOMs are read.
2. The target is completed from its nearest recorded configurations when it leaves things out
   (model dims of the same size class, seq_len, global batch, GPU type), and says so in `notes`.
3. Candidates: every layout the framework's records show it can run (TP, PP, CP, ZeRO stage,
   recompute, micro-batch: the values recorded near the target plus powers of two) that divides
   the world size and the model (heads by TP, layers by PP), adapted exactly: DP = world/(TP·PP·CP),
   GAS = global batch / (DP·MBS·seq), which must be a whole number ≥ 1 — the micro-batch is
   lowered when GAS would fall below 1; a layout that cannot hit the batch is left out (counted in
   `notes`).
4. Ranked by the lower end of the predicted tokens/s/GPU's interval for the target: the
   throughput model's prediction (service/analytics/throughput.py) anchored on the residuals of
   the recorded runs of the same TP/PP/CP/recompute nearest to it (service/analytics/anchor.py,
   regression kriging), its interval the fit's held-out half-width times the kriging standard
   deviation those runs leave — so a layout recorded near (and around) the target ranks above an
   equally good extrapolation; a layout family never recorded keeps the model's interval widened
   by its distance (MAX_WIDEN) — times the probability that it fits (p_fits: the memory model's
   prediction and held-out error; an OOM delivers no tokens) — and
   dropped when the memory model (service/analytics/memory.py) predicts no fit or a recorded OOM
   implies one (same TP/PP/CP/seq/GPU, no more ZeRO sharding, no smaller micro-batch, no stronger
   recompute, and under ZeRO ≥ 1 no larger DP) — unless the very configuration ran on the target.
5. Each candidate carries `predicted` (tokens/s/GPU, MFU, peak memory, interval) apart from its
   `evidence` (the recorded runs of the same layout nearest to the target: id, model, GPU type,
   framework, nodes, distance, measured tokens/s) and, when it ran on this very target,
   `measured` side by side with the prediction.

Distance: |ln(size/size*)| + |ln(nodes/nodes*)| + |ln(seq/seq*)| + hardware (0 same GPU type,
0.5 same vendor, 1 otherwise).
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from core import hardware
from core.model import model_size_class, resolve_shape
from core.record import parse_param_count
from service.analytics import on_target
from service.analytics import throughput as th
from service.analytics.anchor import SUPPORT_DISTANCE, Anchors, interval_halves
from service.analytics.layouts import enumerate_layouts, recorded_options
from service.analytics.memory import estimate_memory
from service.analytics.on_target import CONFIG_FIELDS, DIM_FIELDS, config_value
from service.errors import BadRequest
from service.tables import Run

LAYOUT_FIELDS = ("tp", "pp", "cp", "zero_stage", "micro_batch_size", "recompute")
_RECOMPUTE_RANK = {None: 0, "none": 0, "selective": 1, "full": 2}
#: the most the interval's half-width is widened by (× (1 + widen)) for extrapolation
MAX_WIDEN = 2.0
#: "what worked" answers propose only configurations predicted to fit with this relative headroom: the
#: memory model's median held-out error on the whole-step peak (bench/memory_accuracy.py --calibration,
#: leave-one-cell-out: 8.0 %), so that a configuration within the model's own error of the capacity is
#: not recommended (it may OOM); /suggest, which explores, uses the plain prediction
MEMORY_MARGIN = 0.08
#: σ of log(predicted / measured) whole-step peak memory held out (bench/memory_accuracy.py --calibration:
#: median |error| 8.0 %, p90 21.6 % → 1.4826 × median |log error| ≈ 0.12, and 0.216 / 1.645 ≈ 0.13 agrees)
MEMORY_LOG_SIGMA = 0.12
#: "what worked": layouts recorded at the nearest node count(s) of the size class, up to this far
#: beyond the nearest in |ln(nodes ratio)| (ln 2: the next power of two too)
WORKED_NODES_SLACK = math.log(2) + 1e-9

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
    from the records (_complete_target)."""

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


def _log_ratio(a: float | None, b: float | None) -> float:
    return abs(math.log(a / b)) if a and b else 0.0


def distance(row: dict[str, Any], size_class: float | None, nodes: int, seq: int | None, gpu: str | None) -> float:
    """Distance of a recorded configuration row from the target (module docstring)."""
    return round(_log_ratio(row.get("model_size_class"), size_class) + _log_ratio(row.get("nodes"), nodes)
                 + _log_ratio(row.get("seq_len"), seq) + hw_penalty(gpu, row.get("gpu_type")), 4)


def _oom_rows(session: Session, ctx: dict[str, Any]) -> list[dict[str, Any]]:
    """Recorded OOMs (not retired) that can veto a candidate for the completed target `ctx`: those
    of its GPU type, size class and seq_len (the equalities oom_implied checks first), one row per
    distinct configuration. (On PostgreSQL a range of ix_runs_oom, whose key starts with those.)"""
    cols = [Run.gpu_type, Run.model_size_class, Run.seq_len, Run.dp, Run.tp, Run.pp, Run.cp, Run.zero_stage,
            Run.micro_batch_size, Run.recompute]
    same = [col.is_(None) if value is None else col == value
            for col, value in ((Run.gpu_type, ctx["gpu_type"]), (Run.model_size_class, ctx["size_class"]),
                               (Run.seq_len, ctx["seq_len"]))]
    query = sa.select(*cols, sa.func.min(Run.id).label("run_id")).where(
        Run.status == "oom", Run.retired_at.is_(None), *same).group_by(*cols)
    result = session.execute(query)
    keys = list(result.keys())  # (row._mapping builds the key list again for every row)
    return [dict(zip(keys, r)) for r in result]


def oom_implied(cfg: dict[str, Any], ctx: dict[str, Any], ooms: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The recorded OOM that implies `cfg` does not fit on the target either, or None: same GPU
    type, size class, seq_len, TP, PP, CP; ZeRO stage ≤; micro-batch ≥; recompute no stronger;
    under ZeRO ≥ 1 the optimizer shards over DP, so DP ≤ as well. An OOM with an unknown (NULL)
    TP, PP or CP implies nothing."""
    for o in ooms:
        if (o["gpu_type"] == ctx["gpu_type"] and o["model_size_class"] == ctx["size_class"]
                and o["seq_len"] == ctx["seq_len"] and o["tp"] == cfg["tp"] and o["pp"] == cfg["pp"]
                and o["cp"] == cfg["cp"] and (o["zero_stage"] or 0) >= cfg["zero_stage"]
                and o["micro_batch_size"] is not None and o["micro_batch_size"] <= cfg["micro_batch_size"]
                and _RECOMPUTE_RANK.get(o["recompute"], 0) >= _RECOMPUTE_RANK.get(cfg["recompute"], 0)
                and (cfg["zero_stage"] == 0 or (o["dp"] or 0) >= cfg["dp"])):
            return o
    return None


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
    ranked = sorted(rows, key=lambda r: (distance(r, size_class, target.nodes, None, gpu), -r["n_runs"]))
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
        return min(candidates, key=lambda r: (abs(math.log((r["model_params"] or target.model_params)
                                                           / target.model_params)),
                                              distance(r, size_class, target.nodes, seq, gpu), -r["n_runs"],
                                              r["first_id"]), default=None)

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


def _complete_target(session: Session, target: Target, rows: list[dict[str, Any]], notes: list[str], *,
                     need_batch: bool = True, measured_limit: int = 10) -> tuple[dict[str, Any],
                                                                                on_target.Cell,
                                                                                on_target.Measured]:
    """The target with what it leaves out completed, each completion said in `notes`: GPU type
    (_target_gpu), seq_len (_target_seq), precision, the runs measured on the target
    (service/analytics/on_target.py), the model (the dims given, else the recorded model's:
    _recorded_model; what neither gives is inferred from model_params as the memory and throughput
    models do), the global batch (the recorded model's run on the target, else the nearest recorded
    configuration's; not when `need_batch` is False) and the framework. Returns (ctx, the cell,
    what was measured on it). Raises BadRequest naming the field that cannot be completed."""
    gpu = _target_gpu(target, rows, notes)
    seq = _target_seq(target, rows, gpu, notes)
    asked_class = model_size_class(target.model_params)
    precision = _precision(target, sorted(rows, key=lambda r: (distance(r, asked_class, target.nodes, seq, gpu),
                                                                -r["n_runs"])), gpu, notes)
    given = {f: getattr(target, f) for f in DIM_FIELDS}
    cell = on_target.Cell(target.model_params, target.family, target.nodes, target.gpus_per_node, gpu, seq,
                          {k: v for k, v in given.items() if v})
    found = on_target.measured(session, cell, precision=precision, limit=measured_limit)
    ctx: dict[str, Any] = {"model_params": target.model_params, "nodes": target.nodes,
                           "gpus_per_node": target.gpus_per_node, "gpu_type": gpu, "seq_len": seq,
                           "precision": precision, **given, "gated_linear_unit": target.gated_linear_unit}
    recorded = None if any(given.values()) else _recorded_model(target, cell, found, rows, gpu, seq)
    if recorded is not None:
        model, where = recorded
        ctx.update({k: v for k, v in model.items() if k != "gated_linear_unit" and (k != "model_params" or v)})
        if ctx["gated_linear_unit"] is None:
            ctx["gated_linear_unit"] = model.get("gated_linear_unit")
        dims = ", ".join(f"{f} {ctx[f]:,}" for f in DIM_FIELDS if ctx.get(f))
        notes.append(f"costed on {where}: {on_target.size_label(ctx['model_params'], None)} parameters"
                     + (f", {dims}" if dims else ", dims not recorded"))
    ctx["size_class"] = size_class = model_size_class(ctx["model_params"])
    if not all(ctx.get(f) for f in DIM_FIELDS):
        # what the target leaves out is inferred from model_params, as the memory and throughput models do
        # (core.model.resolve_shape): said, so that the answer is read for those dims
        inferred: list[str] = []
        try:
            resolve_shape(dict(ctx), inferred)
        except ValueError:
            inferred = []
        inferred = [n for n in inferred if not n.startswith("dims give")]  # a check, not an inference
        if inferred:
            source = ("the target leaves out" if any(given.values()) else "the records leave out" if recorded
                      else "neither given nor recorded")
            notes.append(f"model dims {source}, inferred from model_params {ctx['model_params']:,}: "
                         + "; ".join(inferred) + " — pass your model's dims (num_layers, hidden_size, ...) to be "
                         "costed on them")
    ranked = sorted(rows, key=lambda r: (distance(r, size_class, target.nodes, seq, gpu), -r["n_runs"]))
    ctx["global_batch_tokens"] = target.global_batch_tokens
    if target.global_batch_tokens is None and need_batch:
        ctx["global_batch_tokens"] = _target_batch(found, ranked, notes)
    ctx["framework"] = fw = _target_framework(target, found, rows, ranked, gpu, notes)
    if target.precision and not any(r["gpu_type"] == gpu and r["framework"] == fw and r["precision"] == precision
                                    for r in rows):
        notes.append(f"no successful run of {fw} on {gpu} in {precision} is recorded: the throughput model carries "
                     f"what it fitted in other precisions to the {precision} peak (an extrapolation)")
    return ctx, cell, found


def _target_batch(found: on_target.Measured, ranked: list[dict[str, Any]], notes: list[str]) -> int:
    """The global batch (tokens) of the first run measured on the target, else of the nearest recorded
    configuration; BadRequest when neither gives one."""
    for run in found.runs[:1]:
        if run["global_batch_tokens"]:
            notes.append(f"global_batch_tokens not given: {run['global_batch_tokens']:,}, run "
                         f"#{run['run_id']}'s (measured on this target)")
            return int(run["global_batch_tokens"])
    if ranked:
        n = ranked[0]
        gbt = n["dp"] * n["micro_batch_size"] * n["grad_accum_steps"] * n["seq_len"] if n["dp"] else None
        if gbt:
            notes.append(f"global_batch_tokens not given: {gbt:,}, the nearest recorded configuration's")
            return int(gbt)
    raise BadRequest("global_batch_tokens is needed (no recorded run to take it from)",
                     [{"field": "global_batch_tokens", "value": None, "message": "required"}])


def _precision(target: Target, ranked: list[dict[str, Any]], gpu: str | None, notes: list[str]) -> str:
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
    on_gpu = [r for r in ranked if r["gpu_type"] == gpu and hardware.peak_tflops(gpu, r["precision"])]
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
                      ranked: list[dict[str, Any]], gpu: str | None, notes: list[str]) -> str | None:
    """The framework the target is costed for: the one given (resolve_framework); else that of the
    first run measured on the target when the records hold configurations of it to fit on; else
    that of the nearest recorded configurations (on the target GPU when it has any)."""
    if target.framework:
        return resolve_framework(target.framework, rows, notes)
    for run in found.runs[:1]:
        if run["framework"] and any(r["framework"] == run["framework"] for r in rows):
            notes.append(f"framework: {run['framework']} (run #{run['run_id']}'s, measured on this target)")
            return str(run["framework"])
    on_gpu = [r for r in ranked if r["gpu_type"] == gpu] or ranked
    if not on_gpu:
        return None
    fw = on_gpu[0]["framework"]
    notes.append(f"framework: {fw} (the nearest recorded configurations')")
    return fw


def layouts(ctx: dict[str, Any], rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every valid configuration for the target (service/analytics/layouts.py): options are the values
    the framework's records show (plus powers of two for TP/PP/MBS), filtered to divide the world size
    (TP·PP·CP), the heads (TP), the layers (PP ≤ L) and to hit the global batch exactly (GAS whole, ≥ 1)."""
    return enumerate_layouts(ctx, recorded_options(ctx, rows))


def _run_record(cfg: dict[str, Any], ctx: dict[str, Any]) -> dict[str, Any]:
    rec = {k: ctx.get(k) for k in ("model_params", "seq_len", "nodes", "gpus_per_node", "gpu_type", "precision",
                                   "framework", *DIM_FIELDS, "gated_linear_unit", "flash_attention")}
    rec.update(cfg)
    return rec


_value = config_value  # (the matching rule lives in on_target, which recommend builds on)


def _evidence(cfg: dict[str, Any], ctx: dict[str, Any], rows: list[dict[str, Any]], n: int = 3) -> list[dict]:
    """The recorded configurations of the same layout nearest to the target (as evidence)."""
    same = [r for r in rows if all(_value(r, f) == cfg[f] for f in LAYOUT_FIELDS)]
    if not same:
        same = [r for r in rows if r["tp"] == cfg["tp"] and r["pp"] == cfg["pp"]]
    ranked = sorted(same, key=lambda r: (distance(r, ctx["size_class"], ctx["nodes"], ctx["seq_len"], ctx["gpu_type"]),
                                         r["first_id"]))
    return [{"run_id": r["first_id"], "model_size_class": r["model_size_class"], "model_params": r["model_params"],
             "gpu_type": r["gpu_type"], "framework": r["framework"], "nodes": r["nodes"],
             "config": {f: r[f] for f in CONFIG_FIELDS}, "n_runs": r["n_runs"],
             "measured_tokens_per_sec_per_gpu": r["tokens_per_sec_per_gpu"],
             "distance": distance(r, ctx["size_class"], ctx["nodes"], ctx["seq_len"], ctx["gpu_type"])}
            for r in ranked[:n]]


def _exact(cfg: dict[str, Any], ctx: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    for r in rows:
        if (r["model_size_class"] == ctx["size_class"] and r["nodes"] == ctx["nodes"]
                and r["gpu_type"] == ctx["gpu_type"]
                and r["seq_len"] == ctx["seq_len"] and r["gpus_per_node"] in (None, ctx["gpus_per_node"])
                and all(_value(r, f) == cfg[f] for f in CONFIG_FIELDS)):
            return r
    return None


class NothingRecorded(BadRequest):
    """The target leaves out what only recorded runs could supply, and none are recorded."""


@dataclass
class Scored:
    """One valid configuration for the target with its prediction: `widen` is the distance to the
    nearest recorded run of its layout (capped at MAX_WIDEN), `worked` whether its layout ran at
    the target's size class near the target's node count."""

    config: dict[str, Any]
    predicted: dict[str, Any]
    widen: float
    worked: bool


@dataclass
class Prepared:
    """What one request reads and derives once: the configuration rows, the completed target
    (`ctx`), the throughput model and its fit, the recorded OOMs, notes, the target's heatmap cell
    and what was measured on it (service/analytics/on_target.py)."""

    rows: list[dict[str, Any]]
    ctx: dict[str, Any]
    model: th.Model
    fit: th.Fit
    ooms: list[dict[str, Any]]
    notes: list[str]
    cell: on_target.Cell
    measured: on_target.Measured


def prepare(session: Session, target: Target, *, need_batch: bool = True, measured_limit: int = 10) -> Prepared:
    """Read the runs (aggregated) and OOMs, complete the target (_complete_target: `need_batch`
    False leaves a global batch the target does not give unset, for /predict, whose configuration
    sets it; `measured_limit` runs measured on the target are listed), choose the fit. Raises
    BadRequest for a bad or uncompletable target."""
    if target.nodes < 1 or target.gpus_per_node < 1:
        raise BadRequest("nodes and gpus_per_node must be >= 1",
                         [{"field": "nodes", "value": target.nodes, "message": "must be >= 1"}])
    rows, unknown = th.read_configs(session)
    notes: list[str] = []
    skipped = th.skipped_note(unknown)
    if skipped:
        notes.append(skipped)
    try:
        ctx, cell, found = _complete_target(session, target, rows, notes, need_batch=need_batch,
                                            measured_limit=measured_limit)
    except BadRequest as exc:
        if rows:
            raise
        raise NothingRecorded(f"no recorded successful run to complete the target from: {exc.message}") from exc
    model = th.Model(rows)
    fit = model.fit_for(ctx["gpu_type"], ctx["framework"])
    if fit.status == "prior" or fit.reason:
        notes.append(fit.reason or "prior parameters")
    return Prepared(rows, ctx, model, fit, _oom_rows(session, ctx), notes, cell, found)


def layout_distances(prep: Prepared) -> dict[tuple, float]:
    """{LAYOUT_FIELDS values: distance from the target to the nearest recorded run of that exact
    layout} over the request's configuration rows (the evidence distance of interval_halves)."""
    ctx = prep.ctx
    by_layout: dict[tuple, float] = {}
    for r in prep.rows:
        key = tuple(_value(r, f) for f in LAYOUT_FIELDS)
        d = distance(r, ctx["size_class"], ctx["nodes"], ctx["seq_len"], ctx["gpu_type"])
        by_layout[key] = min(d, by_layout.get(key, d))
    return by_layout


def anchors_for(prep: Prepared) -> Anchors:
    """The evidence anchoring of the request's fit (anchor.Anchors), distances from its target."""
    ctx = prep.ctx
    return Anchors(prep.rows, prep.fit, lambda r: distance(r, ctx["size_class"], ctx["nodes"], ctx["seq_len"],
                                                          ctx["gpu_type"]),
                   terms_of=lambda r: prep.model.terms_of(r, prep.fit.network_gb_s))


def predicted_for(prep: Prepared, cfg: dict[str, Any], anchors: Anchors | None,
                  by_layout: dict[tuple, float]) -> dict[str, Any]:
    """The prediction for one configuration `cfg` (CONFIG_FIELDS) on the request's target: the
    throughput model's, anchored on its layout family's evidence unless `anchors` is None, with the
    interval of anchor.interval_halves for the distance to the nearest recorded run of its exact
    layout (`by_layout`: layout_distances). Adds `evidence_distance` (None: never recorded) and
    `supported`. Raises ValueError when the configuration cannot be costed."""
    layout = tuple(cfg[f] for f in LAYOUT_FIELDS)
    d_ev = by_layout.get(layout)
    pred = prep.model.predict(_run_record(cfg, prep.ctx), prep.ctx["framework"])
    corr = anchors.correction(cfg) if anchors is not None else (0.0, None, 1.0)
    out = anchored(pred, *corr, prep.fit.loo_log_q80, evidence_distance=d_ev)
    out["evidence_distance"] = d_ev
    out["supported"] = d_ev is not None and d_ev <= SUPPORT_DISTANCE
    return out


def scored(prep: Prepared, skip: set[tuple] | None = None, *, anchor: bool = True,
           configs: list[dict[str, Any]] | None = None) -> list[Scored]:
    """Every valid configuration for the target (layouts(); or `configs`, the configurations
    /predict is asked about), except those in `skip` (tuples of CONFIG_FIELDS), with its prediction
    (predicted_for): anchored on the residuals of the nearest recorded runs of its layout unless
    `anchor` is False (the model's own prediction). A configuration the model cannot cost is left out."""
    ctx, rows = prep.ctx, prep.rows
    by_layout = layout_distances(prep)
    # layouts that ran at the target's size class (or the nearest recorded one) at the nearest
    # node counts: "what worked" (/suggest says when it proposes another: exploration)
    sizes = {r["model_size_class"] for r in rows if r["model_size_class"]}
    near_size = min(sizes, key=lambda z: (abs(math.log(z / ctx["size_class"])), z)) if sizes else None
    same = [r for r in rows if r["model_size_class"] == near_size and r["gpu_type"] == ctx["gpu_type"]] or \
        [r for r in rows if r["model_size_class"] == near_size]
    gap = min((abs(math.log(r["nodes"] / ctx["nodes"])) for r in same if r["nodes"]), default=0.0)
    worked = {tuple(_value(r, f) for f in LAYOUT_FIELDS) for r in same
              if r["nodes"] and abs(math.log(r["nodes"] / ctx["nodes"])) <= gap + WORKED_NODES_SLACK}
    anchors = anchors_for(prep) if anchor else None
    out = []
    for cfg in layouts(ctx, rows) if configs is None else configs:
        if skip and tuple(cfg[f] for f in CONFIG_FIELDS) in skip:
            continue
        try:
            pred = predicted_for(prep, cfg, anchors, by_layout)
        except ValueError:
            continue
        d_ev = pred["evidence_distance"]
        widen = MAX_WIDEN if d_ev is None else min(d_ev, MAX_WIDEN)
        out.append(Scored(cfg, pred, widen, tuple(cfg[f] for f in LAYOUT_FIELDS) in worked))
    return out


def anchored(pred: dict[str, Any], log_corr: float, d0: float | None, variance: float, q80: float, *,
             evidence_distance: float | None = None) -> dict[str, Any]:
    """The model's prediction corrected by the residuals of the nearest recorded runs of the same
    layout (service/analytics/anchor.py): tokens/s/GPU, MFU and step time scaled by exp(log_corr);
    the interval's log half-widths are anchor.interval_halves: the fit's held-out 80 % half-width
    `q80` times √variance (the kriging variance left after the evidence; 1 without any), widened by
    the distance to the nearest recorded run of the exact layout (`evidence_distance`), and much
    lower below for a layout unsupported near the target. `anchor` says by how much, how near the
    evidence is and what is left of the uncertainty."""
    f = math.exp(log_corr)
    out = dict(pred)
    tps = pred["tokens_per_sec_per_gpu"] * f
    out["model_tokens_per_sec_per_gpu"] = pred["tokens_per_sec_per_gpu"]
    out["tokens_per_sec_per_gpu"] = tps
    out["mfu"] = pred["mfu"] * f
    out["step_time_s"] = pred["step_time_s"] / f
    lower, upper = interval_halves(q80, variance, evidence_distance)
    out["interval"] = [tps * math.exp(-lower), tps * math.exp(upper)]
    out["anchor"] = {"factor": f, "evidence_distance": d0, "variance": variance}
    return out


def p_fits(mem: Any, exact: dict[str, Any] | None) -> float:
    """Probability that a configuration fits in the GPU's usable memory: 1 when it ran on this very
    target (`exact`) or the GPU's memory is unknown; else Φ(ln(usable / predicted peak) / σ) with σ the
    memory model's held-out log error (MEMORY_LOG_SIGMA) — its errors taken as log-normal."""
    usable, peak = mem.usable_memory_gib, mem.predicted_peak_memory_gib
    if exact is not None or not usable or not peak:
        return 1.0
    z = math.log(usable / peak) / MEMORY_LOG_SIGMA
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))


def admissible(prep: Prepared, item: Scored, counts: dict[str, int], *,
               margin: float = 0.0) -> tuple[Any, dict[str, Any] | None] | None:
    """(memory estimate, the recorded run on this very target or None) when the configuration
    may be proposed; None when a recorded OOM implies it does not fit or the memory model says
    so — with `margin`, when its predicted peak × (1 + margin) exceeds the usable memory (a
    configuration that ran on the target is never ruled out). Counts rejections."""
    exact = _exact(item.config, prep.ctx, prep.rows)
    mem = estimate_memory(_run_record(item.config, prep.ctx))
    if exact is None:
        if oom_implied(item.config, prep.ctx, prep.ooms) is not None:
            counts["oom_rejected"] = counts.get("oom_rejected", 0) + 1
            return None
        tight = (margin > 0 and mem.usable_memory_gib is not None
                 and mem.predicted_peak_memory_gib * (1.0 + margin) > mem.usable_memory_gib)
        if mem.fits is False or tight:
            counts["memory_rejected"] = counts.get("memory_rejected", 0) + 1
            return None
    return mem, exact


def target_body(prep: Prepared) -> dict[str, Any]:
    """The completed target as the answers show it."""
    ctx = prep.ctx
    return {**{k_: v for k_, v in ctx.items() if k_ != "size_class"}, "model_size_class": ctx["size_class"],
            "world_size": ctx["nodes"] * ctx["gpus_per_node"]}


def empty_answer(target: Target, reason: str) -> dict[str, Any]:
    """The answer when nothing is recorded to complete the target from: no candidates, and why
    (a valid question with no data is not a client error)."""
    return {"target": {**target.__dict__, "model_size_class": model_size_class(target.model_params),
                       "world_size": target.world_size},
            "model": th.Fit(dict(th.PRIOR), "prior", {}, reason="no recorded runs").describe(),
            "candidates": [], "suggestions": [], "best_recorded": None, "notes": [reason],
            "measured_on_target": [], "cell": None,
            "counts": {"layouts": 0, "memory_rejected": 0, "oom_rejected": 0}}


def recommend(
    session: Session, target: Target, *, k: int = 5, metric: str = "tokens_per_sec_per_gpu", anchor: bool = True,
    skip_recorded: bool = False,
) -> dict[str, Any]:
    """Up to k candidates for the target, best first (module docstring), after what was measured
    on it.

    Returns {"target": the completed target, "model": the throughput fit used (status, fitted-on
    runs, held-out error), "measured_on_target": up to k runs measured on the target's heatmap
    cell (service/analytics/on_target.measured: every framework and precision, labelled, the
    costed precision first, then the model nearest the size asked, then best), "cell": its counts,
    "candidates": [{config, origin, predicted {tokens_per_sec_per_gpu, mfu,
    peak_memory_gib, interval, step_time_s, breakdown_s}, measured | None, evidence [...],
    memory {...}, why}], "notes": [...], "counts": {...}}. `metric` "mfu" ranks by predicted MFU
    (the same order on one target). `anchor` False ranks by the throughput model alone (no
    evidence anchoring: bench/recommend_holdout.py compares the two). `skip_recorded`: the
    candidates are the layouts not run on the target ("What worked?": what ran there is listed
    first, measured); else every layout, one that ran on the target with `measured` beside its
    prediction (the planner's best configuration at a scale). Raises BadRequest for a bad target."""
    keys = ("target", "model", "measured_on_target", "cell", "candidates", "notes", "counts")
    try:
        prep = prepare(session, target, measured_limit=k)
    except NothingRecorded as exc:
        answer = empty_answer(target, exc.message)
        return {k_: answer[k_] for k_ in keys}
    items = scored(prep, recorded_on_target(session, prep.ctx) if skip_recorded else None, anchor=anchor)
    key = "mfu" if metric == "mfu" else "tokens_per_sec_per_gpu"
    counts = {"layouts": len(items), "memory_rejected": 0, "oom_rejected": 0}

    def low(e: Scored) -> float:  # the lower end of the interval (of the MFU for metric=mfu)
        return float(e.predicted[key] * e.predicted["interval"][0] / e.predicted["tokens_per_sec_per_gpu"])

    def tie(e: Scored) -> tuple:
        return tuple(str(e.config[f]) for f in CONFIG_FIELDS)

    # ranked by what the step is expected to deliver: the lower end of the predicted interval times the
    # probability that the configuration fits (an OOM delivers nothing) — of two layouts predicted alike,
    # the one with memory to spare ranks first. As p_fits ≤ 1, a layout's lower end bounds its score:
    # walked in that order, the walk stops once k admitted layouts score at least the next one's bound
    items.sort(key=lambda e: (-low(e), tie(e)))
    kept: list[tuple[float, Scored, tuple[Any, dict[str, Any] | None]]] = []
    best_k: list[float] = []  # min-heap of the k best scores so far: best_k[0] is the k-th
    for item in items:
        if len(best_k) >= k and best_k[0] >= low(item):
            break
        ok = admissible(prep, item, counts, margin=MEMORY_MARGIN)
        if ok is not None:
            score = low(item) * p_fits(*ok)
            kept.append((score, item, ok))
            if len(best_k) < k:
                heapq.heappush(best_k, score)
            else:
                heapq.heappushpop(best_k, score)
    kept.sort(key=lambda e: (-e[0], tie(e[1])))
    out: list[dict[str, Any]] = []
    for _, item, ok in kept[:k]:
        out.append(candidate(item.config, prep.ctx, item.predicted, ok[0], ok[1], prep.rows))
    found = prep.measured
    notes = prep.notes + on_target.disagreement_notes(found)
    if found.runs and not out:
        notes.append(f"no layout {'that was not run on this target ' if skip_recorded else ''}is predicted to "
                     f"fit; {found.n_configurations} configuration(s) measured on it are listed first: the record "
                     "wins over the memory model")
    return {"target": target_body(prep), "model": prep.fit.describe(), "measured_on_target": found.runs,
            "cell": found.summary(prep.cell), "candidates": out, "notes": notes, "counts": counts}


def recorded_on_target(session: Session, ctx: dict[str, Any]) -> set[tuple]:
    """Configurations with any recorded run (any status, not retired) on this very target."""
    cols = [getattr(Run, f) for f in CONFIG_FIELDS]
    q = sa.select(*cols).distinct().where(Run.model_size_class == ctx["size_class"], Run.nodes == ctx["nodes"],
                                          Run.gpu_type == ctx["gpu_type"], Run.seq_len == ctx["seq_len"],
                                          Run.retired_at.is_(None))
    return {tuple(_value(dict(zip(CONFIG_FIELDS, r)), f) for f in CONFIG_FIELDS) for r in session.execute(q)}


def candidate(cfg: dict[str, Any], ctx: dict[str, Any], pred: dict[str, Any], mem: Any,
               exact: dict[str, Any] | None, rows: list[dict[str, Any]]) -> dict[str, Any]:
    evidence = _evidence(cfg, ctx, rows)
    fit_gpu = pred["fit"][0]
    why = ("ran on this very target; " if exact else "") + (
        f"predicted by the {pred['fit'][2]} model of {pred['fit'][1]} on {fit_gpu}")
    if fit_gpu and fit_gpu != ctx["gpu_type"]:
        why += f", carried to {ctx['gpu_type']} through peak FLOP/s and link-bandwidth ratios"
    anchor = pred.get("anchor") or {}
    if anchor.get("evidence_distance") is not None:
        why += (f"; ×{anchor['factor']:.2f} for how far the model was off on the recorded runs of this layout "
                f"(uncertainty left {100 * math.sqrt(anchor['variance']):.0f} % of the model's)")
    far = [e for e in evidence if e["gpu_type"] != ctx["gpu_type"] or e["model_size_class"] != ctx["size_class"]]
    if evidence and len(far) == len(evidence):
        e = evidence[0]
        why += f"; nearest evidence: {e['model_size_class']:g}B × {e['nodes']} nodes on {e['gpu_type']}"
    measured = None
    if exact is not None:
        measured = {"tokens_per_sec_per_gpu": exact["tokens_per_sec_per_gpu"], "n_runs": exact["n_runs"],
                    "run_id": exact["first_id"], "peak_memory_gib": exact["peak_memory_gib"],
                    "framework": exact["framework"], "precision": exact["precision"]}
    return {
        "config": cfg,
        "origin": "recorded on this target" if exact else "predicted",
        "global_batch_tokens": cfg["dp"] * cfg["micro_batch_size"] * cfg["grad_accum_steps"] * ctx["seq_len"],
        "predicted": {"tokens_per_sec_per_gpu": pred["tokens_per_sec_per_gpu"], "mfu": pred["mfu"],
                      "peak_memory_gib": mem.predicted_peak_memory_gib, "interval": pred["interval"],
                      "step_time_s": pred["step_time_s"], "breakdown_s": pred["breakdown_s"],
                      "bandwidth_source": pred["bandwidth_source"]},
        "measured": measured,
        "evidence": evidence,
        "memory": {"fits": mem.fits, "predicted_peak_memory_gib": mem.predicted_peak_memory_gib,
                   "gpu_memory_gib": mem.gpu_memory_gib, "p_fits": round(p_fits(mem, exact), 3)},
        "why": why,
    }
