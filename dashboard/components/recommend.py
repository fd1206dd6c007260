"""The "What worked?" form and its answer (GET /api/v1/recommend), used by two pages.

The form asks for the target (model size, nodes, GPUs per node, GPU type — the most recorded by
default —, sequence length, global batch; the framework, precision and model shape in an
expander); the answer lists what was measured on the target first, then the predictions for the
layouts not run there, best first, with their evidence and the memory check.
The last submitted query is kept in session state, so the answer survives other interactions.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from dashboard import data, ui
from dashboard.logic import recommend as rec
from dashboard.logic.fmt import config_label, pct, size_label
from dashboard.logic.runs import styled


def defaults_from_cell(cell: dict[str, Any] | None) -> dict[str, Any]:
    """Form defaults from a heatmap cell: its model size, nodes and its best run's hardware and
    sequence length ("8B on 8 nodes" when there is no cell)."""
    if not cell:
        return {"model": "8B", "nodes": 8, "gpus_per_node": 8}
    best = cell.get("best") or {}
    return {"model": size_label(cell["model_size_class"]), "nodes": cell["nodes"],
            "gpus_per_node": best.get("gpus_per_node") or 8, "gpu_type": best.get("gpu_type"),
            "seq_len": best.get("seq_len")}


#: the precisions the form offers (the catalog's names; the API refuses one the GPU has no peak for)
PRECISIONS = ("bf16", "fp8", "fp16", "fp32", "fp4")
#: the MLP shapes the form offers: the records', gated (SwiGLU), plain (GELU)
GATED = {rec.RECORDS: None, "gated (SwiGLU, 3 matrices)": True, "plain (GELU, 2 matrices)": False}


def _prefill(key: str, defaults: dict[str, Any], gpu_types: list[str], default_gpu: str | None) -> None:
    """Put ``defaults`` into the form's widgets whenever they change (e.g. another heatmap cell was
    picked); the user's edits stand until then. The GPU type defaults to the most recorded."""
    signature = repr(sorted(defaults.items()))
    if st.session_state.get(f"{key}_defaults") == signature:
        return
    st.session_state[f"{key}_defaults"] = signature
    gpu = defaults.get("gpu_type")
    gated = defaults.get("gated_linear_unit")
    st.session_state.update({
        f"{key}_model": str(defaults.get("model") or "8B"), f"{key}_nodes": int(defaults.get("nodes") or 8),
        f"{key}_gpn": int(defaults.get("gpus_per_node") or 8),
        f"{key}_gpu": gpu if gpu in gpu_types else default_gpu,
        f"{key}_seq": int(defaults.get("seq_len") or 0), f"{key}_gbt": int(defaults.get("global_batch_tokens") or 0),
        f"{key}_k": int(st.session_state.get(f"{key}_k") or 5),
        f"{key}_fw": defaults.get("framework") or rec.RECORDS, f"{key}_prec": defaults.get("precision") or rec.RECORDS,
        f"{key}_gated": next(label for label, v in GATED.items() if v is gated),
        **{f"{key}_{f}": int(defaults.get(f) or 0) for f in rec.DIM_FIELDS},
    })


def _url_signature() -> str:
    return repr(sorted(st.query_params.to_dict().items()))


def _from_url(key: str) -> dict[str, Any] | None:
    """The form defaults of the question the page's URL asks (the answer to it becomes the form's
    query), or None. The URL is read again whenever it changed since it was last read or written
    (another heatmap cell's link), so a link always answers its own question."""
    signature = _url_signature()
    if st.session_state.get(f"{key}_url_signature") == signature:
        return st.session_state.get(f"{key}_url_defaults")
    st.session_state[f"{key}_url_signature"] = signature
    st.session_state[f"{key}_url_defaults"] = None
    try:
        asked = rec.query_from_url(st.query_params.to_dict())
    except ValueError as exc:
        st.warning(f"The question in the URL could not be read: {exc}")
        return None
    if asked:
        st.session_state[f"{key}_query"] = asked
        st.session_state[f"{key}_k"] = asked["k"]
        st.session_state[f"{key}_url_defaults"] = {
            "model": asked["model_params"], "nodes": asked["nodes"], "gpus_per_node": asked["gpus_per_node"],
            "gpu_type": asked["gpu_type"], "seq_len": asked["seq_len"],
            "global_batch_tokens": asked["global_batch_tokens"], **{f: asked.get(f) for f in rec.SHAPE_FIELDS}}
    return st.session_state[f"{key}_url_defaults"]


