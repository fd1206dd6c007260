"""Failure aggregates: what breaks, at which node count, with which configuration (DESIGN §6).

Inputs are the API's shapes: heatmap cells (exact success / OOM / failed counts per model size ×
nodes) and failed runs from GET /runs?status=... pages. A failed run without an ``error_class`` is
counted as "unclassified (<status>)" so nothing disappears from the totals.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from core.record import LOST, STATUSES
from core.rules import parallel_label
from dashboard.logic.fmt import config_label, size_label

Run = Mapping[str, Any]
#: what the Failures page counts as failed: every finished status but success, and the lost runs (a
#: running run without a heartbeat for lost_after_s: the job hung or was killed). Running runs are not
#: results yet and are left out.
FAILED_STATUSES = (*(s for s in STATUSES if s != "success"), LOST)


def failure_class(run: Run) -> str:
    """The run's error class, or "unclassified (<status>)" when the importer could not classify it."""
    return run.get("error_class") or f"unclassified ({run.get('status') or '?'})"


def by_nodes(cells: Sequence[Mapping[str, Any]], lost: Mapping[int, int] | None = None) -> pd.DataFrame:
    """Runs, successes, OOMs, other failures, lost runs and the failure rate per node count (summed over
    the heatmap cells — finished runs — so the counts are exact whatever the number of runs; `lost`:
    {nodes: lost runs}, from GET /runs?status=lost, counted as failures)."""
    acc: dict[int, Counter] = {}
    for c in cells:
        counter = acc.setdefault(c["nodes"], Counter())
        counter["success"] += c.get("n_success", 0)
        counter["oom"] += c.get("n_oom", 0)
        counter["failed"] += c.get("n_failed", 0)
    for nodes, n in (lost or {}).items():
        acc.setdefault(nodes, Counter())["lost"] += n
    rows = []
    for nodes in sorted(acc, key=lambda n: (n is None, n)):
        k = acc[nodes]
        total = k["success"] + k["oom"] + k["failed"] + k["lost"]
        bad = k["oom"] + k["failed"] + k["lost"]
        rows.append({"nodes": nodes, "runs": total, "success": k["success"], "oom": k["oom"],
                     "other_failed": k["failed"], "lost": k["lost"], "failure_rate": bad / total if total else None})
    return pd.DataFrame(rows, columns=["nodes", "runs", "success", "oom", "other_failed", "lost", "failure_rate"])


def count_by_nodes(runs: Sequence[Run]) -> dict[Any, int]:
    """{nodes: number of runs} of `runs`."""
    return dict(Counter(r.get("nodes") for r in runs))


def class_by_nodes(runs: Sequence[Run]) -> pd.DataFrame:
    """Failed runs counted per node count (rows) and error class (columns), largest classes first."""
    counts = Counter((r.get("nodes"), failure_class(r)) for r in runs if r.get("status") != "success")
    if not counts:
        return pd.DataFrame()
    totals = Counter()
    for (_, cls), n in counts.items():
        totals[cls] += n
    classes = [c for c, _ in totals.most_common()]
    nodes = sorted({n for n, _ in counts}, key=lambda n: (n is None, n))
    frame = pd.DataFrame([[counts.get((n, c), 0) for c in classes] for n in nodes],
                         index=pd.Index(["?" if n is None else n for n in nodes], name="nodes"), columns=classes)
    return frame


def class_figure(table: pd.DataFrame) -> go.Figure:
    """Stacked bars of failed runs per node count, one colour per error class."""
    fig = go.Figure()
    x = [str(n) for n in table.index]
    for cls in table.columns:
        fig.add_trace(go.Bar(x=x, y=table[cls], name=cls))
    fig.update_layout(barmode="stack", height=360, xaxis={"title": {"text": "nodes"}, "type": "category"},
                      yaxis={"title": {"text": "failed runs"}}, margin={"t": 30, "l": 10, "r": 10, "b": 10},
                      legend={"title": {"text": "error class"}})
    return fig


def layout_label(run: Run) -> str:
    """The parallel layout of a run without the batch knobs: "DP16 TP2 PP1 Z1" (core.rules.parallel_label
    and the ZeRO stage); an unknown degree shows as "?", never as 1."""
    zero = run.get("zero_stage")
    return f"{parallel_label(run)} Z{zero if zero is not None else '?'}"


def _values(values: set[Any]) -> str:
    known = sorted(v for v in values if v is not None)
    return ", ".join(str(v) for v in known) + (", ?" if None in values else "")


def by_config(runs: Sequence[Run], limit: int = 50) -> pd.DataFrame:
    """Failed runs grouped by model size, nodes and parallel layout (DP/TP/PP/CP/EP + ZeRO): count per
    status, the micro-batch sizes and accumulation steps that failed, and the most common error
    class; most failures first."""
    groups: dict[tuple[Any, Any, str], list[Run]] = {}
    for r in runs:
        if r.get("status") != "success":
            groups.setdefault((r.get("model_size_class"), r.get("nodes"), layout_label(r)), []).append(r)
    rows = []
    for (size, nodes, layout), members in groups.items():
        statuses = Counter(r.get("status") for r in members)
        rows.append({"model_size": size_label(size) if size is not None else "?", "nodes": nodes, "layout": layout,
                     "failures": len(members), **{s: statuses.get(s, 0) for s in FAILED_STATUSES},
                     "failed_mbs": _values({r.get("micro_batch_size") for r in members}),
                     "failed_gas": _values({r.get("grad_accum_steps") for r in members}),
                     "top_error_class": Counter(failure_class(r) for r in members).most_common(1)[0][0]})
    columns = ["model_size", "nodes", "layout", "failures", *FAILED_STATUSES, "failed_mbs", "failed_gas",
               "top_error_class"]
    frame = pd.DataFrame(rows, columns=columns)
    if frame.empty:
        return frame
    return frame.sort_values(["failures", "nodes"], ascending=[False, True]).head(limit).reset_index(drop=True)


def dimension_failure_rates(dimension: str, totals: Mapping[Any, tuple[int, int]]) -> pd.DataFrame:
    """Failure rate per value of one config field (zero_stage, tp, micro_batch_size, …) from
    ``{value: (runs, successes)}`` (exact counts, e.g. the ``total`` of GET /runs pages; runs still
    running are not counted: they have no outcome yet)."""
    rows = [{dimension: v, "runs": n, "failed": n - ok, "failure_rate": (n - ok) / n if n else None}
            for v, (n, ok) in sorted(totals.items(), key=lambda kv: _order(kv[0])) if n]
    return pd.DataFrame(rows, columns=[dimension, "runs", "failed", "failure_rate"])


def _order(value: Any) -> tuple:
    numeric = isinstance(value, (int, float))
    return (value is None, not numeric, value if numeric else str(value))


def latest_errors(runs: Sequence[Run], limit: int = 20, width: int = 300) -> pd.DataFrame:
    """The most recent failed runs (highest id first) with their error message cut to ``width``."""
    failed = sorted((r for r in runs if r.get("status") != "success"), key=lambda r: -(r.get("id") or 0))[:limit]
    rows = [{"id": r.get("id"), "started_at": r.get("started_at"), "model": r.get("model_name"),
             "nodes": r.get("nodes"), "config": config_label(r), "status": r.get("status"),
             "error_class": failure_class(r),
             "error_message": _cut(r.get("error_message"), width)} for r in failed]
    return pd.DataFrame(rows, columns=["id", "started_at", "model", "nodes", "config", "status", "error_class",
                                       "error_message"])


def _cut(text: str | None, width: int) -> str:
    if not text:
        return ""
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"
