"""Sweeps (DESIGN §9, issue 29): a named search for one target's best configuration.

A sweep stores only its definition (service/tables.Sweep): the target (model size or dims, nodes ×
gpus_per_node of gpu_type, seq_len, global batch, framework, precision), the strategy, the budget and,
for a grid, the listed values. Its progress is read per request from the runs that name it
(runs.sweep) and the leases that handed them out (service/tables.SweepLease; service/sweep_leases.py):
counts by status, the best run so far with its figures, the best so far over the sweep's runs in the
order they were handed out, each run's predicted vs measured throughput, and what is left.

Strategies
- `grid`: every valid combination (service/analytics/recommend.enumerate_layouts: TP·PP·CP divides the
  world size, TP the heads, CP the sequence, EP DP·CP, PP ≤ layers, GAS whole) of the listed values of
  dp, tp, pp, cp, ep, zero_stage, micro_batch_size and recompute; a field not listed takes its default (1, ZeRO 0,
  recompute "none"; DP whatever the world size leaves). Handed out in enumeration order.
- `suggest`: /suggest's expected improvement (service/analytics/suggest.py), one configuration at a
  time; the sweep stops when the best expected improvement falls below `min_expected_improvement`
  (default DEFAULT_MIN_EXPECTED_IMPROVEMENT) of the best so far.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from core import hardware
from core.lifecycle import DEFAULT_LOST_AFTER_S, read_status
from core.model import model_size_class, params_from_dims
from core.record import parse_param_count
from core.rules import CONFIG_FIELDS, config_label
from service import limits as L
from service.analytics import recommend as rec
from service.analytics.target import CompletedTarget
from service.errors import Conflict, NotFound, ValidationFailed
from service.lifecycle import utcnow
from service.tables import Run, Sweep, SweepLease

STRATEGIES = ("grid", "suggest")

#: the fields a grid lists values of (DP and GAS follow from them and the target; DP may be listed too)
OPTION_FIELDS = ("dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size", "recompute")

#: The suggest strategy's stop threshold: the sweep is done when no configuration's expected
#: improvement (suggest.expected_improvement: a fraction of the best run so far) reaches 1 %. The
#: stopping rule of Jones, Schonlau & Welch 1998 ("Efficient Global Optimization of Expensive
#: Black-Box Functions", J. Global Optim. 13, §4.2: stop when the expected improvement is below 1 % of
#: the current best function value). It applies once the target has a successful run: before that the
#: best is itself a prediction, and the first configurations are handed out whatever their EI.
DEFAULT_MIN_EXPECTED_IMPROVEMENT = 0.01

#: fields of a sweep's target (a subset of the run record's), stored as JSON in sweeps.target
TARGET_FIELDS = ("model_name", "model_params", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
                 "ffn_hidden_size", "vocab_size", "gated_linear_unit", "nodes", "gpus_per_node", "gpu_type",
                 "seq_len", "global_batch_tokens", "framework", "precision")

_INT_BOUNDS = {"dp": L.MAX_DP, "tp": L.MAX_TP, "pp": L.MAX_PP, "cp": L.MAX_CP, "ep": L.MAX_EP,
               "zero_stage": 3, "micro_batch_size": L.MAX_MICRO_BATCH}
_RECOMPUTE = ("none", "selective", "full")


def _invalid(field: str, value: Any, message: str) -> ValidationFailed:
    return ValidationFailed(f"{field}: {message}", [{"field": field, "value": value, "message": message}])


def normalise_target(target: dict[str, Any]) -> dict[str, Any]:
    """The target as stored: model_params an int (core.record.parse_param_count: '1.34B', 8e9),
    gpu_type and precision the catalog's names, unknown fields refused, None values dropped.
    Raises ValidationFailed (422) naming the field."""
    unknown = set(target) - set(TARGET_FIELDS)
    if unknown:
        raise _invalid("target", sorted(unknown), f"unknown field(s) {sorted(unknown)}; expected {TARGET_FIELDS}")
    out = {k: v for k, v in target.items() if v is not None}
    if "model_params" not in out and not ("num_layers" in out and "hidden_size" in out):
        raise _invalid("target.model_params", None, "a target names the model: model_params, or its dims")
    if "model_params" in out:
        try:
            out["model_params"] = parse_param_count(out["model_params"])
        except ValueError as exc:
            raise _invalid("target.model_params", target["model_params"], str(exc)) from None
        L.check_model_params(out["model_params"], "target.model_params")
    else:  # the dims name the model: its parameter count is theirs (core.model.params_from_dims)
        out["model_params"] = params_from_dims(out)
        if not out["model_params"]:
            raise _invalid("target.model_params", None, "the dims given do not determine the parameter count; "
                                                        "give model_params")
    if "nodes" not in out:
        raise _invalid("target.nodes", None, "required")
    out.setdefault("gpus_per_node", 8)
    L.check_parallelism({"nodes": out["nodes"], "gpus_per_node": out["gpus_per_node"]})
    if out.get("gpu_type"):
        out["gpu_type"] = hardware.canonical_gpu_type(out["gpu_type"]) or out["gpu_type"]
    if out.get("precision"):
        out["precision"] = hardware.canonical_precision(out["precision"]) or out["precision"]
    return out


def normalise_grid(grid: dict[str, Any] | None) -> dict[str, list[Any]]:
    """The grid's listed values per field (OPTION_FIELDS), deduplicated in the order given.
    Raises ValidationFailed naming the field for an unknown field, an empty list or a bad value."""
    out: dict[str, list[Any]] = {}
    for field, values in (grid or {}).items():
        if field not in OPTION_FIELDS:
            raise _invalid(f"grid.{field}", values, f"not a grid field; one of {', '.join(OPTION_FIELDS)}")
        if not isinstance(values, list) or not values:
            raise _invalid(f"grid.{field}", values, "a non-empty list of values")
        for v in values:
            if field == "recompute":
                if v not in _RECOMPUTE:
                    raise _invalid(f"grid.{field}", v, f"one of {', '.join(_RECOMPUTE)}")
            elif isinstance(v, bool) or not isinstance(v, int) or not (0 if field == "zero_stage" else 1) <= v \
                    <= _INT_BOUNDS[field]:
                raise _invalid(f"grid.{field}", v, f"an integer in [{0 if field == 'zero_stage' else 1}, "
                                                   f"{_INT_BOUNDS[field]}]")
        out[field] = list(dict.fromkeys(values))
    return out


def grid_configs(target: dict[str, Any], grid: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every valid configuration of a grid sweep, in enumeration order (recommend.enumerate_layouts,
    the recommender's own: TP outermost, recompute innermost). A field the grid does not list takes its
    default: 1 (TP, PP, CP, EP, micro-batch), ZeRO 0, recompute "none", DP whatever the world size
    leaves. The target must give seq_len and global_batch_tokens (GAS follows from them). Raises
    ValidationFailed when it does not."""
    for field in ("seq_len", "global_batch_tokens"):
        if not target.get(field):
            raise _invalid(f"target.{field}", None, "a grid sweep needs it (GAS = batch / (DP·MBS·seq_len))")
    ctx = CompletedTarget(model_params=target["model_params"], nodes=target["nodes"],
                          gpus_per_node=target["gpus_per_node"], gpu_type=target.get("gpu_type") or "",
                          seq_len=target["seq_len"], precision=target.get("precision") or "",
                          num_layers=target.get("num_layers"), num_heads=target.get("num_heads"),
                          global_batch_tokens=target["global_batch_tokens"])
    opts = rec.LayoutOptions(tp=grid.get("tp") or [1], pp=grid.get("pp") or [1], cp=grid.get("cp") or [1],
                             zero_stage=grid.get("zero_stage") or [0], recompute=grid.get("recompute") or ["none"],
                             micro_batch_size=grid.get("micro_batch_size") or [1])
    return rec.enumerate_layouts(ctx, opts, dps=grid.get("dp"), eps=grid.get("ep"))


