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
from dashboard.logic.runs import runs_table, styled

CELL_KEY = "hm_cell"
_LAST_CLICK = "hm_last_click"
#: the default zoom shows at most this many node counts (the smallest ones), so the configuration
#: text fits the cells; the Nodes slider widens it
DEFAULT_MAX_COLUMNS = 6


def _url_with(changes: dict[str, str | None]) -> str:
    """This page's query string with `changes` applied (None removes a parameter)."""
    from urllib.parse import urlencode

    params = [(k, v) for k in st.query_params for v in st.query_params.get_all(k) if k not in changes]
    params += [(k, v) for k, v in changes.items() if v is not None]
    return "?" + urlencode(params)


def slice_link(label: str, changes: dict[str, str | None]) -> None:
    """A link that reloads this page with `changes` in its URL (same tab), as opening a shared link
    does: the widgets read their values from the URL. (Setting a bound widget's value from a
    callback left the URL unchanged and logged a Session State warning; st.page_link to the same
    page kept the old URL.)"""
    import html

    st.markdown(f'<a href="{html.escape(_url_with(changes))}" target="_self">{html.escape(label)}</a>',
                unsafe_allow_html=True)


def slice_note(options: dict[str, Any], params: dict[str, Any]) -> None:
    """Say which slice is shown and offer the one click that widens it."""
    gpu, seq = ui.default_slice(options)
    if gpu is None:
        return
    shown = params.get("gpu_type"), params.get("seq_len")
    if shown == (gpu, seq):
        runs = options["slice"][2]
        st.info(f"Showing the most-recorded comparable slice: **{gpu}**, sequence length **{seq:,}** "
                f"({runs:,} runs), so every cell compares like with like.", icon=":material/filter_alt:")
        slice_link("⤢ All GPUs & lengths (every GPU type and sequence length, mixed)",
                   {"hm_gpu": ui.ANY, "hm_seq": ui.ANY, "hm_cell": None})
    elif shown == (None, None):
        st.caption("Every GPU type and sequence length are mixed in these cells (a 4-GPU GB300 node and an 8-GPU "
                   "H100 node share a column): pick a GPU type and sequence length in the sidebar to compare.")
        slice_link(f"Back to the most-recorded slice ({gpu}, sequence length {seq:,})",
                   {"hm_gpu": None, "hm_seq": None, "hm_cell": None})


def zoom(rows: list[str], nodes: list[int]) -> tuple[list[str], list[int]]:
    """Sidebar range sliders over the families and node counts present (bound to the URL as
    ``hm_rows`` / ``hm_nodes``); returns what to show. The node range starts on the
    DEFAULT_MAX_COLUMNS smallest node counts."""
    with st.sidebar:
        st.subheader("Zoom")
        if len(rows) > 1:
            lo, hi = st.select_slider("Model sizes", rows, value=(rows[0], rows[-1]), key="hm_rows",
                                      bind="query-params")
            rows = rows[rows.index(lo):rows.index(hi) + 1]
        if len(nodes) > 1:
            top = nodes[min(len(nodes), DEFAULT_MAX_COLUMNS) - 1]
            lo, hi = st.select_slider("Nodes", nodes, value=(nodes[0], top), key="hm_nodes", bind="query-params",
                                      help=f"starts on the {DEFAULT_MAX_COLUMNS} smallest node counts, so the "
                                           "configurations fit the cells")
            shown = [n for n in nodes if lo <= n <= hi]
            if len(shown) < len(nodes):
                st.caption(f"{len(shown)} of {len(nodes)} node counts shown (up to {max(nodes):,} recorded)")
            nodes = shown
    return rows, nodes


