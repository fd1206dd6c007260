"""scalebook dashboard: the router (`streamlit run dashboard/app.py`, or `scalebook dashboard`).

It reads only through the API at SCALEBOOK_API_URL (default http://127.0.0.1:8000), sending
SCALEBOOK_TOKEN as a bearer token when set. The pages live in dashboard/app_pages/, their logic in
dashboard/logic/ (pure functions) and dashboard/components/ (shared Streamlit pieces).
"""

import sys
from pathlib import Path

import streamlit as st

_REPO = Path(__file__).resolve().parent.parent
if str(_REPO) not in sys.path:  # a checkout that is not pip-installed: make `dashboard` importable
    sys.path.insert(0, str(_REPO))

st.set_page_config(page_title="scalebook", page_icon=":material/grid_view:", layout="wide")

PAGES = [
    st.Page("app_pages/heatmap.py", title="Heatmap", icon=":material/grid_view:", default=True),
    st.Page("app_pages/what_worked.py", title="What worked?", icon=":material/explore:"),
    st.Page("app_pages/explore.py", title="Explore", icon=":material/scatter_plot:"),
    st.Page("app_pages/runs.py", title="Runs", icon=":material/table_rows:"),
    st.Page("app_pages/live.py", title="Live", icon=":material/monitor_heart:"),
    st.Page("app_pages/sweeps.py", title="Sweeps", icon=":material/science:"),
    st.Page("app_pages/scaling.py", title="Scaling & planner", icon=":material/trending_up:"),
    st.Page("app_pages/failures.py", title="Failures", icon=":material/error:"),
    st.Page("app_pages/sql.py", title="SQL", icon=":material/database:"),
]

st.navigation(PAGES).run()
