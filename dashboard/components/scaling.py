"""Scaling & planner pieces: throughput and efficiency vs nodes with the Amdahl fit
(GET /api/v1/scaling) and the GPU planner (GET /api/v1/plan). Both endpoints may be missing on
an older server: that is said plainly, and the rest of the page still works."""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import data, ui
from dashboard.components import recommend
from dashboard.logic import scaling as sc
from dashboard.logic.fmt import pct, size_label
from dashboard.logic.recommend import shape_params
from dashboard.logic.runs import styled
from service.client import ApiDown, ApiError, Unauthorized

#: display formats of the scaling table
TABLE_FORMATS = {"nodes": "{:,.0f}", "world_size": "{:,.0f}", "tokens_per_sec_per_gpu": "{:,.0f}",
                 "aggregate_tokens_per_sec": "{:,.0f}", "efficiency": "{:.1%}", "best_run_id": "{:.0f}",
                 "fit_efficiency": "{:.1%}", "error_pp": "{:+.1f}", "aggregate_error_pct": "{:+.1f}"}

#: the planner's defaults (the form starts on them and the page answers them on first visit)
PLAN_DEFAULTS = {"model_params": "3B", "tokens": "11T", "days": 28.0, "gpu_type": "H100-SXM-80GB", "mfu": None,
                 "peak_tflops": None}

MISSING = ("This API server has no `{path}` endpoint yet (it answers 404 Not Found). Update scalebook on the "
           "server, restart `scalebook serve`, and reload this page.")


def _get(path: str, **params: Any) -> dict[str, Any] | None:
    """GET that renders errors inline: missing endpoint → warning, no data → info, other → error."""
    try:
        with st.spinner(f"Asking {path}…"):
            return data.get(path, **params)
    except ApiError as exc:
        if exc.endpoint_missing:
            st.warning(MISSING.format(path=f"/api/v1{path}"), icon=":material/construction:")
        elif exc.status == 404:
            st.info(f"{exc.message}", icon=":material/inbox:")
        else:
            ui.show_error(exc)
    except (ApiDown, Unauthorized) as exc:
        ui.show_error(exc)
    return None


def scaling(options: dict[str, list[Any]], cells: list[dict[str, Any]]) -> None:
    """Pick a model size, GPU type and sequence length; chart the best run per node count."""
    target = sc.default_target(cells)
    sizes = options.get("model_size_class", [])
    gpus = options.get("gpu_type", [])
    c = st.columns(3)
    size = c[0].selectbox("Model size", sizes, format_func=size_label, key="sc_size",
                          index=sizes.index(target["model_size_class"]) if target.get("model_size_class") in sizes
                          else 0)
    gpu = c[1].selectbox("GPU type", [None, *gpus], format_func=lambda v: "any" if v is None else v, key="sc_gpu",
                         index=(gpus.index(target["gpu_type"]) + 1) if target.get("gpu_type") in gpus else 0)
    seqs = options.get("seq_len", [])
    seq = c[2].selectbox("Sequence length", [None, *seqs], format_func=lambda v: "any" if v is None else f"{v:,}",
                         key="sc_seq", index=(seqs.index(target["seq_len"]) + 1) if target.get("seq_len") in seqs
                         else 0)
    if size is None:
        st.info("No model size to chart yet.")
        return
    body = _get("/scaling", model_params=int(round(size * 1e9)), gpu_type=gpu, seq_len=seq)
    if body is None:
        return
    frame = sc.points_frame(body.get("points") or [])
    if frame.empty:
        st.info(f"No successful runs of {size_label(size)} to chart with these choices.")
        return
    amdahl = body.get("amdahl") or {}
    m = st.columns(4)
    m[0].metric("node counts measured", len(frame))
    m[1].metric("serial fraction", pct(amdahl.get("serial_fraction"), 2) if amdahl.get("serial_fraction") is not None
                else "—", help="Amdahl's law: speedup(n) = 1 / (s + (1 − s) / n)")
    last = frame.iloc[-1]
    m[2].metric(f"efficiency at {int(last['nodes'])} nodes", pct(last["efficiency"]))
    m[3].metric("best tok/s/GPU", f"{frame['tokens_per_sec_per_gpu'].max():,.0f}")
    st.caption(sc.amdahl_summary(amdahl, body.get("amdahl_reason")))
    errors = sc.fit_errors(frame, amdahl)
    quality = sc.fit_quality(errors)
    if quality:
        st.markdown(f"**How well the curve fits:** {quality}.")
    for note in body.get("notes") or []:
        st.caption(f"Note: {note}")
    title = " · ".join(p for p in (size_label(body.get("model_size_class") or size), body.get("gpu_type") or gpu,
                                   f"seq {body['seq_len']:,}" if body.get("seq_len") else None) if p)
    st.plotly_chart(sc.figure(frame, sc.amdahl_curve(frame, amdahl), title=title), key="sc_chart")
    table = frame.merge(errors.drop(columns=["measured_efficiency"]), on="nodes", how="left") if not errors.empty \
        else frame
    st.dataframe(styled(table, TABLE_FORMATS), hide_index=True, key="sc_points", column_config={
        "efficiency": "measured efficiency", "tokens_per_sec_per_gpu": "tok/s/GPU",
        "aggregate_tokens_per_sec": "aggregate tok/s", "fit_efficiency": "Amdahl efficiency",
        "error_pp": "fit − measured (pp)", "aggregate_error_pct": "fit − measured tok/s (%)",
        "best_run_id": "best run", "world_size": "GPUs",
    })


