"""Scaling chart data (GET /api/v1/scaling) and GPU-planner summaries (GET /api/v1/plan).

Scaling answer: ``{"model_size_class", "points": [{"nodes", "world_size", "tokens_per_sec_per_gpu",
"aggregate_tokens_per_sec", "efficiency", "best_run_id", "config"}], "amdahl": {"serial_fraction",
"serial_fraction_stderr", ...}}``. Amdahl's law (DESIGN §4): ``speedup(n) = 1 / (s + (1 − s) / n)``
with n the node count relative to the smallest measured one; the fitted serial fraction s says
where more GPUs stop paying (the speedup never exceeds 1/s).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.logic.fmt import config_label, pct

Point = Mapping[str, Any]


def amdahl_speedup(n: float, serial_fraction: float) -> float:
    """Amdahl's speedup on ``n`` times the base resources with serial fraction ``s``."""
    return 1.0 / (serial_fraction + (1.0 - serial_fraction) / n)


def points_frame(points: Sequence[Point]) -> pd.DataFrame:
    """The measured points, sorted by nodes, with the config label and efficiency filled in
    (efficiency = per-GPU throughput relative to the smallest node count when the API omits it)."""
    rows = sorted(points, key=lambda p: p["nodes"])
    frame = pd.DataFrame([{
        "nodes": p["nodes"], "world_size": p.get("world_size"),
        "tokens_per_sec_per_gpu": p.get("tokens_per_sec_per_gpu"),
        "aggregate_tokens_per_sec": p.get("aggregate_tokens_per_sec"),
        "efficiency": p.get("efficiency"), "best_run_id": p.get("best_run_id"),
        "config": config_label(p["config"]) if isinstance(p.get("config"), Mapping) else p.get("config"),
    } for p in rows], columns=["nodes", "world_size", "tokens_per_sec_per_gpu", "aggregate_tokens_per_sec",
                               "efficiency", "best_run_id", "config"])
    if not frame.empty:
        if frame["aggregate_tokens_per_sec"].isna().all() and frame["world_size"].notna().all():
            frame["aggregate_tokens_per_sec"] = frame["tokens_per_sec_per_gpu"] * frame["world_size"]
        if frame["efficiency"].isna().all() and frame["tokens_per_sec_per_gpu"].notna().all():
            frame["efficiency"] = frame["tokens_per_sec_per_gpu"] / frame["tokens_per_sec_per_gpu"].iloc[0]
    return frame


def amdahl_curve(frame: pd.DataFrame, amdahl: Mapping[str, Any] | None, steps: int = 60) -> pd.DataFrame:
    """The fitted curve over the measured node range: ``nodes``, ``aggregate_tokens_per_sec`` (the
    base point's throughput × speedup) and ``efficiency`` (speedup / relative nodes). Empty when
    there is no fit or no base point."""
    s = (amdahl or {}).get("serial_fraction")
    if s is None or frame.empty or pd.isna(frame["aggregate_tokens_per_sec"].iloc[0]):
        return pd.DataFrame(columns=["nodes", "aggregate_tokens_per_sec", "efficiency"])
    base_nodes = float(amdahl.get("base_nodes") or frame["nodes"].iloc[0])
    base_agg = float(frame["aggregate_tokens_per_sec"].iloc[0])
    top = float(frame["nodes"].max())
    grid = [base_nodes + (top - base_nodes) * i / steps for i in range(steps + 1)] if top > base_nodes else [base_nodes]
    rows = []
    for n in grid:
        rel = n / base_nodes
        sp = amdahl_speedup(rel, float(s))
        rows.append({"nodes": n, "aggregate_tokens_per_sec": base_agg * sp, "efficiency": sp / rel})
    return pd.DataFrame(rows)


