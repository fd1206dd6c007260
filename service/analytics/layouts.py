"""The parallel layouts of a target: every combination of TP, PP, CP, EP, ZeRO stage, micro-batch and
recompute that the world size, the model and the global batch admit (DESIGN §4, "Recommendation").

One enumeration for the recommender (its options: the values the records show plus powers of two,
`recorded_options`) and for a grid sweep (its options: the values the user listed, service/sweeps.py).

Validity (Megatron-LM's rules, Narayanan et al. 2021, arXiv 2104.04473 §2; EP carved out of DP·CP as in
Megatron-Core): TP·PP·CP divides the world size and DP = world / (TP·PP·CP); TP divides the attention
heads; PP ≤ layers; CP divides seq_len; EP divides DP·CP; the global batch is hit exactly:
GAS = global_batch_tokens / (DP·MBS·seq_len) is a whole number ≥ 1; ZeRO > 0 needs DP·CP > 1
(nothing to shard over otherwise).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: the fields a layout is enumerated over (DP and GAS follow from them and the target)
OPTION_FIELDS = ("dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size", "recompute")
_POW2 = (1, 2, 4, 8, 16, 32, 64)


def recorded_options(ctx: dict[str, Any], rows: list[dict[str, Any]]) -> dict[str, list[Any] | None]:
    """The recommender's options: the values the target framework's recorded configurations show
    (all frameworks' when it has none), plus powers of two for TP, PP and the micro-batch; CP from 1,
    EP 1 (dense models), DP free (None: whatever the world size leaves)."""
    fw = [r for r in rows if r["framework"] == ctx["framework"]] or rows
    return {"dp": None,
            "tp": sorted({*_POW2, *(r["tp"] for r in fw if r["tp"])}),
            "pp": sorted({*_POW2, *(r["pp"] for r in fw if r["pp"])}),
            "cp": sorted({r["cp"] for r in fw if r["cp"]} | {1}),
            "ep": [1],
            "zero_stage": sorted({r["zero_stage"] or 0 for r in fw} or {0}),
            "micro_batch_size": sorted({*_POW2, *(r["micro_batch_size"] for r in fw)}),
            "recompute": sorted({r["recompute"] or "none" for r in fw} or {"none"})}


def enumerate_layouts(ctx: Mapping[str, Any], options: Mapping[str, list[Any] | None]) -> list[dict[str, Any]]:
    """Every valid configuration (module docstring) of `options` ({field of OPTION_FIELDS: values};
    `dp` None or absent: any DP) for the target `ctx` (nodes, gpus_per_node, seq_len,
    global_batch_tokens; num_heads and num_layers when known). Returns config dicts with dp, tp, pp,
    cp, ep, zero_stage, micro_batch_size, grad_accum_steps, recompute, in option order (TP outermost,
    recompute innermost)."""
    world, seq, gbt = ctx["nodes"] * ctx["gpus_per_node"], ctx["seq_len"], ctx["global_batch_tokens"]
    heads, layers = ctx.get("num_heads"), ctx.get("num_layers")
    dps = options.get("dp")
    out = []
    for tp in options.get("tp") or [1]:
        if world % tp or (heads and heads % tp):
            continue
        for pp in options.get("pp") or [1]:
            if world % (tp * pp) or (layers and pp > layers):
                continue
            for cp in options.get("cp") or [1]:
                if world % (tp * pp * cp) or seq % cp:
                    continue
                dp = world // (tp * pp * cp)
                if dps and dp not in dps:
                    continue
                for ep in options.get("ep") or [1]:
                    if (dp * cp) % ep:
                        continue
                    for mbs in options.get("micro_batch_size") or [1]:
                        per = dp * mbs * seq
                        if gbt % per or gbt // per < 1:
                            continue
                        for zero in options.get("zero_stage") or [0]:
                            if zero > 0 and dp * cp == 1:
                                continue
                            for rc in options.get("recompute") or ["none"]:
                                out.append({"dp": dp, "tp": tp, "pp": pp, "cp": cp, "ep": ep, "zero_stage": zero,
                                            "micro_batch_size": mbs, "grad_accum_steps": gbt // per,
                                            "recompute": rc})
    return out
