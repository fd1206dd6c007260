"""Live: the runs open right now — running, or lost (no heartbeat for lost_after_s: hung or killed) —
with their last heartbeat and last step, refreshed every few seconds; pick one to see its series."""

import streamlit as st

from dashboard import data, ui
from dashboard.components import runs as view
from dashboard.logic import live as lv

REFRESH_S = 10

st.title("Live runs")
ui.require_api()
which = st.radio("Show", ["running and lost", "running", "lost"], horizontal=True, key="live_which",
                 bind="query-params")


@st.fragment(run_every=REFRESH_S)
def live_table() -> None:
    status = None if which == "running and lost" else which
    body = ui.call(data.get_fresh, "/live", status=status)
    frame = lv.live_table(body)
    st.caption(f"{len(frame)} open run(s); a running run reads lost after {body.get('lost_after_s', 0):g} s "
               f"without a heartbeat (SCALEBOOK_LOST_AFTER_S). Refreshed every {REFRESH_S} s.")
    if frame.empty:
        st.info("No run is open. Jobs started with the recorder or an integration appear here while they train.")
        return
    st.dataframe(frame, hide_index=True, key="live_runs", column_config={
        "heard_s_ago": st.column_config.NumberColumn("heard (s ago)", help="seconds since the last heartbeat"),
        "last_step": st.column_config.NumberColumn("last step"),
        "loss": st.column_config.NumberColumn("loss", format="%.3f"),
        "tokens_per_sec_per_gpu": st.column_config.NumberColumn("tok/s/GPU", format="%.0f"),
        "step_time_s": st.column_config.NumberColumn("step time (s)", format="%.3f")})
    run_id = st.selectbox("Series of run", frame["id"].tolist(), key="live_pick")
    if run_id is not None:
        view.series(int(run_id), fresh=True)


live_table()