def fit_errors(frame: pd.DataFrame, amdahl: Mapping[str, Any] | None) -> pd.DataFrame:
    """The fit as a reader sees it, per measured node count: the measured scaling efficiency, the
    Amdahl fit's efficiency at that node count, and the miss in percentage points (fit − measured)
    and in aggregate tokens/s (percent of the measured value). Empty without a fit.

    Same inputs as the chart: the measured points and the API's serial fraction, the speedup taken
    relative to ``amdahl["base_nodes"]`` (else the smallest node count), as in :func:`amdahl_curve`."""
    s = (amdahl or {}).get("serial_fraction")
    columns = ["nodes", "measured_efficiency", "fit_efficiency", "error_pp", "aggregate_error_pct"]
    if s is None or frame.empty or frame["efficiency"].isna().all():
        return pd.DataFrame(columns=columns)
    base_nodes = float(amdahl.get("base_nodes") or frame["nodes"].iloc[0])
    rows = []
    for _, p in frame.iterrows():
        rel = float(p["nodes"]) / base_nodes
        fit_eff = amdahl_speedup(rel, float(s)) / rel
        measured = float(p["efficiency"]) if pd.notna(p["efficiency"]) else None
        rows.append({
            "nodes": int(p["nodes"]), "measured_efficiency": measured, "fit_efficiency": fit_eff,
            "error_pp": None if measured is None else 100 * (fit_eff - measured),
            "aggregate_error_pct": None if measured is None or measured == 0 else 100 * (fit_eff / measured - 1),
        })
    return pd.DataFrame(rows, columns=columns)


def fit_quality(errors: pd.DataFrame) -> str:
    """"the fit misses the measured efficiency by at most 3.1 percentage points (at 4 nodes); mean
    |miss| 1.2 pp" — what a reader of the chart sees, rather than an R²."""
    errs = errors.dropna(subset=["error_pp"])
    if errs.empty:
        return ""
    worst = errs.loc[errs["error_pp"].abs().idxmax()]
    return (f"fit vs measured: largest miss {abs(worst['error_pp']):.1f} percentage points of efficiency "
            f"(at {int(worst['nodes'])} nodes, the fit {'above' if worst['error_pp'] > 0 else 'below'} the "
            f"measurement); mean |miss| {errs['error_pp'].abs().mean():.1f} pp over {len(errs)} node counts")


def amdahl_summary(amdahl: Mapping[str, Any] | None, reason: str | None = None) -> str:
    """"serial fraction 0.80% ± 0.20% (R² 0.98): speedup at most 125× the 1-node throughput; efficiency
    falls to 50% at 126 nodes" — or why there is no fit (``reason``: the API's ``amdahl_reason``)."""
    if not amdahl or amdahl.get("serial_fraction") is None:
        return f"no Amdahl fit: {reason or (amdahl or {}).get('reason') or 'fewer than two node counts measured'}"
    s = float(amdahl["serial_fraction"])
    err = amdahl.get("serial_fraction_stderr")
    text = f"serial fraction {pct(s, 2)}" + (f" ± {pct(float(err), 2)}" if err is not None else "")
    base = amdahl.get("base_nodes")
    where = f"the {base:g}-node throughput" if base else "the smallest node count"
    if s > 0:
        max_speedup = amdahl.get("max_speedup") or 1 / s
        text += f": speedup at most {float(max_speedup):,.0f}× {where}"
        if amdahl.get("nodes_at_50pct_efficiency") is not None:
            text += f"; efficiency falls to 50% at ≈ {float(amdahl['nodes_at_50pct_efficiency']):,.0f} nodes"
    else:
        text += ": no serial bottleneck visible in the measured range"
    return text


