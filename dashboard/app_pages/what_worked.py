""""What worked?": first the runs measured on the target (the heatmap's cell), then predictions for
the layouts not run there, ranked by the throughput model for the target, with the recorded runs
they rest on (GET /api/v1/recommend); "Plan the next runs" (GET /api/v1/suggest); "What if?" for
any configuration (POST /api/v1/predict)."""

import streamlit as st

from dashboard import ui
from dashboard.components import recommend, whatif
from dashboard.logic import whatif as wi

st.title("What worked?")
st.caption("First what ran on the target — the heatmap's cell: the same size family, nodes, GPU type and sequence "
           "length, every framework and precision — then every valid layout not run there, adapted to the target "
           "(DP from the world size, GAS — and MBS — for the batch), checked against the memory model and recorded "
           "OOMs, and ranked by the throughput model's prediction for the target, fitted to your own runs, with the "
           "recorded runs it rests on as evidence.")
ui.require_api()
options = ui.load_options()
query = recommend.form("ww", options, {"model": "8B", "nodes": 8, "gpus_per_node": 8}, url=True)
body = None
if query:
    body = recommend.answer(query)
    recommend.next_runs(query)
else:
    st.info("Describe the run you are planning and press **What worked?** The question goes into the page's "
            "address, so the answer can be shared (e.g. `?model_params=8B&nodes=8&gpu_type=H100`).")
whatif.panel("wi", options, wi.seed(query, body))
