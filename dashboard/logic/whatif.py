""""What if?" (POST /api/v1/predict): one configuration's prediction as texts, a table and the
step-time bar. Pure functions over the API's answers (no Streamlit, no HTTP).

An answer is ``{"target", "config", "global_batch_tokens", "predicted": {tokens_per_sec_per_gpu, mfu,
step_time_s, peak_memory_gib, interval, breakdown_s: {compute, pipeline_bubble, tp_comm, dp_comm,
other}}, "fits", "memory": {predicted_peak_memory_gib, usable_memory_gib, p_fits,
recorded_oom_run_id}, "measured": {tokens_per_sec_per_gpu, run_id, n_runs} | None, "evidence",
"model": {…, extrapolates, extrapolation}, "why", "notes"}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from dashboard.logic.fmt import config_label, size_label
from dashboard.logic.recommend import DIM_FIELDS, shape_params

#: the step-time terms in the bar's order, with their names and colours
TERMS = (("compute", "compute", "#4C78A8"), ("pipeline_bubble", "pipeline bubble", "#F58518"),
         ("tp_comm", "TP communication", "#E45756"), ("dp_comm", "DP / ZeRO communication", "#72B7B2"),
         ("other", "other (PP sends, CP)", "#B0B0B0"))
#: the configuration fields the panel asks for (the API's names) and their defaults
CONFIG_DEFAULTS: dict[str, Any] = {"dp": 0, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "zero_stage": 0,
                                   "micro_batch_size": 1, "grad_accum_steps": 8, "recompute": "none"}


def seed(query: Mapping[str, Any] | None, answer: Mapping[str, Any] | None) -> dict[str, Any]:
    """The panel's defaults from the What worked? question and its answer: the completed target
    (model size as asked, nodes, GPUs per node, GPU type, seq_len, framework, precision, the dims
    given) and the configuration of the first run measured on the target whose layout is complete,
    else of the first prediction; CONFIG_DEFAULTS without either."""
    query, answer = query or {}, answer or {}
    target = answer.get("target") or {}
    out: dict[str, Any] = {"model": query.get("model_params") or "8B", "nodes": query.get("nodes") or 8,
                           "gpus_per_node": query.get("gpus_per_node") or 8,
                           "gpu_type": target.get("gpu_type") or query.get("gpu_type"),
                           "seq_len": target.get("seq_len") or query.get("seq_len") or 0,
                           "framework": target.get("framework") or query.get("framework"),
                           "precision": target.get("precision") or query.get("precision"),
                           **{f: query.get(f) for f in DIM_FIELDS}, **CONFIG_DEFAULTS}
    configs = [m.get("config") or {} for m in answer.get("measured_on_target") or []]
    configs += [c.get("config") or {} for c in answer.get("candidates") or []]
    for cfg in configs:
        if all(cfg.get(f) for f in ("dp", "tp", "pp", "micro_batch_size", "grad_accum_steps")):
            out.update({f: cfg[f] if cfg.get(f) is not None else CONFIG_DEFAULTS[f] for f in CONFIG_DEFAULTS})
            break
    return out


def predict_body(values: Mapping[str, Any]) -> dict[str, Any]:
    """The POST /predict body from the panel's values: the model size as text, the cluster, the
    layout (dp 0 = the world size over tp·pp·cp), the batch, the framework / precision / dims the
    form gives (shape_params: "" / 0 / "the records'" are left out)."""
    body: dict[str, Any] = {"model_params": str(values.get("model") or "").strip(), "nodes": int(values["nodes"]),
                            "gpus_per_node": int(values.get("gpus_per_node") or 8)}
    if values.get("gpu_type"):
        body["gpu_type"] = values["gpu_type"]
    if values.get("seq_len"):
        body["seq_len"] = int(values["seq_len"])
    for f in ("dp", "tp", "pp", "cp", "ep", "micro_batch_size", "grad_accum_steps"):
        if values.get(f):
            body[f] = int(values[f])
    body["zero_stage"] = int(values.get("zero_stage") or 0)
    body["recompute"] = values.get("recompute") or "none"
    body.update({k: v for k, v in shape_params(values).items() if v is not None})
    return body


def breakdown_frame(predicted: Mapping[str, Any]) -> pd.DataFrame:
    """One row per step-time term: its name, seconds, share of the step (fraction)."""
    parts = predicted.get("breakdown_s") or {}
    total = sum(max(0.0, float(parts.get(k) or 0.0)) for k, _, _ in TERMS) or 1.0
    rows = [{"term": name, "seconds": float(parts.get(key) or 0.0), "share": max(0.0, float(parts.get(key) or 0.0))
             / total} for key, name, _ in TERMS]
    return pd.DataFrame(rows, columns=["term", "seconds", "share"])


def breakdown_figure(predicted: Mapping[str, Any]) -> go.Figure:
    """The step time as one horizontal bar, stacked by term (seconds; the share in each segment)."""
    frame = breakdown_frame(predicted)
    fig = go.Figure()
    for (_, name, colour), (_, row) in zip(TERMS, frame.iterrows()):
        fig.add_trace(go.Bar(y=["step"], x=[row["seconds"]], name=name, orientation="h", marker_color=colour,
                             text=[f"{name} {row['seconds']:.2f} s ({row['share']:.0%})" if row["share"] >= 0.08
                                   else ""],
                             textposition="inside", insidetextanchor="middle",
                             hovertemplate=f"{name}: %{{x:.3f}} s ({row['share']:.1%})<extra></extra>"))
    fig.update_layout(barmode="stack", height=190, margin={"l": 10, "r": 10, "t": 30, "b": 60},
                      title={"text": f"step time {float(predicted.get('step_time_s') or 0):.2f} s per optimizer step",
                             "font": {"size": 14}},
                      xaxis_title="seconds", yaxis={"showticklabels": False},
                      legend={"orientation": "h", "y": -0.75, "traceorder": "normal"},
                      uniformtext={"minsize": 10, "mode": "hide"})
    return fig


def fits_text(answer: Mapping[str, Any]) -> str:
    """"✓ fits: 43.0 of 78.4 GiB usable (p 0.97)", "✗ does not fit: a recorded OOM (run #12) implies it",
    "✓ ran on this target (run #1168)"."""
    mem = answer.get("memory") or {}
    peak, usable = mem.get("predicted_peak_memory_gib"), mem.get("usable_memory_gib")
    amount = f"{peak:.1f} of {usable:.1f} GiB usable" if peak is not None and usable else (
        f"{peak:.1f} GiB" if peak is not None else "?")
    measured = answer.get("measured")
    if measured:
        return f"✓ ran on this target (run #{measured.get('run_id')}); the memory model predicts {amount}"
    if mem.get("recorded_oom_run_id"):
        return f"✗ does not fit: a recorded OOM (run #{mem['recorded_oom_run_id']}) implies it; predicted {amount}"
    fits = answer.get("fits")
    if fits is None:
        return f"not decided (GPU memory unknown): {amount}"
    return (f"✓ fits: {amount}" if fits else f"✗ does not fit: {amount}") + (
        f" (p {mem['p_fits']:.2f})" if mem.get("p_fits") is not None else "")


def model_text(model: Mapping[str, Any]) -> str:
    """"fitted on 241 runs of nanotron on H100-SXM-80GB, held-out error 3 %; extrapolates: 8 nodes,
    outside the fitted runs' 1–4" (or "within the recorded runs' range")."""
    err = model.get("loo_median_rel_err")
    text = f"{model.get('status')} on {model.get('n_runs')} runs of {model.get('framework')} on {model.get('gpu_type')}"
    if err is not None:
        text += f", held-out error {100 * err:.0f} %"
    if model.get("extrapolates"):
        return text + "; **extrapolates**: " + "; ".join(model.get("extrapolation") or [])
    return text + "; within the recorded runs' range"


def evidence_rows(evidence: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """The recorded runs the prediction rests on: run, model, nodes, GPU, framework, config, measured
    tokens/s per GPU, distance from the target."""
    rows = [{"run": f"#{e.get('run_id')}", "model": size_label(e.get("model_size_class")), "nodes": e.get("nodes"),
             "gpu_type": e.get("gpu_type"), "framework": e.get("framework"),
             "config": config_label(e.get("config") or {}),
             "measured_tokens_per_sec_per_gpu": e.get("measured_tokens_per_sec_per_gpu"),
             "distance": e.get("distance")} for e in evidence]
    return pd.DataFrame(rows, columns=["run", "model", "nodes", "gpu_type", "framework", "config",
                                       "measured_tokens_per_sec_per_gpu", "distance"])


#: how the evidence table writes its numbers
EVIDENCE_FORMATS: dict[str, str] = {"measured_tokens_per_sec_per_gpu": "{:,.0f}", "distance": "{:.2f}"}
