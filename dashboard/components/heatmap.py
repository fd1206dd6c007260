"""Heatmap page pieces: the zoom controls, the chart (click a cell to open it), the grid as text,
the downloads (CSV of the cells; PNG when kaleido is installed, else an interactive HTML file)
and a cell's runs."""

from __future__ import annotations

import importlib.util
from typing import Any

import streamlit as st

from dashboard import data, ui
from dashboard.components.runs import COLUMNS as RUN_COLUMNS
from dashboard.logic import heatmap as hm
from dashboard.logic.fmt import nodes_label, size_label
from dashboard.logic.runs import runs_table

CELL_KEY = "hm_cell"
_LAST_CLICK = "hm_last_click"

def zoom(cells: list[dict[str, Any]]) -> tuple[list[float], list[int]]:
    """Sidebar range sliders over the model sizes and node counts present; returns what to show."""
    sizes = sorted({c["model_size_class"] for c in cells})
    nodes = sorted({c["nodes"] for c in cells})
    with st.sidebar:
        st.subheader("Zoom")
        if len(sizes) > 1:
            lo, hi = st.select_slider("Model sizes", sizes, value=(sizes[0], sizes[-1]), format_func=size_label)
            sizes = [s for s in sizes if lo <= s <= hi]
        if len(nodes) > 1:
            lo, hi = st.select_slider("Nodes", nodes, value=(nodes[0], nodes[-1]))
            nodes = [n for n in nodes if lo <= n <= hi]
    return sizes, nodes


def chart(grid: hm.Grid) -> Any:
    """Draw the heatmap; a clicked cell becomes the selected cell (see :func:`cell_picker`)."""
    fig = hm.figure(grid)
    if not hm.text_font_size(grid):
        st.info(f"{len(grid.sizes)} model sizes × {len(grid.nodes)} node counts is too many to write the "
                "configurations in the cells: narrow the zoom or the filters in the sidebar (hover a cell for "
                "its details; the table below lists every cell).")
    event = st.plotly_chart(fig, key="hm_chart", on_select="rerun", selection_mode="points", config={
        "displaylogo": False,
        "toImageButtonOptions": {"format": "png", "filename": "scalebook-heatmap", "scale": 2},
    })
    points = (getattr(event, "selection", None) or {}).get("points", []) if event else []
    if points:
        where = grid.locate(points[0].get("y"), points[0].get("x"))
        if where and where != st.session_state.get(_LAST_CLICK):
            st.session_state[_LAST_CLICK] = where
            st.session_state[CELL_KEY] = where
    st.caption("Each cell: the best successful run (DP/TP/PP[/CP/EP], GAS = gradient-accumulation steps, "
               "Z = ZeRO stage, MBS = micro-batch size, RC = recompute), its MFU and peak memory per GPU. "
               "Grey cells: only failed runs (OOM / other failures). Click a cell or pick it below.")
    return fig


def grid_text(grid: hm.Grid) -> None:
    """The grid as an HTML table (text a reader can copy; every cell's config and numbers)."""
    table = hm.label_table(grid)
    with st.container(key="hm_grid_text"):
        if len(grid.nodes) <= 12 and len(grid.sizes) <= 30:
            st.table(table)
        else:
            st.dataframe(table)


def downloads(fig: Any, cells: list[dict[str, Any]]) -> None:
    """CSV of the cells; the chart as PNG (kaleido) or as a self-contained interactive HTML file."""
    c1, c2, _ = st.columns([1, 1, 3])
    with c1:
        ui.csv_download("Cells as CSV", lambda: hm.cells_frame(cells).to_csv(index=False), "scalebook-heatmap.csv",
                        key="hm_csv")
    with c2:
        if importlib.util.find_spec("kaleido") is not None:
            st.download_button("Heatmap as PNG", data=lambda: fig.to_image(format="png", scale=2),
                               icon=":material/image:", file_name="scalebook-heatmap.png", mime="image/png",
                               key="hm_png", on_click="ignore")
        else:
            st.download_button("Heatmap as HTML", data=lambda: fig.to_html(include_plotlyjs=True, full_html=True),
                               file_name="scalebook-heatmap.html", mime="text/html", key="hm_html",
                               icon=":material/image:", on_click="ignore",
                               help="kaleido is not installed, so no server-side PNG: this HTML file is the "
                                    "interactive chart; the camera icon above the chart saves a PNG")


def cell_picker(cells: list[dict[str, Any]], metric: str) -> tuple[float, int] | None:
    """A select box of every cell (also set by clicking the chart); returns (size, nodes)."""
    choices = hm.cell_choices(cells, metric)
    if not choices:
        return None
    if st.session_state.get(CELL_KEY) not in choices:
        st.session_state[CELL_KEY] = hm.default_cell(cells)
    return st.selectbox("Cell", list(choices), format_func=choices.get, key=CELL_KEY,
                        help="pick a cell (or click it in the chart) to list its runs")


def cell_runs(where: tuple[float, int], metric: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of one cell, best first, as a table."""
    size, nodes = where
    body = ui.call(data.get, "/heatmap/cell", model_size_class=size, nodes=nodes, metric=metric,
                   spinner="Loading the cell's runs…", **params)
    runs = body.get("runs", [])
    st.markdown(f"**{len(runs)} run(s) in {size_label(size)} × {nodes_label(nodes)}**, successes best first, "
                "then failures")
    st.dataframe(runs_table(runs), hide_index=True, column_config=RUN_COLUMNS, key="hm_cell_runs")
    return runs
