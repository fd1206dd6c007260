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

    ln ŷ(c) = ln model(c) + ρ(d₀) · Σᵢ wᵢ rᵢ / Σᵢ wᵢ,   wᵢ = ρ(dᵢ) = exp(−dᵢ)

over the recorded configurations i of the same TP, PP, CP and recompute as the candidate c (its
"family"); dᵢ is their distance from the candidate on the target in correlation lengths:
recommend's distance of the run from the target (|ln size ratio| + |ln nodes ratio| + |ln seq
ratio| + hardware) / λ_target + |ln micro-batch ratio| / λ_mbs + [another ZeRO stage] / λ_zero,
d₀ the smallest. ρ is an exponential correlation (the usual kriging choice): evidence far from
the target leaves the model's prediction nearly alone; the same configuration recorded on the
target itself sets the prediction to what was measured. (A plain ρ-weighted mean rather than
the full simple-kriging weights K⁻¹k: those over-extrapolated on the sweep, one top-1 61 % off.)

The uncertainty left is the simple-kriging variance v = (1 + η − kᵀ(K + ηI)⁻¹k)/(1 + η) of the
family's MAX_EVIDENCE runs nearest the target (K their mutual correlations, k theirs with the
candidate, η the NUGGET): 1 without evidence, smaller with more and nearer evidence — the same
layout recorded on both sides of the target leaves less than on one side only. Recommend scales
the fit's held-out interval by √v; /suggest its σ.

The correlation lengths are measured on the user's own runs, not set (`correlation_lengths`):
for pairs of recorded configurations that differ along one axis only — one doubling of nodes,
one doubling of the micro-batch, ZeRO-0 vs ZeRO-1 — the Pearson correlation ρ of their residuals
gives λ = step / −ln ρ, clipped to [LAMBDA_MIN, LAMBDA_MAX] per ln 2 of step; fewer than
MIN_PAIRS pairs → LAMBDA_PRIOR (one doubling = one correlation length). On the sweep: ρ ≈ 0.7 per
node doubling, 0.4–0.5 per micro-batch doubling, 0.6–0.9 between ZeRO stages.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.linalg import cho_factor, get_lapack_funcs

from core import hardware
from service.analytics import throughput as th

#: bounds and fallback of a correlation length, per ln 2 of step (in recommend's distance units, ln
#: ratios): ρ per doubling between 0.06 and 0.79 (a measured ρ outside is not believed to the end)
LAMBDA_MIN, LAMBDA_MAX, LAMBDA_PRIOR = 0.25, 3.0, math.log(2)
#: pairs of configurations needed to measure the correlation length
MIN_PAIRS = 10

FAMILY = ("tp", "pp", "cp", "recompute")
#: the recorded configurations of one family (the nearest to the target) the kriging variance is
#: computed from: bounds its linear system at MAX_EVIDENCE²
MAX_EVIDENCE = 100
#: nugget η relative to the sill: the part of a residual's variance shared with no other
#: configuration (run-to-run noise); keeps K + ηI well conditioned when two recorded
#: configurations are at distance 0 from each other
NUGGET = 0.05

