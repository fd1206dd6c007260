"""Runs: filter, sort and page through every stored run; open one; compare 2–4 side by side."""

import streamlit as st

from dashboard import ui
from dashboard.components import runs as view

st.title("Runs")
ui.require_api()
options = ui.load_options()
query, sort, limit = view.filters(options)
body = view.page(query, sort, limit)
runs = body.get("runs", [])
if not runs:
    st.info("No run matches these filters.")
    st.stop()
view.table(runs, query, sort, body.get("total", len(runs)))

st.subheader("Run detail")
view.detail(runs)

st.subheader("Compare runs")
view.compare(runs)
