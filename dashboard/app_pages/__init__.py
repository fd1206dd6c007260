"""Thin page scripts run by the router in dashboard/app.py (st.navigation); not imported."""
