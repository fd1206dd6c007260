""""What worked?" (GET /api/v1/recommend) and "Plan the next runs" (GET /api/v1/suggest): the runs
measured on the target and the candidates as table rows and readable texts.

A candidate is ``{"config": {dp, tp, pp, cp, ep, zero_stage, micro_batch_size, grad_accum_steps,
recompute}, "origin", "predicted": {tokens_per_sec_per_gpu, mfu, peak_memory_gib, interval, ...},
"measured": {tokens_per_sec_per_gpu, n_runs, run_id} | None, "evidence": [{run_id,
model_size_class, gpu_type, framework, nodes, distance, measured_tokens_per_sec_per_gpu}],
"memory": {predicted_peak_memory_gib, gpu_memory_gib, fits}, "why"}``. The headline figure is
always the prediction for the target; a neighbour's measurement is evidence only.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from dashboard.logic.fmt import config_label, nodes_label, size_label

Candidate = Mapping[str, Any]


def memory_check(candidate: Candidate) -> str:
    """"✓ fits: 32.2 of 80 GiB predicted" / "✗ does not fit: 91.0 of 80 GiB" / "memory not checked"."""
    mem = candidate.get("memory") or {}
    predicted, capacity, fits = mem.get("predicted_peak_memory_gib"), mem.get("gpu_memory_gib"), mem.get("fits")
    amount = ""
    if predicted is not None:
        amount = f": {predicted:.1f} of {f'{capacity:g}' if capacity is not None else '?'} GiB predicted"
    if fits is True:
        return "✓ fits" + amount
    if fits is False:
        return "✗ does not fit" + amount
    return "memory not checked" + amount


def evidence_text(candidate: Candidate, target: Mapping[str, Any] | None = None) -> str:
    """"#818 1.3B × 2 nodes (d 0.69); #820 3.6B × 2 nodes on A100-SXM-80GB (d 1.6)": the recorded
    runs the prediction rests on, naming their model and hardware where they differ from the target."""
    target = target or {}
    parts = []
    for e in candidate.get("evidence") or []:
        where = f"#{e.get('run_id')} {size_label(e.get('model_size_class'))} × {nodes_label(e.get('nodes') or 0)}"
        if e.get("gpu_type") and e.get("gpu_type") != target.get("gpu_type"):
            where += f" on {e['gpu_type']}"
        parts.append(f"{where} (d {e.get('distance', 0):.2f})")
    return "; ".join(parts) or "no recorded run of this layout"


def interval_text(candidate: Candidate) -> str:
    """"5,900–7,100" tokens/s/GPU: the prediction's interval."""
    lo, hi = (candidate.get("predicted") or {}).get("interval") or (None, None)
    return f"{lo:,.0f}–{hi:,.0f}" if lo is not None and hi is not None else "?"


#: how the candidate and suggestion tables write their numbers (runs.styled: a missing value is "—")
TABLE_FORMATS: dict[str, str] = {
    "predicted_tokens_per_sec_per_gpu": "{:,.0f}", "measured_tokens_per_sec_per_gpu": "{:,.0f}",
    "predicted_mfu": "{:.1%}", "predicted_peak_memory_gib": "{:.1f}", "expected_improvement": "{:.1%}",
}


