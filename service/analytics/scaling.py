"""Scaling across node counts for one model size class, and its Amdahl's-law fit (DESIGN §4).

For a model size class (billions, 2 significant figures; service/derive.py) the best successful run
per node count is taken (highest metric; ties → lower id), and

- per-GPU throughput `tokens_per_sec_per_gpu` (tokens/s per GPU) and aggregate throughput
  `aggregate_tokens_per_sec = tokens_per_sec_per_gpu × world_size` (tokens/s);
- `efficiency(n)` = per-GPU metric at n nodes / per-GPU metric at the smallest node count n₀ (1 = linear);
- `speedup(n)` = aggregate metric at n / aggregate metric at n₀ (aggregate metric = per-GPU metric × world size).

Amdahl's law (G. M. Amdahl, "Validity of the single processor approach to achieving large scale
computing capabilities", AFIPS Spring Joint Computer Conference 1967, pp. 483–485):

    speedup(n) = 1 / (s + (1 − s) / n),   n = nodes / n₀ (the smallest measured node count)

`fit_amdahl` finds the serial fraction s ∈ [0, 1] by least squares on the measured speedups (a
bounded one-parameter minimisation: a log-spaced grid, then golden-section refinement; numpy only).
Its standard error is the asymptotic one of nonlinear least squares (as scipy's curve_fit reports
it): var(s) = σ² / Σ J², J = ∂speedup/∂s = −(1 − 1/n) / (s + (1 − s)/n)², σ² = RSS / dof with
dof = n_points − 2 (one parameter, and the base point is fixed at speedup 1 by normalisation).
R² = 1 − RSS/TSS on the speedups. Where more GPUs stop paying: the speedup never exceeds
`max_speedup = 1/s` (× the base throughput), and efficiency = 1 / (s·n + 1 − s) falls to 50 % at
n = 1 + 1/s, reported in nodes as `nodes_at_50pct_efficiency = n₀ · (1 + 1/s)`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import sqlalchemy as sa
from sqlalchemy.orm import Session

from core import hardware
from core.rules import CONFIG_FIELDS, best_slice
from service.analytics.heatmap import METRICS, metric_expr
from service.errors import BadRequest, NotFound
from service.ranking import best_order
from service.tables import Run

_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


def amdahl_speedup(n_rel: float | np.ndarray, s: float) -> float | np.ndarray:
    """Amdahl speedup on n_rel times the base resources with serial fraction s (dimensionless)."""
    return 1.0 / (s + (1.0 - s) / n_rel)


def amdahl_efficiency(n_rel: float, s: float) -> float:
    """Amdahl efficiency speedup/n = 1 / (s·n + 1 − s) at n_rel times the base resources."""
    return 1.0 / (s * n_rel + 1.0 - s)


def fit_amdahl(n_rel: Sequence[float], speedup: Sequence[float]) -> dict[str, Any]:
    """Least-squares fit of Amdahl's serial fraction to measured speedups.

    `n_rel`: resources relative to the base (base = 1); `speedup`: measured speedups (base = 1).
    Needs at least two distinct n_rel (raises ValueError otherwise). Returns {"serial_fraction",
    "serial_fraction_stderr" (None with < 3 points), "r2" (None when the speedups do not vary),
    "max_speedup" (1/s; None for s = 0), "n_rel_at_50pct_efficiency" (1 + 1/s; None for s = 0),
    "rss", "n_points", "at_bound" (s clipped to 0 or 1: superlinear or no speedup at all)}.
    """
    n = np.asarray(n_rel, dtype=float)
    y = np.asarray(speedup, dtype=float)
    if n.shape != y.shape or len(np.unique(n)) < 2 or not (np.all(np.isfinite(n)) and np.all(np.isfinite(y))):
        raise ValueError("need at least two distinct, finite resource counts")

    def rss(s: float) -> float:
        return float(np.sum((y - amdahl_speedup(n, s)) ** 2))

    grid = np.concatenate(([0.0], np.logspace(-7, 0, 1401)))
    values = np.array([rss(s) for s in grid])
    i = int(np.argmin(values))
    lo, hi = grid[max(i - 1, 0)], grid[min(i + 1, len(grid) - 1)]
    a, b = lo + (1 - _GOLDEN) * (hi - lo), lo + _GOLDEN * (hi - lo)
    fa, fb = rss(a), rss(b)
    for _ in range(200):
        if hi - lo < 1e-13:
            break
        if fa < fb:
            hi, b, fb = b, a, fa
            a = lo + (1 - _GOLDEN) * (hi - lo)
            fa = rss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + _GOLDEN * (hi - lo)
            fb = rss(b)
    candidates = [(values[i], grid[i]), (fa, a), (fb, b)]
    best_rss, s = min(candidates)
    s = float(min(max(s, 0.0), 1.0))
    best_rss = rss(s)

    dof = len(n) - 2
    jac = -(1.0 - 1.0 / n) / (s + (1.0 - s) / n) ** 2
    sjj = float(np.sum(jac ** 2))
    stderr = math.sqrt(best_rss / dof / sjj) if dof > 0 and sjj > 0 else None
    tss = float(np.sum((y - y.mean()) ** 2))
    return {
        "serial_fraction": s,
        "serial_fraction_stderr": stderr,
        "r2": 1.0 - best_rss / tss if tss > 0 else None,
        "max_speedup": 1.0 / s if s > 0 else None,
        "n_rel_at_50pct_efficiency": 1.0 + 1.0 / s if s > 0 else None,
        "rss": best_rss,
        "n_points": int(len(n)),
        "at_bound": s <= 0.0 or s >= 1.0,
    }


def _pick_slice(session: Session, gpu_type: str | None, seq_len: int | None, conds: list,
                notes: list[str]) -> tuple[str | None, int | None]:
    """Restrict `conds` to one GPU type and one sequence length: those given, else the slice with the
    most node counts (then the most runs; core.rules.best_slice(most="nodes")) — a curve needs node
    counts, and the most-recorded slice may have one. Says the choice in `notes` when there was one."""
    if gpu_type:
        conds.append(Run.gpu_type == gpu_type)
    if seq_len:
        conds.append(Run.seq_len == seq_len)
    if gpu_type and seq_len:
        return gpu_type, seq_len
    rows = session.execute(
        sa.select(Run.gpu_type, Run.seq_len, sa.func.count().label("runs"),
                  sa.func.count(sa.distinct(Run.nodes)).label("node_counts"))
        .where(*conds, Run.gpu_type.is_not(None))
        .group_by(Run.gpu_type, Run.seq_len)).all()
    # a run that does not record its sequence length is in the slice of those that do not either
    # (one source, one setting: the Llama 3 8B runs at 1, 8 and 16 nodes), never mixed with a known one
    found = [{"gpu_type": r.gpu_type, "seq_len": None if r.seq_len is None else int(r.seq_len), "runs": int(r.runs),
              "node_counts": int(r.node_counts)} for r in rows]
    chosen = best_slice(found, most="nodes")
    if chosen is None:
        return gpu_type, seq_len
    if len(found) > 1:
        asked = " and ".join(p for p, given in (("gpu_type", gpu_type), ("seq_len", seq_len)) if not given)
        length = (f"sequence length {chosen['seq_len']:,}" if chosen["seq_len"] is not None
                  else "a sequence length the runs do not record")
        notes.append(f"runs of this size class were measured in {len(found)} GPU type × sequence length slices; "
                     f"using {chosen['gpu_type']} at {length} ({chosen['node_counts']} node counts, the most; "
                     f"{chosen['runs']:,} runs): pass {asked} to choose")
    if not gpu_type:
        conds.append(Run.gpu_type == chosen["gpu_type"])
    if not seq_len:
        conds.append(Run.seq_len == chosen["seq_len"] if chosen["seq_len"] is not None else Run.seq_len.is_(None))
    return chosen["gpu_type"], chosen["seq_len"]


def scaling(session: Session, size_class: float, *, gpu_type: str | None = None, seq_len: int | None = None,
            metric: str = "tokens_per_sec_per_gpu") -> dict[str, Any]:
    """Best successful run per node count for one model size class, and the Amdahl fit.

    `size_class`: billions (2 significant figures, as stored in runs.model_size_class); `gpu_type`
    any catalog alias; `metric`: tokens_per_sec_per_gpu | mfu (coalesce(mfu_derived, mfu)).
    When gpu_type / seq_len are not given and the class was measured in several (GPU type, sequence
    length) slices, the slice with the most node counts (then the most successful runs) is used
    (core.rules.best_slice(most="nodes"), said in `notes`), so that curves are not mixed and have points.

    Returns {"model_size_class", "metric", "gpu_type", "seq_len", "points": [{"nodes", "world_size",
    "tokens_per_sec_per_gpu", "aggregate_tokens_per_sec", "mfu", "value", "efficiency", "speedup",
    "best_run_id", "config"}], "amdahl": {"serial_fraction", "serial_fraction_stderr", "r2",
    "max_speedup", "nodes_at_50pct_efficiency", "n_points", "base_nodes", "method"} | None,
    "amdahl_reason": str | None, "notes": [str]}. Raises NotFound when no successful run of the class
    (with these filters) has the metric; BadRequest for an unknown metric.
    """
    if metric not in METRICS:
        raise BadRequest(f"unknown metric '{metric}'; one of {', '.join(METRICS)}",
                         [{"field": "metric", "value": metric, "message": "unknown metric"}])
    value = metric_expr(metric)
    notes: list[str] = []
    conds = [Run.status == "success", Run.retired_at.is_(None), Run.model_size_class == size_class,
             Run.nodes.is_not(None), value.is_not(None)]
    if gpu_type:
        gpu_type = hardware.canonical_gpu_type(gpu_type) or gpu_type
    gpu_type, seq_len = _pick_slice(session, gpu_type, seq_len or None, conds, notes)

    best = _best_per_node(session, conds, value)
    if not best:
        raise NotFound(f"no successful run of model size class {size_class:g}B"
                       f"{' on ' + gpu_type if gpu_type else ''}{f' at seq_len {seq_len}' if seq_len else ''} "
                       f"with {metric}", [{"field": "model_params", "value": size_class, "message": "no runs"}])
    if len({r.gpus_per_node for r in best}) > 1:
        notes.append("the best runs use different GPUs per node; speedups follow nodes as asked, "
                     "efficiencies compare per-GPU values")
    points = _points(best, metric, notes)
    amdahl, reason = _amdahl(points, best[0], notes)
    return {"model_size_class": size_class, "metric": metric, "gpu_type": gpu_type, "seq_len": seq_len,
            "points": points, "amdahl": amdahl, "amdahl_reason": reason, "notes": notes}


def _best_per_node(session: Session, conds: list, value: Any) -> list[Run]:
    """The best run (core.rules' order: `value`, then MFU, then the lower id) per node count among
    the runs `conds` select, fewest nodes first."""
    ranked = sa.select(
        Run.id, sa.func.row_number().over(partition_by=Run.nodes,
                                          order_by=best_order(value, sa.func.coalesce(Run.mfu_derived, Run.mfu),
                                                              Run.id)).label("rank"),
    ).where(*conds).subquery()
    return list(session.scalars(sa.select(Run).where(Run.id.in_(sa.select(ranked.c.id).where(ranked.c.rank == 1)))
                                .order_by(Run.nodes)))


def _points(best: list[Run], metric: str, notes: list[str]) -> list[dict[str, Any]]:
    """One curve point per best run (scaling's "points"): per-GPU and aggregate throughput, MFU, the
    metric, efficiency and speedup against the first (smallest) node count. A run whose GPU count is
    unknown gets no speedup, said in `notes`."""
    def metric_of(run: Run) -> float:
        value = (run.tokens_per_sec_per_gpu if metric == "tokens_per_sec_per_gpu"
                 else run.mfu_derived if run.mfu_derived is not None else run.mfu)
        assert value is not None  # the ranked runs have the metric
        return float(value)

    def world_of(run: Run) -> int | None:
        """The run's GPU count: world_size, else nodes × gpus_per_node; None when neither is known
        (never a guessed 1 GPU per node)."""
        if run.world_size:
            return run.world_size
        if run.nodes and run.gpus_per_node:
            return run.nodes * run.gpus_per_node
        notes.append(f"run #{run.id}: world size unknown (no world_size or gpus_per_node): no speedup")
        return None

    base = best[0]
    base_world = world_of(base)
    base_agg = metric_of(base) * base_world if base_world else None
    points: list[dict[str, Any]] = []
    for run in best:
        world = base_world if run is base else world_of(run)
        tps = run.tokens_per_sec_per_gpu
        points.append({
            "nodes": run.nodes, "world_size": world, "tokens_per_sec_per_gpu": tps,
            "aggregate_tokens_per_sec": tps * world if tps is not None and world else None,
            "mfu": run.mfu_derived if run.mfu_derived is not None else run.mfu,
            "value": metric_of(run),
            "efficiency": metric_of(run) / metric_of(base) if metric_of(base) else None,
            "speedup": metric_of(run) * world / base_agg if base_agg and world else None,
            "best_run_id": run.id,
            "config": {f: getattr(run, f) for f in CONFIG_FIELDS},
        })
    return points


def _amdahl(points: list[dict[str, Any]], base: Run, notes: list[str]) -> tuple[dict[str, Any] | None, str | None]:
    """(scaling's "amdahl" object, or None and the reason): fit_amdahl on the points with a speedup,
    resources relative to the base run's node count; what the fit cannot say is added to `notes`."""
    base_nodes = base.nodes
    assert base_nodes is not None
    usable = [p for p in points if p["speedup"] is not None]
    if len(usable) < 2:
        return None, (f"only {len(usable)} node count measured ({base.nodes}); Amdahl's law needs at least two"
                      if usable else "no usable points")
    fit = fit_amdahl([p["nodes"] / base_nodes for p in usable], [p["speedup"] for p in usable])
    s = fit["serial_fraction"]
    amdahl = {
        "serial_fraction": s, "serial_fraction_stderr": fit["serial_fraction_stderr"], "r2": fit["r2"],
        "max_speedup": fit["max_speedup"],
        "nodes_at_50pct_efficiency": base_nodes * fit["n_rel_at_50pct_efficiency"] if s > 0 else None,
        "n_points": fit["n_points"], "base_nodes": base_nodes,
        "method": "least squares on speedup vs nodes/base_nodes, s bounded to [0, 1] (Amdahl 1967)",
    }
    if fit["serial_fraction_stderr"] is None:
        notes.append("two node counts determine s exactly: no standard error (measure a third)")
    if s <= 0:
        notes.append("superlinear or perfectly linear scaling measured: serial fraction at its bound 0, "
                     "no limit in sight within the measured range")
    return amdahl, None


def predicted_efficiency(fit: dict[str, Any], nodes: float) -> float | None:
    """Amdahl efficiency at `nodes` relative to the fit's base node count (1 at the base); None
    without a fit. `fit` is the "amdahl" object of `scaling()`."""
    if not fit or fit.get("serial_fraction") is None:
        return None
    return amdahl_efficiency(nodes / fit["base_nodes"], fit["serial_fraction"])
