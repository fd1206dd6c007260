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
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from core.layout import layout_breaches
from core.model import model_size_class
from service.analytics import on_target
from service.analytics import throughput as th
from service.analytics.anchor import SUPPORT_DISTANCE, Anchors, interval_halves
from service.analytics.fits import MEMORY_MARGIN, fit_shown, oom_implied, p_fits, same_model_rows
from service.analytics.fits import oom_rows as _oom_rows
from service.analytics.memory import estimate_memory
from service.analytics.on_target import CONFIG_FIELDS, DIM_FIELDS, config_value, config_values
from service.analytics.target import CompletedTarget, Target, complete_target, distance, distances
from service.db import fetch_select
from service.errors import BadRequest
from service.tables import RunCell

LAYOUT_FIELDS = ("tp", "pp", "cp", "zero_stage", "micro_batch_size", "recompute")
_POW2 = (1, 2, 4, 8, 16, 32, 64)
#: the most the interval's half-width is widened by (× (1 + widen)) for extrapolation
MAX_WIDEN = 2.0
#: "what worked": layouts recorded at the nearest node count(s) of the size class, up to this far
#: beyond the nearest in |ln(nodes ratio)| (ln 2: the next power of two too)
WORKED_NODES_SLACK = math.log(2) + 1e-9




@dataclass(frozen=True)
class LayoutOptions:
    """The values each layout dimension is tried at for a target (layout_options), ascending."""

    tp: list[int]
    pp: list[int]
    cp: list[int]
    zero_stage: list[int]
    recompute: list[str]
    micro_batch_size: list[int]


def layout_options(ctx: CompletedTarget, rows: list[dict[str, Any]]) -> LayoutOptions:
    """The values the target's framework's records show (every framework's when it has none), plus
    powers of two for TP, PP and the micro-batch; CP 1, ZeRO 0 and no recompute always."""
    fw = [r for r in rows if r["framework"] == ctx.framework] or rows
    return LayoutOptions(tp=sorted({*_POW2, *(r["tp"] for r in fw if r["tp"])}),
                         pp=sorted({*_POW2, *(r["pp"] for r in fw if r["pp"])}),
                         cp=sorted({r["cp"] for r in fw if r["cp"]} | {1}),
                         zero_stage=sorted({r["zero_stage"] or 0 for r in fw} or {0}),
                         recompute=sorted({r["recompute"] or "none" for r in fw} or {"none"}),
                         micro_batch_size=sorted({*_POW2, *(r["micro_batch_size"] for r in fw)}))


def _model_splits(ctx: CompletedTarget, opts: LayoutOptions) -> Iterator[tuple[int, int, int, int]]:
    """(tp, pp, cp, dp) whose TP·PP·CP divides the world size (DP the rest) and that the model can run
    (core.layout.layout_breaches: heads and KV heads over TP, PP ≤ layers, the sequence over CP);
    dims the target does not give do not constrain."""
    world = ctx.world_size
    for tp in opts.tp:
        for pp in opts.pp:
            for cp in opts.cp:
                if world % (tp * pp * cp) or layout_breaches(
                        tp=tp, pp=pp, cp=cp, num_heads=ctx.num_heads, num_kv_heads=ctx.num_kv_heads,
                        num_layers=ctx.num_layers, seq_len=ctx.seq_len):
                    continue
                yield tp, pp, cp, world // (tp * pp * cp)


def _batch_splits(dp: int, seq: int, gbt: int, micro_batch_sizes: list[int]) -> Iterator[tuple[int, int]]:
    """(micro-batch, GAS) that hit the global batch `gbt` (tokens) exactly over `dp` replicas:
    GAS = gbt / (dp·mbs·seq) whole and ≥ 1."""
    for mbs in micro_batch_sizes:
        per = dp * mbs * seq
        if gbt % per or gbt // per < 1:
            continue
        yield mbs, gbt // per


