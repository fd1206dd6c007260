"""Failures page pieces. Counts come from the API's exact numbers wherever possible: heatmap cells
(success / OOM / failed per model size × nodes) and the ``total`` of GET /runs pages; the failed
runs themselves are paged with ``status=`` filters (newest first, capped) for error classes and
configurations."""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import data, ui
from dashboard.logic import failures as fl
from dashboard.logic.fmt import size_label

MAX_PER_STATUS = 5000
RATE = st.column_config.NumberColumn("failure rate", format="percent")
DIMENSIONS = {"zero_stage": "ZeRO stage", "tp": "TP", "pp": "PP", "dp": "DP", "micro_batch_size": "micro-batch size",
              "grad_accum_steps": "grad-accumulation steps", "recompute": "recompute", "nodes": "nodes"}


def filters(options: dict[str, list[Any]]) -> dict[str, Any]:
    """Sidebar filters: model size, GPU type, framework."""
    with st.sidebar:
        st.subheader("Filters")
        f = {"model_size_class": ui.choice("Model size", options.get("model_size_class", []), "fail_size",
                                           fmt=size_label),
             "gpu_type": ui.choice("GPU type", options.get("gpu_type", []), "fail_gpu"),
             "framework": ui.choice("Framework", options.get("framework", []), "fail_fw")}
    return {k: v for k, v in f.items() if v is not None}


def by_nodes(query: dict[str, Any]) -> None:
    """Runs, OOMs, other failures and the failure rate per node count (exact, from heatmap cells)."""
    cells = ui.call(data.get, "/heatmap", gpu_type=query.get("gpu_type"), framework=query.get("framework"))["cells"]
    if query.get("model_size_class") is not None:
        cells = [c for c in cells if c["model_size_class"] == query["model_size_class"]]
    lost_runs, _ = ui.call(data.all_runs, max_runs=MAX_PER_STATUS, status="lost", **query)
    lost = fl.count_by_nodes(lost_runs)
    st.dataframe(fl.by_nodes(cells, lost), hide_index=True, key="fail_nodes", column_config={"failure_rate": RATE})
    if lost:
        st.caption("lost: runs still open whose job stopped heartbeating (hung, or killed outright) — see the Live "
                   "page")


def failed_runs(query: dict[str, Any]) -> list[dict[str, Any]]:
    """Every failed run matching ``query`` (newest first, at most MAX_PER_STATUS per status)."""
    runs: list[dict[str, Any]] = []
    capped = []
    with st.spinner("Loading failed runs…"):
        for status in fl.FAILED_STATUSES:
            got, total = ui.call(data.all_runs, max_runs=MAX_PER_STATUS, status=status, sort="-id", **query)
            runs.extend(got)
            if total > len(got):
                capped.append(f"{status}: newest {len(got):,} of {total:,}")
    if capped:
        st.caption("Aggregates below cover " + "; ".join(capped))
    return runs


def classes(runs: list[dict[str, Any]]) -> None:
    """Error classes per node count: stacked bars and the table."""
    table = fl.class_by_nodes(runs)
    if table.empty:
        st.success("No failed runs match.")
        return
    st.plotly_chart(fl.class_figure(table), key="fail_classes_chart")
    st.dataframe(table, key="fail_classes")


def configs(runs: list[dict[str, Any]]) -> None:
    """The configurations that fail most."""
    st.dataframe(fl.by_config(runs), hide_index=True, key="fail_configs")


def rates(options: dict[str, list[Any]], query: dict[str, Any]) -> None:
    """Failure rate per value of a chosen config field (exact: two run counts per value)."""
    dim = st.selectbox("Failure rate by", list(DIMENSIONS), format_func=DIMENSIONS.get, key="fail_dim")
    totals = {}
    for value in options.get(dim, []):
        params = {**query, dim: value}
        n = ui.call(data.get, "/runs", limit=1, **params)["total"]
        ok = ui.call(data.get, "/runs", limit=1, status="success", **params)["total"] if n else 0
        running = ui.call(data.get, "/runs", limit=1, status="running", **params)["total"] if n else 0
        totals[value] = (n - running, ok)  # a running run has no outcome yet; a lost one counts as failed
    st.dataframe(fl.dimension_failure_rates(dim, totals), hide_index=True, key="fail_rates",
                 column_config={"failure_rate": RATE})


def latest(query: dict[str, Any], limit: int = 20) -> None:
    """The newest failed runs with their error messages."""
    recent: list[dict[str, Any]] = []
    for status in fl.FAILED_STATUSES:
        recent.extend(ui.call(data.get, "/runs", sort="-id", status=status, limit=limit, **query)["runs"])
    frame = fl.latest_errors(recent, limit=limit)
    if frame.empty:
        st.success("No failed runs match.")
        return
    st.dataframe(frame, hide_index=True, key="fail_latest",
                 column_config={"error_message": st.column_config.TextColumn("error message", width="large")})