def figure(frame: pd.DataFrame, curve: pd.DataFrame, title: str = "") -> go.Figure:
    """Two panels against nodes: aggregate tokens/s (measured, ideal linear, Amdahl fit) and
    scaling efficiency (measured, Amdahl)."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("aggregate tokens/s", "scaling efficiency"))
    if not frame.empty:
        hover = [f"{n} nodes · {c or '?'} · run #{r}" for n, c, r in
                 zip(frame["nodes"], frame["config"], frame["best_run_id"])]
        fig.add_trace(go.Scatter(x=frame["nodes"], y=frame["aggregate_tokens_per_sec"], mode="markers+lines",
                                 name="measured (best run per node count)", hovertext=hover,
                                 marker={"size": 9, "color": "#1f77b4"}), row=1, col=1)
        base_n, base_agg = frame["nodes"].iloc[0], frame["aggregate_tokens_per_sec"].iloc[0]
        if pd.notna(base_agg):
            fig.add_trace(go.Scatter(x=frame["nodes"], y=base_agg * frame["nodes"] / base_n, mode="lines",
                                     name="ideal (linear)", line={"dash": "dot", "color": "#999999"}),
                          row=1, col=1)
        fig.add_trace(go.Scatter(x=frame["nodes"], y=frame["efficiency"], mode="markers+lines",
                                 name="measured efficiency", hovertext=hover, showlegend=False,
                                 marker={"size": 9, "color": "#1f77b4"}), row=1, col=2)
    if not curve.empty:
        fig.add_trace(go.Scatter(x=curve["nodes"], y=curve["aggregate_tokens_per_sec"], mode="lines",
                                 name="Amdahl fit", line={"color": "#d62728"}), row=1, col=1)
        fig.add_trace(go.Scatter(x=curve["nodes"], y=curve["efficiency"], mode="lines", showlegend=False,
                                 name="Amdahl fit", line={"color": "#d62728"}), row=1, col=2)
    ticks = [int(n) for n in frame["nodes"]] if not frame.empty else None
    fig.update_xaxes(title_text="nodes", type="log", tickvals=ticks, ticktext=[str(t) for t in ticks or []])
    fig.update_yaxes(tickformat=".0%", row=1, col=2, rangemode="tozero")
    fig.update_yaxes(type="log", row=1, col=1)  # log-log: linear scaling is a straight line
    fig.update_layout(height=420, title=title, margin={"t": 60, "l": 10, "r": 10, "b": 10},
                      legend={"orientation": "h", "y": -0.2})
    return fig


PLAN_LABELS = {
    "gpus_booked": "GPUs booked (whole nodes)", "nodes": "nodes", "gpus_per_node": "GPUs per node",
    "gpus": "GPUs the compute needs", "gpus_exact": "GPUs (exact)",
    "gpu_type": "GPU type", "mfu": "MFU", "mfu_source": "MFU from", "peak_tflops": "peak TFLOP/s per GPU",
    "peak_source": "peak from", "model_params": "parameters", "model_size_class": "model size class (B)",
    "tokens": "training tokens", "days": "days", "total_flops": "training FLOPs",
    "flops_per_token": "FLOPs per token",
    "gpu_hours": "GPU-hours booked (GPUs booked × 24 × days)", "gpu_hours_compute": "GPU-hours of compute",
}
EFFICIENCY_LABELS = {
    "predicted_efficiency": "Amdahl efficiency at the planned nodes",
    "relative_to_reference": "efficiency relative to the MFU run's node count",
    "nodes_with_scaling_loss": "nodes, counting the scaling loss",
    "gpus_with_scaling_loss": "GPUs, counting the scaling loss",
    "serial_fraction": "serial fraction", "source": "scaling fit",
}
#: shown elsewhere (headline, captions) rather than in the table
PLAN_SKIP = {"notes", "formula", "mfu_run", "efficiency", "flops_formula"}
#: quantities written as powers of ten (a FLOP count as papers write it, never 5.164e+22)
_POWERS = {"total_flops", "flops_per_token"}
_PERCENT = {"mfu", "predicted_efficiency", "relative_to_reference", "serial_fraction"}


def power_of_ten(x: float, digits: int = 3) -> str:
    """5.164e22 → "5.16×10²²"; below 10⁶ with separators."""
    if abs(x) < 1e6:
        return f"{x:,.0f}"
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"{mantissa}×10{str(int(exponent)).translate(str.maketrans('-0123456789', '⁻⁰¹²³⁴⁵⁶⁷⁸⁹'))}"


def _show(key: str, value: Any) -> str:
    if key in _PERCENT and isinstance(value, (int, float)):
        return pct(float(value), 2 if key == "serial_fraction" else 1)
    if key in _POWERS and isinstance(value, (int, float)):
        return power_of_ten(float(value))
    if isinstance(value, float):
        return f"{value:,.4g}" if abs(value) < 1e6 else f"{value:.3e}"
    if isinstance(value, int) and not isinstance(value, bool):
        return f"{value:,}"
    if isinstance(value, (dict, list)):
        import json

        return json.dumps(value, sort_keys=True, default=str)
    return str(value)


def plan_rows(plan: Mapping[str, Any]) -> pd.DataFrame:
    """The planner's answer as (quantity, value) rows: known fields first, then the Amdahl efficiency
    at that scale, then anything else the API added."""
    keys = [k for k in PLAN_LABELS if k in plan]
    keys += sorted(k for k in plan if k not in PLAN_LABELS and k not in PLAN_SKIP)
    formula = plan.get("flops_formula")
    labels = {**PLAN_LABELS, **({"total_flops": f"training FLOPs (({formula})·tokens)",
                                 "flops_per_token": f"FLOPs per token ({formula})"} if formula else {})}
    rows = [(labels.get(k, k), _show(k, plan[k])) for k in keys if plan[k] is not None]
    eff = plan.get("efficiency") or {}
    rows += [(EFFICIENCY_LABELS.get(k, k), _show(k, v)) for k, v in eff.items()
             if v is not None and k != "serial_fraction_stderr"]
    return pd.DataFrame(rows, columns=["quantity", "value"])


def plan_headline(plan: Mapping[str, Any]) -> str:
    """"384 GPUs (48 nodes × 8; the compute needs 379) at MFU 30.0% (given) and 720 TFLOP/s peak
    (given)", plus the count with the Amdahl scaling loss when the API estimated it."""
    gpus, nodes, booked = plan.get("gpus"), plan.get("nodes"), plan.get("gpus_booked")
    if isinstance(booked, (int, float)) and isinstance(nodes, (int, float)):
        text = f"{booked:,.0f} GPUs ({nodes:,.0f} nodes × {plan.get('gpus_per_node')}; the compute needs {gpus:,})"
    else:
        text = f"≈ {gpus:,.0f} GPUs" if isinstance(gpus, (int, float)) else "GPUs: ?"
        if isinstance(nodes, (int, float)):
            text += f" ({nodes:,.0f} nodes)"
    if plan.get("mfu") is not None:
        text += f" at MFU {pct(float(plan['mfu']))}"
        if plan.get("mfu_source"):
            text += f" ({plan['mfu_source']})"
    if plan.get("peak_tflops") is not None:
        text += f" and {float(plan['peak_tflops']):,.0f} TFLOP/s peak"
        if plan.get("peak_source"):
            text += f" ({plan['peak_source']})"
    eff = plan.get("efficiency") or {}
    if eff.get("gpus_with_scaling_loss"):
        text += f"; counting the Amdahl scaling loss: ≈ {eff['gpus_with_scaling_loss']:,} GPUs"
        if eff.get("nodes_with_scaling_loss"):
            text += f" ({eff['nodes_with_scaling_loss']:,} nodes)"
    return text


def default_target(cells: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """The scaling view to open first: the (model size, GPU type, sequence length) whose best runs
    span the most node counts in the heatmap (ties: more runs, then the smaller model)."""
    spans: dict[tuple[Any, Any, Any], set[int]] = {}
    runs: dict[tuple[Any, Any, Any], int] = {}
    for c in cells:
        best = c.get("best")
        if not best:
            continue
        key = (c["model_size_class"], best.get("gpu_type"), best.get("seq_len"))
        spans.setdefault(key, set()).add(c["nodes"])
        runs[key] = runs.get(key, 0) + c.get("n_success", 0) + c.get("n_oom", 0) + c.get("n_failed", 0)
    if not spans:
        return {}
    size, gpu, seq = max(spans, key=lambda k: (len(spans[k]), runs[k], -k[0]))
    return {"model_size_class": size, "gpu_type": gpu, "seq_len": seq}
