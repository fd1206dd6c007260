"""scalebook's Streamlit dashboard: reads only through the HTTP API (see dashboard/app.py)."""
