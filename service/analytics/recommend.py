""""What worked on N nodes for an xB model?" — nearest recorded configurations, adapted to a target.

DESIGN §4. Recorded successful runs are grouped by configuration (model size class, nodes, GPUs per
node, gpu_type, seq_len and the parallel config). A group with the target's size class and node
count (and gpu_type/seq_len when given) is an exact match and answers with its recorded numbers.
Otherwise groups are ranked by a distance

    d = |ln(size/size*)| + |ln(nodes/nodes*)| + |ln(seq/seq*)| + hardware penalty

(0 for the same GPU type or when the target names none, 0.5 for the same vendor, 1 otherwise) and
their config is adapted: TP/PP/CP/EP/ZeRO/MBS/recompute kept, DP set from the target world size
(world/(TP·PP·CP), which must be exact), GAS set to hit the target global batch (default: the
neighbour's global batch). Adapted configs are checked against the memory model
(service/analytics/memory.py) and against recorded OOMs of the same model size with the same or
less sharding (same TP·PP·CP, same or lower ZeRO stage, same or larger micro-batch and recompute no
stronger): such configs are dropped, unless the very configuration has a recorded success.
"""

from __future__ import annotations

import math
import re
import statistics
from dataclasses import dataclass
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from service import hardware
from service.analytics.heatmap import metric_expr
from service.derive import model_size_class
from service.errors import BadRequest
from service.ranking import best_order
from service.tables import Run

CONFIG_FIELDS = ("dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size", "grad_accum_steps", "recompute")
#: a recorded configuration: successful runs with equal values of these are one group
GROUP_FIELDS = ("model_size_class", "nodes", "gpus_per_node", "gpu_type", "seq_len", "dp", "tp", "pp", "cp", "ep",
                "zero_stage", "micro_batch_size", "grad_accum_steps", "recompute")
_RECOMPUTE_RANK = {None: 0, "none": 0, "selective": 1, "full": 2}

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?\d+)?)\s*([kKmMbBgGtT]?)\s*$")
_SCALE = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_model_params(value: str | float) -> int:
    """'8B' | '1.34B' | '8e9' | '470' | 8030261248 -> parameter count.

    A bare number below 10,000 is read as billions ("8" -> 8e9). Raises BadRequest naming the value.
    """
    if isinstance(value, (int, float)):
        n = float(value)
    else:
        m = _SIZE.match(str(value))
        if not m:
            raise BadRequest(f"model_params '{value}' is not a size like 8B, 1.34B or 8e9",
                             [{"field": "model_params", "value": value, "message": "unparseable size"}])
        n = float(m.group(1)) * _SCALE[m.group(2).lower()]
    if n < 1e4:
        n *= 1e9
    if not math.isfinite(n) or n <= 0:
        raise BadRequest(f"model_params '{value}' must be positive",
                         [{"field": "model_params", "value": value, "message": "must be positive"}])
    return int(n)


@dataclass
class Target:
    """What the user plans: model size (params), nodes × gpus_per_node of gpu_type, seq_len, batch."""

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

    @property
    def world_size(self) -> int:
        return self.nodes * self.gpus_per_node


def _hw_penalty(target_gpu: str | None, gpu: str | None) -> float:
    if not target_gpu:
        return 0.0
    if gpu == target_gpu:
        return 0.0
    a, b = hardware.lookup(target_gpu), hardware.lookup(gpu)
    if a and b and a.vendor == b.vendor and a.name.split("-")[0] == b.name.split("-")[0]:
        return 0.25
    if a and b and a.vendor == b.vendor:
        return 0.5
    return 1.0


def _log_ratio(a: float | None, b: float | None) -> float:
    if not a or not b:
        return 0.0
    return abs(math.log(a / b))