def shape_choices(options: dict[str, Any]) -> tuple[list[str], list[str]]:
    """(frameworks, precisions) a form offers: "the records'" first, then the recorded ones (and the
    catalog's precisions)."""
    return ([rec.RECORDS, *options.get("framework", [])],
            [rec.RECORDS, *dict.fromkeys([*PRECISIONS, *options.get("precision", [])])])


def shape_inputs(key: str, frameworks: list[str], precisions: list[str]) -> dict[str, Any]:
    """The framework, precision, MLP shape and the six dims (0 = the recorded model's) in an
    expander, inside a form; returns them as rec.shape_params reads them."""
    with st.expander("Framework, precision and model shape (default: the records')"):
        c1 = st.columns(3)
        fw = c1[0].selectbox("Framework", frameworks, key=f"{key}_fw", accept_new_options=True)
        prec = c1[1].selectbox("Precision", precisions, key=f"{key}_prec", accept_new_options=True)
        gated = c1[2].selectbox("MLP", list(GATED), key=f"{key}_gated")
        c2 = st.columns(6)
        dims = {f: c2[i].number_input(f.replace("_", " ").replace("num ", "").capitalize() + " (0 = recorded)",
                                      min_value=0, step=1, key=f"{key}_{f}")
                for i, f in enumerate(rec.DIM_FIELDS)}
    return {"framework": fw, "precision": prec, "gated_linear_unit": GATED.get(gated), **dims}


def form(key: str, options: dict[str, list[Any]], defaults: dict[str, Any] | None = None,
         url: bool = False) -> dict[str, Any] | None:
    """Render the form (prefilled from ``defaults``; the GPU type from the most-recorded one when
    they name none); returns the query of the last submission (None before the first one). ``url``:
    the question lives in the page's URL (rec.URL_FIELDS): a link with one is answered when opened,
    and each submission is written there, so the answer can be shared."""
    gpu_types = list(options.get("gpu_type", []))
    if url:
        defaults = _from_url(key) or defaults
        asked_gpu = (defaults or {}).get("gpu_type")
        if asked_gpu and asked_gpu not in gpu_types:  # e.g. "H100" as typed in a link: shown as asked
            gpu_types.append(asked_gpu)
    frameworks, precisions = shape_choices(options)
    for value, choices in (((defaults or {}).get("framework"), frameworks),
                           ((defaults or {}).get("precision"), precisions)):
        if value and value not in choices:
            choices.append(value)
    _prefill(key, defaults or {}, gpu_types, rec.default_gpu(options))
    with st.form(key=f"{key}_form", border=True):
        c = st.columns([1.1, 0.8, 0.8, 1.6, 1, 1.3, 0.7])
        model = c[0].text_input("Model size", key=f"{key}_model",
                                help="parameters: 8B (the heatmap's 7–8B row), 8.03B or 8030261248 (one model)")
        nodes = c[1].number_input("Nodes", min_value=1, step=1, key=f"{key}_nodes")
        gpn = c[2].number_input("GPUs/node", min_value=1, step=1, key=f"{key}_gpn")
        gpu = c[3].selectbox("GPU type", gpu_types, key=f"{key}_gpu", accept_new_options=True,
                             help="default: the GPU type with the most recorded runs")
        seq = c[4].number_input("Seq len (0 = most recorded)", min_value=0, step=1024, key=f"{key}_seq")
        gbt = c[5].number_input("Global batch tokens (0 = the runs')", min_value=0, step=2**20, key=f"{key}_gbt")
        k = c[6].number_input("Show", min_value=1, max_value=rec.MAX_K, key=f"{key}_k")
        shape = shape_inputs(key, frameworks, precisions)
        submitted = st.form_submit_button("What worked?", type="primary", key=f"{key}_submit")
    if submitted:
        if not (model or "").strip():
            st.warning("Give a model size, e.g. 8B.")
            return None
        st.session_state[f"{key}_query"] = rec.recommend_params(model, nodes, gpn, gpu, seq, gbt, k, shape=shape)
        if url:
            st.query_params.from_dict(rec.url_from_query(st.session_state[f"{key}_query"]))
            st.session_state[f"{key}_url_signature"] = _url_signature()
            st.session_state[f"{key}_url_defaults"] = None  # the form's own values stand
    return st.session_state.get(f"{key}_query")


def answer(query: dict[str, Any]) -> dict[str, Any] | None:
    """Fetch and render the answer for ``query`` (errors shown inline, the page goes on); returns it
    (None on an error)."""
    with ui.api_errors(stop=False):
        with st.spinner("Searching the recorded runs…"):
            body = data.get("/recommend", **query)
        render(body)
        return body
    return None


