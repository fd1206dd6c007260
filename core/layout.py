"""The one rule for whether a parallel layout can run a model: written once, read by recommend's
layout enumeration (service/analytics/recommend.py, and the grid sweeps built on it) and by
/predict's check of a named configuration (service/analytics/predict.py). Standard library only.

A layout (tp, pp, cp) breaks a model when (Megatron-LM's and nanotron's argument checks; the
Ultra-Scale Playbook, "Tensor Parallelism", "Pipeline Parallelism", "Context Parallelism"):

- num_heads is not divisible by tp: attention heads are split across the TP ranks;
- num_kv_heads and tp do not divide one another: the key/value heads (GQA groups) are split across
  the TP ranks, or each is replicated on tp / num_kv_heads ranks;
- pp > num_layers: a pipeline stage holds at least one layer;
- seq_len is not divisible by cp: each context-parallel rank holds seq_len / cp tokens.

A dim that is not known (None) does not constrain. Whether the world size divides by tp·pp·cp is the
caller's (recommend fills DP from it; a named configuration is checked as a run record is,
service/derive.py).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Breach", "layout_breaches"]


@dataclass(frozen=True)
class Breach:
    """One broken rule: the model dim (`dim`, e.g. "num_heads") with its value, the layout field it
    constrains (`field`: "tp", "pp" or "cp") and why, as a phrase that follows "<dim> <value> "."""

    dim: str
    dim_value: int
    field: str
    why: str


def layout_breaches(*, tp: int, pp: int, cp: int, num_heads: int | None, num_kv_heads: int | None,
                    num_layers: int | None, seq_len: int | None) -> list[Breach]:
    """The rules (module docstring) that the layout tp × pp × cp breaks for a model with these dims,
    in the order heads, KV heads, layers, sequence; [] when it can run. Degrees are positive ints;
    a dim None is not checked."""
    out: list[Breach] = []
    if num_heads and num_heads % tp:
        out.append(Breach("num_heads", num_heads, "tp",
                          f"is not divisible by tp {tp}: heads are split across TP ranks"))
    if num_kv_heads and num_kv_heads % tp and tp % num_kv_heads:
        out.append(Breach("num_kv_heads", num_kv_heads, "tp",
                          f"and tp {tp}: one must divide the other (KV heads are split across TP ranks, "
                          "or replicated)"))
    if num_layers and pp > num_layers:
        out.append(Breach("num_layers", num_layers, "pp", f"< pp {pp}: a stage holds at least one layer"))
    if seq_len and seq_len % cp:
        out.append(Breach("seq_len", seq_len, "cp", f"is not divisible by cp {cp}"))
    return out