def chart(grid: hm.Grid) -> Any:
    """Draw the heatmap; a clicked cell becomes the selected cell (see :func:`cell_picker`)."""
    fig = hm.figure(grid)
    if not hm.text_font_size(grid):
        st.info(f"{len(grid.rows)} model sizes × {len(grid.nodes)} node counts is too many to write the "
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
            cell = grid.cell(*where)
            if cell is not None:
                st.session_state[CELL_KEY] = hm.cell_key(cell)
    lo, hi = hm.MFU_SCALE
    st.caption(f"Each cell: the best successful run of the family at that node count (ranked by "
               f"{hm.METRICS[grid.metric]}, then MFU, then the lower run id): DP/TP/PP[/CP/EP], GAS = "
               "gradient-accumulation steps, Z = ZeRO stage, MBS = micro-batch size, RC = recompute; its "
               "throughput, MFU, and the exact model size with peak memory per GPU. Colour = MFU on a fixed "
               f"scale, {lo:.0f} % → {hi:.0f} % (higher is the same green), the same on every view. Pale blue: "
               "no MFU (unknown precision or peak). Grey: only failed runs. Rows are families on a fixed log "
               "grid (≤200M, 350M, 760M, 1–2B, 3B, 7–8B, 13B, 20B, 30–34B, 70B, 175B, 405B, 1T+); a family's "
               "mixture-of-experts models have a row of their own (\"30–34B MoE (A3B)\": total size, then "
               "active parameters). Click a cell or pick it below.")
    return fig


def grid_text(grid: hm.Grid) -> None:
    """The grid as an HTML table (text a reader can copy; every cell's config and numbers)."""
    table = hm.label_table(grid)
    with st.container(key="hm_grid_text"):
        if len(grid.nodes) <= 12 and len(grid.rows) <= 30:
            st.table(table)
        else:
            st.dataframe(table)


def downloads(fig: Any, cells: list[dict[str, Any]]) -> None:
    """CSV of the cells; the chart as PNG (kaleido) or as a self-contained interactive HTML file."""
    c1, c2, _ = st.columns([1, 1.5, 2.5])  # "Heatmap as HTML" whole at 1280 px (was cut to "Heatmap as HT…")
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


def cell_picker(cells: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A select box of every (grouped) cell, bound to the URL as ``hm_cell`` (also set by clicking
    the chart); returns the selected cell."""
    choices = hm.cell_choices(cells)
    if not choices:
        return None
    default = hm.default_cell(cells)
    keys = list(choices)
    key = st.selectbox("Cell", keys, index=keys.index(default) if default in keys else 0, key=CELL_KEY,
                       bind="query-params", help="pick a cell (or click it in the chart) to list its runs; the "
                                                 "link of this page keeps it")
    cell = choices.get(key)
    if cell is not None:
        st.caption(hm.choice_label(cell))
    return cell


def cell_runs(cell: dict[str, Any], metric: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    """The runs of one (family) cell, best first, as a table: GET /heatmap/cell for each exact
    size class the family merged, of the cell's kind (MoE or dense: a MoE row never lists the dense
    runs of its size class, nor the reverse)."""
    runs: list[dict[str, Any]] = []
    moe = hm.cell_moe(cell)
    with st.spinner("Loading the cell's runs…"):
        for size in cell.get("sizes") or [cell["model_size_class"]]:
            body = ui.call(data.get, "/heatmap/cell", model_size_class=size, nodes=cell["nodes"], metric=metric,
                           moe=moe, **params)
            runs.extend(body.get("runs", []))
    ok = [r for r in runs if r.get("status") == "success"]
    failed = [r for r in runs if r.get("status") != "success"]
    ok.sort(key=lambda r: (-(r.get(metric if metric != "mfu" else "mfu_derived") or -1), r.get("id") or 0))
    runs = ok + failed
    st.markdown(f"**{len(runs)} run(s) in {hm.cell_key(cell)}** (sizes {hm.sizes_text(cell)}), successes best "
                "first, then failures")
    st.dataframe(styled(runs_table(runs)), hide_index=True, column_config=RUN_COLUMNS, key="hm_cell_runs")
    return runs
