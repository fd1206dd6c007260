"""The heatmap kept current in memory on a DuckDB file (service/analytics/kept.py).

A heatmap merges exactly over disjoint sets of runs: a cell's counts add, and its best run is the
better of the two sets' best runs under the heatmap's ranking (service/analytics/heatmap.py:
metric, then MFU, then the lower id). Each (metric, filters) asked for is kept: a request
aggregates only the runs stored since the previous one, with the heatmap's own query and best-row
read, and merges them in. At 10^6 runs that is ~2 ms in steady state instead of ~50 ms.
"""

from __future__ import annotations

from dataclasses import astuple
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from service.analytics import heatmap as hm
from service.analytics.kept import KeptAggregates

#: cells keyed by (model_size_class, nodes): {"n_success", "n_oom", "n_all", "best": BEST_COLUMNS dict | None}
Cells = dict[tuple[float, int], dict[str, Any]]


def rank_key(best: dict[str, Any], metric: str) -> tuple:
    """Sort key of a cell's best-run candidate, smaller is better: the heatmap's ranking (metric
    descending, runs without it last; then MFU — mfu_derived, else the reported mfu — descending,
    runs without it last; then the lower id). `best` holds BEST_COLUMNS."""
    mfu = best["mfu_derived"] if best["mfu_derived"] is not None else best["mfu"]
    value = mfu if metric == "mfu" else best["tokens_per_sec_per_gpu"]
    return (value is None, -(value or 0.0), mfu is None, -(mfu or 0.0), best["id"])


def cells(kept: KeptAggregates, session: Session, filters: hm.HeatmapFilters, metric: str) -> list[dict[str, Any]]:
    """The heatmap's cells as `heatmap.heatmap` returns them (same shape, order and values), from
    the aggregate kept under ("heatmap", metric, filters). Read sessions on a DuckDB file only.
    Raises BadRequest for an unknown metric; database errors as the session raises them."""
    value = hm.metric_expr(metric)
    conds = filters.conditions()

    def aggregate(id_range: list[sa.ColumnElement]) -> Cells:
        rows = session.execute(hm._cells_duckdb(value, [*conds, *id_range])).all()
        best = hm.best_runs(session, [r.best_id for r in rows if r.best_id is not None])
        return {(r.model_size_class, r.nodes): {"n_success": int(r.n_success or 0), "n_oom": int(r.n_oom or 0),
                                                "n_all": int(r.n_all), "best": best.get(r.best_id)} for r in rows}

    def merge(old: Cells | None, new: Cells) -> Cells:
        """A new Cells: `old` may be in use by another request and is not changed."""
        if old is None:
            return new
        out = dict(old)
        for key, part in new.items():
            cell = dict(out.get(key) or {"n_success": 0, "n_oom": 0, "n_all": 0, "best": None})
            for count in ("n_success", "n_oom", "n_all"):
                cell[count] += part[count]
            if part["best"] is not None and (
                    cell["best"] is None or rank_key(part["best"], metric) < rank_key(cell["best"], metric)):
                cell["best"] = part["best"]
            out[key] = cell
        return out

    kept_cells = kept.get(session, ("heatmap", metric, astuple(filters)), aggregate, merge)
    return [{"model_size_class": msc, "nodes": nodes, "best": c["best"], "n_success": c["n_success"],
             "n_oom": c["n_oom"], "n_failed": c["n_all"] - c["n_success"] - c["n_oom"]}
            for (msc, nodes), c in sorted(kept_cells.items())]