#: The interval of a prediction widens with the distance between the target and the nearest recorded
#: run of the candidate's exact layout (TP, PP, CP, ZeRO stage, micro-batch, recompute; recommend's
#: distance: |ln size ratio| + |ln nodes ratio| + |ln seq ratio| + hardware): each unit of it adds
#: EXTRAPOLATION_PER_DISTANCE to the log half-width, in quadrature with the fit's own held-out error.
#: Measured by bench/interval_calibration.py on the Ultra-Scale sweep under extrapolation (fit on the
#: small node counts or on the other model sizes, predict the held-out cells): the 80 % |log error| of
#: the competitive configurations (within 70 % of their cell's best) is 0.12 with the same layout
#: recorded up to one node doubling away (0.69 units) and 0.15–0.24 one to two units away, where the
#: fit's own held-out error is 0.05–0.08.
EXTRAPOLATION_PER_DISTANCE = 0.15
#: a layout with no recorded run within SUPPORT_DISTANCE of the target (none at a neighbouring scale or
#: model size: two node doublings are 1.39) is unsupported: its prediction's lower end is
#: exp(−UNSUPPORTED_LOWER) of it. On the same extrapolation holdouts, 78 % of the configurations that
#: ran with no recorded run of their layout within 2 units were slower than 70 % of their cell's best,
#: and their log error's 10th / 20th percentiles were −1.39 / −0.88 (against −0.35 / −0.16 with their
#: layout recorded one doubling away): a physically plausible layout nobody ran nearby is often slow for
#: reasons no model term captures (bench/RESULTS.md, issue 25)
SUPPORT_DISTANCE = 2.0
#: a recorded configuration slower than half its cell's best anchors nothing: at that distance from its
#: siblings it was slow for a reason of its own (a hung pipeline engine at 1/40 of its cell's best, a
#: contended network, an allocator thrashing near the memory limit) and its residual says nothing about
#: its layout's neighbours (issue 25: "configurations the fit leaves out as not competitive still anchor
#: predictions"). It still counts as evidence that the layout ran (layout distances) and as a recorded
#: measurement. Measured (bench/recommend_holdout.py): the 8-node holdout's top-1 median error 7.2 → 2.1 %,
#: the 3.57B size holdout's 2.2 → 0.9 %, the 8.86B's 3.8 → 5.0 %; every top-1 count unchanged; at 0.7 (the
#: fit's COMPETITIVE_FRACTION) leave-one-cell-out fell to 10 of 12.
ANCHOR_FRACTION = 0.5
UNSUPPORTED_LOWER = 1.0


def interval_halves(q80: float, variance: float, evidence_distance: float | None) -> tuple[float, float]:
    """(lower, upper) log half-widths of a prediction's 80 % interval: the fit's held-out 80 % |log
    error| `q80` scaled by √variance (the kriging variance its layout family's evidence leaves, 1 without
    any), in quadrature with EXTRAPOLATION_PER_DISTANCE × the distance to the nearest recorded run of
    the exact layout (`evidence_distance`, recommend's distance units; None: never recorded). A layout
    unsupported within SUPPORT_DISTANCE gets UNSUPPORTED_LOWER below (at least) and the distance cap above."""
    base = q80 * math.sqrt(max(variance, 0.0))
    d = SUPPORT_DISTANCE if evidence_distance is None else min(evidence_distance, SUPPORT_DISTANCE)
    half = math.hypot(base, EXTRAPOLATION_PER_DISTANCE * d)
    supported = evidence_distance is not None and evidence_distance <= SUPPORT_DISTANCE
    return (half if supported else max(half, UNSUPPORTED_LOWER)), half


def evidence_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The configuration rows that may anchor a prediction: measured, and at least ANCHOR_FRACTION of
    their cell's best tokens/s/GPU (throughput.cell_key: same target and global batch)."""
    best: dict[tuple, float] = {}
    measured = [r for r in rows if r.get("tokens_per_sec_per_gpu")]
    keys = [th.cell_key(r) for r in measured]
    for r, key in zip(measured, keys):
        best[key] = max(best.get(key, 0.0), float(r["tokens_per_sec_per_gpu"]))
    return [r for r, key in zip(measured, keys)
            if float(r["tokens_per_sec_per_gpu"]) >= ANCHOR_FRACTION * best[key]]


def _family(row: dict[str, Any]) -> tuple:
    return (row.get("tp"), row.get("pp"), row.get("cp") or 1, row.get("recompute") or "none")


def _log_ratio(a: Any, b: Any) -> float:
    return abs(math.log(a / b)) if a and b else 0.0


