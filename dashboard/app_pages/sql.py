"""SQL: read-only queries over the `runs` table through POST /api/v1/sql (same column names as
the API and CSV export); the result as a table and CSV. The example query runs on first visit."""

import time

import streamlit as st

from dashboard import data, ui
from dashboard.logic import sql
from service.client import ApiError, ClientError


def run(query: str) -> None:
    """POST the query; keep (answer, round-trip seconds) in session state, or show why not."""
    st.session_state["sql_result"] = None
    try:
        with st.spinner("Running…"):
            start = time.perf_counter()
            st.session_state["sql_result"] = (data.post("/sql", {"query": query}), time.perf_counter() - start)
    except ApiError as exc:
        if exc.endpoint_missing:
            st.warning("This API server has no `POST /api/v1/sql` endpoint yet: update scalebook on the server and "
                       "restart `scalebook serve`.", icon=":material/construction:")
        else:
            ui.show_error(exc)
    except ClientError as exc:  # down / unauthorised: the same clear messages as everywhere
        ui.show_error(exc)


st.title("SQL")
st.caption("Read-only SQL over the `runs` table (one row per run; columns as in the API: model_size_class, "
           "nodes, dp, tp, pp, zero_stage, status, tokens_per_sec_per_gpu, mfu_derived, peak_memory_gib, "
           "error_class, …). The server enforces a timeout and a row cap.")
ui.require_api(need_runs=False)
query = st.text_area("Query", value=sql.EXAMPLE_QUERY, height=200, key="sql_query")
if st.button("Run query", type="primary", key="sql_run", shortcut="Ctrl+Enter") or "sql_result" not in st.session_state:
    run(query)

result = st.session_state.get("sql_result")
if result:
    body, elapsed = result
    st.caption(sql.result_caption(body, elapsed))
    frame = sql.result_frame(body)
    st.dataframe(frame, hide_index=True, key="sql_table")
    ui.csv_download("Result as CSV", frame.to_csv(index=False), "scalebook-query.csv", key="sql_csv")