def candidate_rows(candidates: Sequence[Candidate], target: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """One row per candidate (a layout not run on the target), best first: config, predicted
    tokens/s per GPU and its interval, predicted MFU and peak memory, evidence."""
    rows = []
    for i, c in enumerate(candidates, 1):
        p = c.get("predicted") or {}
        rows.append({
            "#": i, "config": config_label(c.get("config") or {}),
            "predicted_tokens_per_sec_per_gpu": p.get("tokens_per_sec_per_gpu"), "interval": interval_text(c),
            "predicted_mfu": p.get("mfu"), "predicted_peak_memory_gib": p.get("peak_memory_gib"),
            "evidence": evidence_text(c, target),
        })
    return pd.DataFrame(rows, columns=["#", "config", "predicted_tokens_per_sec_per_gpu", "interval", "predicted_mfu",
                                       "predicted_peak_memory_gib", "evidence"])


def memory_verdict(run: Mapping[str, Any]) -> str:
    """A measured run's memory-model verdict: "fits (66 GiB)", "model says no (136 GiB): it ran" (the
    record wins), "fits with ZeRO-1 (not recorded; 136 GiB without)" (the fields the run leaves out
    decide it), "not checked" (a degree or the micro-batch not recorded)."""
    mem = run.get("memory") or {}
    if not mem:
        return "not checked"
    peak = f"{mem.get('predicted_peak_memory_gib', 0):.0f} GiB"
    if mem.get("disagrees"):
        return f"model says no ({peak}): it ran"
    if mem.get("fits_with"):
        return f"fits with {mem['fits_with']} (not recorded; {peak} without)"
    return f"fits ({peak})" if mem.get("fits") else f"not decided ({peak})"


#: how the measured table writes its numbers
MEASURED_FORMATS: dict[str, str] = {"tokens_per_sec_per_gpu": "{:,.0f}", "mfu": "{:.1%}",
                                    "peak_memory_gib": "{:.1f}"}


def measured_rows(measured: Sequence[Mapping[str, Any]]) -> pd.DataFrame:
    """One row per configuration measured on the target (GET /recommend `measured_on_target`), best
    first as the API orders them: run id, model (exact size · framework · precision), config,
    measured tokens/s per GPU, MFU, peak memory (as recorded), runs of that config, the memory
    model's verdict for it."""
    rows = [{"run": f"#{m.get('run_id')}", "model": m.get("label"), "config": config_label(m.get("config") or {}),
             "tokens_per_sec_per_gpu": m.get("tokens_per_sec_per_gpu"), "mfu": m.get("mfu"),
             "peak_memory_gib": m.get("peak_memory_gib"), "runs": m.get("n_runs"), "memory model": memory_verdict(m)}
            for m in measured]
    return pd.DataFrame(rows, columns=["run", "model", "config", "tokens_per_sec_per_gpu", "mfu", "peak_memory_gib",
                                       "runs", "memory model"])


def cell_text(cell: Mapping[str, Any] | None) -> str:
    """"the heatmap's 7–8B row × 8 nodes of H100-SXM-80GB, seq 4096: 17 configurations ran, 42 OOM,
    6 other failures; successful runs at other sequence lengths: 8192 (5)"."""
    if not cell:
        return "nothing recorded"
    text = (f"{cell.get('size')} × {nodes_label(cell.get('nodes') or 0)} of {cell.get('gpu_type')}, seq "
            f"{cell.get('seq_len')}: {cell.get('n_configurations', 0)} configuration(s) ran, {cell.get('n_oom', 0)} "
            f"OOM, {cell.get('n_failed', 0)} other failure(s)")
    other = cell.get("success_at_other_seq_len") or {}
    if other:
        text += "; successful runs at other sequence lengths: " + ", ".join(f"{k} ({v})" for k, v in other.items())
    return text


def model_text(model: Mapping[str, Any]) -> str:
    """"fitted on 587 runs of nanotron on H100-SXM-80GB, held-out error 18 %" (or why a prior)."""
    err = model.get("loo_median_rel_err")
    text = (f"{model.get('status')} on {model.get('n_runs')} runs of {model.get('framework')} on "
            f"{model.get('gpu_type')}")
    if err is not None:
        text += f", held-out error {100 * err:.0f} %"
    if model.get("n_not_competitive"):
        text += (f" ({model['n_not_competitive']} configurations under "
                 f"{100 * float(model.get('competitive_fraction') or 0):.0f} % of their cell's best not fitted)")
    if model.get("reason"):
        text += f" — {model['reason']}"
    return text


def target_text(target: Mapping[str, Any]) -> str:
    """"8B on 8 nodes × 8 GPUs (64) of H100-SXM-80GB, seq 4096, 1,048,576 tokens per batch"."""
    text = f"{size_label(target.get('model_size_class'))} on {target.get('nodes')} node(s) × " \
           f"{target.get('gpus_per_node')} GPUs"
    if target.get("world_size"):
        text += f" ({target['world_size']})"
    if target.get("gpu_type"):
        text += f" of {target['gpu_type']}"
    if target.get("seq_len"):
        text += f", seq {target['seq_len']}"
    if target.get("global_batch_tokens"):
        text += f", {target['global_batch_tokens']:,} tokens per batch"
    return text


#: what the target is costed for beyond its size and cluster: the API's parameter names (None = the records')
SHAPE_FIELDS = ("framework", "precision", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
                "vocab_size", "gated_linear_unit")
#: the model dims among SHAPE_FIELDS (positive integers)
DIM_FIELDS = SHAPE_FIELDS[2:8]


def shape_params(shape: Mapping[str, Any] | None) -> dict[str, Any]:
    """The framework, precision, dims and MLP shape a form gives, as API parameters: "" / 0 / None /
    "records'" mean "not given" (the records' are used); gated_linear_unit True / False / None."""
    shape = shape or {}
    out: dict[str, Any] = {}
    for f in SHAPE_FIELDS:
        v = shape.get(f)
        if f == "gated_linear_unit":
            out[f] = v if isinstance(v, bool) else None
        elif f in DIM_FIELDS:
            out[f] = int(v) if v else None
        else:
            out[f] = str(v).strip() if v and str(v).strip() and v != RECORDS else None
    return out


#: the choice that leaves a framework / precision / MLP shape to the records
RECORDS = "the records'"


def default_gpu(options: Mapping[str, Any]) -> str | None:
    """The GPU type with the most recorded runs (the form's default: never an arbitrary one), None
    when no run has one."""
    counts = (options.get("counts") or {}).get("gpu_type") or {}
    if counts:
        return min(counts, key=lambda g: (-counts[g], str(g)))
    gpus = options.get("gpu_type") or []
    return gpus[0] if len(gpus) == 1 else None


def recommend_params(model: str, nodes: int, gpus_per_node: int, gpu_type: str | None = None,
                     seq_len: int | None = None, global_batch_tokens: int | None = None, k: int = 5,
                     metric: str = "tokens_per_sec_per_gpu", shape: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The query of GET /recommend from the form; 0 / "" / "any" mean "not given"; `shape`: the
    framework, precision, dims and gated_linear_unit (shape_params)."""
    return {"model_params": model.strip(), "nodes": int(nodes), "gpus_per_node": int(gpus_per_node),
            "gpu_type": gpu_type if gpu_type and gpu_type != "any" else None,
            "seq_len": int(seq_len) if seq_len else None,
            "global_batch_tokens": int(global_batch_tokens) if global_batch_tokens else None,
            "k": int(k), "metric": metric, **shape_params(shape)}


#: the most candidates the form shows (its "Show" field's maximum)
MAX_K = 50
#: the question's URL parameters (the API's names), so a "what worked?" link answers when opened
URL_FIELDS = ("model_params", "nodes", "gpus_per_node", "gpu_type", "seq_len", "global_batch_tokens", "k",
              *SHAPE_FIELDS)


def query_from_url(params: Mapping[str, str]) -> dict[str, Any] | None:
    """The recommend query a page URL asks (``?model_params=8B&nodes=8&gpu_type=H100``), or None
    when it asks none (no model_params or nodes). Raises ValueError naming the parameter and its
    value when a number is not a positive integer or gated_linear_unit not true/false."""
    model, nodes = (params.get("model_params") or "").strip(), params.get("nodes")
    if not model or not nodes:
        return None

    def positive(name: str, default: int | None) -> int | None:
        raw = params.get(name)
        if raw in (None, ""):
            return default
        if not str(raw).isdigit() or int(raw) < 1:
            raise ValueError(f"{name}={raw!r} in the URL: a positive integer")
        return int(raw)

    k = positive("k", 5) or 5
    if k > MAX_K:
        raise ValueError(f"k={k!r} in the URL: at most {MAX_K}")
    gated = params.get("gated_linear_unit")
    if gated not in (None, "", "true", "false", "True", "False"):
        raise ValueError(f"gated_linear_unit={gated!r} in the URL: true or false")
    shape = {"framework": params.get("framework"), "precision": params.get("precision"),
             **{f: positive(f, None) for f in DIM_FIELDS},
             "gated_linear_unit": None if gated in (None, "") else gated.lower() == "true"}
    return recommend_params(model, positive("nodes", None) or 1, positive("gpus_per_node", 8) or 8,
                            params.get("gpu_type"), positive("seq_len", None),
                            positive("global_batch_tokens", None), k, shape=shape)


def url_from_query(query: Mapping[str, Any]) -> dict[str, str]:
    """The URL parameters of a recommend query (only those given)."""
    return {k: (str(query[k]).lower() if isinstance(query[k], bool) else str(query[k]))
            for k in URL_FIELDS if query.get(k) is not None}


def suggestion_rows(suggestions: Sequence[Candidate]) -> pd.DataFrame:
    """One row per suggested next run (GET /suggest), best first: config, predicted tokens/s per
    GPU and its interval, expected improvement, predicted peak memory, why."""
    rows = []
    for i, s in enumerate(suggestions, 1):
        p = s.get("predicted") or {}
        rows.append({"#": i, "config": config_label(s.get("config") or {}),
                     "predicted_tokens_per_sec_per_gpu": p.get("tokens_per_sec_per_gpu"), "interval": interval_text(s),
                     "expected_improvement": s.get("expected_improvement"),
                     "predicted_peak_memory_gib": p.get("peak_memory_gib"), "why": s.get("why")})
    return pd.DataFrame(rows, columns=["#", "config", "predicted_tokens_per_sec_per_gpu", "interval",
                                       "expected_improvement", "predicted_peak_memory_gib", "why"])
