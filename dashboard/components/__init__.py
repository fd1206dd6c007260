"""Streamlit building blocks shared by several pages (filters, the "What worked?" form)."""
