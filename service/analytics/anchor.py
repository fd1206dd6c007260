"""Evidence anchoring: the throughput model's prediction for a candidate, corrected by how far the
model was off on the recorded runs of the same layout nearest to the target.

The fitted model (service/analytics/throughput.py) has a handful of parameters for every layout
at once; its residual on a recorded configuration (ln measured − ln predicted) is therefore
partly layout-specific and systematic: a layout the model costs too cheaply at 2 nodes is costed
too cheaply at 1 and 4 nodes as well. Regression kriging (Hengl, Heuvelink & Rossiter 2007,
"About regression-kriging: from equations to case studies", Computers & Geosciences 33) predicts
with the trend model plus the residuals of the nearest observations, weighted by their
correlation with the point predicted; here the trend is the physical model and the residual
field lives on the configuration space:

    ln ŷ(c) = ln model(c) + ρ(d₀) · Σᵢ wᵢ rᵢ / Σᵢ wᵢ,   wᵢ = exp(−dᵢ/λ),  ρ(d) = exp(−d/λ)

over the recorded configurations i of the same TP, PP, CP and recompute as the candidate c; dᵢ
is recommend's distance of the run from the target (|ln size ratio| + |ln nodes ratio| + |ln
seq ratio| + hardware) plus the layout's own difference (|ln micro-batch ratio|, and 0.5 for
another ZeRO stage, as for another GPU of the same vendor), d₀ the smallest. ρ is the residuals'
correlation at distance d₀ (an exponential covariance, the usual kriging choice): evidence far
from the target leaves the model's prediction nearly alone; the same configuration recorded on
the target itself sets the prediction to what was measured.

λ (the correlation length) is measured on the user's own runs, not set: for pairs of recorded
configurations of one layout and model, the correlation of their residuals one doubling of nodes
apart (distance ln 2) gives λ = −ln 2 / ln ρ(ln 2) (`correlation_length`), clipped to
[LAMBDA_MIN, LAMBDA_MAX]; fewer than MIN_PAIRS pairs → LAMBDA_PRIOR.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np

from service.analytics import throughput as th

#: bounds and fallback of the correlation length (in recommend's distance units, ln ratios)
LAMBDA_MIN, LAMBDA_MAX, LAMBDA_PRIOR = 0.25, 3.0, math.log(2)
#: pairs of configurations needed to measure the correlation length
MIN_PAIRS = 10

FAMILY = ("tp", "pp", "cp", "recompute")


def _family(row: dict[str, Any]) -> tuple:
    return (row.get("tp"), row.get("pp"), row.get("cp") or 1, row.get("recompute") or "none")


def _log_ratio(a: Any, b: Any) -> float:
    return abs(math.log(a / b)) if a and b else 0.0


class Anchors:
    """Residuals of the recorded configurations under one fit, grouped by layout family, and the
    simple-kriging weights that carry them to a candidate.

    rows: load_configs' dicts; fit: the fit the candidates are predicted with; distance: a
    function (row) -> distance of the row from the target (recommend.distance, bound)."""

    def __init__(self, rows: list[dict[str, Any]], fit: th.Fit, distance: Any):
        groups: dict[tuple, list[tuple[dict[str, Any], float, float]]] = defaultdict(list)
        residuals: list[tuple[dict[str, Any], float]] = []
        for r in rows:
            t = th.config_terms(r)
            if t is None or not r.get("tokens_per_sec_per_gpu"):
                continue
            pred = t.tokens_per_gpu / th.step_time(t, fit.params)[0]
            res = math.log(r["tokens_per_sec_per_gpu"] / pred)
            residuals.append((r, res))
            groups[_family(r)].append((r, res, distance(r)))
        self.lengths = correlation_lengths(residuals)
        self.groups = dict(groups)

    def scaled_distance(self, r: dict[str, Any], d: float, cfg: dict[str, Any]) -> float:
        """d/λ_target + |ln mbs ratio|/λ_mbs + [other ZeRO stage]/λ_zero: the evidence's distance
        from the candidate on the target, in correlation lengths (ρ = exp(−this))."""
        lam = self.lengths
        zero_diff = 1.0 if (r.get("zero_stage") or 0) != cfg["zero_stage"] else 0.0
        mbs = _log_ratio(r["micro_batch_size"], cfg["micro_batch_size"])
        return (d / lam["target"].length + mbs / lam["mbs"].length
                + zero_diff / lam["zero"].length)

    def correction(self, cfg: dict[str, Any]) -> tuple[float, float | None]:
        """(ln correction factor, d₀ the nearest evidence's distance in correlation lengths, or
        None without evidence) for candidate `cfg` (configuration fields): ρ(d₀) times the
        residuals' mean weighted by their correlation with the candidate (module docstring)."""
        group = self.groups.get(_family(cfg))
        if not group:
            return 0.0, None
        dists = np.array([self.scaled_distance(r, d, cfg) for r, _, d in group])
        res = np.array([x for _, x, _ in group])
        w = np.exp(-dists)
        d0 = float(dists.min())
        return float(math.exp(-d0) * (w @ res) / w.sum()), d0


@dataclass
class Length:
    """A correlation length along one axis: λ, the pairs it was measured on, their ρ (None: prior)."""

    length: float
    n_pairs: int
    rho: float | None


def _length(pairs: list[tuple[float, float]], step: float) -> Length:
    """λ = step / −ln ρ from residual pairs `step` apart (Pearson ρ), clipped; the prior when too
    few pairs or ρ ≤ 0."""
    if len(pairs) < MIN_PAIRS:
        return Length(LAMBDA_PRIOR * step / math.log(2), len(pairs), None)
    a, b = zip(*pairs)
    rho = float(np.corrcoef(a, b)[0, 1])
    if not math.isfinite(rho) or rho <= 0:
        return Length(LAMBDA_MIN * step / math.log(2), len(pairs), rho)
    lam = step / -math.log(min(rho, 0.999))
    return Length(min(max(lam, LAMBDA_MIN * step / math.log(2)), LAMBDA_MAX * step / math.log(2)), len(pairs), rho)


def correlation_lengths(residuals: list[tuple[dict[str, Any], float]]) -> dict[str, Length]:
    """Correlation lengths of the residuals along three axes, from pairs of recorded
    configurations that differ along that axis only (same layout family, GPU type, seq_len):
    "target" — one doubling of nodes (distance ln 2, same size class, micro-batch, ZeRO stage);
    "mbs" — one doubling of the micro-batch (ln 2; same cell and ZeRO stage); "zero" — ZeRO-0 vs
    ZeRO-1 (unit step; same cell and micro-batch)."""
    cells: dict[tuple, float] = {}
    for r, x in residuals:
        key = (*_family(r), r.get("gpu_type"), r.get("seq_len"), r.get("model_size_class"), r.get("nodes"),
               r.get("micro_batch_size"), r.get("zero_stage") or 0)
        cells[key] = x
    nodes_pairs, mbs_pairs, zero_pairs = [], [], []
    for key, x in cells.items():
        *base, nodes, mbs, zero = key
        if nodes and (other := (*base, nodes * 2, mbs, zero)) in cells:
            nodes_pairs.append((x, cells[other]))
        if mbs and (other := (*base, nodes, mbs * 2, zero)) in cells:
            mbs_pairs.append((x, cells[other]))
        if zero == 0 and (other := (*base, nodes, mbs, 1)) in cells:
            zero_pairs.append((x, cells[other]))
    return {"target": _length(nodes_pairs, math.log(2)), "mbs": _length(mbs_pairs, math.log(2)),
            "zero": _length(zero_pairs, 1.0)}