class Anchors:
    """Residuals of the recorded configurations under one fit, grouped by layout family, and the
    simple-kriging weights that carry them to a candidate.

    rows: load_configs' dicts; fit: the fit the candidates are predicted with; distance: a
    function (row) -> distance of the row from the target (recommend.distance, bound); terms_of:
    (rows) -> their terms as th.rows_terms gives them (default th.rows_terms under the fit's network: pass
    Model.terms_table, which costs the request's rows once)."""

    def __init__(self, rows: list[dict[str, Any]], fit: th.Fit, distance: Any, terms_of: Any = None):
        groups: dict[tuple, list[tuple[dict[str, Any], float, float]]] = defaultdict(list)
        residuals: list[tuple[dict[str, Any], float]] = []
        terms_of = terms_of or (lambda rs: th.rows_terms(rs, fit.network_gb_s))
        evidence = evidence_rows(rows)
        # the model's predictions of every evidence row at once (elementwise: the same floats as one
        # step_time per row)
        arr, kept = terms_of(evidence)
        preds = (arr["tokens_per_gpu"] / th.step_time(arr, fit.params)[0]).tolist() if kept else []
        for r, pred in zip([evidence[i] for i in kept], preds):
            res = math.log(r["tokens_per_sec_per_gpu"] / pred)
            residuals.append((r, res))
            groups[_family(r)].append((r, res, distance(r)))
        self.lengths = correlation_lengths(residuals)
        self.groups = dict(groups)
        self._set_up: dict[tuple, tuple] = {}  # _family_arrays, per family a candidate asked about

    def _family_arrays(self, key: tuple) -> tuple:
        """Family `key`'s evidence as arrays for corrections() — residuals, distances from the target, ln
        micro-batch, ZeRO stage — and its simple-kriging system: the MAX_EVIDENCE runs nearest the target
        and the Cholesky factor of their covariance (unit sill, nugget NUGGET), for the posterior variance
        of a candidate's residual. Built the first time a candidate of the family asks (a request's
        candidates ask of some of the families)."""
        if key not in self._set_up:
            g = self.groups[key]
            near = sorted(range(len(g)), key=lambda i: (g[i][2], i))[:MAX_EVIDENCE]
            feats = _features([g[i][0] for i in near])
            cov = np.exp(-self._pairwise(feats, feats))
            self._set_up[key] = (np.array([x for _, x, _ in g]), np.array([d for _, _, d in g]),
                                 np.array([math.log(r["micro_batch_size"]) if r.get("micro_batch_size") else math.nan
                                           for r, _, _ in g]),
                                 np.array([r.get("zero_stage") or 0 for r, _, _ in g]),
                                 near, cho_factor(cov + NUGGET * np.eye(len(near))))
        return self._set_up[key]

    def _pairwise(self, a: dict[str, np.ndarray], b: dict[str, np.ndarray]) -> np.ndarray:
        """Distances in correlation lengths between two sets of recorded configurations (_features)."""
        lam = self.lengths
        cell = sum(np.abs(a[k][:, None] - b[k][None, :]) for k in ("size", "nodes", "seq"))
        hw = np.where(a["gpu"][:, None] == b["gpu"][None, :], 0.0,
                      np.where(a["vendor"][:, None] == b["vendor"][None, :], 0.5, 1.0))
        mbs = np.abs(a["mbs"][:, None] - b["mbs"][None, :])
        zero = (a["zero"][:, None] != b["zero"][None, :]).astype(float)
        return (cell + hw) / lam["target"].length + mbs / lam["mbs"].length + zero / lam["zero"].length

    def scaled_distance(self, r: dict[str, Any], d: float, cfg: dict[str, Any]) -> float:
        """d/λ_target + |ln mbs ratio|/λ_mbs + [other ZeRO stage]/λ_zero: the evidence's distance
        from the candidate on the target, in correlation lengths (ρ = exp(−this))."""
        lam = self.lengths
        zero_diff = 1.0 if (r.get("zero_stage") or 0) != cfg["zero_stage"] else 0.0
        mbs = _log_ratio(r["micro_batch_size"], cfg["micro_batch_size"])
        return (d / lam["target"].length + mbs / lam["mbs"].length
                + zero_diff / lam["zero"].length)

    def correction(self, cfg: dict[str, Any]) -> tuple[float, float | None, float]:
        """(ln correction factor, d₀ the nearest evidence's distance in correlation lengths or None
        without evidence, the residual's remaining variance as a fraction of the model's) for
        candidate `cfg` (configuration fields). The correction is ρ(d₀) times the residuals' mean
        weighted by their correlation with the candidate (module docstring); the variance is the
        simple-kriging variance (1 + η − kᵀ(K + ηI)⁻¹k)/(1 + η) [Hengl et al. 2007] — smaller
        with more and nearer evidence (e.g. the layout recorded on both sides of the target), 1
        without any."""
        return self.corrections([cfg])[0]

    def corrections(self, cfgs: list[dict[str, Any]]) -> list[tuple[float, float | None, float]]:
        """correction() of each candidate in `cfgs`, computed per layout family as arrays (candidates ×
        the family's evidence)."""
        out: list[tuple[float, float | None, float]] = [(0.0, None, 1.0)] * len(cfgs)
        families: dict[tuple, list[int]] = defaultdict(list)
        for i, cfg in enumerate(cfgs):
            families[_family(cfg)].append(i)
        lam = self.lengths
        for key, idx in families.items():
            if key not in self.groups:
                continue
            res, d, ln_mbs, zero, near, factor = self._family_arrays(key)
            cand_mbs = np.array([math.log(cfgs[i]["micro_batch_size"]) for i in idx])[:, None]
            cand_zero = np.array([cfgs[i]["zero_stage"] for i in idx])[:, None]
            # scaled_distance of every (candidate, evidence row) pair (a missing micro-batch counts 0, as there)
            mbs = np.nan_to_num(np.abs(ln_mbs - cand_mbs))
            dists = (d / lam["target"].length + mbs / lam["mbs"].length
                     + (zero != cand_zero).astype(float) / lam["zero"].length)
            w = np.exp(-dists)
            d0 = dists.min(axis=1)
            # (the solves and dot products one candidate at a time, each on a vector of its own: LAPACK and
            # BLAS sum in another order for a matrix than for a vector, and the answers keep their last bits)
            for row, i in enumerate(idx):
                k = w[row][near]
                var = (1.0 + NUGGET - float(k @ _cho_solve(factor, k))) / (1.0 + NUGGET)
                corr = math.exp(-d0[row]) * float(w[row] @ res) / float(w[row].sum())
                out[i] = corr, float(d0[row]), min(1.0, max(NUGGET / (1.0 + NUGGET), var))
        return out