def to_recommend_target(target: dict[str, Any]) -> rec.Target:
    """The sweep's target as /recommend's and /suggest's (one model, not a size family)."""
    t = target.get
    return rec.Target(model_params=target["model_params"], nodes=target["nodes"],
                      gpus_per_node=target["gpus_per_node"],
                      gpu_type=t("gpu_type"), seq_len=t("seq_len"), global_batch_tokens=t("global_batch_tokens"),
                      num_layers=t("num_layers"), hidden_size=t("hidden_size"), num_heads=t("num_heads"),
                      num_kv_heads=t("num_kv_heads"), ffn_hidden_size=t("ffn_hidden_size"),
                      vocab_size=t("vocab_size"), gated_linear_unit=t("gated_linear_unit"),
                      framework=t("framework"), precision=t("precision"), family=False)


def create(session: Session, name: str, strategy: str, target: dict[str, Any], budget: int,
           grid: dict[str, Any] | None = None, min_expected_improvement: float | None = None,
           description: str | None = None) -> tuple[Sweep, bool]:
    """Store a sweep; returns (sweep, created). Creating a sweep that exists with the same definition
    answers the stored one (created False: an agent's set-up script may run twice); with another
    definition it is a Conflict (409). Raises ValidationFailed (422) for a bad target, grid or
    threshold, and for a grid with no valid combination."""
    if strategy not in STRATEGIES:
        raise _invalid("strategy", strategy, f"one of {', '.join(STRATEGIES)}")
    target = normalise_target(target)
    if strategy == "grid":
        grid_values = normalise_grid(grid)
        if not grid_values:
            raise _invalid("grid", grid, "a grid sweep lists values of at least one field")
        if not grid_configs(target, grid_values):
            raise _invalid("grid", grid, "no combination of these values is valid for the target (world size "
                                         f"{target['nodes'] * target['gpus_per_node']}, seq_len, batch, heads, layers)")
        threshold = None
    else:
        if grid:
            raise _invalid("grid", grid, "only a grid sweep lists values")
        grid_values = None
        threshold = DEFAULT_MIN_EXPECTED_IMPROVEMENT if min_expected_improvement is None else min_expected_improvement
        if not (math.isfinite(threshold) and 0 <= threshold < 1):
            raise _invalid("min_expected_improvement", threshold, "a fraction in [0, 1)")
    definition = {"strategy": strategy, "budget": budget, "target": target, "grid": grid_values,
                  "min_expected_improvement": threshold}
    stored = session.scalars(sa.select(Sweep).where(Sweep.name == name)).first()
    if stored is not None:
        if {k: getattr(stored, k) for k in definition} == definition:
            return stored, False
        raise Conflict(f"a sweep named {name!r} exists with another definition",
                       [{"field": "name", "value": name, "message": "exists with another definition"}])
    sweep = Sweep(name=name, created_at=datetime.now(UTC).replace(tzinfo=None), description=description,
                  **definition)
    session.add(sweep)
    session.flush()
    return sweep, True


