"""The "What if?" panel (POST /api/v1/predict): any configuration, its predicted throughput with the
interval, MFU, the step time broken down as a bar, peak memory and whether it fits, the runs it
rests on, and the measurement when it ran on the target. Prefilled from the What worked? answer
(dashboard.logic.whatif.seed); the last question is kept in session state."""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import data, ui
from dashboard.components.recommend import GATED, PRECISIONS
from dashboard.logic import recommend as rec
from dashboard.logic import whatif as wi
from dashboard.logic.fmt import config_label, pct
from dashboard.logic.runs import styled

RECOMPUTE = ("none", "selective", "full")


def _prefill(key: str, seed: dict[str, Any]) -> None:
    """Put the seed into the panel's widgets whenever it changes (a new What worked? answer)."""
    ui.reset_on_change(f"{key}_seed", sorted((k, str(v)) for k, v in seed.items()), {
        f"{key}_model": str(seed["model"]), f"{key}_nodes": int(seed["nodes"]),
        f"{key}_gpn": int(seed["gpus_per_node"]), f"{key}_gpu": seed.get("gpu_type"),
        f"{key}_seq": int(seed.get("seq_len") or 0),
        **{f"{key}_{f}": int(seed.get(f) or 0) for f in ("dp", "tp", "pp", "cp", "ep", "micro_batch_size",
                                                          "grad_accum_steps")},
        f"{key}_zero_stage": int(seed.get("zero_stage") or 0), f"{key}_recompute": seed.get("recompute") or "none",
        f"{key}_fw": seed.get("framework") or rec.RECORDS, f"{key}_prec": seed.get("precision") or rec.RECORDS,
        **{f"{key}_{f}": int(seed.get(f) or 0) for f in rec.DIM_FIELDS},
        f"{key}_gated": next(label for label, v in GATED.items() if v is seed.get("gated_linear_unit")),
    })


def panel(key: str, options: dict[str, Any], seed: dict[str, Any]) -> None:
    """The form, then the answer to its last submission."""
    st.subheader("What if?")
    st.caption("Any configuration — a slow one too: what the throughput and memory models predict for it on this "
               "cluster, the recorded runs the prediction rests on, and the measurement when it ran here "
               "(POST /api/v1/predict, `scalebook predict`). DP 0 = the world size over TP·PP·CP.")
    seed = {**seed, "gpu_type": seed.get("gpu_type") or rec.default_gpu(options)}
    _prefill(key, seed)
    gpu_types = list(dict.fromkeys([*options.get("gpu_type", []), *([seed["gpu_type"]] if seed.get("gpu_type")
                                                                     else [])]))
    frameworks = list(dict.fromkeys([rec.RECORDS, *options.get("framework", []),
                                     *([seed["framework"]] if seed.get("framework") else [])]))
    precisions = list(dict.fromkeys([rec.RECORDS, *PRECISIONS, *options.get("precision", [])]))
    with st.form(key=f"{key}_form", border=True):
        c = st.columns([1.1, 0.7, 0.9, 1.6, 0.9, 1.5, 1.1])
        values: dict[str, Any] = {
            "model": c[0].text_input("Model size", key=f"{key}_model"),
            "nodes": c[1].number_input("Nodes", min_value=1, step=1, key=f"{key}_nodes"),
            "gpus_per_node": c[2].number_input("GPUs/node", min_value=1, step=1, key=f"{key}_gpn"),
            "gpu_type": c[3].selectbox("GPU type", gpu_types, key=f"{key}_gpu", accept_new_options=True),
            "seq_len": c[4].number_input("Seq len", min_value=0, step=1024, key=f"{key}_seq"),
            "framework": c[5].selectbox("Framework", frameworks, key=f"{key}_fw", accept_new_options=True),
            "precision": c[6].selectbox("Precision", precisions, key=f"{key}_prec", accept_new_options=True),
        }
        c = st.columns([1, 1, 1, 1, 1, 1, 1, 1, 1.5])
        for i, (f, label) in enumerate((("dp", "DP"), ("tp", "TP"), ("pp", "PP"), ("cp", "CP"), ("ep", "EP"),
                                        ("micro_batch_size", "MBS"), ("grad_accum_steps", "GAS"))):
            values[f] = c[i].number_input(label, min_value=0 if f == "dp" else 1, step=1, key=f"{key}_{f}")
        values["zero_stage"] = c[7].selectbox("ZeRO", (0, 1, 2, 3), key=f"{key}_zero_stage")
        values["recompute"] = c[8].selectbox("Recompute", RECOMPUTE, key=f"{key}_recompute")
        with st.expander("Model shape (default: the recorded model's)"):
            c = st.columns(7)
            for i, f in enumerate(rec.DIM_FIELDS):
                values[f] = c[i].number_input(f.replace("_", " ").replace("num ", "").capitalize(), min_value=0,
                                              step=1, key=f"{key}_{f}")
            values["gated_linear_unit"] = GATED.get(c[6].selectbox("MLP", list(GATED), key=f"{key}_gated"))
        if st.form_submit_button("What if?", type="primary", key=f"{key}_submit"):
            st.session_state[f"{key}_body"] = wi.predict_body(values)
    body = st.session_state.get(f"{key}_body")
    if not body:
        st.info("Set a configuration and press **What if?**")
        return
    with ui.api_errors(stop=False):
        with st.spinner("Predicting…"):
            answer(data.post_cached("/predict", body))


def answer(a: dict[str, Any]) -> None:
    """The prediction: headline figures, the step-time bar, memory, model, evidence, notes."""
    p = a.get("predicted") or {}
    lo, hi = p.get("interval") or (None, None)
    st.markdown(f"**{config_label(a.get('config') or {})}** on {rec.target_text(a.get('target') or {})}")
    cols = st.columns(4)
    cols[0].metric("predicted tokens/s per GPU", f"{p.get('tokens_per_sec_per_gpu', 0):,.0f}",
                   help=f"interval {lo:,.0f}–{hi:,.0f}" if lo is not None else None)
    cols[1].metric("predicted MFU", pct(p.get("mfu")))
    cols[2].metric("step time", f"{p.get('step_time_s', 0):.2f} s")
    measured = (a.get("measured") or {}).get("tokens_per_sec_per_gpu")
    cols[3].metric("measured on this target", f"{measured:,.0f}" if measured is not None else "not run")
    st.markdown(f"**Interval:** {lo:,.0f}–{hi:,.0f} tok/s/GPU  \n**Memory:** {wi.fits_text(a)}"
                if lo is not None else f"**Memory:** {wi.fits_text(a)}")
    st.plotly_chart(wi.breakdown_figure(p), key=None, config={"displayModeBar": False})
    why = a.get("why") or ""
    st.caption(f"Throughput model: {wi.model_text(a.get('model') or {})}. {why[:1].upper() + why[1:]}")
    evidence = a.get("evidence") or []
    if evidence:
        st.dataframe(styled(wi.evidence_rows(evidence), wi.EVIDENCE_FORMATS), hide_index=True, key=None,
                     column_config={"measured_tokens_per_sec_per_gpu": "measured tok/s/GPU"})
    else:
        st.caption("No recorded run of this layout: the model alone.")
    for note in a.get("notes") or []:
        (st.warning if "the record wins" in note else st.caption)(f"note: {note}")