def _cho_solve(factor: tuple[np.ndarray, bool], b: np.ndarray) -> np.ndarray:
    """scipy.linalg.cho_solve(factor, b) for a finite factor and vector or matrix (LAPACK potrs, as
    cho_solve calls it): the same floats without its argument checks and batching wrapper."""
    c, lower = factor
    potrs, = get_lapack_funcs(("potrs",), (c, b))
    x, info = potrs(c, b, lower=lower)
    if info != 0:
        raise ValueError(f"illegal value in {-info}th argument of internal potrs")
    return x


def _features(rows: list[dict[str, Any]]) -> dict[str, np.ndarray]:
    """Log size class, nodes, seq_len, micro-batch; ZeRO stage; GPU type and vendor codes."""
    def logs(key: str) -> np.ndarray:
        return np.array([math.log(r[key]) if r.get(key) else 0.0 for r in rows])

    def codes(names: list[str]) -> np.ndarray:  # one integer per distinct name (compared for equality only)
        seen: dict[str, int] = {}
        return np.array([seen.setdefault(name, len(seen)) for name in names])

    gpus = [str(r.get("gpu_type")) for r in rows]
    accs = {g: hardware.lookup(g) for g in set(gpus)}
    return {"size": logs("model_size_class"), "nodes": logs("nodes"), "seq": logs("seq_len"),
            "mbs": logs("micro_batch_size"), "zero": np.array([r.get("zero_stage") or 0 for r in rows]),
            "gpu": codes(gpus), "vendor": codes([a.vendor if (a := accs[g]) else g for g in gpus])}


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
