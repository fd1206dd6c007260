""""What worked?": configurations for a target model size and cluster, ranked by the throughput
model's prediction for the target, with the recorded runs they rest on (GET /api/v1/recommend)."""

import streamlit as st

from dashboard import ui
from dashboard.components import recommend

st.title("What worked?")
st.caption("Every valid layout is adapted to the target (DP from the world size, GAS — and MBS — for the "
           "batch), checked against the memory model and recorded OOMs, and ranked by the throughput model's "
           "prediction for the target, fitted to your own runs. The recorded runs it rests on are shown "
           "as evidence; a configuration that ran on this very target shows its measurement beside it.")
ui.require_api()
options = ui.load_options()
query = recommend.form("ww", options, {"model": "8B", "nodes": 8, "gpus_per_node": 8}, url=True)
if query:
    recommend.answer(query)
    recommend.next_runs(query)
else:
    st.info("Describe the run you are planning and press **What worked?** The question goes into the page's "
            "address, so the answer can be shared (e.g. `?model_params=8B&nodes=8&gpu_type=H100`).")
