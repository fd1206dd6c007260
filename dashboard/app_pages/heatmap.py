"""Heatmap (landing page): the best configuration per model-size family × node count, on the
most-recorded comparable slice (GPU type, sequence length) by default; every filter, zoom and the
selected cell live in the URL, so a view can be shared."""

import streamlit as st

from dashboard import data, ui
from dashboard.components import heatmap as view
from dashboard.components import recommend
from dashboard.logic import heatmap as hm
from dashboard.logic import recommend as rq

st.title("Best configuration per model size × nodes")
ui.require_api()
options = ui.load_options()
with st.sidebar:
    metric = st.radio("Rank by", list(hm.METRICS), format_func=hm.METRICS.get, key="hm_metric",
                      bind="query-params", horizontal=True,
                      help="a cell shows its successful run with the highest value (then higher MFU, then lower id)")
params = ui.heatmap_filters(options, comparable=True)
view.slice_note(options, params)
body = ui.call(data.get, "/heatmap", metric=metric, spinner="Loading the heatmap…", **params)
cells = hm.group(body.get("cells", []), metric)
if not cells:
    st.info("No runs match these filters: relax them in the sidebar.")
    st.stop()

all_grid = hm.build_grid(cells, metric)
rows, nodes = view.zoom(all_grid.rows, all_grid.nodes)
grid = hm.build_grid(cells, metric, rows, nodes)
fig = view.chart(grid)
shown = [c for c in cells if (hm.row_of(c), c["nodes"]) in grid.cells]
view.downloads(fig, shown)

st.subheader("Runs of a cell")
selected = view.cell_picker(shown)
if selected:
    view.cell_runs(selected, metric, params)
    asked = recommend.defaults_from_cell(selected)
    st.page_link("app_pages/what_worked.py", label=f"What worked? for {asked['model']} on {asked['nodes']} node(s): "
                 "ranked by the throughput model, with the runs it rests on", icon=":material/explore:",
                 query_params=rq.url_from_query(rq.recommend_params(
                     asked["model"], asked["nodes"], asked["gpus_per_node"], asked.get("gpu_type"),
                     asked.get("seq_len"))))

st.subheader("The grid as text")
view.grid_text(grid)
