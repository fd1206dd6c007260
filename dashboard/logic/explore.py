"""Explore: the runs as points over any two fields and as parallel coordinates (pure functions).

The runs come from ONE read-only query through POST /api/v1/sql (:func:`explore_sql`): only the
columns plotted, the newest :data:`MAX_POINTS` runs matching the filters. :func:`scatter` draws a
plotly scatter (one point per run, ``customdata`` = run id, so a box/lasso selection in the page
gives the run ids shown in the table); :func:`parallel` draws parallel coordinates over the chosen
fields. Colour: the run's status (categorical, fixed colours) or a metric (continuous).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

#: the newest runs drawn at most (a scatter of more points is a blur and a slow page)
MAX_POINTS = 2000
#: lines of the parallel coordinates at most (the newest; WebGL without a GPU draws thousands slowly)
MAX_LINES = 1000

#: numeric run fields offered as axes / dimensions, with their axis titles
NUMERIC_FIELDS: dict[str, str] = {
    "tokens_per_sec_per_gpu": "tokens/s per GPU",
    "mfu_derived": "MFU (derived)",
    "tflops_per_gpu": "TFLOP/s per GPU",
    "peak_memory_gib": "peak memory (GiB)",
    "step_time_s": "step time (s)",
    "model_size_class": "model size (B params)",
    "nodes": "nodes",
    "world_size": "GPUs",
    "gpus_per_node": "GPUs per node",
    "seq_len": "sequence length",
    "global_batch_tokens": "global batch (tokens)",
    "dp": "DP", "tp": "TP", "pp": "PP", "cp": "CP", "ep": "EP",
    "zero_stage": "ZeRO stage",
    "micro_batch_size": "micro-batch size",
    "grad_accum_steps": "grad-accum steps",
}
#: text fields carried for hover, colour and the table
TEXT_FIELDS = ("model_name", "gpu_type", "framework", "precision", "recompute", "status", "error_class")
COLUMNS = ("id", *NUMERIC_FIELDS, *TEXT_FIELDS)
#: colour choices: status (categorical) or a metric (continuous)
COLOR_CHOICES = {"mfu_derived": "MFU", "status": "status", "tokens_per_sec_per_gpu": "tokens/s per GPU",
                 "peak_memory_gib": "peak memory"}
STATUS_COLORS = {"success": "#1a9850", "oom": "#d73027", "nccl_error": "#7b3294", "timeout": "#fdae61",
                 "failed": "#4d4d4d"}
LOG_FIELDS = {"tokens_per_sec_per_gpu", "model_size_class", "nodes", "world_size", "global_batch_tokens", "seq_len"}


def sql_literal(value: Any) -> str:
    """A value as an SQL literal: numbers as written, text single-quoted with quotes doubled.
    Raises ValueError for anything else (the filters only ever hold text and numbers)."""
    if isinstance(value, bool) or value is None:
        raise ValueError(f"not a filter value: {value!r}")
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise ValueError(f"not a filter value: {value!r}")


def explore_sql(filters: Mapping[str, Any], limit: int = MAX_POINTS) -> str:
    """SELECT of :data:`COLUMNS` for the newest ``limit`` runs whose fields equal ``filters``
    (field → value; None values ignored; field names must be columns of COLUMNS)."""
    conds = []
    for field, value in filters.items():
        if value is None:
            continue
        if field not in COLUMNS:
            raise ValueError(f"unknown filter field {field!r}")
        conds.append(f"{field} = {sql_literal(value)}")
    where = f" where {' and '.join(conds)}" if conds else ""
    return f"select {', '.join(COLUMNS)} from runs{where} order by id desc limit {int(limit)}"


def frame(body: Mapping[str, Any]) -> pd.DataFrame:
    """The SQL answer ({"columns", "rows"}) as a DataFrame (numeric columns as floats, NaN = missing)."""
    df = pd.DataFrame(body.get("rows", []), columns=body.get("columns", list(COLUMNS)))
    for col in NUMERIC_FIELDS:
        if col in df:
            df[col] = pd.to_numeric(df[col], errors="coerce")
    return df


def hover_text(row: Mapping[str, Any]) -> str:
    """One run in the hover box: id, model, GPUs, layout, status and the metrics."""
    def num(v: Any, fmt: str) -> str:
        return "—" if v is None or pd.isna(v) else format(v, fmt)

    layout = " ".join(f"{d.upper()}{num(row.get(d), '.0f')}" for d in ("dp", "tp", "pp"))
    return (f"<b>#{row.get('id')}</b> {row.get('model_name') or '—'} · {num(row.get('nodes'), '.0f')} nodes × "
            f"{row.get('gpu_type') or '—'}<br>{layout} Z{num(row.get('zero_stage'), '.0f')} "
            f"MBS{num(row.get('micro_batch_size'), '.0f')} · {row.get('status')}<br>"
            f"{num(row.get('tokens_per_sec_per_gpu'), ',.0f')} tok/s/GPU · MFU {num(row.get('mfu_derived'), '.1%')}"
            f" · {num(row.get('peak_memory_gib'), '.1f')} GiB")


def scatter(df: pd.DataFrame, x: str, y: str, color: str = "status", log_x: bool = False,
            log_y: bool = False) -> go.Figure:
    """One point per run at (x, y) (SVG, not WebGL: quick without a GPU too); colour by status (one
    trace per status, fixed colours) or by a metric (continuous, viridis). ``customdata`` = [run id];
    runs missing x or y are left out."""
    data = df.dropna(subset=[x, y])
    fig = go.Figure()
    if color == "status":
        for status, part in data.groupby("status", sort=True):
            fig.add_trace(go.Scatter(
                x=part[x], y=part[y], mode="markers", name=str(status),
                marker={"color": STATUS_COLORS.get(str(status), "#999999"), "size": 7, "opacity": 0.75},
                customdata=part[["id"]].to_numpy(), hovertext=[hover_text(r) for r in part.to_dict("records")],
                hovertemplate="%{hovertext}<extra></extra>"))
    else:
        fig.add_trace(go.Scatter(
            x=data[x], y=data[y], mode="markers", name="runs",
            marker={"color": data[color], "colorscale": "Viridis", "size": 7, "opacity": 0.8, "showscale": True,
                    "colorbar": {"title": {"text": COLOR_CHOICES.get(color, color)}}},
            customdata=data[["id"]].to_numpy(), hovertext=[hover_text(r) for r in data.to_dict("records")],
            hovertemplate="%{hovertext}<extra></extra>"))
    fig.update_layout(
        height=520, margin={"l": 10, "r": 10, "t": 30, "b": 10}, dragmode="lasso", legend={"title": {"text": "status"}},
        xaxis={"title": {"text": NUMERIC_FIELDS.get(x, x)}, "type": "log" if log_x else "linear"},
        yaxis={"title": {"text": NUMERIC_FIELDS.get(y, y)}, "type": "log" if log_y else "linear"},
    )
    return fig


def bounds(df: pd.DataFrame, field: str) -> tuple[float, float] | None:
    """(min, max) of a numeric field over the runs that have it (ints when every value is whole, so
    a slider steps by 1); None when no run has it or all runs have the same value (nothing to narrow)."""
    values = df[field].dropna() if field in df else pd.Series(dtype=float)
    if values.empty or values.min() == values.max():
        return None
    if (values == values.round()).all():
        return int(values.min()), int(values.max())
    return float(values.min()), float(values.max())


def apply_ranges(df: pd.DataFrame, ranges: Mapping[str, tuple[float, float]]) -> pd.DataFrame:
    """The runs whose every field in ``ranges`` (field → (lo, hi), inclusive) lies in its range;
    a run missing a narrowed field is left out (it cannot be said to lie in the range)."""
    keep = pd.Series(True, index=df.index)
    for field, (lo, hi) in ranges.items():
        keep &= df[field].between(lo, hi)
    return df[keep]


def parallel(df: pd.DataFrame, dims: Sequence[str], color: str = "status",
             ranges: Mapping[str, tuple[float, float]] | None = None) -> go.Figure:
    """Parallel coordinates over ``dims`` (numeric fields), one line per run (the newest
    :data:`MAX_LINES`); colour by status (codes in :data:`STATUS_COLORS` order) or by a metric. Runs
    missing a dimension are left out. ``ranges`` (field → (lo, hi)) are drawn as the axes' brushed
    ranges (plotly ``constraintrange``), so the page's range filters show on the chart."""
    data = df.dropna(subset=list(dims)).head(MAX_LINES)  # df is newest first
    if color == "status":
        order = list(STATUS_COLORS)
        codes = data["status"].map(lambda s: order.index(s) if s in order else len(order)).astype(float)
        n = len(order)
        scale = [[i / n, c] for i, c in enumerate(STATUS_COLORS.values())] + [[1.0, "#999999"]]
        line = {"color": codes, "colorscale": scale, "cmin": 0, "cmax": n, "showscale": False}
    else:
        data = data.dropna(subset=[color])
        line = {"color": data[color], "colorscale": "Viridis", "showscale": True,
                "colorbar": {"title": {"text": COLOR_CHOICES.get(color, color)}}}
    dimensions = [{"label": NUMERIC_FIELDS.get(d, d), "values": data[d],
                   **({"constraintrange": list(ranges[d])} if ranges and d in ranges else {})} for d in dims]
    fig = go.Figure(go.Parcoords(line=line, dimensions=dimensions))
    # room on the right for the colour bar, clear of the last axis' labels
    fig.update_layout(height=460, margin={"l": 60, "r": 60 if color == "status" else 150, "t": 60, "b": 20})
    return fig


def selected_ids(event: Any) -> list[int]:
    """Run ids of the points selected in the scatter (Streamlit's selection event), in order."""
    points = (getattr(event, "selection", None) or {}).get("points", []) if event else []
    ids: list[int] = []
    for p in points:
        custom = p.get("customdata")
        if custom:
            value = custom[0] if isinstance(custom, (list, tuple)) else custom
            if int(value) not in ids:
                ids.append(int(value))
    return ids


def summary(df: pd.DataFrame) -> str:
    """"1,234 runs · success 900 · oom 200 · failed 134"."""
    counts = df["status"].value_counts() if "status" in df else pd.Series(dtype=int)
    parts = [f"{k} {v:,}" for k, v in counts.items()]
    return " · ".join([f"{len(df):,} runs", *parts])
