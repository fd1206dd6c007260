""""What worked?" (GET /api/v1/recommend): candidates as table rows and readable checks.

A candidate is ``{"match": "exact" | "adapted", "config": {dp, tp, pp, cp, ep, zero_stage,
micro_batch_size, grad_accum_steps, recompute}, "metrics": {tokens_per_sec_per_gpu, mfu,
peak_memory_gib, value}, "evidence": {n_runs, source_run_ids, best_run_id, spread}, "distance",
"memory": {predicted_peak_memory_gib, gpu_memory_gib, fits}, "why", "risk", "adapted_fields",
"source": {...}}``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import pandas as pd

from dashboard.logic.fmt import config_label, nodes_label, pct, size_label

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


def evidence_text(candidate: Candidate) -> str:
    """"6 runs, best #818, 3,708–5,570 tok/s/GPU" (what the candidate rests on)."""
    ev = candidate.get("evidence") or {}
    n = ev.get("n_runs") or 0
    text = f"{n} run{'s' if n != 1 else ''}"
    if ev.get("best_run_id") is not None:
        text += f", best #{ev['best_run_id']}"
    spread = ev.get("spread") or {}
    if spread.get("min") is not None and spread.get("max") is not None and n > 1:
        lo, hi = spread["min"], spread["max"]
        m = candidate.get("metrics") or {}
        is_mfu = m.get("value") is not None and m.get("value") == m.get("mfu")
        text += f", MFU {pct(lo)}–{pct(hi)}" if is_mfu else f", {lo:,.0f}–{hi:,.0f} tok/s/GPU"
    return text


def source_text(candidate: Candidate) -> str:
    """Where the evidence was recorded: "8B × 8 nodes of H100-SXM-96GB-HBM2e, seq 4096"."""
    src = candidate.get("source") or {}
    if not src:
        return ""
    parts = [f"{size_label(src.get('model_size_class'))} × {nodes_label(src['nodes'])}" if src.get("nodes")
             else size_label(src.get("model_size_class"))]
    if src.get("gpu_type"):
        parts[0] += f" of {src['gpu_type']}"
    if src.get("seq_len"):
        parts.append(f"seq {src['seq_len']}")
    return ", ".join(parts)


def candidate_rows(candidates: Sequence[Candidate]) -> pd.DataFrame:
    """One row per candidate, best first: match, config label, tokens/s per GPU, MFU, recorded
    peak memory, the memory check, evidence and distance."""
    rows = []
    for i, c in enumerate(candidates, 1):
        m = c.get("metrics") or {}
        rows.append({
            "#": i, "match": c.get("match"), "config": config_label(c.get("config") or {}),
            "tokens_per_sec_per_gpu": m.get("tokens_per_sec_per_gpu"), "mfu": m.get("mfu"),
            "peak_memory_gib": m.get("peak_memory_gib"), "memory_check": memory_check(c),
            "evidence": evidence_text(c), "recorded_on": source_text(c), "distance": c.get("distance"),
            "adapted": ", ".join(c.get("adapted_fields") or []),
        })
    return pd.DataFrame(rows, columns=["#", "match", "config", "tokens_per_sec_per_gpu", "mfu", "peak_memory_gib",
                                       "memory_check", "evidence", "recorded_on", "distance", "adapted"])


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


def recommend_params(model: str, nodes: int, gpus_per_node: int, gpu_type: str | None = None,
                     seq_len: int | None = None, global_batch_tokens: int | None = None, k: int = 5,
                     metric: str = "tokens_per_sec_per_gpu") -> dict[str, Any]:
    """The query of GET /recommend from the form; 0 / "" / "any" mean "not given"."""
    return {"model_params": model.strip(), "nodes": int(nodes), "gpus_per_node": int(gpus_per_node),
            "gpu_type": gpu_type if gpu_type and gpu_type != "any" else None,
            "seq_len": int(seq_len) if seq_len else None,
            "global_batch_tokens": int(global_batch_tokens) if global_batch_tokens else None,
            "k": int(k), "metric": metric}
