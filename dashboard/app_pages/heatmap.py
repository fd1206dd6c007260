"""Heatmap (landing page): the best configuration per model size × node count, its runs, and
"What worked?" for a target next to the data."""

import streamlit as st

from dashboard import data, ui
from dashboard.components import heatmap as view
from dashboard.components import recommend
from dashboard.logic import heatmap as hm

st.title("Best configuration per model size × nodes")
ui.require_api()
options = ui.load_options()
with st.sidebar:
    metric = st.radio("Rank and colour by", list(hm.METRICS), format_func=hm.METRICS.get, key="hm_metric",
                      bind="query-params", help="a cell shows its successful run with the highest value")
params = ui.heatmap_filters(options)
body = ui.call(data.get, "/heatmap", metric=metric, spinner="Loading the heatmap…", **params)
cells = body.get("cells", [])
if not cells:
    st.info("No runs match these filters: relax them in the sidebar.")
    st.stop()

sizes, nodes = view.zoom(cells)
grid = hm.build_grid(cells, metric, sizes, nodes)
fig = view.chart(grid)
view.downloads(fig, [c for c in cells if (c["model_size_class"], c["nodes"]) in grid.cells])
st.subheader("The grid as text")
view.grid_text(grid)

st.subheader("Runs of a cell")
where = view.cell_picker(cells, metric)
if where:
    view.cell_runs(where, metric, params)

st.subheader("What worked?")
st.caption("Nearest recorded configurations for a target, adapted to it and checked against the memory model.")
selected = next((c for c in cells if (c["model_size_class"], c["nodes"]) == where), None)
defaults = recommend.defaults_from_cell(selected)
query = recommend.form("hm_rec", options, defaults)
if query:
    recommend.answer(query)
