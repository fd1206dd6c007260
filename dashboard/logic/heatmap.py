"""The best-configuration heatmap (Ultra-Scale Playbook, "Benchmarking thousands of configurations").

Input: the ``cells`` of GET /api/v1/heatmap, each ``{"model_size_class", "nodes", "best": run | null,
"config_label", "n_success", "n_oom", "n_failed"}`` (``best``: the run's config, hardware and
metrics, the API's CellBest; the whole run is GET /api/v1/runs/{id}). Output: a :class:`Grid`
(rows = model size classes, columns = node counts), the text written in each cell like the
Playbook's figure::

    DP8 TP1 PP1
    GAS16 Z1 MBS2
    MFU 39.2%
    25.1 GiB

a plotly figure coloured by the chosen metric (cells with only failures in grey, marked
"✗ OOM 5 · failed 2"), a text table of the same grid and a flat table for CSV export.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import plotly.graph_objects as go

from dashboard.logic.fmt import compact, config_label, gib, mfu_of, nodes_label, pct, size_label, split_label

Cell = Mapping[str, Any]
METRICS = {"mfu": "MFU", "tokens_per_sec_per_gpu": "tokens/s per GPU"}

#: light colours only, so the black cell text stays readable everywhere (low = salmon, high = green)
COLORSCALE = [[0.0, "#f4a582"], [0.35, "#fddbc7"], [0.6, "#ffffbf"], [0.8, "#d9ef8b"], [1.0, "#91cf60"]]
FAILED_COLOR = "#e6e6e6"
FAILED_TEXT = "#b2182b"
#: usable plot width in pixels assumed when sizing the cell text (wide layout with the sidebar open)
PLOT_WIDTH_PX = 1100


def metric_value(run: Mapping[str, Any] | None, metric: str) -> float | None:
    """The value a cell is coloured by: MFU (derived, else reported) or tokens/s per GPU."""
    if not run:
        return None
    return mfu_of(run) if metric == "mfu" else run.get("tokens_per_sec_per_gpu")


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


def cell_lines(cell: Cell, metric: str = "mfu") -> list[str]:
    """The lines written in a cell: config (two lines), MFU (and tok/s when that is the metric),
    peak memory. A failure-only cell gets one line, see :func:`failure_text`."""
    best = cell.get("best")
    if not best:
        return [failure_text(cell)]
    dims, rest = split_label(cell_label(cell))
    lines = [dims, rest, f"MFU {pct(mfu_of(best))}"]
    if metric == "tokens_per_sec_per_gpu":
        lines[2] = f"{compact(best.get('tokens_per_sec_per_gpu'))} tok/s · {lines[2]}"
    memory = gib(best.get("peak_memory_gib"))
    if memory:
        lines.append(memory)
    return [line for line in lines if line]


def cell_text(cell: Cell, metric: str = "mfu") -> str:
    """:func:`cell_lines` joined by newlines (the Playbook's cell text)."""
    return "\n".join(cell_lines(cell, metric))


def cell_summary(cell: Cell, metric: str = "mfu") -> str:
    """The cell on one line, for tables and select boxes."""
    return " · ".join(cell_lines(cell, metric))


def cell_counts(cell: Cell) -> str:
    """"ok 52 · OOM 25 · failed 8"."""
    return f"ok {cell.get('n_success', 0)} · OOM {cell.get('n_oom', 0)} · failed {cell.get('n_failed', 0)}"


def cell_hover(cell: Cell) -> str:
    """Everything about a cell for the hover box (plotly's <br> line breaks)."""
    head = f"<b>{size_label(cell['model_size_class'])} × {nodes_label(cell['nodes'])}</b>"
    best = cell.get("best")
    if not best:
        return f"{head}<br>{failure_text(cell)}<br>{cell_counts(cell)}"
    tps = best.get("tokens_per_sec_per_gpu")
    lines = [head, cell_label(cell),
             f"MFU {pct(mfu_of(best))} · {f'{tps:,.0f}' if tps is not None else '?'} tok/s/GPU",
             f"peak memory {gib(best.get('peak_memory_gib')) or '?'}",
             f"{best.get('gpu_type') or '?'} · seq {best.get('seq_len') or '?'} · {best.get('framework') or '?'}",
             f"{cell_counts(cell)} · best run #{best.get('id')}"]
    return "<br>".join(lines)


@dataclass
class Grid:
    """The heatmap as matrices: rows follow ``sizes`` (ascending), columns ``nodes`` (ascending)."""

    metric: str
    sizes: list[float]
    nodes: list[int]
    cells: dict[tuple[float, int], Cell] = field(default_factory=dict)

    @property
    def row_labels(self) -> list[str]:
        return [size_label(s) for s in self.sizes]

    @property
    def col_labels(self) -> list[str]:
        return [str(n) for n in self.nodes]

    def cell(self, size: float, nodes: int) -> Cell | None:
        return self.cells.get((size, nodes))

    def matrix(self, fn, empty: Any = None) -> list[list[Any]]:
        """``fn(cell)`` for every position, ``empty`` where the grid has no cell."""
        return [[fn(c) if (c := self.cell(s, n)) is not None else empty for n in self.nodes] for s in self.sizes]

    def values(self) -> list[list[float | None]]:
        """Colour values: MFU in percent, or tokens/s per GPU; None where there is no best run."""
        scale = 100.0 if self.metric == "mfu" else 1.0

        def value(c: Cell) -> float | None:
            v = metric_value(c.get("best"), self.metric)
            return None if v is None else v * scale

        return self.matrix(value)

    def locate(self, row_label: str, col_label: str) -> tuple[float, int] | None:
        """(size, nodes) of the cell under plotly axis labels (for click selection)."""
        try:
            return self.sizes[self.row_labels.index(str(row_label))], self.nodes[self.col_labels.index(str(col_label))]
        except ValueError:
            return None


def build_grid(cells: list[Cell], metric: str = "mfu", sizes: list[float] | None = None,
               nodes: list[int] | None = None) -> Grid:
    """Arrange the API's cells; ``sizes``/``nodes`` restrict the rows/columns shown."""
    keep_sizes = set(sizes) if sizes else None
    keep_nodes = set(nodes) if nodes else None
    chosen = {(c["model_size_class"], c["nodes"]): c for c in cells
              if (keep_sizes is None or c["model_size_class"] in keep_sizes)
              and (keep_nodes is None or c["nodes"] in keep_nodes)}
    return Grid(metric=metric, sizes=sorted({k[0] for k in chosen}), nodes=sorted({k[1] for k in chosen}),
                cells=chosen)


def text_font_size(grid: Grid, width_px: int = PLOT_WIDTH_PX) -> int:
    """Font size (px) at which the longest cell line fits its column; 0 when it would be < 8 px."""
    if not grid.nodes:
        return 0
    longest = max((len(line) for c in grid.cells.values() for line in cell_lines(c, grid.metric)), default=10)
    col_px = (width_px - 120) / len(grid.nodes)
    size = int(min(15, col_px / (0.62 * max(longest, 8))))
    return size if size >= 8 else 0


def figure(grid: Grid, show_text: bool = True, width_px: int = PLOT_WIDTH_PX) -> go.Figure:
    """Plotly heatmap: coloured cells with the best config written in them, failure-only cells grey
    with their failure counts in red, empty positions blank. Hover shows every detail; clicking
    anywhere selects the nearest cell (trace "cells": one invisible marker per cell)."""
    font = text_font_size(grid, width_px) if show_text else 0
    xs, ys = grid.col_labels, grid.row_labels
    is_mfu = grid.metric == "mfu"
    z = grid.values()
    hover = grid.matrix(cell_hover, "")
    fig = go.Figure()
    fig.add_trace(go.Heatmap(
        z=z, x=xs, y=ys, colorscale=COLORSCALE, xgap=3, ygap=3, hoverongaps=False,
        text=grid.matrix(lambda c: cell_text(c, grid.metric).replace("\n", "<br>") if c.get("best") else "", ""),
        texttemplate="%{text}" if font else None, textfont={"size": font or 10, "color": "#111111"},
        name="best run",
        colorbar={"title": {"text": "MFU %" if is_mfu else "tok/s/GPU"}, "ticksuffix": "%" if is_mfu else ""},
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
    centres = [(xs[j], ys[i], hover[i][j]) for i, size in enumerate(grid.sizes) for j, nodes in enumerate(grid.nodes)
               if grid.cell(size, nodes)]
    fig.add_trace(go.Scatter(
        x=[c[0] for c in centres], y=[c[1] for c in centres], customdata=[c[2] for c in centres], mode="markers",
        marker={"size": 24, "opacity": 0}, hovertemplate="%{customdata}<extra></extra>", name="cells",
        showlegend=False,
    ))
    for trace in fig.data[:-1]:
        trace.hoverinfo = "skip"
        trace.hovertemplate = None
    lines = max((len(cell_lines(c, grid.metric)) for c in grid.cells.values()), default=1)
    row_px = max(30, int(lines * (font or 0) * 1.45) + 18) if font else 30
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
    """The grid as text (rows = model sizes, columns = "1 node", "2 nodes", …; empty = no runs)."""
    data = {nodes_label(n): [cell_summary(c, grid.metric) if (c := grid.cell(s, n)) else "" for s in grid.sizes]
            for n in grid.nodes}
    return pd.DataFrame(data, index=pd.Index(grid.row_labels, name="model size"))


CSV_COLUMNS = ["model_size_class", "nodes", "config_label", "best_run_id", "tokens_per_sec_per_gpu", "mfu",
               "peak_memory_gib", "gpu_type", "seq_len", "global_batch_tokens", "framework", "precision",
               "n_success", "n_oom", "n_failed"]


def cells_frame(cells: list[Cell]) -> pd.DataFrame:
    """One row per cell with its best run's key numbers (MFU as a fraction), for tables and CSV."""
    rows = []
    for c in cells:
        best = c.get("best") or {}
        rows.append({
            "model_size_class": c["model_size_class"], "nodes": c["nodes"], "config_label": cell_label(c) or None,
            "best_run_id": best.get("id"), "tokens_per_sec_per_gpu": best.get("tokens_per_sec_per_gpu"),
            "mfu": mfu_of(best), "peak_memory_gib": best.get("peak_memory_gib"), "gpu_type": best.get("gpu_type"),
            "seq_len": best.get("seq_len"), "global_batch_tokens": best.get("global_batch_tokens"),
            "framework": best.get("framework"), "precision": best.get("precision"),
            "n_success": c.get("n_success", 0), "n_oom": c.get("n_oom", 0), "n_failed": c.get("n_failed", 0),
        })
    return pd.DataFrame(rows, columns=CSV_COLUMNS)


def cell_choices(cells: list[Cell], metric: str = "mfu") -> dict[tuple[float, int], str]:
    """Select-box labels of the cells, in grid order: "1.3B × 1 node — DP8 TP1 PP1 … · ok 32 · OOM 25"."""
    ordered = sorted(cells, key=lambda c: (c["model_size_class"], c["nodes"]))
    return {(c["model_size_class"], c["nodes"]):
            f"{size_label(c['model_size_class'])} × {nodes_label(c['nodes'])} — "
            f"{cell_label(c) if c.get('best') else failure_text(c)} · {cell_counts(c)}" for c in ordered}


def default_cell(cells: list[Cell]) -> tuple[float, int] | None:
    """The cell to open first: the one with the most runs (the sweep being worked on)."""
    if not cells:
        return None
    top = max(cells, key=lambda c: (c.get("n_success", 0) + c.get("n_oom", 0) + c.get("n_failed", 0),
                                    -c["model_size_class"], -c["nodes"]))
    return top["model_size_class"], top["nodes"]
