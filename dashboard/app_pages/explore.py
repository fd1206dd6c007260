"""Explore: a scatter plot and parallel coordinates over any run fields (plotly), coloured by
status or a metric; range filters (sidebar) narrow the scatter, the parallel
coordinates and the table together, and a box/lasso selection in the scatter lists those runs in
the table below."""

import streamlit as st

from dashboard import data, ui
from dashboard.components.runs import COLUMNS as RUN_COLUMNS
from dashboard.logic import explore as ex
from dashboard.logic import runs as rl

st.title("Explore runs")
ui.require_api()
options = ui.load_options()
params = ui.heatmap_filters(options, prefix="ex", comparable=True)
with st.sidebar:
    status = ui.choice("Status", list(rl.STATUSES), "ex_status")
filters = {"gpu_type": params.get("gpu_type"), "seq_len": params.get("seq_len"),
           "global_batch_tokens": params.get("global_batch_tokens"), "framework": params.get("framework"),
           "precision": params.get("precision"), "status": status}
body = ui.call(data.post_cached, "/sql", {"query": ex.explore_sql(filters)}, spinner="Loading runs…")
df = ex.frame(body)
if df.empty:
    st.info("No runs match these filters: relax them in the sidebar.")
    st.stop()
st.caption(f"{ex.summary(df)}" + (f" (the newest {ex.MAX_POINTS:,} matching)" if len(df) >= ex.MAX_POINTS else ""))

fields = list(ex.NUMERIC_FIELDS)
c1, c2, c3, c4 = st.columns([2, 2, 2, 1])
x = c1.selectbox("x", fields, index=fields.index("nodes"), format_func=ex.NUMERIC_FIELDS.get, key="ex_x",
                 bind="query-params")
y = c2.selectbox("y", fields, index=fields.index("tokens_per_sec_per_gpu"), format_func=ex.NUMERIC_FIELDS.get,
                 key="ex_y", bind="query-params")
color = c3.selectbox("Colour by", list(ex.COLOR_CHOICES), format_func=ex.COLOR_CHOICES.get, key="ex_color",
                     bind="query-params")
log_x = c4.toggle("log x", value=x in ex.LOG_FIELDS, key="ex_logx")
log_y = c4.toggle("log y", value=y in ex.LOG_FIELDS, key="ex_logy")

ranges: dict[str, tuple[float, float]] = {}
with st.sidebar:
    narrow = st.multiselect("Narrow by range", fields, format_func=ex.NUMERIC_FIELDS.get, key="ex_narrow",
                            help="The scatter, the parallel coordinates and the table show only the runs in "
                                 "these ranges")
    for d in narrow:
        span = ex.bounds(df, d)
        if span is None:
            st.caption(f"{ex.NUMERIC_FIELDS.get(d, d)}: one value only, nothing to narrow")
            continue
        lo, hi = st.slider(ex.NUMERIC_FIELDS.get(d, d), span[0], span[1], span, key=f"ex_range_{d}")
        if (lo, hi) != span:
            ranges[d] = (lo, hi)
shown = ex.apply_ranges(df, ranges)
if ranges:
    st.caption(f"{len(shown):,} of {len(df):,} runs in the chosen ranges (sidebar)")

event = st.plotly_chart(ex.scatter(shown, x, y, color, log_x, log_y), key="ex_scatter", on_select="rerun",
                        selection_mode=("points", "box", "lasso"), config={"displaylogo": False})
ids = ex.selected_ids(event)

st.subheader("Parallel coordinates")
# drawn on request: plotly's parallel coordinates are WebGL, ~2 s to set up in a browser without a
# GPU (bench/RESULTS.md, page timing), whatever the number of lines
if st.toggle("Draw the parallel coordinates", value=False, key="ex_parcoords_on", bind="query-params"):
    default_dims = ["model_size_class", "nodes", "tp", "pp", "micro_batch_size", "tokens_per_sec_per_gpu",
                    "mfu_derived"]
    dims = st.multiselect("Axes", fields, default=default_dims, format_func=ex.NUMERIC_FIELDS.get, key="ex_dims")
    if len(dims) >= 2:
        st.plotly_chart(ex.parallel(shown, dims, color, ranges), key="ex_parcoords", config={"displaylogo": False})
        st.caption("Ranges narrowed in the sidebar show as brushed axes. Runs missing one of the axes are left out"
                   f"{f', and only the newest {ex.MAX_LINES:,} are drawn' if len(shown) > ex.MAX_LINES else ''}.")
    else:
        st.info("Pick at least two axes.")

st.subheader("Selected runs")
if ids:
    chosen = shown[shown["id"].isin(ids)]
    st.markdown(f"**{len(chosen)} run(s) selected** in the scatter")
    if len(chosen):  # the selection as narrowed by the ranges
        st.page_link("app_pages/runs.py", label="Compare them side by side on the Runs page",
                     query_params={"runs_cmp_ids": ", ".join(str(i) for i in chosen["id"].head(4))},
                     icon=":material/compare:")
else:
    chosen = shown
    st.caption("Select points in the scatter (click, box or lasso) to list those runs; "
               + ("the runs in the chosen ranges are listed now." if ranges else "all runs are listed now."))
table = chosen[["id", "model_name", "model_size_class", "nodes", "gpu_type", "dp", "tp", "pp", "zero_stage",
                "micro_batch_size", "grad_accum_steps", "status", "tokens_per_sec_per_gpu", "mfu_derived",
                "peak_memory_gib"]].rename(columns={"model_size_class": "size_B", "mfu_derived": "mfu"})
fmts = {**rl.TABLE_FORMATS, **{k: "{:,.0f}" for k in ("dp", "tp", "pp", "zero_stage", "micro_batch_size",
                                                      "grad_accum_steps")}}
st.dataframe(rl.styled(table, fmts), hide_index=True, column_config=RUN_COLUMNS, key="ex_table")