def planner(options: dict[str, list[Any]]) -> None:
    """GPUs = FLOPs per token · tokens / (peak · MFU · time), booked in whole nodes: 6·N per token
    with a given MFU (C ≈ 6·N·D, Kaplan et al. 2020), 6·N + 12·L·h·s with the MFU the throughput model
    predicts for the target (PaLM, appendix B)."""
    with st.form("plan_form", border=True):
        c = st.columns(6)
        d = PLAN_DEFAULTS
        model = c[0].text_input("Model size", value=d["model_params"], key="plan_model", help="3B, 70e9, 8030261248")
        tokens = c[1].text_input("Training tokens", value=d["tokens"], key="plan_tokens", help="11T, 2.5e12")
        days = c[2].number_input("Days", min_value=0.1, value=d["days"], step=1.0, key="plan_days")
        gpus = options.get("gpu_type", [])
        gpu = c[3].selectbox("GPU type", gpus, key="plan_gpu", accept_new_options=True,
                             index=gpus.index(d["gpu_type"]) if d["gpu_type"] in gpus else 0)
        mfu = c[4].number_input("MFU % (0 = predicted)", min_value=0.0, max_value=100.0, value=0.0, key="plan_mfu")
        peak = c[5].number_input("Peak TFLOP/s (0 = catalog)", min_value=0.0, value=0.0, key="plan_peak")
        shape = recommend.shape_inputs("plan", *recommend.shape_choices(options))
        submitted = st.form_submit_button("Plan", type="primary", key="plan_submit")
    if submitted:
        st.session_state["plan_query"] = {
            "model_params": model.strip(), "tokens": tokens.strip(), "days": days, "gpu_type": gpu,
            "mfu": mfu / 100 if mfu else None, "peak_tflops": peak or None, **shape_params(shape)}
    query = st.session_state.get("plan_query")
    if not query:  # first visit: the answer for the form's defaults, so the headline matches the form
        gpus = options.get("gpu_type", [])
        query = {**PLAN_DEFAULTS, "gpu_type": PLAN_DEFAULTS["gpu_type"] if PLAN_DEFAULTS["gpu_type"] in gpus
                 else (gpus[0] if gpus else PLAN_DEFAULTS["gpu_type"])}
        st.caption("The answer for the inputs above (MFU: the throughput model's prediction for the target, "
                   "fitted to the recorded runs; peak from the hardware catalog). The SmolLM3 playbook's example "
                   "sets MFU 30 % and 720 TFLOP/s peak.")
    plan = _get("/plan", **query)
    if plan is None:
        return
    st.success(sc.plan_headline(plan))
    st.table(sc.plan_rows(plan).set_index("quantity"))
    for note in [plan.get("formula"), *(plan.get("notes") or [])]:
        if note:
            st.caption(note)