def recommend(session: Session, target: Target, *, k: int = 5, metric: str = "tokens_per_sec_per_gpu",
              memory_check: bool = True) -> list[dict[str, Any]]:
    """Up to k candidates, best first: exact recorded matches by metric, then adapted neighbours by
    distance. Each candidate: config, recorded metrics, evidence (run ids, count, spread), distance,
    match ("exact" | "adapted"), memory check, why and risk. Raises BadRequest on a bad target.
    Everything is read from `runs` in this request (groups, recorded OOMs, evidence)."""
    if target.nodes < 1 or target.gpus_per_node < 1:
        raise BadRequest("nodes and gpus_per_node must be >= 1",
                         [{"field": "nodes", "value": target.nodes, "message": "must be >= 1"}])
    target_gpu = hardware.canonical_gpu_type(target.gpu_type) or target.gpu_type
    size_class = model_size_class(target.model_params)
    value = metric_expr(metric)
    rows = _groups(session, size_class, target, value)
    ooms = _recorded_ooms(session, size_class)

    # every group's adapted config and rank (cheap), then the full candidate only for the
    # first configs that survive the OOM and memory checks
    # (ties in the ranking go to the group whose best run has the lower id)
    ranked: list[tuple] = []
    for r in rows:
        exact = (r["model_size_class"] == size_class and r["nodes"] == target.nodes
                 and r["gpus_per_node"] in (None, target.gpus_per_node)
                 and (not target_gpu or r["gpu_type"] == target_gpu)
                 and (not target.seq_len or r["seq_len"] == target.seq_len))
        adapted = _adapt_config(r, r["best"]["global_batch_tokens"], target)
        if adapted is None:
            continue
        config, changed = adapted
        match = "exact" if exact and not changed else "adapted"
        distance = 0.0 if exact else round(
            _log_ratio(r["model_size_class"], size_class) + _log_ratio(r["nodes"], target.nodes)
            + _log_ratio(r["seq_len"], target.seq_len) + _hw_penalty(target_gpu, r["gpu_type"]), 4)
        ranked.append((match != "exact", distance, -(r["best"]["value"] or 0), r["best"]["id"], r, config, changed,
                       match))
    ranked.sort(key=lambda e: e[:4])
    firsts: dict[tuple, list] = {}  # config → [its best-ranked group's entry, how many more groups]
    for entry in ranked:
        key = tuple(entry[5][f] for f in CONFIG_FIELDS)
        if key in firsts:
            firsts[key][1] += 1
        else:
            firsts[key] = [entry, 0]

    out: list[dict[str, Any]] = []
    for (_, distance, _, _, r, config, changed, match), also in firsts.values():
        cand = _candidate(r, target, target_gpu, config, changed, match)
        cand["distance"] = distance
        cand["evidence"]["also_supported_by"] = also
        if cand["match"] == "adapted" and _blocked_by_oom(cand, size_class, ooms):
            continue
        _attach_memory(cand, target, target_gpu, enabled=memory_check)
        if cand["memory"].get("fits") is False:
            if cand["match"] == "adapted":
                continue
            cand["memory"]["note"] = ("the memory model predicts no fit, but this configuration ran "
                                      "successfully: the recorded run outranks the prediction")
        out.append(cand)
        if len(out) >= k:
            break
    _fill_evidence(session, value, out)
    return out


