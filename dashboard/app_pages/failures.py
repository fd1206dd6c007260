"""Failures: how often runs fail at each node count, with which error classes and configurations,
and the latest error messages (DESIGN §6 failure taxonomy)."""

import streamlit as st

from dashboard import ui
from dashboard.components import failures as view

st.title("Failures")
ui.require_api()
options = ui.load_options()
query = view.filters(options)

st.subheader("By node count")
view.by_nodes(query)
runs = view.failed_runs(query)

st.subheader("Error classes by node count")
view.classes(runs)

st.subheader("Layouts that fail most")
view.configs(runs)

st.subheader("Failure rate by configuration field")
view.rates(options, query)

st.subheader("Latest errors")
view.latest(query)
