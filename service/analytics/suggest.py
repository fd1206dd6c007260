"""Next experiments: the configurations worth benchmarking next for a target (DESIGN §4, issue 17).

Candidates are recommend's (service/analytics/recommend.py): every layout valid for the world
size and the model, adapted exactly to the target batch, predicted to fit by the memory model and
not ruled out by a recorded OOM — minus every configuration already recorded on this very
target (any status, not retired). They are ranked by the expected improvement over the best
recorded run of the target (Jones, Schonlau & Welch 1998, "Efficient Global Optimization of
Expensive Black-Box Functions", J. Global Optim. 13, eq. 15), on log tokens/s/GPU:

    EI = σ·(z·Φ(z) + φ(z)),  z = (ln μ − ln y*)/σ

μ the throughput model's prediction for the target, y* the best recorded tokens/s/GPU of the
target (none recorded: the best prediction among the candidates, so EI then prefers confident
high predictions), σ the prediction's uncertainty: the fit's robust held-out log error σ₀ (1.4826 × the
median |leave-one-out log residual|, the MAD estimate of a normal σ). μ is anchored on the residuals of the
nearest recorded runs of the same layout (service/analytics/anchor.py, regression kriging), so σ is the
kriging standard deviation σ₀·√v, v the simple-kriging variance left by the layout's recorded
runs (Hengl et al. 2007; a run of the layout on the target itself leaves little uncertainty, far
evidence leaves σ₀). The extrapolation part of the prediction's interval (anchor.interval_halves: the
distance to the nearest recorded run of the exact layout, and a much lower end for a layout unsupported
near the target) lowers μ to μ·exp(−(lower − Z80·σ)) rather than raising σ: on the Ultra-Scale sweep
a layout nobody ran nearby is more often slow than fast (bench/interval_calibration.py), so it is
proposed when its pessimistic prediction still promises an improvement. A configuration the fit is
unsure about near its evidence can therefore be worth a run even if its point prediction is below
the best.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import sqlalchemy as sa
from scipy.special import ndtr
from sqlalchemy.orm import Session

from core.rules import CONFIG_FIELDS
from service.analytics import recommend as rec
from service.analytics.target import CompletedTarget
from service.db import fetch_select
from service.tables import RunCell

#: the standard normal's 90th percentile: an 80 % two-sided interval is μ·exp(±Z80·σ)
Z80 = 1.2816
#: √(2π), the standard normal density's constant (scipy.stats._continuous_distns._norm_pdf_C)
_NORM_PDF_C = np.sqrt(2 * np.pi)


def best_recorded(session: Session, ctx: CompletedTarget) -> dict[str, Any] | None:
    """The best successful, not retired run of the target (size class, nodes, GPU type, seq_len): the highest
    tokens/s/GPU > 0, then the lower id — read from run_cells' groups (service/run_cells.py: each group's
    top_id is that run of its runs, best_tps its tokens/s/GPU)."""
    C = RunCell
    cols = [C.top_id, C.best_tps, *(getattr(C, f) for f in CONFIG_FIELDS)]
    _, found = fetch_select(session,
        sa.select(*cols).where(C.status == "success", C.top_id.is_not(None), C.model_size_class == ctx.size_class,
                               C.nodes == ctx.nodes, C.gpu_type == ctx.gpu_type, C.seq_len == ctx.seq_len)
        .order_by(C.best_tps.desc(), C.top_id).limit(1))
    if not found:
        return None
    run_id, tps, *config = found[0]
    return {"id": run_id, "tokens_per_sec_per_gpu": tps, "config": dict(zip(CONFIG_FIELDS, config, strict=True))}


def expected_improvement(mu: float, best: float, sigma: float) -> float:
    """EI of a log-normal prediction `mu` (σ in log units) over `best`, as a fraction of `best`."""
    return expected_improvements([mu], best, [sigma])[0]


def expected_improvements(mus: list[float], best: float, sigmas: list[float]) -> list[float]:
    """expected_improvement of each (mu, sigma) at once: Φ and φ evaluated over one array, as
    scipy.stats.norm computes them (its _norm_cdf = ndtr, _norm_pdf = exp(−z²/2)/√(2π) on an array:
    the same floats as norm.cdf/pdf, which check their arguments on every call, ~0.15 ms each)."""
    out = [0.0] * len(mus)
    zs, where = [], []
    for i, (mu, sigma) in enumerate(zip(mus, sigmas, strict=True)):
        if sigma <= 0:
            out[i] = max(0.0, math.log(mu / best))
        else:
            zs.append((math.log(mu) - math.log(best)) / sigma)
            where.append(i)
    if zs:
        z = np.array(zs, dtype=float)
        cdf, pdf = ndtr(z), np.exp(-z**2 / 2.0) / _NORM_PDF_C
        for j, i in enumerate(where):
            out[i] = sigmas[i] * (zs[j] * float(cdf[j]) + float(pdf[j]))
    return out


def suggest(session: Session, target: rec.Target, *, n: int = 5) -> dict[str, Any]:
    """The n configurations to benchmark next for `target`, best first (module docstring).

    Returns {"target", "best_recorded": {id, tokens_per_sec_per_gpu, config} | None, "model",
    "suggestions": [{"config", "predicted": {tokens_per_sec_per_gpu, mfu, peak_memory_gib,
    interval}, "expected_improvement" (fraction of the best recorded), "uncertainty_rel" (the
    prediction's 1σ as a fraction, exp(σ) − 1 of the log-normal), "exploration" (True when the layout
    was not run near this target), "why"}], "notes"}.
    Raises BadRequest for a bad target."""
    try:
        prep = rec.prepare(session, target)
    except rec.NothingRecorded as exc:
        answer = rec.empty_answer(target, exc.message)
        return {k: answer[k] for k in ("target", "best_recorded", "model", "suggestions", "notes")}
    best = best_recorded(session, prep.ctx)
    items = rec.scored(prep, skip=rec.recorded_on_target(session, prep.ctx))
    sigma0 = prep.fit.loo_log_sigma
    if not items:
        return {"target": rec.target_body(prep), "best_recorded": best, "model": prep.fit.describe(),
                "suggestions": [], "notes": prep.notes + ["no unrecorded configuration is valid for this target"]}
    y = best["tokens_per_sec_per_gpu"] if best else max(i.predicted["tokens_per_sec_per_gpu"] for i in items)
    mus, sigmas = [], []
    for item in items:
        p, a = item.predicted, item.predicted["anchor"]
        # σ: what the fit and the layout family's evidence leave of the uncertainty (kriging); the
        # extrapolation part of the interval's lower end (anchor.interval_halves: distance to the
        # nearest recorded run of the exact layout, unsupported layouts) is a risk, not an upside:
        # it lowers μ instead of raising σ, so an unsupported layout is not explored for its doubt
        sigma = sigma0 * math.sqrt(a["variance"])
        lower = math.log(p["tokens_per_sec_per_gpu"] / p["interval"][0])
        shift = max(0.0, lower - Z80 * sigma)
        mus.append(p["tokens_per_sec_per_gpu"] * math.exp(-shift))
        sigmas.append(sigma)
    ranked = [(-ei, tuple(str(item.config[f]) for f in CONFIG_FIELDS), item, ei, sigma)
              for item, ei, sigma in zip(items, expected_improvements(mus, y, sigmas), sigmas, strict=True)]
    ranked.sort(key=lambda e: e[:2])
    out: list[dict[str, Any]] = []
    counts: dict[str, int] = {}
    for _, _, item, ei, sigma in ranked:  # memory and OOM checks in rank order, until n are found
        ok = rec.admissible(prep, item, counts)
        if ok is None:
            continue
        mem = ok[0]
        p = item.predicted
        ref = f"the best recorded {y:,.0f}" if best else f"the best prediction {y:,.0f} (nothing recorded here yet)"
        why = (f"predicted {p['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU (±{100 * math.expm1(sigma):.0f} % at 1σ) vs "
               f"{ref}: expected improvement {100 * ei:.1f} %"
               + ("" if item.worked else "; a layout not yet run near this target (exploration)"))
        out.append({"config": item.config,
                    "predicted": {"tokens_per_sec_per_gpu": p["tokens_per_sec_per_gpu"], "mfu": p["mfu"],
                                  "peak_memory_gib": mem.predicted_peak_memory_gib, "interval": p["interval"]},
                    "expected_improvement": ei, "uncertainty_rel": math.expm1(sigma),
                    "exploration": not item.worked, "why": why, "extrapolation": rec.extrapolation(prep, item)})
        if len(out) >= n:
            break
    return {"target": rec.target_body(prep), "best_recorded": best, "model": prep.fit.describe(),
            "suggestions": out, "notes": prep.notes}