def render(body: dict[str, Any]) -> None:
    """The candidates: the model used, a summary table, then one bordered card per candidate."""
    target = body.get("target") or {}
    st.markdown(f"**Target:** {rec.target_text(target)}")
    st.subheader("Measured on this target")
    st.caption(rec.cell_text(body.get("cell")) + ". Every framework and precision, the precision the answer is "
               "costed in first, then the model nearest the size asked, then the best.")
    measured = body.get("measured_on_target") or []
    if measured:
        st.dataframe(styled(rec.measured_rows(measured), rec.MEASURED_FORMATS), hide_index=True, key=None,
                     column_config={"tokens_per_sec_per_gpu": "measured tok/s/GPU", "mfu": "MFU",
                                    "peak_memory_gib": "peak GiB"})
    else:
        st.info("Nothing ran on this target yet: the predictions below are all there is.")
    notes = body.get("notes") or []
    for note in notes:
        if "the record wins" in note:
            st.warning(note)
    st.subheader("Predicted for layouts not run here")
    st.caption(f"Throughput model: {rec.model_text(body.get('model') or {})}")
    for note in notes:
        if "the record wins" not in note:
            st.caption(f"note: {note}")
    candidates = body.get("candidates") or []
    if not candidates:
        st.info("No layout that was not run here is predicted to fit this target"
                + (": what ran here is listed above." if measured else
                   ": record runs of a nearby model size or node count, or relax the GPU type / sequence length."))
        return
    st.dataframe(styled(rec.candidate_rows(candidates, target), rec.TABLE_FORMATS), hide_index=True, key=None,
                 column_config={"predicted_mfu": "predicted MFU",
                                "predicted_tokens_per_sec_per_gpu": "predicted tok/s/GPU",
                                "predicted_peak_memory_gib": "predicted GiB"})
    for i, c in enumerate(candidates, 1):
        card(i, c, target)


def card(i: int, c: dict[str, Any], target: dict[str, Any] | None = None) -> None:
    """One candidate: config, the prediction for the target (headline), measured beside it when it
    ran on this target, memory check, evidence and why."""
    p = c.get("predicted") or {}
    with st.container(border=True):
        badge = ":green-badge[ran here]" if c.get("measured") else ":blue-badge[predicted]"
        st.markdown(f"**#{i} · {badge}** · `{config_label(c.get('config') or {})}`")
        cols = st.columns(4)
        tps = p.get("tokens_per_sec_per_gpu")
        cols[0].metric("predicted tokens/s per GPU", f"{tps:,.0f}" if tps is not None else "?",
                       help=f"interval {rec.interval_text(c)}")
        cols[1].metric("predicted MFU", pct(p.get("mfu")))
        measured = (c.get("measured") or {}).get("tokens_per_sec_per_gpu")
        cols[2].metric("measured on this target", f"{measured:,.0f}" if measured is not None else "not run",
                       help="the runs measured on the target are listed above")
        mem = c.get("memory") or {}
        predicted, capacity = mem.get("predicted_peak_memory_gib"), mem.get("gpu_memory_gib")
        verdict = {True: "✓ fits", False: "✗ does not fit"}.get(mem.get("fits"), "not checked")
        cols[3].metric(f"memory model: {verdict}",
                       f"{predicted:.0f} / {capacity:g} GiB" if predicted is not None and capacity else "?",
                       help=rec.memory_check(c))
        st.markdown(f"**Interval:** {rec.interval_text(c)} tok/s/GPU"
                    + f"  \n**Evidence:** {rec.evidence_text(c, target)}"
                    + (f"  \n**Why:** {c['why']}" if c.get("why") else "")
                    + (f"  \n**Extrapolates:** {'; '.join(c['extrapolation'])}" if c.get("extrapolation") else ""))


def next_runs(query: dict[str, Any]) -> None:
    """"Plan the next runs": GET /api/v1/suggest for the same target — the configurations worth
    benchmarking next, by expected improvement over the best recorded run (same as
    `scalebook suggest`)."""
    st.subheader("Plan the next runs")
    params = {k: v for k, v in query.items() if k not in ("k", "metric")}
    params["n"] = query.get("k") or 5
    with ui.api_errors(stop=False):
        with st.spinner("Choosing the next experiments…"):
            body = data.get("/suggest", **params)
        best = body.get("best_recorded")
        st.caption("Best recorded on this target: "
                   + (f"{best['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU (run #{best['id']})" if best else "none yet")
                   + ". Never a configuration already recorded here, never one predicted or recorded to OOM.")
        st.dataframe(styled(rec.suggestion_rows(body.get("suggestions") or []), rec.TABLE_FORMATS), hide_index=True,
                     key=None, column_config={"predicted_tokens_per_sec_per_gpu": "predicted tok/s/GPU",
                                              "expected_improvement": "expected improvement",
                                              "predicted_peak_memory_gib": "predicted GiB"})
