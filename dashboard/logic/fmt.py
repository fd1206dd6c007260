"""Labels and number formats shared by the pages (pure functions over the API's run dicts)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from core import families
from core.rules import config_label, effective_mfu  # noqa: F401 - the one label and MFU, for the pages

Run = Mapping[str, Any]

#: the parallel dimensions that open a config label, in the Playbook's order
PARALLEL_DIMS = ("dp", "tp", "pp", "cp", "ep")


def size_label(size_class: float | None) -> str:
    """Model size class (billions) as a row label (core.families.size_label: 1.3 -> "1.3B", 0.12 ->
    "120M"); "?" when unknown."""
    return "?" if size_class is None else families.size_label(size_class)


def nodes_label(nodes: int) -> str:
    """1 -> "1 node", 4 -> "4 nodes"."""
    return f"{nodes} node{'s' if nodes != 1 else ''}"


def pct(fraction: float | None, digits: int = 1) -> str:
    """0.3917 -> "39.2%"; None -> "?"."""
    if fraction is None or (isinstance(fraction, float) and math.isnan(fraction)):
        return "?"
    return f"{100 * fraction:.{digits}f}%"


def gib(value: float | None) -> str | None:
    """25.07 -> "25.1 GiB"; None -> None (the caller leaves the line out)."""
    return None if value is None else f"{value:.1f} GiB"


def compact(value: float | None) -> str:
    """Short throughput: 40149.9 -> "40.1k", 950.2 -> "950", 1.2e6 -> "1.2M"."""
    if value is None:
        return "?"
    if abs(value) >= 1e6:
        return f"{value / 1e6:.1f}M"
    if abs(value) >= 1e4:
        return f"{value / 1e3:.1f}k"
    if abs(value) >= 1e3:
        return f"{value / 1e3:.2f}k"
    return f"{value:.0f}"


def split_label(label: str) -> tuple[str, str]:
    """Split a config label into its parallel dims and the rest:
    "DP8 TP1 PP1 GAS16 Z1 MBS2" -> ("DP8 TP1 PP1", "GAS16 Z1 MBS2")."""
    dims, rest = [], []
    for token in label.split():
        is_dim = any(token.startswith(d.upper()) and token[len(d):].replace("?", "").isdigit()
                     for d in PARALLEL_DIMS)
        (dims if is_dim and not rest else rest).append(token)
    return " ".join(dims), " ".join(rest)


def run_title(run: Run) -> str:
    """One line that names a run: "#12 nanotron-1.34B · 1 node · DP8 TP1 PP1 GAS16 Z0 MBS2 · success"."""
    nodes = run.get("nodes")
    return " · ".join(p for p in (
        f"#{run.get('id')} {run.get('model_name') or run.get('name') or ''}".strip(),
        nodes_label(nodes) if nodes else None,
        config_label(run),
        run.get("status"),
    ) if p)


#: fields shown as a percentage (fractions in the API)
_PERCENT_FIELDS = frozenset({"mfu", "hfu", "mfu_derived", "hfu_derived"})
#: fields with a unit appended, and how many decimals
_UNITS = {"tokens_per_sec_per_gpu": ("tok/s", 0), "tflops_per_gpu": ("TFLOP/s", 1), "peak_tflops": ("TFLOP/s", 0),
          "step_time_s": ("s", 3), "allreduce_gb_s": ("GB/s", 1), "ar_intra_node_gb_s": ("GB/s", 1)}
#: integer fields printed as they are (identifiers and small degrees: no thousands separator)
_PLAIN_INTS = frozenset({"id", "dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size", "grad_accum_steps",
                         "nodes", "gpus_per_node", "num_layers", "num_heads", "num_kv_heads"})


def field_value(name: str, value: Any) -> str:
    """A run field's value for people, by the field's name: MFU/HFU as percentages ("50.5%"),
    memory in GiB ("25.1 GiB"), throughput and TFLOP/s with their units and separators, a parameter
    count with its size ("70,000,000,000 (70B)"), other numbers with thousands separators and
    never in exponent form; "—" for a missing value; text as it is; JSON as JSON."""
    import json

    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return json.dumps(value, sort_keys=True) if isinstance(value, (dict, list)) else str(value)
    if name in _PERCENT_FIELDS:
        return pct(float(value))
    if name.endswith("_gib"):
        return f"{value:,.1f} GiB"
    if name in _UNITS:
        unit, digits = _UNITS[name]
        return f"{value:,.{digits}f} {unit}"
    if name == "model_params":
        return f"{int(value):,} ({size_label(value / 1e9) if value >= 1e9 else f'{value / 1e6:g}M'})"
    if name == "model_size_class":
        return size_label(float(value))
    if isinstance(value, int):
        return str(value) if name in _PLAIN_INTS else f"{value:,}"
    if abs(value) >= 100:
        return f"{value:,.0f}"
    return f"{value:,.4g}"
