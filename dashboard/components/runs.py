"""Runs page pieces: filters, a cursor-paged table, one run's detail and a side-by-side diff."""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import data, ui
from dashboard.logic import live as lv
from dashboard.logic import runs as rl
from dashboard.logic.fmt import run_title, size_label
from service.client import Client, ClientError

_CURSORS = "runs_cursors"
_SIGNATURE = "runs_signature"

#: column headers of the runs tables (the values are formatted by dashboard.logic.runs.styled)
COLUMNS = {
    "mfu": "MFU", "tokens_per_sec_per_gpu": "tok/s/GPU", "peak_memory_gib": "peak GiB", "size_B": "size (B)",
    "global_batch_tokens": "batch tokens", "started_at": "started",
    "retired": st.column_config.TextColumn("retired", help="a retired run is kept but left out of every analytic"),
}


def filters(options: dict[str, list[Any]]) -> tuple[dict[str, Any], str, int]:
    """Sidebar filters, sort and page size; returns (query filters, sort, limit)."""
    with st.sidebar:
        st.subheader("Filters")
        f = {
            "model_name": ui.choice("Model", options.get("model_name", []), "runs_model"),
            "model_size_class": ui.choice("Model size", options.get("model_size_class", []), "runs_size",
                                          fmt=size_label),
            "nodes": ui.choice("Nodes", options.get("nodes", []), "runs_nodes"),
            "status": ui.choice("Status", list(rl.STATUSES), "runs_status"),
            "gpu_type": ui.choice("GPU type", options.get("gpu_type", []), "runs_gpu"),
            "framework": ui.choice("Framework", options.get("framework", []), "runs_fw"),
            "error_class": ui.choice("Error class", options.get("error_class", []), "runs_err"),
            "source": ui.choice("Source", options.get("source", []), "runs_source"),
        }
        shown = st.radio("Retired runs", list(rl.RETIRED_CHOICES), key="runs_retired", horizontal=True,
                         bind="query-params", help="retired runs are kept and listed, but every analytic leaves "
                                                   "them out; 'only' lists them alone")
        f["retired"] = rl.RETIRED_CHOICES[shown]
        sort = st.selectbox("Sort", list(rl.SORT_CHOICES), format_func=rl.SORT_CHOICES.get, key="runs_sort",
                            bind="query-params")
        limit = st.selectbox("Rows per page", [25, 50, 100, 250, 1000], index=2, key="runs_limit")
    return {k: v for k, v in f.items() if v is not None}, sort, limit


def page(query: dict[str, Any], sort: str, limit: int) -> dict[str, Any]:
    """Fetch the current page (cursor kept in session state, reset when the query changes) and
    draw the pager; returns the page body {"runs", "next_cursor", "total"}."""
    signature = repr((sorted(query.items()), sort, limit))
    if st.session_state.get(_SIGNATURE) != signature:
        st.session_state[_SIGNATURE] = signature
        st.session_state[_CURSORS] = [None]
    cursors: list[str | None] = st.session_state[_CURSORS]
    body = ui.call(data.get, "/runs", limit=limit, sort=sort, cursor=cursors[-1], spinner="Loading runs…", **query)
    total, n = body.get("total", 0), len(body.get("runs", []))
    first = (len(cursors) - 1) * limit
    c1, c2, c3 = st.columns([4, 1, 1])
    c1.markdown(f"**{total:,} runs** match · showing {first + 1 if n else 0:,}–{first + n:,} "
                f"(page {len(cursors)} of {max(1, -(-total // limit)):,})")
    if c2.button("◀ Previous", disabled=len(cursors) == 1, key="runs_prev", width="stretch"):
        cursors.pop()
        st.rerun()
    if c3.button("Next ▶", disabled=not body.get("next_cursor"), key="runs_next", width="stretch"):
        cursors.append(body["next_cursor"])
        st.rerun()
    return body


def table(runs: list[dict[str, Any]], query: dict[str, Any], sort: str, total: int) -> None:
    """The page as a table, plus CSV downloads of this page and of EVERY matching run (all pages,
    fetched when clicked; every field, as `scalebook export` writes it)."""
    st.dataframe(rl.styled(rl.runs_table(runs)), hide_index=True, column_config=COLUMNS, key="runs_table")
    c1, c2, _ = st.columns([2, 1.4, 0.6])  # the first label ("All 1,989 matching runs as CSV") whole at 1280 px
    with c1:
        ui.csv_download(f"All {total:,} matching runs as CSV",
                        lambda: rl.runs_csv(data.all_runs(max_runs=None, sort=sort, **query)[0]),
                        "scalebook-runs.csv", key="runs_csv_all")
    with c2:
        ui.csv_download("This page as CSV", lambda: rl.runs_csv(runs), "scalebook-runs-page.csv", key="runs_csv")