def layouts(ctx: CompletedTarget, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Every valid configuration for the target: the options of layout_options, split over the
    model (_model_splits) and the batch (_batch_splits), with every ZeRO stage (none > 0 without
    a DP·CP group to shard over) and recompute mode recorded."""
    return enumerate_layouts(ctx, layout_options(ctx, rows))


def enumerate_layouts(ctx: CompletedTarget, opts: LayoutOptions, *, dps: list[int] | None = None,
                      eps: list[int] | None = None) -> list[dict[str, Any]]:
    """Every valid configuration of the options `opts` for the target (layouts(); a grid sweep's listed
    values, service/sweeps.py): `dps` keeps only those DP degrees (None: any), `eps` the expert-parallel
    degrees tried (default [1]), each kept where it divides DP·CP (Megatron-Core carves EP out of DP·CP)."""
    gbt = ctx.global_batch_tokens
    assert gbt is not None, "layouts need the target's global batch"
    return [{"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "zero_stage": zero, "micro_batch_size": mbs,
             "grad_accum_steps": gas, "recompute": rc}
            for tp, pp, cp, dp in _model_splits(ctx, opts) if dps is None or dp in dps
            for ep in eps or [1] if (dp * cp) % ep == 0
            for mbs, gas in _batch_splits(dp, ctx.seq_len, gbt, opts.micro_batch_size)
            for zero in opts.zero_stage if not (zero > 0 and dp * cp == 1)
            for rc in opts.recompute]


def _run_record(cfg: dict[str, Any], ctx: CompletedTarget) -> dict[str, Any]:
    """The run record a configuration `cfg` would have on the target: what the throughput and
    memory models read."""
    rec = {k: getattr(ctx, k) for k in ("model_params", "seq_len", "nodes", "gpus_per_node", "gpu_type", "precision",
                                        "framework", *DIM_FIELDS, "gated_linear_unit", "flash_attention")}
    rec.update(cfg)
    return rec


_value = config_value  # (the matching rule lives in on_target, which recommend builds on)


def _evidence(cfg: dict[str, Any], ctx: CompletedTarget, rows: list[dict[str, Any]], n: int = 3,
              dist: Any = None, by_layout: dict[tuple, list[dict[str, Any]]] | None = None) -> list[dict]:
    """The recorded configurations of the same layout nearest to the target (as evidence); `dist`:
    (row) -> its distance from the target (Prepared.distance; default: target.distance); `by_layout`: the
    rows by their LAYOUT_FIELDS values read as _value reads them (Prepared.rows_by_layout), in row order."""
    dist = dist or (lambda r: distance(r, ctx.size_class, ctx.nodes, ctx.seq_len, ctx.gpu_type))
    same = [r for r in rows if all(_value(r, f) == cfg[f] for f in LAYOUT_FIELDS)] if by_layout is None else \
        by_layout.get(tuple(cfg[f] for f in LAYOUT_FIELDS), [])
    if not same:
        same = [r for r in rows if r["tp"] == cfg["tp"] and r["pp"] == cfg["pp"]]
    ranked = sorted(same, key=lambda r: (dist(r), r["first_id"]))
    return [{"run_id": r["first_id"], "model_size_class": r["model_size_class"], "model_params": r["model_params"],
             "gpu_type": r["gpu_type"], "framework": r["framework"], "nodes": r["nodes"],
             "config": {f: r[f] for f in CONFIG_FIELDS}, "n_runs": r["n_runs"],
             "measured_tokens_per_sec_per_gpu": r["tokens_per_sec_per_gpu"],
             "distance": dist(r)}
            for r in ranked[:n]]


def _exact(cfg: dict[str, Any], ctx: CompletedTarget, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    for r in rows:
        if (r["model_size_class"] == ctx.size_class and r["nodes"] == ctx.nodes
                and r["gpu_type"] == ctx.gpu_type
                and r["seq_len"] == ctx.seq_len and r["gpus_per_node"] in (None, ctx.gpus_per_node)
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
    ctx: CompletedTarget
    model: th.Model
    fit: th.Fit
    ooms: list[dict[str, Any]]
    notes: list[str]
    cell: on_target.Cell
    measured: on_target.Measured
    _distances: dict[int, float] = field(default_factory=dict, repr=False)
    _by_layout: dict[tuple, list[dict[str, Any]]] | None = field(default=None, repr=False)
    _same_model: list[dict[str, Any]] | None = field(default=None, repr=False)

    def same_model_rows(self) -> list[dict[str, Any]]:
        """The configuration rows that can show a layout fits (fits.same_model_rows), found once per request."""
        if self._same_model is None:
            self._same_model = same_model_rows(self.ctx, self.rows)
        return self._same_model

    def rows_by_layout(self) -> dict[tuple, list[dict[str, Any]]]:
        """The request's configuration rows by their LAYOUT_FIELDS values (as _value reads them), in row
        order: the evidence of each candidate layout, found once per request."""
        if self._by_layout is None:
            self._by_layout = {}
            for r, key in zip(self.rows, config_values(self.rows, LAYOUT_FIELDS)):
                self._by_layout.setdefault(key, []).append(r)
        return self._by_layout

    def distance(self, r: dict[str, Any]) -> float:
        """target.distance of configuration row `r` from the request's target, computed once per row of
        the request (layout_distances, the anchors and the evidence all ask it of the same rows)."""
        ctx = self.ctx
        if not self._distances:  # every row's at once (target.distances)
            self._distances = dict(zip(map(id, self.rows), distances(self.rows, ctx.size_class, ctx.nodes, ctx.seq_len,
                                                                     ctx.gpu_type)))
        d = self._distances.get(id(r))
        if d is None:
            d = self._distances[id(r)] = distance(r, ctx.size_class, ctx.nodes, ctx.seq_len, ctx.gpu_type)
        return d


def prepare(session: Session, target: Target, *, need_batch: bool = True, measured_limit: int = 10) -> Prepared:
    """Read the runs (aggregated) and OOMs, complete the target (target.complete_target: `need_batch`
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
        ctx, cell, found = complete_target(session, target, rows, notes, need_batch=need_batch,
                                           measured_limit=measured_limit)
    except BadRequest as exc:
        if rows:
            raise
        raise NothingRecorded(f"no recorded successful run to complete the target from: {exc.message}") from exc
    model = th.Model(rows)
    fit = model.fit_for(ctx.gpu_type, ctx.framework)
    if fit.status == "prior" or fit.reason:
        notes.append(fit.reason or "prior parameters")
    return Prepared(rows, ctx, model, fit, _oom_rows(session, ctx), notes, cell, found)


def layout_distances(prep: Prepared) -> dict[tuple, float]:
    """{LAYOUT_FIELDS values: distance from the target to the nearest recorded run of that exact
    layout} over the request's configuration rows (the evidence distance of interval_halves)."""
    return {key: min(map(prep.distance, rows)) for key, rows in prep.rows_by_layout().items()}


def anchors_for(prep: Prepared) -> Anchors:
    """The evidence anchoring of the request's fit (anchor.Anchors), distances from its target."""
    return Anchors(prep.rows, prep.fit, prep.distance,
                   terms_of=lambda rows: prep.model.terms_table(rows, prep.fit.network_gb_s))


def predicted_for(prep: Prepared, cfg: dict[str, Any], anchors: Anchors | None,
                  by_layout: dict[tuple, float]) -> dict[str, Any]:
    """The prediction for one configuration `cfg` (CONFIG_FIELDS) on the request's target: the
    throughput model's, anchored on its layout family's evidence unless `anchors` is None, with the
    interval of anchor.interval_halves for the distance to the nearest recorded run of its exact
    layout (`by_layout`: layout_distances). Adds `evidence_distance` (None: never recorded) and
    `supported`. Raises ValueError when the configuration cannot be costed."""
    out = predicted_many(prep, [cfg], anchors, by_layout)[0]
    if out is None:  # the model says why
        prep.model.predict(_run_record(cfg, prep.ctx), prep.ctx.framework)
        raise ValueError("the configuration cannot be costed")
    return out


def predicted_many(prep: Prepared, cfgs: list[dict[str, Any]], anchors: Anchors | None,
                   by_layout: dict[tuple, float]) -> list[dict[str, Any] | None]:
    """predicted_for() of each configuration in `cfgs`, the model's predictions and the anchors'
    corrections computed as arrays (Model.predict_many, Anchors.corrections); None for one the model
    cannot cost."""
    preds = prep.model.predict_many([_run_record(cfg, prep.ctx) for cfg in cfgs], prep.ctx.framework)
    costed = [i for i, pred in enumerate(preds) if pred is not None]
    corrs = anchors.corrections([cfgs[i] for i in costed]) if anchors is not None else [(0.0, None, 1.0)] * len(costed)
    out: list[dict[str, Any] | None] = [None] * len(cfgs)
    for i, corr in zip(costed, corrs):
        d_ev = by_layout.get(tuple(cfgs[i][f] for f in LAYOUT_FIELDS))
        item = anchored(preds[i], *corr, prep.fit.loo_log_q80, evidence_distance=d_ev)  # type: ignore[arg-type]
        item["evidence_distance"] = d_ev
        item["supported"] = d_ev is not None and d_ev <= SUPPORT_DISTANCE
        out[i] = item
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
    near_size = min(sizes, key=lambda z: (abs(math.log(z / ctx.size_class)), z)) if sizes else None
    same = [r for r in rows if r["model_size_class"] == near_size and r["gpu_type"] == ctx.gpu_type] or \
        [r for r in rows if r["model_size_class"] == near_size]
    gap = min((abs(math.log(r["nodes"] / ctx.nodes)) for r in same if r["nodes"]), default=0.0)
    worked = {tuple(_value(r, f) for f in LAYOUT_FIELDS) for r in same
              if r["nodes"] and abs(math.log(r["nodes"] / ctx.nodes)) <= gap + WORKED_NODES_SLACK}
    anchors = anchors_for(prep) if anchor else None
    cfgs = [cfg for cfg in (layouts(ctx, rows) if configs is None else configs)
            if not (skip and tuple(cfg[f] for f in CONFIG_FIELDS) in skip)]
    out = []
    for cfg, pred in zip(cfgs, predicted_many(prep, cfgs, anchors, by_layout)):
        if pred is None:
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



def admissible(prep: Prepared, item: Scored, counts: dict[str, int], *,
               margin: float = 0.0) -> tuple[Any, dict[str, Any] | None, dict[str, Any] | None] | None:
    """(memory estimate, the recorded run on this very target or None, the recorded run that shows it
    fits though the memory model says otherwise (fit_shown) or None) when the configuration may be
    proposed; None when a recorded OOM implies it does not fit or the memory model says so — with
    `margin`, when its predicted peak × (1 + margin) exceeds the usable memory — and no recorded run
    shows otherwise (a configuration that ran on the target is never ruled out). Counts rejections."""
    exact = _exact(item.config, prep.ctx, prep.rows)
    mem = estimate_memory(_run_record(item.config, prep.ctx))
    shown = None
    if exact is None:
        if oom_implied(item.config, prep.ctx, prep.ooms) is not None:
            counts["oom_rejected"] = counts.get("oom_rejected", 0) + 1
            return None
        tight = (margin > 0 and mem.usable_memory_gib is not None
                 and mem.predicted_peak_memory_gib * (1.0 + margin) > mem.usable_memory_gib)
        if mem.fits is False or tight:
            shown = fit_shown(item.config, prep.ctx, prep.same_model_rows())
            if shown is None:
                counts["memory_rejected"] = counts.get("memory_rejected", 0) + 1
                return None
    return mem, exact, shown


def target_body(prep: Prepared) -> dict[str, Any]:
    """The completed target as the answers show it."""
    return prep.ctx.body()


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
    kept: list[tuple[float, Scored, tuple[Any, dict[str, Any] | None, dict[str, Any] | None]]] = []
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
        out.append(candidate(item.config, prep.ctx, item.predicted, ok[0], ok[1], prep.rows, dist=prep.distance,
                             extrapolates=extrapolation(prep, item), by_layout=prep.rows_by_layout(),
                             shown=ok[2]))
    found = prep.measured
    notes = prep.notes + on_target.disagreement_notes(found)
    if found.runs and not out:
        notes.append(f"no layout {'that was not run on this target ' if skip_recorded else ''}is predicted to "
                     f"fit; {found.n_configurations} configuration(s) measured on it are listed first: the record "
                     "wins over the memory model")
    return {"target": target_body(prep), "model": prep.fit.describe(), "measured_on_target": found.runs,
            "cell": found.summary(prep.cell), "candidates": out, "notes": notes, "counts": counts}


def recorded_on_target(session: Session, ctx: CompletedTarget) -> set[tuple]:
    """Configurations with any finished run (any status, not retired) on this very target (run_cells'
    groups: the finished, not retired runs)."""
    cols = [getattr(RunCell, f) for f in CONFIG_FIELDS]
    q = sa.select(*cols).distinct().where(RunCell.model_size_class == ctx.size_class, RunCell.nodes == ctx.nodes,
                                          RunCell.gpu_type == ctx.gpu_type, RunCell.seq_len == ctx.seq_len)
    return {tuple(_value(dict(zip(CONFIG_FIELDS, r)), f) for f in CONFIG_FIELDS) for r in fetch_select(session, q)[1]}


def extrapolation(prep: Prepared, item: Scored) -> list[str]:
    """Why the prediction for `item` extrapolates, one reason per string (empty: it interpolates): a prior
    or a fit carried from another GPU type or framework (of the same engine family), a node count / model
    size / seq_len outside the fitted group's runs, no recorded run of the exact layout within
    SUPPORT_DISTANCE (anchor.py), a layout family never recorded (the model alone). The one copy of that
    rule: /recommend's candidates, /suggest's suggestions and /predict say it with these words."""
    ctx, fit = prep.ctx, prep.fit
    why: list[str] = []
    frameworks = fit.group.get("frameworks") or [fit.group.get("framework")]  # fitted on (throughput.Model.fit_for)
    if fit.status == "prior":
        why.append("no fit: the documented prior")
    else:
        if fit.group.get("gpu_type") != ctx.gpu_type:
            why.append(f"fitted on {fit.group.get('gpu_type')}, carried to {ctx.gpu_type}")
        if ctx.framework not in frameworks:
            why.append(f"fitted on {fit.group.get('framework')} runs, carried to {ctx.framework}")
        elif len(frameworks) > 1:
            why.append(f"fitted with its engine family's runs: {fit.group.get('framework')}")
    group = [r for r in prep.rows if r["gpu_type"] == fit.group.get("gpu_type") and r["framework"] in frameworks]
    for key, value, text in (("nodes", ctx.nodes, "{:g} nodes"), ("model_size_class", ctx.size_class,
                                                                     "a {:g}B model"),
                             ("seq_len", ctx.seq_len, "seq_len {:g}")):
        seen = [r[key] for r in group if r[key]]
        if seen and not min(seen) <= value <= max(seen):
            why.append(f"{text.format(value)}, outside the fitted runs' {min(seen):g}–{max(seen):g}")
    if group and not any(r["precision"] == ctx.precision for r in group):
        why.append(f"precision {ctx.precision}: no fitted run in it")
    d_ev = item.predicted.get("evidence_distance")
    if d_ev is not None and not item.predicted.get("supported", True):
        why.append(f"no run of this exact layout within {SUPPORT_DISTANCE:g} (nearest {d_ev:.2f}: the |ln| ratios "
                   "of model size, nodes and seq_len, plus the hardware)")
    elif d_ev is None and item.predicted.get("anchor", {}).get("evidence_distance") is not None:
        why.append("no recorded run of this exact layout (ZeRO stage, micro-batch): its family's runs anchor it")
    if item.predicted.get("anchor", {}).get("evidence_distance") is None:
        why.append(f"no recorded run of the layout TP{item.config['tp']} PP{item.config['pp']} CP{item.config['cp']} "
                   f"({item.config['recompute']} recompute): the model alone")
    return why


def candidate(cfg: dict[str, Any], ctx: CompletedTarget, pred: dict[str, Any], mem: Any,
               exact: dict[str, Any] | None, rows: list[dict[str, Any]], dist: Any = None,
               extrapolates: list[str] | None = None,
               by_layout: dict[tuple, list[dict[str, Any]]] | None = None,
               shown: dict[str, Any] | None = None) -> dict[str, Any]:
    """One answer row: the configuration, its prediction (interval included), what was measured of it on
    the target (`exact`), the evidence it rests on, the memory verdict, why — and `extrapolation`: the
    reasons the prediction extrapolates (`extrapolates`, from extrapolation(); empty: it interpolates),
    `shown`: the recorded run that shows it fits against the memory model (fit_shown), said in `why` and
    `memory.fit_shown_by_run_id`; with `evidence_distance` (recommend's distance units to the nearest
    recorded run of the exact layout; None: never recorded) and `supported` (a run within anchor.SUPPORT_DISTANCE)."""
    evidence = _evidence(cfg, ctx, rows, dist=dist, by_layout=by_layout)
    fit_gpu = pred["fit"][0]
    why = ("ran on this very target; " if exact else "") + (
        f"predicted by the {pred['fit'][2]} model of {pred['fit'][1]} on {fit_gpu}")
    if fit_gpu and fit_gpu != ctx.gpu_type:
        why += f", carried to {ctx.gpu_type} through peak FLOP/s and link-bandwidth ratios"
    if shown is not None:
        why += (f"; fits: run #{shown['first_id']} ({shown['nodes']} nodes) ran this layout with no less memory "
                f"per GPU, though the memory model predicts {mem.predicted_peak_memory_gib:.1f} GiB here")
    anchor = pred.get("anchor") or {}
    if anchor.get("evidence_distance") is not None:
        why += (f"; ×{anchor['factor']:.2f} for how far the model was off on the recorded runs of this layout "
                f"(uncertainty left {100 * math.sqrt(anchor['variance']):.0f} % of the model's)")
    far = [e for e in evidence if e["gpu_type"] != ctx.gpu_type or e["model_size_class"] != ctx.size_class]
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
        "global_batch_tokens": cfg["dp"] * cfg["micro_batch_size"] * cfg["grad_accum_steps"] * ctx.seq_len,
        "predicted": {"tokens_per_sec_per_gpu": pred["tokens_per_sec_per_gpu"], "mfu": pred["mfu"],
                      "peak_memory_gib": mem.predicted_peak_memory_gib, "interval": pred["interval"],
                      "step_time_s": pred["step_time_s"], "breakdown_s": pred["breakdown_s"],
                      "bandwidth_source": pred["bandwidth_source"]},
        "measured": measured,
        "evidence": evidence,
        "memory": {"fits": mem.fits, "predicted_peak_memory_gib": mem.predicted_peak_memory_gib,
                   "gpu_memory_gib": mem.gpu_memory_gib, "p_fits": round(p_fits(mem, exact, shown), 3),
                   "fit_shown_by_run_id": shown["first_id"] if shown is not None else None},
        "why": why,
        "extrapolates": bool(extrapolates),
        "extrapolation": list(extrapolates or []),
        "evidence_distance": pred.get("evidence_distance"),
        "supported": bool(pred.get("supported")),
    }
