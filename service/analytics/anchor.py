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
from typing import Any

import numpy as np

from service.analytics import throughput as th

#: bounds and fallback of the correlation length (in recommend's distance units, ln ratios)
LAMBDA_MIN, LAMBDA_MAX, LAMBDA_PRIOR = 0.25, 3.0, math.log(2)
#: pairs of configurations needed to measure the correlation length
MIN_PAIRS = 10
#: a ZeRO stage other than the candidate's counts as far as a GPU of the same vendor (recommend)
ZERO_DISTANCE = 0.5

FAMILY = ("tp", "pp", "cp", "recompute")


def _family(row: dict[str, Any]) -> tuple:
    return (row.get("tp"), row.get("pp"), row.get("cp") or 1, row.get("recompute") or "none")


def _log_ratio(a: Any, b: Any) -> float:
    return abs(math.log(a / b)) if a and b else 0.0


class Anchors:
    """Residuals of the recorded configurations under one fit, grouped by layout family.

    rows: load_configs' dicts; fit: the fit the candidates are predicted with; distance: a
    function (row) -> distance of the row from the target (recommend.distance, bound)."""

    def __init__(self, rows: list[dict[str, Any]], fit: th.Fit, distance: Any):
        self.groups: dict[tuple, list[tuple[dict[str, Any], float, float]]] = defaultdict(list)
        residuals: list[tuple[dict[str, Any], float]] = []
        for r in rows:
            t = th.config_terms(r)
            if t is None or not r.get("tokens_per_sec_per_gpu"):
                continue
            pred = t.tokens_per_gpu / th.step_time(t, fit.params)[0]
            res = math.log(r["tokens_per_sec_per_gpu"] / pred)
            residuals.append((r, res))
            self.groups[_family(r)].append((r, res, distance(r)))
        self.length, self.n_pairs, self.rho_doubling = correlation_length(residuals)

    def correction(self, cfg: dict[str, Any]) -> tuple[float, float | None]:
        """(ln correction factor, d₀ the distance of the nearest evidence or None) for candidate
        `cfg` (configuration fields)."""
        group = self.groups.get(_family(cfg))
        if not group:
            return 0.0, None
        dists = np.array([d + _log_ratio(r["micro_batch_size"], cfg["micro_batch_size"])
                          + (ZERO_DISTANCE if (r.get("zero_stage") or 0) != cfg["zero_stage"] else 0.0)
                          for r, _, d in group])
        res = np.array([x for _, x, _ in group])
        w = np.exp(-dists / self.length)
        d0 = float(dists.min())
        return float(math.exp(-d0 / self.length) * (w @ res) / w.sum()), d0


def correlation_length(residuals: list[tuple[dict[str, Any], float]]) -> tuple[float, int, float | None]:
    """(λ, pairs used, ρ at one doubling) from residuals of recorded configurations: pairs of the
    same layout (family, ZeRO stage, micro-batch), model size class, GPU type and seq_len, one
    doubling of nodes apart (distance ln 2); ρ is their residuals' Pearson
    correlation and λ = ln 2 / −ln ρ. Too few pairs or ρ ≤ 0 → (LAMBDA_PRIOR or LAMBDA_MIN)."""
    by_key: dict[tuple, dict[tuple, float]] = defaultdict(dict)
    for r, x in residuals:
        key = (*_family(r), r.get("zero_stage") or 0, r.get("micro_batch_size"), r.get("gpu_type"), r.get("seq_len"))
        by_key[key][(r.get("model_size_class"), r.get("nodes"))] = x
    a, b = [], []
    for cells in by_key.values():
        for (size, nodes), x in cells.items():
            if nodes and (size, nodes * 2) in cells:
                a.append(x)
                b.append(cells[(size, nodes * 2)])
    if len(a) < MIN_PAIRS:
        return LAMBDA_PRIOR, len(a), None
    rho = float(np.corrcoef(a, b)[0, 1])
    if not math.isfinite(rho) or rho <= 0:
        return LAMBDA_MIN, len(a), rho
    lam = math.log(2) / -math.log(min(rho, 0.999))
    return min(max(lam, LAMBDA_MIN), LAMBDA_MAX), len(a), rho
