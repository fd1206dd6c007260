"""Does a configuration fit on its target? What the records say beside the memory model
(service/analytics/memory.py), for /recommend, /suggest and /predict:

- oom_rows / oom_implied: a recorded OOM of the same layout with no more memory-friendly settings
  says it does not;
- fit_shown: a recorded successful run of the same layout with no less memory per GPU says it does,
  whatever the memory model's absolute figure (off most where memory is tight: bench/RESULTS.md,
  "Issue 25, fourth pass"; checked by bench/fit_shown.py);
- p_fits: the probability that it fits under the memory model's held-out error, ranking layouts with
  memory to spare first.
"""

from __future__ import annotations

import math
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from core.record import HOST_MEMORY_OOM_CLASSES
from service.analytics.on_target import config_value as _value
from service.analytics.target import CompletedTarget
from service.db import fetch_select
from service.tables import RunCell

_RECOMPUTE_RANK = {None: 0, "none": 0, "selective": 1, "full": 2}
#: "what worked" answers propose only configurations predicted to fit with this relative headroom: the
#: memory model's median held-out error on the whole-step peak (bench/memory_accuracy.py --calibration,
#: leave-one-cell-out: 8.0 %), so that a configuration within the model's own error of the capacity is
#: not recommended (it may OOM); /suggest, which explores, uses the plain prediction
MEMORY_MARGIN = 0.08
#: σ of log(predicted / measured) whole-step peak memory held out (bench/memory_accuracy.py --calibration:
#: median |error| 8.0 %, p90 21.6 % → 1.4826 × median |log error| ≈ 0.12, and 0.216 / 1.645 ≈ 0.13 agrees)
MEMORY_LOG_SIGMA = 0.12


def oom_rows(session: Session, ctx: CompletedTarget) -> list[dict[str, Any]]:
    """Recorded OOMs (not retired) that can veto a candidate for the completed target `ctx`: those
    of its GPU type, size class and seq_len (the equalities oom_implied checks first), one row per
    distinct configuration. (On PostgreSQL a range of ix_runs_oom, whose key starts with those.)
    A host-memory OOM (core.record.HOST_MEMORY_OOM_CLASSES: the kernel's or cgroup's OOM killer) is
    left out: it says nothing about whether the layout fits in GPU memory; an OOM with no
    error_class still counts (GPU OOMs were recorded without one before the taxonomy had classes). Read from
    run_cells (service/run_cells.py), whose groups hold the finished, not retired runs."""
    C = RunCell
    cols = [C.gpu_type, C.model_size_class, C.seq_len, C.dp, C.tp, C.pp, C.cp, C.zero_stage, C.micro_batch_size,
            C.recompute]
    same = [col.is_(None) if value is None else col == value
            for col, value in ((C.gpu_type, ctx.gpu_type), (C.model_size_class, ctx.size_class),
                               (C.seq_len, ctx.seq_len))]
    query = sa.select(*cols, sa.func.min(C.min_id).label("run_id")).where(
        C.status == "oom", *same,
        sa.or_(C.error_class.is_(None), C.error_class.not_in(sorted(HOST_MEMORY_OOM_CLASSES)))).group_by(*cols)
    keys, rows = fetch_select(session, query)
    return [dict(zip(keys, r)) for r in rows]

