"""The "What worked?" form and its answer (GET /api/v1/recommend), used by two pages.

The form asks for the target (model size, nodes, GPUs per node, GPU type, sequence length, global
batch); the answer lists the candidates best first with their evidence and the memory check.
The last submitted query is kept in session state, so the answer survives other interactions.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import data, ui
from dashboard.logic import recommend as rec
from dashboard.logic.fmt import config_label, pct, size_label


def defaults_from_cell(cell: dict[str, Any] | None) -> dict[str, Any]:
    """Form defaults from a heatmap cell: its model size, nodes and its best run's hardware and
    sequence length ("8B on 8 nodes" when there is no cell)."""
    if not cell:
        return {"model": "8B", "nodes": 8, "gpus_per_node": 8}
    best = cell.get("best") or {}
    return {"model": size_label(cell["model_size_class"]), "nodes": cell["nodes"],
            "gpus_per_node": best.get("gpus_per_node") or 8, "gpu_type": best.get("gpu_type"),
            "seq_len": best.get("seq_len")}


def _prefill(key: str, defaults: dict[str, Any], gpu_types: list[str]) -> None:
    """Put ``defaults`` into the form's widgets whenever they change (e.g. another heatmap cell was
    picked); the user's edits stand until then."""
    signature = repr(sorted(defaults.items()))
    if st.session_state.get(f"{key}_defaults") == signature:
        return
    st.session_state[f"{key}_defaults"] = signature
    gpu = defaults.get("gpu_type")
    st.session_state.update({
        f"{key}_model": str(defaults.get("model") or "8B"), f"{key}_nodes": int(defaults.get("nodes") or 8),
        f"{key}_gpn": int(defaults.get("gpus_per_node") or 8), f"{key}_gpu": gpu if gpu in gpu_types else "any",
        f"{key}_seq": int(defaults.get("seq_len") or 0), f"{key}_gbt": int(defaults.get("global_batch_tokens") or 0),
        f"{key}_k": int(st.session_state.get(f"{key}_k") or 5),
    })


def form(key: str, options: dict[str, list[Any]], defaults: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """Render the form (prefilled from ``defaults``); returns the query of the last submission
    (None before the first one)."""
    gpu_types = ["any", *options.get("gpu_type", [])]
    _prefill(key, defaults or {}, gpu_types)
    with st.form(key=f"{key}_form", border=True):
        c = st.columns([1.1, 0.8, 0.8, 1.6, 1, 1.3, 0.7])
        model = c[0].text_input("Model size", key=f"{key}_model", help="parameters: 8B, 1.34B, 70e9, 8030261248")
        nodes = c[1].number_input("Nodes", min_value=1, step=1, key=f"{key}_nodes")
        gpn = c[2].number_input("GPUs/node", min_value=1, step=1, key=f"{key}_gpn")
        gpu = c[3].selectbox("GPU type", gpu_types, key=f"{key}_gpu", accept_new_options=True)
        seq = c[4].number_input("Seq len (0 = any)", min_value=0, step=1024, key=f"{key}_seq")
        gbt = c[5].number_input("Global batch tokens (0 = any)", min_value=0, step=2**20, key=f"{key}_gbt")
        k = c[6].number_input("Show", min_value=1, max_value=50, key=f"{key}_k")
        submitted = st.form_submit_button("What worked?", type="primary", key=f"{key}_submit")
    if submitted:
        if not (model or "").strip():
            st.warning("Give a model size, e.g. 8B.")
            return None
        st.session_state[f"{key}_query"] = rec.recommend_params(model, nodes, gpn, gpu, seq, gbt, k)
    return st.session_state.get(f"{key}_query")


def answer(query: dict[str, Any]) -> None:
    """Fetch and render the candidates for ``query`` (errors shown inline, the page goes on)."""
    with ui.api_errors(stop=False):
        with st.spinner("Searching the recorded runs…"):
            body = data.get("/recommend", **query)
        render(body)


def render(body: dict[str, Any]) -> None:
    """The candidates: a summary table, then one bordered card per candidate."""
    st.markdown(f"**Target:** {rec.target_text(body.get('target') or {})}")
    candidates = body.get("candidates") or []
    if not candidates:
        st.info("No recorded configuration can be adapted to this target: record runs of a nearby model "
                "size or node count, or relax the GPU type / sequence length.")
        return
    st.dataframe(rec.candidate_rows(candidates), hide_index=True, key=None, column_config={
        "mfu": st.column_config.NumberColumn("MFU", format="percent"),
        "tokens_per_sec_per_gpu": st.column_config.NumberColumn("tok/s/GPU", format="localized"),
        "peak_memory_gib": st.column_config.NumberColumn("peak GiB", format="%.1f"),
        "distance": st.column_config.NumberColumn("distance", format="%.2f"),
    })
    for i, c in enumerate(candidates, 1):
        card(i, c)


def card(i: int, c: dict[str, Any]) -> None:
    """One candidate: config, metrics, memory check, evidence, why and risk."""
    m = c.get("metrics") or {}
    with st.container(border=True):
        badge = ":green-badge[exact]" if c.get("match") == "exact" else ":orange-badge[adapted]"
        st.markdown(f"**#{i} · {badge}** · `{config_label(c.get('config') or {})}` · distance "
                    f"{c.get('distance', 0):.2f}")
        cols = st.columns(4)
        tps = m.get("tokens_per_sec_per_gpu")
        cols[0].metric("tokens/s per GPU", f"{tps:,.0f}" if tps is not None else "?")
        cols[1].metric("MFU", pct(m.get("mfu")))
        peak = m.get("peak_memory_gib")
        cols[2].metric("recorded peak memory", f"{peak:.1f} GiB" if peak is not None else "?")
        check = rec.memory_check(c)
        mem = c.get("memory") or {}
        predicted, capacity = mem.get("predicted_peak_memory_gib"), mem.get("gpu_memory_gib")
        verdict = {True: "✓ fits", False: "✗ does not fit"}.get(mem.get("fits"), "not checked")
        cols[3].metric(f"memory model: {verdict}",
                       f"{predicted:.0f} / {capacity:g} GiB" if predicted is not None and capacity else "?", help=check)
        st.markdown(f"**Evidence:** {rec.evidence_text(c)}"
                    + (f" — recorded on {rec.source_text(c)}" if rec.source_text(c) else "")
                    + f"  \n**Memory:** {check}"
                    + (f"  \n**Adapted:** {', '.join(c['adapted_fields'])}" if c.get("adapted_fields") else "")
                    + (f"  \n**Why:** {c['why']}" if c.get("why") else "")
                    + (f"  \n**Risk:** {c['risk']}" if c.get("risk") else ""))
