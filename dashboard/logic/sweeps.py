"""The Sweeps page's logic (pure functions over GET /api/v1/sweeps/{name}): the progress line, the runs
table with predicted vs measured throughput, and the best-so-far curve."""

from __future__ import annotations

from typing import Any

import pandas as pd
import plotly.graph_objects as go

from dashboard.logic.fmt import size_label

#: the runs table's columns (display names) and formats
RUN_COLUMNS = {"n": "#", "id": "run", "label": "configuration", "status": "status", "attempt": "try",
               "tokens_per_sec_per_gpu": "tok/s/GPU", "predicted_tokens_per_sec_per_gpu": "predicted",
               "measured_vs_predicted": "measured / predicted", "mfu": "MFU", "peak_memory_gib": "peak GiB",
               "error_class": "error class"}
RUN_FORMATS = {"tok/s/GPU": "{:,.0f}", "predicted": "{:,.0f}", "measured / predicted": "{:.0%}", "MFU": "{:.1%}",
               "peak GiB": "{:.1f}", "run": "{:.0f}", "#": "{:.0f}", "try": "{:.0f}"}


def target_text(target: dict[str, Any]) -> str:
    """'1.3B × 1 node × 8 H100-SXM-80GB, seq 4,096, batch 1,048,576 tokens'."""
    nodes = target["nodes"]
    parts = [f"{size_label(target.get('model_size_class'))} × {nodes} node{'s' if nodes != 1 else ''} × "
             f"{target['gpus_per_node']} {target.get('gpu_type') or 'GPU'}"]
    if target.get("seq_len"):
        parts.append(f"seq {target['seq_len']:,}")
    if target.get("global_batch_tokens"):
        parts.append(f"batch {target['global_batch_tokens']:,} tokens")
    if target.get("framework"):
        parts.append(target["framework"])
    return ", ".join(parts)


def progress_text(sweep: dict[str, Any]) -> str:
    """'5 of 6 configurations handed out (3 success, 1 oom, 1 running); 1 grid configuration left'."""
    counts = ", ".join(f"{n} {status}" for status, n in sorted(sweep["counts"].items())) or "no runs yet"
    left = f"; {sweep['left']} grid configuration(s) left" if sweep.get("left") is not None else ""
    return f"{sweep['handed_out']} of {sweep['budget']} configurations handed out ({counts}){left}"


def runs_frame(sweep: dict[str, Any]) -> pd.DataFrame:
    """One row per run in hand-out order, predicted beside measured (measured / predicted when both)."""
    rows = []
    for n, r in enumerate(sweep["runs"], 1):
        measured, predicted = r.get("tokens_per_sec_per_gpu"), r.get("predicted_tokens_per_sec_per_gpu")
        rows.append({**{k: r.get(k) for k in RUN_COLUMNS if k in r}, "n": n,
                     "measured_vs_predicted": measured / predicted if measured and predicted else None})
    frame = pd.DataFrame(rows, columns=list(RUN_COLUMNS))
    return frame.rename(columns=RUN_COLUMNS)


def best_so_far_figure(sweep: dict[str, Any]) -> go.Figure:
    """The best tokens/s/GPU so far against the run's place in hand-out order (a step line), each
    successful run's measurement as a point and its prediction as an open marker."""
    runs = sweep["runs"]
    fig = go.Figure()
    curve = sweep["best_over_time"]
    fig.add_trace(go.Scatter(x=[p["n"] for p in curve], y=[p["tokens_per_sec_per_gpu"] for p in curve],
                             mode="lines", line_shape="hv", name="best so far"))
    ok = [(n, r) for n, r in enumerate(runs, 1) if r.get("tokens_per_sec_per_gpu")]
    fig.add_trace(go.Scatter(x=[n for n, _ in ok], y=[r["tokens_per_sec_per_gpu"] for _, r in ok], mode="markers",
                             name="measured", text=[r["label"] for _, r in ok]))
    pred = [(n, r) for n, r in enumerate(runs, 1) if r.get("predicted_tokens_per_sec_per_gpu")]
    fig.add_trace(go.Scatter(x=[n for n, _ in pred], y=[r["predicted_tokens_per_sec_per_gpu"] for _, r in pred],
                             mode="markers", marker_symbol="circle-open", name="predicted",
                             text=[r["label"] for _, r in pred]))
    fig.update_layout(xaxis_title="run (hand-out order)", yaxis_title="tokens/s/GPU", height=360,
                      margin={"l": 10, "r": 10, "t": 30, "b": 10}, legend={"orientation": "h"})
    return fig
