""""What worked?": the nearest recorded configurations for a target model size and cluster,
adapted to it, with their evidence and the memory check (GET /api/v1/recommend)."""

import streamlit as st

from dashboard import ui
from dashboard.components import recommend

st.title("What worked?")
st.caption("Exact matches answer with their best runs; otherwise neighbouring configurations (by model "
           "size, node count, sequence length and hardware) are adapted to the target — TP/PP/CP/ZeRO/MBS "
           "kept, DP from the world size, GAS for the batch — and checked against the memory model and "
           "recorded OOMs.")
ui.require_api()
options = ui.load_options()
query = recommend.form("ww", options, {"model": "8B", "nodes": 8, "gpus_per_node": 8})
if query:
    recommend.answer(query)
else:
    st.info("Describe the run you are planning and press **What worked?**")
