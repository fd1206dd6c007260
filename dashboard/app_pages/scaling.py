"""Scaling & planner: throughput and efficiency against nodes with the Amdahl fit, and how many
GPUs a training run needs (GPUs = FLOPs per token · tokens / (peak · MFU · time), booked in whole
nodes; MFU given, or the throughput model's prediction)."""

import streamlit as st

from dashboard import data, ui
from dashboard.components import scaling as view

st.title("Scaling & planner")
ui.require_api()
options = ui.load_options()
cells = ui.call(data.get, "/heatmap").get("cells", [])

st.subheader("Scaling across nodes")
st.caption("Best successful run per node count; Amdahl's law speedup(n) = 1 / (s + (1 − s) / n) fitted to "
           "the aggregate throughput: the serial fraction s says where more nodes stop paying.")
view.scaling(options, cells)

st.subheader("GPU planner")
view.planner(options)
