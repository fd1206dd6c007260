"""Sweeps: a sweep's progress (configurations handed out, runs by status, what is left), its best run so
far and the best-so-far curve, and every run with its status and predicted vs measured throughput
(GET /api/v1/sweeps, /sweeps/{name}; DESIGN §9). Sweeps are created with `scalebook sweep create` and run
by `scalebook agent`."""

import streamlit as st

from dashboard import data, ui
from dashboard.logic import sweeps as sv
from dashboard.logic.fmt import pct
from dashboard.logic.runs import styled

st.title("Sweeps")
ui.require_api(need_runs=False)
sweeps = ui.call(data.get, "/sweeps", spinner="Reading the sweeps…")["sweeps"]
if not sweeps:
    st.info("No sweeps yet. Create one with `scalebook sweep create NAME --model 1.34B --nodes 1 --strategy grid "
            "--grid tp=1,2 --budget 4` and run it with `scalebook agent NAME -- COMMAND …` (see the README).",
            icon=":material/inbox:")
    st.stop()
names = [s["name"] for s in sweeps]
asked = st.query_params.get("sweep")
name = st.selectbox("Sweep", names, index=names.index(asked) if asked in names else 0, key="sw_name")
st.query_params["sweep"] = name
sweep = ui.call(data.get, f"/sweeps/{name}", spinner="Reading the sweep…")
st.caption(f"{sweep['strategy']} · {sv.target_text(sweep['target'])}")
st.write(sv.progress_text(sweep))
st.progress(min(1.0, sweep["handed_out"] / sweep["budget"]))
best = sweep.get("best")
c = st.columns(3)
if best:
    c[0].metric("Best so far, tok/s/GPU", f"{best['tokens_per_sec_per_gpu']:,.0f}")
    c[1].metric("Its MFU", pct(best.get("mfu")))
    c[2].markdown(f"Its configuration  \n**{best['label']}**  \nrun {best['id']}")
else:
    c[0].metric("Best so far, tok/s/GPU", "—")
    st.caption("No successful run yet.")
if sweep["runs"]:
    st.subheader("Best so far")
    st.plotly_chart(sv.best_so_far_figure(sweep), key="sw_chart")
    st.subheader("Runs")
    st.dataframe(styled(sv.runs_frame(sweep), sv.RUN_FORMATS), hide_index=True, key="sw_runs")