def oom_implied(cfg: dict[str, Any], ctx: CompletedTarget, ooms: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The recorded OOM that implies `cfg` does not fit on the target either, or None: same GPU
    type, size class, seq_len, TP, PP, CP; ZeRO stage ≤; micro-batch ≥; recompute no stronger;
    under ZeRO ≥ 1 the optimizer shards over DP, so DP ≤ as well. An OOM with an unknown (NULL)
    TP, PP or CP implies nothing."""
    for o in ooms:
        if (o["gpu_type"] == ctx.gpu_type and o["model_size_class"] == ctx.size_class
                and o["seq_len"] == ctx.seq_len and o["tp"] == cfg["tp"] and o["pp"] == cfg["pp"]
                and o["cp"] == cfg["cp"] and (o["zero_stage"] or 0) >= cfg["zero_stage"]
                and o["micro_batch_size"] is not None and o["micro_batch_size"] <= cfg["micro_batch_size"]
                and _RECOMPUTE_RANK.get(o["recompute"], 0) >= _RECOMPUTE_RANK.get(cfg["recompute"], 0)
                and (cfg["zero_stage"] == 0 or (o["dp"] or 0) >= cfg["dp"])):
            return o
    return None

def same_model_rows(ctx: CompletedTarget, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of `rows` that fit_shown can read as proof for the target `ctx`: its GPU type, size class,
    seq_len, framework and precision (fit_shown's equalities on the target, taken once per request)."""
    return [r for r in rows if r["gpu_type"] == ctx.gpu_type and r["model_size_class"] == ctx.size_class
            and r["seq_len"] == ctx.seq_len and r["framework"] == ctx.framework and r["precision"] == ctx.precision]


def fit_shown(cfg: dict[str, Any], ctx: CompletedTarget, rows: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The recorded successful configuration (a row of `rows`) that shows `cfg` fits on the target even
    where the memory model says it does not, or None — oom_implied's mirror: same GPU type, size class,
    seq_len, framework and precision, the same TP, PP, CP; the same ZeRO stage (a lower one without
    PP: ZeRO-3 under PP keeps a stage's parameters gathered between micro-batches), a micro-batch ≥, a
    recompute no stronger, at least as many micro-batches in flight on the first pipeline stage (1F1B
    keeps min(pp, GAS) [Narayanan et al. 2021 §2.2]) and, under ZeRO ≥ 1 (the optimizer states sharded
    over DP in the recorded run), a DP ≤ cfg's. Every term of the memory model (service/analytics/memory.py) is then no
    larger for cfg than for a run that fitted, so the record wins over the model's absolute figure —
    which is off most where memory is tight (the caching allocator keeps less slack there: bench/RESULTS.md,
    "Issue 25, fourth pass"). NULLs are read as config_value reads them. `rows` may be any configuration
    rows; same_model_rows(ctx, rows) gives the same answer faster when many layouts are asked."""
    zero, mbs, gas = cfg["zero_stage"], cfg["micro_batch_size"], cfg["grad_accum_steps"]
    for r in rows:
        if (r["gpu_type"] == ctx.gpu_type and r["model_size_class"] == ctx.size_class
                and r["seq_len"] == ctx.seq_len and r["framework"] == ctx.framework
                and r["precision"] == ctx.precision and r["tp"] == cfg["tp"] and r["pp"] == cfg["pp"]
                and _value(r, "cp") == cfg["cp"]
                and (_value(r, "zero_stage") == zero or (_value(r, "zero_stage") < zero and cfg["pp"] == 1))
                and r["micro_batch_size"] is not None and r["micro_batch_size"] >= mbs
                and r["grad_accum_steps"] is not None
                and min(cfg["pp"], r["grad_accum_steps"]) >= min(cfg["pp"], gas)
                and _RECOMPUTE_RANK.get(_value(r, "recompute"), 0) <= _RECOMPUTE_RANK.get(cfg["recompute"], 0)
                and (_value(r, "zero_stage") == 0 or (r["dp"] is not None and r["dp"] <= cfg["dp"]))):
            return r
    return None


def p_fits(mem: Any, exact: dict[str, Any] | None, shown: dict[str, Any] | None = None) -> float:
    """Probability that a configuration fits in the GPU's usable memory: 1 when it ran on this very
    target (`exact`), a recorded run shows it fits (`shown`: fit_shown) or the GPU's memory is unknown;
    else Φ(ln(usable / predicted peak) / σ) with σ the memory model's held-out log error
    (MEMORY_LOG_SIGMA) — its errors taken as log-normal."""
    usable, peak = mem.usable_memory_gib, mem.predicted_peak_memory_gib
    if exact is not None or shown is not None or not usable or not peak:
        return 1.0
    z = math.log(usable / peak) / MEMORY_LOG_SIGMA
    return 0.5 * (1.0 + math.erf(z / math.sqrt(2.0)))
