"""The Live page and a run's step series: the open runs as a table, and the series as a plot with its
warm-up, steady-state median, jitter and stragglers (core/steps.py's rules, computed by the API)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from dashboard.logic.fmt import config_label

#: what a glance needs first (status, last heartbeat, the last step's figures), then what ran
LIVE_COLUMNS = ["id", "status", "heard_s_ago", "last_step", "tokens_per_sec_per_gpu", "step_time_s", "loss",
                "peak_memory_gib", "name", "model_name", "config", "nodes", "gpu_type", "run_key"]


def _parse(moment: str | None) -> datetime | None:
    if not moment:
        return None
    parsed = datetime.fromisoformat(moment.replace("Z", "+00:00"))
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def live_table(body: Mapping[str, Any], now: datetime | None = None) -> pd.DataFrame:
    """GET /live's runs as rows: status (running / lost), what ran, seconds since the last heartbeat,
    and the last step's figures (empty when no step arrived yet)."""
    now = now or datetime.now(UTC)
    rows = []
    for item in body.get("runs", []):
        run, last = item["run"], item.get("last_step") or {}
        heard = _parse(run.get("last_heartbeat_at"))
        rows.append({"id": run.get("id"), "status": run.get("status"), "name": run.get("name"),
                     "model_name": run.get("model_name"), "nodes": run.get("nodes"), "gpu_type": run.get("gpu_type"),
                     "config": config_label(run),
                     "heard_s_ago": round((now - heard).total_seconds()) if heard else None,
                     "last_step": last.get("step"), "step_time_s": last.get("step_time_s"),
                     "tokens_per_sec_per_gpu": last.get("tokens_per_sec_per_gpu"), "loss": last.get("loss"),
                     "peak_memory_gib": last.get("peak_memory_gib"), "run_key": run.get("run_key")})
    return pd.DataFrame(rows, columns=LIVE_COLUMNS)


def summary_text(summary: Mapping[str, Any]) -> list[str]:
    """Plain sentences for a series' summary: steps and warm-up, steady-state medians, jitter, stragglers."""
    out = [f"{summary['steps']} steps: the first {summary['warmup_steps']} are warm-up, "
           f"{summary['steady_steps']} steady ({summary['rule']})."]
    head = summary.get("headline") or {}
    if head:
        parts = [f"{k.replace('_', ' ')} {v:,.4g}" for k, v in sorted(head.items())]
        out.append("Steady state: " + ", ".join(parts) + ".")
    jitter = summary.get("jitter_step_time")
    if jitter is not None:
        out.append(f"Step-time jitter (coefficient of variation): {jitter:.1%}.")
    stragglers = summary.get("stragglers") or []
    out.append(f"Straggler steps (step time > median + 3.5 robust z): {', '.join(map(str, stragglers))}."
               if stragglers else "No straggler steps.")
    return out


def series_figure(steps: Sequence[Mapping[str, Any]], summary: Mapping[str, Any]) -> go.Figure:
    """Tokens/s/GPU and step time (s) per step, with the loss when reported: the warm-up shaded, the
    steady-state medians as dashed lines, straggler steps marked with red crosses."""
    x = [s["step"] for s in steps]
    has_loss = any(s.get("loss") is not None for s in steps)
    rows = 3 if has_loss else 2
    titles = ["tokens/s per GPU", "step time (s)"] + (["loss"] if has_loss else [])
    fig = make_subplots(rows=rows, cols=1, shared_xaxes=True, vertical_spacing=0.06, subplot_titles=titles)
    fields = ["tokens_per_sec_per_gpu", "step_time_s"] + (["loss"] if has_loss else [])
    stragglers = set(summary.get("stragglers") or [])
    head = summary.get("headline") or {}
    warm = summary.get("warmup_steps") or 0
    for row, field in enumerate(fields, start=1):
        fig.add_trace(go.Scatter(x=x, y=[s.get(field) for s in steps], mode="lines+markers", name=titles[row - 1],
                                 marker={"size": 4}, showlegend=False), row=row, col=1)
        if field in head:
            fig.add_hline(y=head[field], line_dash="dash", line_color="gray", row=row, col=1,
                          annotation_text=f"steady median {head[field]:,.4g}", annotation_position="top left")
        marked = [s for s in steps if s["step"] in stragglers]
        if marked and field != "loss":
            fig.add_trace(go.Scatter(x=[s["step"] for s in marked], y=[s.get(field) for s in marked], mode="markers",
                                     marker={"symbol": "x", "size": 10, "color": "red"}, name="straggler",
                                     showlegend=row == 1), row=row, col=1)
    if warm and len(x) > warm:
        fig.add_vrect(x0=x[0], x1=x[warm - 1], fillcolor="gray", opacity=0.12, line_width=0,
                      annotation_text="warm-up", annotation_position="top left")
    fig.update_xaxes(title_text="step", row=rows, col=1)
    fig.update_layout(height=220 * rows + 60, margin={"t": 40, "l": 10, "r": 10, "b": 10})
    return fig
