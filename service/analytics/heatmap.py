"""Best-configuration heatmap: one cell per (model size class, MoE or dense, node count).

Ultra-Scale Playbook, "Benchmarking thousands of configurations": for every model size and node
count, the best successful run and its configuration. A cell's best run is the successful run with
the highest metric — `tokens_per_sec_per_gpu` (default) or `mfu` (mfu_derived, falling back to the
reported mfu) — ties broken by the higher MFU, then the lower id (service/ranking.py, the one
ranking rule). Successful runs without the metric rank after those with it, so a cell that has
successes always shows one. Cells carry counts of successful, OOM and
other failed runs; a cell with only failures has `best = None`. A cell's best run is carried as the
columns of BEST_COLUMNS only (its config, metrics and memory); the whole run is GET /api/v1/runs/{id}.

A mixture-of-experts model and a dense model of the same total size (Qwen3-30B-A3B and MPT-30B) are
different rows: the cell key includes the run's stored ``moe`` flag (core.model.is_moe, service/derive.py),
so neither hides the other.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from core import hardware
from core.rules import METRICS, slice_key
from service.errors import BadRequest
from service.lifecycle import FINISHED
from service.ranking import SqlExpr, best_order
from service.tables import Run, RunCell

#: 'success' inlined in the SQL (not a bind parameter), so PostgreSQL matches the partial indexes
#: `... WHERE status = 'success'` in generic (prepared) plans too
SUCCESS_LITERAL: sa.ColumnElement[Any] = sa.literal_column("'success'")

#: The columns of a cell's best run (DESIGN §4: the config DP/TP/PP/CP/ZeRO/MBS/GAS/recompute, MFU,
#: peak memory), with what the dashboard shows of it (throughput, hardware, seq_len, framework, …)
#: and takes filter choices from (dashboard/logic/options.py; error_class is null for a success).
#: Units as on a run: tokens/s per GPU, TFLOP/s per GPU, MFU/HFU as fractions, GiB per GPU, seconds
#: per step. Reading these 34 of the 53 columns, without `fingerprint`, `extra` or the error text,
#: keeps DuckDB (a column store) from fetching every column of 436 scattered rows at 10^6 runs.
BEST_COLUMNS = (
    "id", "run_key", "name", "source", "model_name", "model_params", "model_size_class",
    "gpu_type", "gpus_per_node", "nodes", "world_size", "seq_len", "global_batch_tokens",
    "dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size", "grad_accum_steps", "recompute",
    "precision", "framework", "status", "started_at",
    "tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu", "mfu_derived", "hfu", "hfu_derived",
    "peak_memory_gib", "step_time_s",
)


def metric_expr(metric: str) -> sa.ColumnElement[Any]:
    """SQL expression of a ranking metric; BadRequest for an unknown one."""
    if metric == "tokens_per_sec_per_gpu":
        return Run.tokens_per_sec_per_gpu.expression
    if metric == "mfu":
        return sa.func.coalesce(Run.mfu_derived, Run.mfu)
    raise BadRequest(f"unknown metric '{metric}'; one of {', '.join(METRICS)}",
                     [{"field": "metric", "value": metric, "message": "unknown metric"}])


@dataclass
class HeatmapFilters:
    """Filters shared by heatmap and its drill-down. gpu_type accepts any catalog alias."""

    gpu_type: str | None = None
    seq_len: int | None = None
    global_batch_tokens: int | None = None
    framework: str | None = None
    precision: str | None = None
    started_after: datetime | None = None
    started_before: datetime | None = None
    sweep: str | None = None  # the runs of one sweep (runs.sweep)

    def conditions(self) -> list[sa.ColumnElement]:
        """The filters as conditions on `runs`: finished, not retired runs of a known size and node count."""
        conds: list[sa.ColumnElement] = [Run.model_size_class.is_not(None), Run.nodes.is_not(None),
                                          Run.retired_at.is_(None),  # retired runs leave every analytic
                                          FINISHED]  # so do open (running, lost) ones: no result yet
        conds += [getattr(Run, name) == value for name, value in self._grouped().items()]
        if self.global_batch_tokens:
            conds.append(Run.global_batch_tokens == self.global_batch_tokens)
        if self.started_after:
            conds.append(Run.started_at >= self.started_after)
        if self.started_before:
            conds.append(Run.started_at < self.started_before)
        if self.sweep:
            conds.append(Run.sweep == self.sweep)
        return conds

    def _grouped(self) -> dict[str, Any]:
        """The filters on columns `run_cells` groups by (GPU type, seq_len, framework, precision), as stored."""
        values = {"gpu_type": self.gpu_type and (hardware.canonical_gpu_type(self.gpu_type) or self.gpu_type),
                  "seq_len": self.seq_len, "framework": self.framework,
                  "precision": self.precision and (hardware.canonical_precision(self.precision) or self.precision)}
        return {name: value for name, value in values.items() if value}

    def summary_conditions(self) -> list[sa.ColumnElement] | None:
        """The filters as conditions on `run_cells` (whose rows are the finished, not retired runs already),
        or None when one of them is on a column it does not group by (global batch, dates, sweep)."""
        if self.global_batch_tokens or self.started_after or self.started_before or self.sweep:
            return None
        return [RunCell.model_size_class.is_not(None), RunCell.nodes.is_not(None),
                *(getattr(RunCell, name) == value for name, value in self._grouped().items())]


def heatmap(session: Session, filters: HeatmapFilters, metric: str = "tokens_per_sec_per_gpu") -> list[dict[str, Any]]:
    """All cells, sorted by (model_size_class, moe, nodes), from one query per request.

    Returns [{"model_size_class": float (billions), "moe": bool (the cell's runs are
    mixture-of-experts: :data:`MOE`), "nodes": int, "best": {column: value} | None
    (the BEST_COLUMNS of the cell's best run, plain Python values; started_at a naive UTC datetime),
    "n_success": int, "n_oom": int, "n_failed": int}]. The best run of a cell is the successful run
    first in service/ranking.py's order (metric, then MFU, then the lower id). Nothing is kept
    in the process between requests; `run_cells` is kept by the database in every write's transaction (a
    run changed with outside SQL: `scalebook db rebuild-configs`).
    - by tokens/s/GPU with filters on what `run_cells` groups by (GPU type, seq_len, framework,
      precision; the dashboard's slices), on either backend: from that summary, which the database keeps
      in the transaction of every write (service/run_cells.py) — the counts are the sums of its groups'
      n_runs, the best run the first of the groups' best runs in the same ranking (each group's best is
      its first, so the first of those is the cell's), its BEST_COLUMNS read by id: a few thousand rows
      instead of 10^6 (at 10^6 over HTTP: PostgreSQL ~520 → ~50 ms, DuckDB ~170 → ~50;
      bench/RESULTS.md, "Session 5, lead");
    - otherwise (the MFU metric; a global batch, date or sweep filter), over `runs`:
    - DuckDB: counts and the top metric per cell, the best run among those at the top by
      arg_min (MFU, id), and its BEST_COLUMNS joined by id;
    - PostgreSQL: counts per cell, then a LATERAL top-1 per cell that walks the partial index
      `ix_runs_best_tps` / `ix_runs_best_mfu` (status = 'success'; migration 0003) — a few index
      entries per cell instead of every successful run.
    Raises BadRequest for an unknown metric.
    """
    value = metric_expr(metric)
    summary = filters.summary_conditions() if metric == "tokens_per_sec_per_gpu" else None
    if summary is not None:
        query = _cells_summary(summary)
    elif session.get_bind().dialect.name == "duckdb":
        query = _cells_duckdb(value, filters.conditions())
    else:
        query = _cells_lateral(value, filters.conditions())
    cells = []
    for row in session.execute(query).mappings():
        n_success, n_oom = int(row["n_success"] or 0), int(row["n_oom"] or 0)
        best = {name: row[f"best_{name}"] for name in BEST_COLUMNS} if row["best_id"] is not None else None
        cells.append({
            "model_size_class": row["model_size_class"],
            "moe": bool(row["moe"]),
            "nodes": row["nodes"],
            "best": best,
            "n_success": n_success,
            "n_oom": n_oom,
            "n_failed": int(row["n_all"]) - n_success - n_oom,
        })
    return cells


#: MoE or dense (core.model.is_moe, stored by service/derive.py); a run stored without the flag
#: (written by outside SQL) counts as dense
MOE: sa.ColumnElement[bool] = sa.func.coalesce(Run.is_moe, sa.false())
#: the cell key: size class, MoE or dense, node count (CELL_COLUMNS: the same, selected by name)
CELL_KEY = (Run.model_size_class, MOE, Run.nodes)
CELL_COLUMNS = (Run.model_size_class, MOE.label("moe"), Run.nodes)


def _same_cell(cells: Any) -> sa.ColumnElement[bool]:
    """The run's cell key equals that of the CTE ``cells``."""
    return sa.and_(Run.model_size_class == cells.c.model_size_class, MOE == cells.c.moe, Run.nodes == cells.c.nodes)


def _counts() -> list[SqlExpr]:
    return [
        *CELL_COLUMNS,
        sa.func.count().filter(Run.status == "success").label("n_success"),
        sa.func.count().filter(Run.status == "oom").label("n_oom"),
        sa.func.count().label("n_all"),
    ]


def _cells_summary(conds: list[sa.ColumnElement]) -> sa.Select:
    """The cells from `run_cells` (either backend): each cell's counts summed over its groups, its best run
    the first by best_order of the best runs of its successful groups, that run's BEST_COLUMNS by id."""
    cell = (RunCell.model_size_class, RunCell.is_moe, RunCell.nodes)
    cells = (sa.select(RunCell.model_size_class, RunCell.is_moe.label("moe"), RunCell.nodes,
                       sa.func.sum(RunCell.n_runs).filter(RunCell.status == "success").label("n_success"),
                       sa.func.sum(RunCell.n_runs).filter(RunCell.status == "oom").label("n_oom"),
                       sa.func.sum(RunCell.n_runs).label("n_all"))
             .where(*conds).group_by(*cell).cte("cells"))
    ranked = (sa.select(*cell, RunCell.best_id,
                        sa.func.row_number().over(partition_by=cell, order_by=best_order(
                            RunCell.best_tps, RunCell.best_mfu, RunCell.best_id)).label("rank"))
              .where(*conds, RunCell.status == SUCCESS_LITERAL).subquery("ranked"))
    row = Run.__table__.alias("best_run")
    same = sa.and_(ranked.c.model_size_class == cells.c.model_size_class, ranked.c.is_moe == cells.c.moe,
                   ranked.c.nodes == cells.c.nodes, ranked.c.rank == 1)
    return (sa.select(cells.c.model_size_class, cells.c.moe, cells.c.nodes, cells.c.n_success, cells.c.n_oom,
                      cells.c.n_all, *_best_columns(row))
            .select_from(cells.outerjoin(ranked, same).outerjoin(row, row.c.id == ranked.c.best_id))
            .order_by(cells.c.model_size_class, cells.c.moe, cells.c.nodes))


def _best_columns(table: Any) -> list[sa.ColumnElement]:
    return [table.c[name].label(f"best_{name}") for name in BEST_COLUMNS]


def _cells_duckdb(value: sa.ColumnElement, conds: list[sa.ColumnElement]) -> sa.Select:
    """Two scans instead of one arg_min over the whole ranking key (which costs DuckDB ~2× as
    much at 10^6 runs): counts and the top metric per cell, then, among the cell's successful
    runs at that top value (all of them when no run has the metric), the first by the rest of
    the ranking (higher MFU, lower id); the best run's columns joined by id."""
    mfu = sa.func.coalesce(Run.mfu_derived, Run.mfu)
    cells = (sa.select(*_counts(), sa.func.max(value).filter(Run.status == SUCCESS_LITERAL).label("top"))
             .where(*conds).group_by(*CELL_KEY).cte("cells"))
    key = sa.tuple_(mfu.is_(None), -sa.func.coalesce(mfu, 0.0), Run.id)
    # metrics are positive, so -1 stands for "none": a cell without the metric keeps all its runs
    at_top = sa.func.coalesce(value, -1.0) == sa.func.coalesce(cells.c.top, -1.0)
    best = (sa.select(*CELL_COLUMNS, sa.func.arg_min(Run.id, key).label("best_id"))
            .join(cells, sa.and_(_same_cell(cells), at_top))
            .where(*conds, Run.status == SUCCESS_LITERAL)
            .group_by(*CELL_KEY).cte("best"))
    row = Run.__table__.alias("best_run")
    return (sa.select(cells.c.model_size_class, cells.c.moe, cells.c.nodes, cells.c.n_success, cells.c.n_oom,
                      cells.c.n_all, *_best_columns(row))
            .select_from(cells.outerjoin(best, sa.and_(best.c.model_size_class == cells.c.model_size_class,
                                                       best.c.moe == cells.c.moe,
                                                       best.c.nodes == cells.c.nodes))
                         .outerjoin(row, row.c.id == best.c.best_id))
            .order_by(cells.c.model_size_class, cells.c.moe, cells.c.nodes))


def _cells_lateral(value: sa.ColumnElement, conds: list[sa.ColumnElement]) -> sa.Select:
    """Counts per cell, LEFT JOIN LATERAL the top-1 successful run of the cell (PostgreSQL)."""
    cells = sa.select(*_counts()).where(*conds).group_by(*CELL_KEY).cte("cells")
    mfu = sa.func.coalesce(Run.mfu_derived, Run.mfu)
    table = Run.__table__
    top = (sa.select(*_best_columns(table))
           .where(*conds, Run.status == SUCCESS_LITERAL, _same_cell(cells))
           .order_by(*best_order(value, mfu, Run.id))
           .limit(1).lateral("top"))
    return (sa.select(cells, top).select_from(cells.outerjoin(top, sa.true()))
            .order_by(cells.c.model_size_class, cells.c.moe, cells.c.nodes))


def cell_runs(session: Session, filters: HeatmapFilters, model_size_class: float, nodes: int,
              metric: str = "tokens_per_sec_per_gpu", limit: int = 500, moe: bool | None = None) -> list[Run]:
    """The runs of one cell: successes first in the ranking order (service/ranking.py), then the
    failures in the same order; at most `limit`. ``moe``: True the cell's mixture-of-experts runs,
    False its dense ones (a run stored without the flag counts as dense), None both."""
    value = metric_expr(metric)
    mfu = sa.func.coalesce(Run.mfu_derived, Run.mfu)
    conds = [*filters.conditions(), Run.model_size_class == model_size_class, Run.nodes == nodes]
    if moe is not None:
        conds.append(MOE == moe)
    return list(session.scalars(
        sa.select(Run).where(*conds)
        .order_by(Run.status != "success", *best_order(value, mfu, Run.id)).limit(limit)))


def slices(session: Session, filters: HeatmapFilters, model_size_class: float | None = None,
           most: str = "runs") -> list[dict[str, Any]]:
    """The (GPU type, sequence length) slices of the runs the filters choose (of one size class when
    given): [{"gpu_type", "seq_len", "runs" (every status), "successes", "node_counts" (distinct node
    counts with a successful run)}], the one to show first first (core.rules.slice_key, `most`).
    Runs without a GPU type or sequence length belong to no slice. Read from `run_cells` when the filters
    are on what it groups by (as heatmap()), else from `runs`."""
    summary = filters.summary_conditions()
    table: Any = Run if summary is None else RunCell
    runs = sa.func.count() if summary is None else sa.func.sum(RunCell.n_runs)
    conds = [*(filters.conditions() if summary is None else summary),
             table.gpu_type.is_not(None), table.seq_len.is_not(None)]
    if model_size_class is not None:
        conds.append(table.model_size_class == model_size_class)
    ok = table.status == SUCCESS_LITERAL
    rows = session.execute(
        sa.select(table.gpu_type, table.seq_len, runs.label("runs"), runs.filter(ok).label("ok"),
                  sa.func.count(sa.distinct(table.nodes)).filter(ok).label("node_counts"))
        .where(*conds).group_by(table.gpu_type, table.seq_len)).all()
    out = [{"gpu_type": r.gpu_type, "seq_len": int(r.seq_len), "runs": int(r.runs), "successes": int(r.ok or 0),
            "node_counts": int(r.node_counts or 0)} for r in rows]
    return sorted(out, key=lambda s: slice_key(s, most))