def get(session: Session, name: str) -> Sweep:
    """The sweep named `name`; NotFound (404) otherwise."""
    sweep = session.scalars(sa.select(Sweep).where(Sweep.name == name)).first()
    if sweep is None:
        raise NotFound(f"no sweep named {name!r}", [{"field": "name", "value": name, "message": "not found"}])
    return sweep


def definition(sweep: Sweep) -> dict[str, Any]:
    """The stored definition, as the API shows it (with the target's size class and world size)."""
    target = dict(sweep.target)
    if target.get("model_params"):
        target["model_size_class"] = model_size_class(target["model_params"])
    target["world_size"] = target["nodes"] * target["gpus_per_node"]
    return {"name": sweep.name, "strategy": sweep.strategy, "budget": sweep.budget, "target": target,
            "grid": sweep.grid, "min_expected_improvement": sweep.min_expected_improvement,
            "description": sweep.description, "created_at": sweep.created_at}


def _run_config(run: Run) -> dict[str, Any]:
    return {f: getattr(run, f) for f in CONFIG_FIELDS}


def progress(session: Session, sweep: Sweep, *, with_runs: bool = True,
             lost_after_s: float = DEFAULT_LOST_AFTER_S) -> dict[str, Any]:
    """A sweep's definition and progress (module docstring): {..definition, "counts": {status: n},
    "handed_out": configurations handed out, "budget_left", "left": configurations of the grid not yet
    handed out (suggest: null), "best": the best successful run {id, run_key, config,
    tokens_per_sec_per_gpu, mfu, peak_memory_gib, step_time_s} or null, "best_over_time": [{"n": the
    run's place in hand-out order, "run_id", "tokens_per_sec_per_gpu": the best so far}], "runs": [{id,
    run_key, status (as read now: a running run without a heartbeat for `lost_after_s` reads lost), config,
    label, attempt, leased_at, tokens_per_sec_per_gpu, predicted_tokens_per_sec_per_gpu,
    mfu, peak_memory_gib, error_class}] (hand-out order; runs that name the sweep without a lease after)}."""
    runs = list(session.scalars(sa.select(Run).where(Run.sweep == sweep.name).order_by(Run.id)))
    leases = list(session.scalars(sa.select(SweepLease).where(SweepLease.sweep == sweep.name)
                                  .order_by(SweepLease.id)))
    by_key = {r.run_key: r for r in runs}
    order = [lease.run_key for lease in leases if lease.run_key in by_key]
    order += [r.run_key for r in runs if r.run_key not in set(order)]
    lease_of = {lease.run_key: lease for lease in leases}
    counts: dict[str, int] = {}
    best: Run | None = None
    best_over_time: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    now = utcnow()
    for n, key in enumerate(order, 1):
        run, lease = by_key[key], lease_of.get(key)
        status = read_status(run.status, run.last_heartbeat_at, now, lost_after_s)
        counts[status] = counts.get(status, 0) + 1
        tps = run.tokens_per_sec_per_gpu
        if run.status == "success" and tps and run.retired_at is None and (
                best is None or tps > (best.tokens_per_sec_per_gpu or 0)):
            best = run
        if best is not None:
            best_over_time.append({"n": n, "run_id": run.id, "tokens_per_sec_per_gpu": best.tokens_per_sec_per_gpu})
        predicted = (lease.predicted or {}) if lease is not None else {}
        rows.append({"id": run.id, "run_key": run.run_key, "status": status, "config": _run_config(run),
                     "label": config_label(_run_config(run)), "attempt": lease.attempt if lease else None,
                     "leased_at": lease.leased_at if lease else None, "tokens_per_sec_per_gpu": tps,
                     "predicted_tokens_per_sec_per_gpu": predicted.get("tokens_per_sec_per_gpu"),
                     "mfu": run.mfu_derived if run.mfu_derived is not None else run.mfu,
                     "peak_memory_gib": run.peak_memory_gib, "error_class": run.error_class})
    handed = len({lease.config_key for lease in leases})
    left = None
    if sweep.strategy == "grid":
        taken = {lease.config_key for lease in leases}
        left = sum(1 for c in grid_configs(sweep.target, sweep.grid or {}) if config_label(c) not in taken)
    out = definition(sweep)
    out.update({"counts": counts, "handed_out": handed, "budget_left": max(0, sweep.budget - handed),
                "left": left, "best": None, "best_over_time": best_over_time, "runs": rows if with_runs else []})
    if best is not None:
        out["best"] = {"id": best.id, "run_key": best.run_key, "config": _run_config(best),
                       "label": config_label(_run_config(best)),
                       "tokens_per_sec_per_gpu": best.tokens_per_sec_per_gpu,
                       "mfu": best.mfu_derived if best.mfu_derived is not None else best.mfu,
                       "peak_memory_gib": best.peak_memory_gib, "step_time_s": best.step_time_s}
    return out


def list_sweeps(session: Session, lost_after_s: float = DEFAULT_LOST_AFTER_S) -> list[dict[str, Any]]:
    """Every sweep, newest first, with its progress (without the run list)."""
    sweeps = session.scalars(sa.select(Sweep).order_by(Sweep.id.desc()))
    return [progress(session, s, with_runs=False, lost_after_s=lost_after_s) for s in sweeps]
