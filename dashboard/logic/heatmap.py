"""The best-configuration heatmap (Ultra-Scale Playbook, "Benchmarking thousands of configurations").

Input: the ``cells`` of GET /api/v1/heatmap, each ``{"model_size_class", "nodes", "best": run | null,
"config_label", "n_success", "n_oom", "n_failed"}``. They are folded into model-size FAMILIES
(core.families: a fixed log grid, "7–8B" holds 6.7 … 8B; the best cell of a family × node count
by the one best-run rule) and arranged as a :class:`Grid` (rows = families, columns = node counts).
Each cell's text is the Playbook's, plus the exact size of its best run::

    DP8 TP1 PP1
    GAS16 Z1 MBS2
    40.1k tok/s
    MFU 39.2%
    1.3B · 25.1 GiB

Colour: ALWAYS the best run's MFU on the FIXED scale :data:`MFU_SCALE` (0 % … 60 %, the same on
every view and database, never auto-ranged; tokens/s per GPU are not comparable across model sizes,
so they rank a cell but do not colour it). Cells with only failures are grey with their counts in
red; cells whose best run has no MFU (unknown precision or peak) are pale blue.
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from core.families import family_index, group_cells, is_moe_cell
from dashboard.logic.fmt import (
    compact,
    config_label,
    effective_mfu,
    gib,
    nodes_label,
    pct,
    size_label,
    split_label,
)

Cell = Mapping[str, Any]
#: the ranking metrics, default first (tokens/s per GPU: the API's and the CLI's default too)
METRICS = {"tokens_per_sec_per_gpu": "tokens/s per GPU", "mfu": "MFU"}
DEFAULT_METRIC = "tokens_per_sec_per_gpu"

#: the fixed colour scale: MFU in percent, lowest → highest colour (higher saturates)
MFU_SCALE = (0.0, 60.0)
#: light colours only, so the black cell text stays readable everywhere (low = salmon, high = green)
COLORSCALE = [[0.0, "#f4a582"], [0.35, "#fddbc7"], [0.6, "#ffffbf"], [0.8, "#d9ef8b"], [1.0, "#91cf60"]]
FAILED_COLOR = "#e6e6e6"
FAILED_TEXT = "#b2182b"
NO_MFU_COLOR = "#dbe7f3"
#: cell lines longer than this wrap at a space ("DP16 TP2 PP8 EP32" → "DP16 TP2 PP8" / "EP32")
LINE_CHARS = 15
#: plot width in pixels assumed when sizing the cell text: a 1280-px window with the sidebar open
#: leaves the chart ~700 px (150 of them for the row labels); wider windows get the same text in
#: wider cells, never text wider than its cell
PLOT_WIDTH_PX = 700


def cell_label(cell: Cell) -> str:
    """The cell's config label: the API's ``config_label``, else built from the best run."""
    if cell.get("config_label"):
        return cell["config_label"]
    return config_label(cell["best"]) if cell.get("best") else ""


def failure_text(cell: Cell) -> str:
    """"✗ OOM 5 · failed 2" for a cell whose runs all failed (zero counts left out)."""
    parts = []
    if cell.get("n_oom"):
        parts.append(f"OOM {cell['n_oom']}")
    if cell.get("n_failed"):
        parts.append(f"failed {cell['n_failed']}")
    return "✗ " + (" · ".join(parts) if parts else "no success")


def cell_lines(cell: Cell, metric: str = DEFAULT_METRIC) -> list[str]:
    """The lines written in a cell: config (two lines), the ranking metric, the other metric, the
    exact size of the best run with its peak memory. A failure-only cell gets one line
    (:func:`failure_text`)."""
    best = cell.get("best")
    if not best:
        return [failure_text(cell)]
    dims, rest = split_label(cell_label(cell))
    tps = best.get("tokens_per_sec_per_gpu")
    tps_line = f"{compact(tps)} tok/s" if tps is not None else ""
    mfu = effective_mfu(best)
    mfu_line = f"MFU {pct(mfu)}" if mfu is not None else ""
    metrics = [tps_line, mfu_line] if metric == "tokens_per_sec_per_gpu" else [mfu_line, tps_line]
    size = size_label(best.get("model_size_class", cell.get("model_size_class")))
    memory = gib(best.get("peak_memory_gib"))
    lines = [dims, rest, *metrics, f"{size} · {memory}" if memory else size]
    return [part for line in lines if line for part in textwrap.wrap(line, LINE_CHARS, break_long_words=False)]


def cell_text(cell: Cell, metric: str = DEFAULT_METRIC) -> str:
    """:func:`cell_lines` joined by newlines (the Playbook's cell text)."""
    return "\n".join(cell_lines(cell, metric))


def cell_summary(cell: Cell, metric: str = DEFAULT_METRIC) -> str:
    """The cell on one line, for tables and select boxes."""
    return " · ".join(cell_lines(cell, metric))


def cell_counts(cell: Cell) -> str:
    """"ok 52 · OOM 25 · failed 8"."""
    return f"ok {cell.get('n_success', 0)} · OOM {cell.get('n_oom', 0)} · failed {cell.get('n_failed', 0)}"


def row_of(cell: Cell) -> str:
    """The grid row of a cell: its family (core.families), or its exact size class when ungrouped."""
    return cell.get("family") or size_label(cell["model_size_class"])


def cell_moe(cell: Cell) -> bool:
    """Whether a cell holds mixture-of-experts runs (core.families.is_moe_cell), as GET /heatmap/cell's
    ``moe`` parameter."""
    return is_moe_cell(cell)


def sizes_text(cell: Cell) -> str:
    """The exact size classes merged into a family cell: "6.7B, 7B"."""
    return ", ".join(size_label(s) for s in cell.get("sizes") or [cell["model_size_class"]])


def cell_hover(cell: Cell) -> str:
    """Everything about a cell for the hover box (plotly's <br> line breaks)."""
    head = f"<b>{row_of(cell)} × {nodes_label(cell['nodes'])}</b> (sizes {sizes_text(cell)})"
    best = cell.get("best")
    if not best:
        return f"{head}<br>{failure_text(cell)}<br>{cell_counts(cell)}"
    tps = best.get("tokens_per_sec_per_gpu")
    lines = [head, cell_label(cell),
             f"MFU {pct(effective_mfu(best))} · {f'{tps:,.0f}' if tps is not None else '?'} tok/s/GPU",
             f"peak memory {gib(best.get('peak_memory_gib')) or '?'}",
             (f"{best.get('model_name') or '?'} ({size_label(best.get('model_size_class'))}) · "
              f"{best.get('gpu_type') or '?'} · seq {best.get('seq_len') or '?'}"),
             f"{best.get('framework') or '?'}",
             f"{cell_counts(cell)} · best run #{best.get('id')}"]
    return "<br>".join(lines)


@dataclass
class Grid:
    """The heatmap as matrices: rows follow ``rows`` (family labels, small to large), columns
    ``nodes`` (ascending); ``cells`` maps (row, nodes) to a grouped cell."""

    metric: str
    rows: list[str]
    nodes: list[int]
    cells: dict[tuple[str, int], Cell] = field(default_factory=dict)

    @property
    def row_labels(self) -> list[str]:
        return list(self.rows)

    @property
    def col_labels(self) -> list[str]:
        return [str(n) for n in self.nodes]

    def cell(self, row: str, nodes: int) -> Cell | None:
        return self.cells.get((row, nodes))

    def matrix(self, fn, empty: Any = None) -> list[list[Any]]:
        """``fn(cell)`` for every position, ``empty`` where the grid has no cell."""
        return [[fn(c) if (c := self.cell(r, n)) is not None else empty for n in self.nodes] for r in self.rows]

    def values(self) -> list[list[float | None]]:
        """Colour values: the best run's MFU in percent (fixed scale :data:`MFU_SCALE`); None where
        there is no best run or it has no MFU."""

        def value(c: Cell) -> float | None:
            v = effective_mfu(c.get("best"))
            return None if v is None else 100.0 * v

        return self.matrix(value)

    def locate(self, row_label: str, col_label: str) -> tuple[str, int] | None:
        """(row, nodes) of the cell under plotly axis labels (for click selection)."""
        try:
            return self.rows[self.row_labels.index(str(row_label))], self.nodes[self.col_labels.index(str(col_label))]
        except ValueError:
            return None


def group(cells: list[Cell], metric: str = DEFAULT_METRIC) -> list[dict[str, Any]]:
    """The API's cells folded into families (core.families.group_cells, the one best-run rule)."""
    return group_cells(cells, metric)


def build_grid(cells: list[Cell], metric: str = DEFAULT_METRIC, rows: list[str] | None = None,
               nodes: list[int] | None = None) -> Grid:
    """Arrange cells (grouped ones with ``family``, or the API's ungrouped ones, which are grouped
    first); ``rows``/``nodes`` restrict the rows/columns shown."""
    if cells and "family" not in cells[0]:
        cells = group(cells, metric)
    keep_rows = set(rows) if rows else None
    keep_nodes = set(nodes) if nodes else None
    chosen = {(row_of(c), c["nodes"]): c for c in cells
              if (keep_rows is None or row_of(c) in keep_rows) and (keep_nodes is None or c["nodes"] in keep_nodes)}
    ordered_rows = sorted({k[0] for k in chosen}, key=lambda r: (family_index(r), r))
    return Grid(metric=metric, rows=ordered_rows, nodes=sorted({k[1] for k in chosen}), cells=chosen)


def text_font_size(grid: Grid, width_px: int = PLOT_WIDTH_PX) -> int:
    """Font size (px) at which the longest cell line fits its column; 0 when it would be < 8 px."""
    if not grid.nodes:
        return 0
    longest = max((len(line) for c in grid.cells.values() for line in cell_lines(c, grid.metric)), default=10)
    col_px = (width_px - 150) / len(grid.nodes)
    size = int(min(14, col_px / (0.6 * max(longest, 8))))
    return size if size >= 8 else 0


def figure(grid: Grid, show_text: bool = True, width_px: int = PLOT_WIDTH_PX) -> go.Figure:
    """Plotly heatmap: cells coloured by MFU on the fixed :data:`MFU_SCALE` with the best config
    written in them; failure-only cells grey with their failure counts in red; cells without MFU
    pale blue; empty positions blank. Hover shows every detail; clicking anywhere selects the
    nearest cell (trace "cells": one invisible marker per cell)."""
    font = text_font_size(grid, width_px) if show_text else 0
    xs, ys = grid.col_labels, grid.row_labels
    z = grid.values()
    hover = grid.matrix(cell_hover, "")

    def text_of(keep) -> list[list[str]]:
        return grid.matrix(lambda c: cell_text(c, grid.metric).replace("\n", "<br>") if keep(c) else "", "")

    fig = go.Figure()
    fig.add_trace(go.Heatmap(
        z=z, x=xs, y=ys, colorscale=COLORSCALE, zmin=MFU_SCALE[0], zmax=MFU_SCALE[1], zauto=False,
        xgap=3, ygap=3, hoverongaps=False, text=text_of(lambda c: effective_mfu(c.get("best")) is not None),
        texttemplate="%{text}" if font else None, textfont={"size": font or 10, "color": "#111111"},
        name="best run",
        colorbar={"title": {"text": "MFU"}, "ticksuffix": "%", "tickvals": [0, 10, 20, 30, 40, 50, 60],
                  "ticktext": ["0", "10", "20", "30", "40", "50", "≥60"]},
    ))
    no_mfu = grid.matrix(lambda c: 1.0 if c.get("best") and effective_mfu(c["best"]) is None else None)
    if any(v is not None for row in no_mfu for v in row):
        fig.add_trace(go.Heatmap(
            z=no_mfu, x=xs, y=ys, colorscale=[[0, NO_MFU_COLOR], [1, NO_MFU_COLOR]], showscale=False,
            xgap=3, ygap=3, hoverongaps=False, zmin=0, zmax=1,
            text=text_of(lambda c: bool(c.get("best")) and effective_mfu(c["best"]) is None),
            texttemplate="%{text}" if font else None, textfont={"size": font or 10, "color": "#111111"},
            name="no MFU",
        ))
    failed = grid.matrix(lambda c: None if c.get("best") else 1.0)
    if any(v is not None for row in failed for v in row):
        fig.add_trace(go.Heatmap(
            z=failed, x=xs, y=ys, colorscale=[[0, FAILED_COLOR], [1, FAILED_COLOR]], showscale=False,
            xgap=3, ygap=3, hoverongaps=False, zmin=0, zmax=1,
            text=grid.matrix(lambda c: "" if c.get("best") else failure_text(c), ""),
            texttemplate="%{text}" if font else None, textfont={"size": font or 10, "color": FAILED_TEXT},
            name="failures only",
        ))
    # plotly heatmaps cannot be selected: an invisible marker at every cell centre takes the hover
    # and the click (nearest centre, wherever the pointer is), so a click selects that cell
    centres = [(xs[j], ys[i], hover[i][j]) for i, row in enumerate(grid.rows) for j, nodes in enumerate(grid.nodes)
               if grid.cell(row, nodes)]
    fig.add_trace(go.Scatter(
        x=[c[0] for c in centres], y=[c[1] for c in centres], customdata=[c[2] for c in centres], mode="markers",
        marker={"size": 24, "opacity": 0}, hovertemplate="%{customdata}<extra></extra>", name="cells",
        showlegend=False,
    ))
    for trace in fig.data[:-1]:
        trace.hoverinfo = "skip"
        trace.hovertemplate = None
    lines = max((len(cell_lines(c, grid.metric)) for c in grid.cells.values()), default=1)
    row_px = max(30, int(lines * (font or 0) * 1.35) + 14) if font else 30
    fig.update_layout(
        height=max(260, row_px * len(ys) + 130),
        margin={"l": 10, "r": 10, "t": 40, "b": 10},
        xaxis={"title": {"text": "nodes"}, "type": "category", "side": "top"},
        yaxis={"title": {"text": "model size"}, "type": "category", "autorange": "reversed"},
        plot_bgcolor="white", hovermode="closest", hoverdistance=-1, clickmode="event+select",
        hoverlabel={"bgcolor": "white", "font": {"color": "#111111", "size": 12}},
    )
    return fig


def label_table(grid: Grid) -> pd.DataFrame:
    """The grid as text (rows = families, columns = "1 node", "2 nodes", …; empty = no runs)."""
    data = {nodes_label(n): [cell_summary(c, grid.metric) if (c := grid.cell(r, n)) else "" for r in grid.rows]
            for n in grid.nodes}
    return pd.DataFrame(data, index=pd.Index(grid.row_labels, name="model size"))


CSV_COLUMNS = ["family", "model_size_class", "sizes", "nodes", "config_label", "best_run_id", "model_name",
               "tokens_per_sec_per_gpu", "mfu", "peak_memory_gib", "gpu_type", "seq_len", "global_batch_tokens",
               "framework", "precision", "n_success", "n_oom", "n_failed"]


def cells_frame(cells: list[Cell]) -> pd.DataFrame:
    """One row per (grouped) cell with its best run's key numbers (MFU as a fraction), for CSV."""
    rows = []
    for c in cells:
        best = c.get("best") or {}
        rows.append({
            "family": row_of(c), "model_size_class": c["model_size_class"],
            "sizes": " ".join(f"{s:g}" for s in c.get("sizes") or [c["model_size_class"]]), "nodes": c["nodes"],
            "config_label": cell_label(c) or None, "best_run_id": best.get("id"), "model_name": best.get("model_name"),
            "tokens_per_sec_per_gpu": best.get("tokens_per_sec_per_gpu"), "mfu": effective_mfu(best),
            "peak_memory_gib": best.get("peak_memory_gib"), "gpu_type": best.get("gpu_type"),
            "seq_len": best.get("seq_len"), "global_batch_tokens": best.get("global_batch_tokens"),
            "framework": best.get("framework"), "precision": best.get("precision"),
            "n_success": c.get("n_success", 0), "n_oom": c.get("n_oom", 0), "n_failed": c.get("n_failed", 0),
        })
    return pd.DataFrame(rows, columns=CSV_COLUMNS)


def cell_key(cell: Cell) -> str:
    """The selected-cell value kept in the URL: "1–2B × 4 nodes"."""
    return f"{row_of(cell)} × {nodes_label(cell['nodes'])}"


def cell_choices(cells: list[Cell], metric: str = DEFAULT_METRIC) -> dict[str, Cell]:
    """The cells by :func:`cell_key`, in grid order (family, then nodes)."""
    ordered = sorted(cells, key=lambda c: (family_index(row_of(c)), row_of(c), c["nodes"]))
    return {cell_key(c): c for c in ordered}


def choice_label(cell: Cell) -> str:
    """A select-box line: "1–2B × 1 node — DP8 TP1 PP1 GAS16 Z0 MBS2 · ok 33 · OOM 25 · failed 8"."""
    return f"{cell_key(cell)} — {cell_label(cell) if cell.get('best') else failure_text(cell)} · {cell_counts(cell)}"


def default_cell(cells: list[Cell]) -> str | None:
    """The cell to open first: the one with the most runs (the sweep being worked on)."""
    if not cells:
        return None
    top = max(cells, key=lambda c: (c.get("n_success", 0) + c.get("n_oom", 0) + c.get("n_failed", 0),
                                    -family_index(row_of(c)), -c["nodes"]))
    return cell_key(top)