def detail(runs: list[dict[str, Any]]) -> None:
    """One run (GET /runs/{id}) in sections: model, hardware, parallelism, results, software, …"""
    ui.reset_on_change("runs_detail", [r["id"] for r in runs], {"runs_detail_id": int(runs[0]["id"]) if runs else 1})
    run_id = st.number_input("Run id", min_value=1, step=1, key="runs_detail_id")
    with ui.api_errors(stop=False):
        run = data.get(f"/runs/{int(run_id)}")
        st.markdown(f"**{run_title(run)}**")
        if run.get("retired_at"):
            st.badge("retired", icon=":material/archive:", color="orange")
            st.caption(f"Retired {str(run['retired_at'])[:16].replace('T', ' ')} UTC — "
                       f"{run.get('retired_reason') or 'no reason given'}. Kept and listed here; the heatmap, "
                       "recommendations and fits leave it out.")
        if run.get("status") in ("running", "lost"):
            st.badge(run["status"], icon=":material/monitor_heart:",
                     color="blue" if run["status"] == "running" else "red")
            st.caption(f"Open run, last heard from {str(run.get('last_heartbeat_at'))[:19].replace('T', ' ')} UTC; "
                       "analytics leave it out until it finishes.")
        sections = rl.detail_sections(run)
        cols = st.columns(2)  # two wide columns: field names such as tokens_per_sec_per_gpu stay whole
        for i, (name, frame) in enumerate(sections.items()):
            with cols[i % 2]:
                st.markdown(f"*{name}*")
                st.dataframe(frame, hide_index=True, key=f"runs_detail_{name}", width="stretch",
                             column_config={"field": st.column_config.TextColumn("field", width="medium"),
                                            "value": st.column_config.TextColumn("value", width="large")})
        series(int(run["id"]))
        retire(run)


def series(run_id: int, fresh: bool = False) -> None:
    """The run's step series (GET /runs/{id}/steps) plotted, with its jitter and stragglers; nothing for a
    run without steps. `fresh`: past the cache (the Live page)."""
    body = (data.get_fresh if fresh else data.get)(f"/runs/{run_id}/steps")
    steps = body.get("steps") or []
    if not steps:
        return
    st.markdown(f"*Step series* ({len(steps)} steps)")
    st.plotly_chart(lv.series_figure(steps, body["summary"]), key=f"series_{run_id}_{fresh}")
    for line in lv.summary_text(body["summary"]):
        st.caption(line)


def retire(run: dict[str, Any]) -> None:
    """Retire the run shown, with a reason (POST /runs/retire), or un-retire it (POST /runs/unretire),
    with a write token (SCALEBOOK_TOKEN, or one typed here for this request only)."""
    retired = bool(run.get("retired") or run.get("retired_at"))
    label = "Un-retire this run" if retired else "Retire this run"
    with st.expander(f"{label} (needs a write token)", icon=":material/archive:"):
        st.caption("A retired run stays stored and listed here, but the heatmap, recommendations and fits leave it "
                   "out (a mis-recorded or superseded benchmark). Un-retiring brings it back.")
        if retired:
            st.markdown(f"Retired: {run.get('retired_reason') or rl.MISSING}")
        reason = "" if retired else st.text_input("Reason", key="runs_retire_reason",
                                                  placeholder="e.g. wrong gpu_type recorded; rerun is #1234")
        token = st.text_input("Write token", type="password", key="runs_retire_token",
                              help="leave empty to use SCALEBOOK_TOKEN; used for this request only, never stored")
        if st.button(label, key="runs_retire_go", disabled=not retired and not reason.strip()):
            try:
                if retired:
                    Client(token=token or None).unretire([int(run["id"])])
                else:
                    Client(token=token or None).retire(reason, [int(run["id"])])
            except ClientError as exc:
                ui.show_error(exc)
            else:
                data.clear()
                st.success(f"Run #{run['id']} {'un-retired' if retired else 'retired'}.")


def compare(runs: list[dict[str, Any]]) -> None:
    """2–4 runs side by side (picked on this page or typed as ids, also from the URL's
    ``runs_cmp_ids``); fields whose values differ are highlighted, missing values are "—"."""
    ids = [r["id"] for r in runs]
    titles = {r["id"]: run_title(r) for r in runs}
    ui.reset_on_change("runs_cmp", ids, {"runs_cmp_pick": ids[:2]})
    c1, c2 = st.columns([3, 1])
    picked = c1.multiselect("Runs from this page", ids, max_selections=4, key="runs_cmp_pick",
                            format_func=lambda i: titles.get(i, f"#{i}"))
    typed = c2.text_input("…or run ids", key="runs_cmp_ids", placeholder="12, 15, 20", bind="query-params")
    chosen = list(dict.fromkeys([*picked, *rl.parse_ids(typed)]))[:4]
    if len(chosen) < 2:
        st.info("Pick two to four runs to compare.")
        return
    only = st.toggle("Only fields that differ", value=False, key="runs_cmp_only")
    with ui.api_errors(stop=False):
        full = [data.get(f"/runs/{i}") for i in chosen]
        frame, differing = rl.compare_runs(full, only_differences=only)
        st.caption(f"{len(differing)} field(s) differ (highlighted): {', '.join(differing[:12])}"
                   f"{' …' if len(differing) > 12 else ''}")
        st.dataframe(rl.style_differences(frame, differing), key="runs_cmp_table",
                     height=min(900, 35 * (len(frame) + 1) + 5),
                     column_config={"_index": st.column_config.TextColumn("field", width="medium")})