def _groups(session: Session, size_class: float | None, target: Target,
            value: sa.ColumnElement) -> list[dict[str, Any]]:
    """Successful runs grouped by configuration (GROUP_FIELDS), from one query over `runs`: per
    group `n_runs`, `n_values`/`vmin`/`vmax` of the metric `value` and its best run (`best`: id,
    value, mfu_eff, tps, peak_memory_gib, global_batch_tokens) — first in service/ranking.py's
    order. Limited to size classes and node counts within a factor of 16 of the target; widened
    to everything when that window is empty."""
    windows = ([((size_class / 16, size_class * 16), (max(1, target.nodes // 16), target.nodes * 16))]
               if size_class else [])
    for window in (*windows, (None, None)):
        rows = _group_rows(session, value, *window)
        if rows:
            return rows
    return []


def _group_rows(session: Session, value: sa.ColumnElement, sizes: tuple[float, float] | None,
                nodes: tuple[int, int] | None) -> list[dict[str, Any]]:
    part = _group_cols()
    mfu = sa.func.coalesce(Run.mfu_derived, Run.mfu)
    conds = [Run.status == sa.literal_column("'success'"), Run.model_size_class.is_not(None), Run.nodes.is_not(None)]
    if sizes is not None and nodes is not None:
        conds += [Run.model_size_class.between(*sizes), Run.nodes.between(*nodes)]
    inner = (sa.select(*part, Run.id, value.label("value"), mfu.label("mfu_eff"), Run.tokens_per_sec_per_gpu,
                       Run.peak_memory_gib, Run.global_batch_tokens,
                       sa.func.count().over(partition_by=part).label("n_runs"),
                       sa.func.count(value).over(partition_by=part).label("n_values"),
                       sa.func.min(value).over(partition_by=part).label("vmin"),
                       sa.func.max(value).over(partition_by=part).label("vmax"),
                       sa.func.row_number().over(partition_by=part, order_by=best_order(value, mfu, Run.id))
                       .label("rn"))
             .where(*conds).subquery())
    out = []
    for r in session.execute(sa.select(inner).where(inner.c.rn == 1)).mappings():
        g = {f: r[f] for f in GROUP_FIELDS}
        g.update(n_runs=r["n_runs"], n_values=r["n_values"], vmin=r["vmin"], vmax=r["vmax"],
                 best={"id": r["id"], "value": r["value"], "mfu_eff": r["mfu_eff"],
                       "tps": r["tokens_per_sec_per_gpu"], "peak_memory_gib": r["peak_memory_gib"],
                       "global_batch_tokens": r["global_batch_tokens"]})
        out.append(g)
    return out


_TOP_IDS = 20


def _group_cols() -> list[sa.ColumnElement]:
    return [getattr(Run, f) for f in GROUP_FIELDS]


def _fill_evidence(session: Session, value: sa.ColumnElement, candidates: list[dict[str, Any]]) -> None:
    """For the returned candidates only: evidence.source_run_ids (the group's first 20 runs in the
    ranking order) and evidence.spread (min, max and population stdev of the metric over the
    group's runs, None without values), from one query over the runs of their groups."""
    groups = {tuple(c["_group"][f] for f in GROUP_FIELDS): c["_group"] for c in candidates}
    runs: dict[tuple, list[tuple]] = {}  # {group key: [(metric missing, -metric, mfu missing, -mfu, run id)]}
    if groups:
        mfu = sa.func.coalesce(Run.mfu_derived, Run.mfu)
        exact = sa.or_(*[sa.and_(*[(col.is_(None) if g[f] is None else col == g[f])
                                   for f, col in zip(GROUP_FIELDS, _group_cols(), strict=True)])
                         for g in groups.values()])
        query = sa.select(*_group_cols(), Run.id, value.label("value"), mfu.label("mfu")).where(
            Run.status == "success", exact)
        for r in session.execute(query).all():
            runs.setdefault(tuple(r[:len(GROUP_FIELDS)]), []).append(
                (r.value is None, -(r.value or 0.0), r.mfu is None, -(r.mfu or 0.0), r.id))
    for cand in candidates:
        g = cand.pop("_group")
        ranked = sorted(runs.get(tuple(g[f] for f in GROUP_FIELDS), []))
        cand["evidence"]["source_run_ids"] = [entry[-1] for entry in ranked[:_TOP_IDS]]
        values = [-entry[1] for entry in ranked if not entry[0]]
        if values:
            cand["evidence"]["spread"] = {"min": g["vmin"], "max": g["vmax"],
                                          "stdev": statistics.pstdev(values) if len(values) > 1 else 0.0}


def _adapt_config(g: dict[str, Any], best_gbt: int | None, target: Target) -> tuple[dict[str, Any], list[str]] | None:
    """The config of group `g` (its GROUP_FIELDS; `best_gbt` the global batch of its best run)
    adapted to the target — TP/PP/CP/EP, ZeRO stage, MBS and recompute kept, DP from the
    target's world size, GAS to hit the target global batch — and the fields that changed; None
    when the target's world size does not divide into the group's TP·PP·CP (or DP·CP into EP)."""
    tp, pp, cp, ep = g["tp"], g["pp"] or 1, g["cp"] or 1, g["ep"] or 1
    world = target.world_size
    if world % (tp * pp * cp):
        return None
    dp = world // (tp * pp * cp)
    if (dp * cp) % ep:
        return None
    seq = target.seq_len or g["seq_len"]
    mbs = g["micro_batch_size"]
    gas = g["grad_accum_steps"]
    # GAS hits the target global batch; without a target, the neighbour's global batch is kept
    # (only when the neighbour reported its GAS: a batch we cannot reproduce is not invented)
    gbt_target = target.global_batch_tokens or (best_gbt if gas else None)
    if gbt_target and mbs and seq:
        gas = max(1, round(gbt_target / (dp * mbs * seq)))
    config = {"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "zero_stage": g["zero_stage"],
              "micro_batch_size": mbs, "grad_accum_steps": gas, "recompute": g["recompute"]}
    return config, [f for f in CONFIG_FIELDS if config[f] != g[f]]


def _candidate(g: dict[str, Any], target: Target, target_gpu: str | None, config: dict[str, Any],
               changed: list[str], match: str) -> dict[str, Any]:
    """The answer's candidate for group `g` adapted to `config` (see _adapt_config)."""
    seq = target.seq_len or g["seq_len"]
    dp, mbs, gas = config["dp"], config["micro_batch_size"], config["grad_accum_steps"]
    best = g["best"]
    source = {f: g[f] for f in ("model_size_class", "nodes", "gpus_per_node", "gpu_type", "seq_len")}
    why = ("recorded on this very target" if match == "exact" else
           f"recorded on {g['model_size_class']}B × {g['nodes']} nodes"
           f"{' of ' + g['gpu_type'] if g['gpu_type'] else ''}"
           f"{', seq ' + str(g['seq_len']) if g['seq_len'] else ''}"
           f"{'; adapted ' + ', '.join(changed) if changed else ''}")
    return {
        "_group": g,
        "match": match,
        "config": config,
        "nodes": target.nodes,
        "gpus_per_node": target.gpus_per_node,
        "gpu_type": target_gpu or g["gpu_type"],
        "seq_len": seq,
        "global_batch_tokens": dp * mbs * gas * seq if (mbs and gas and seq) else None,
        "adapted_fields": changed,
        "source": source,
        "metrics": {"value": best["value"], "tokens_per_sec_per_gpu": best["tps"], "mfu": best["mfu_eff"],
                    "peak_memory_gib": best["peak_memory_gib"]},
        # source_run_ids and spread: _fill_evidence, for the returned candidates only
        "evidence": {"n_runs": g["n_runs"], "source_run_ids": [], "best_run_id": best["id"],
                     "spread": None, "also_supported_by": 0},
        "why": why,
        "risk": "low: measured on this configuration" if match == "exact" else
                "medium: extrapolated from a neighbouring configuration; measure before committing",
    }


def _recorded_ooms(session: Session, size_class: float | None) -> list[dict[str, Any]]:
    """The distinct sharding configs (tp, pp, cp, zero_stage, micro_batch_size, recompute,
    seq_len, dp) of the recorded OOMs of this model size class."""
    if size_class is None:
        return []
    fields = ("tp", "pp", "cp", "zero_stage", "micro_batch_size", "recompute", "seq_len", "dp")
    query = (sa.select(*(getattr(Run, f) for f in fields))
             .where(Run.status == sa.literal_column("'oom'"),  # inlined: partial index ix_runs_oom
                    Run.model_size_class == size_class).distinct())
    return [dict(zip(fields, r, strict=True)) for r in session.execute(query).all()]


def _blocked_by_oom(cand: dict[str, Any], size_class: float | None, ooms: list[dict[str, Any]]) -> bool:
    """True when a recorded OOM of the same model had the same or more sharding than this config
    (same TP/PP/CP, ZeRO stage ≥ ours and, when we shard over DP, DP ≥ ours), no larger
    micro-batch, no shorter sequence and no weaker recompute: then this config needs at least as
    much memory as one that ran out."""
    c = cand["config"]
    zero_c = c["zero_stage"] or 0
    for o in ooms:
        if (o["tp"], o["pp"] or 1, o["cp"] or 1) != (c["tp"], c["pp"], c["cp"]):
            continue
        zero_o = o["zero_stage"] or 0
        as_sharded = zero_o >= zero_c and (zero_c == 0 or (o["dp"] or 1) >= c["dp"])
        if (as_sharded
                and (o["micro_batch_size"] or 1) <= (c["micro_batch_size"] or 1)
                and (not o["seq_len"] or not cand["seq_len"] or o["seq_len"] <= cand["seq_len"])
                and _RECOMPUTE_RANK.get(o["recompute"], 0) >= _RECOMPUTE_RANK.get(c["recompute"], 0)):
            cand["blocked_by_oom"] = o
            return True
    return False


def _attach_memory(cand: dict[str, Any], target: Target, target_gpu: str | None, *, enabled: bool) -> None:
    cand["memory"] = {}
    if not enabled:
        return
    try:
        from service.analytics.memory import estimate_memory
    except ImportError:  # memory model not installed in this build
        return
    run = {**cand["config"], "model_params": target.model_params, "seq_len": cand["seq_len"],
           "gpu_type": target_gpu or cand["gpu_type"], "precision": "bf16",
           **{f: getattr(target, f) for f in ("num_layers", "hidden_size", "num_heads", "num_kv_heads",
                                              "ffn_hidden_size", "vocab_size") if getattr(target, f)}}
    try:
        est = estimate_memory(run)
    except ValueError as exc:
        cand["memory"] = {"fits": None, "note": str(exc)}
        return
    cand["memory"] = {"predicted_peak_memory_gib": round(est.predicted_peak_memory_gib, 2),
                      "gpu_memory_gib": est.gpu_memory_gib, "fits": est.fits}
