"""The rules every layer applies to a run the same way, standard library only: its config label, the
MFU it is shown and ranked by, and which run is "best". The API (heatmap, recommend, scaling,
drill-downs), the CLI and the dashboard import them; the SQL form of the ranking
(service/ranking.best_order) sits beside the queries and implements the same order.

- CONFIG_FIELDS: the fields of a parallel layout, as the API's `config` objects carry them.
- `config_label(run)`: the Ultra-Scale Playbook's cell text, "DP8 TP1 PP1 GAS16 Z1 MBS2".
- `effective_mfu(run)`: mfu_derived (computed one way for every run), else the reported mfu.
- `best_key(run, metric)`: the best-run ranking — the higher metric first (runs without it last),
  then the higher effective MFU (runs without it last), then the lower id.
- `best_slice(slices, most)`: the comparable slice (one GPU type, one sequence length) shown when
  none was asked — the most-recorded one for a heatmap, the one with the most node counts for a
  scaling curve.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["CONFIG_FIELDS", "METRICS", "best_key", "best_slice", "config_label", "effective_mfu", "metric_value",
           "slice_key"]

#: ranking metrics: tokens_per_sec_per_gpu (the default), or mfu (effective_mfu)
METRICS = ("tokens_per_sec_per_gpu", "mfu")

#: a parallel layout: the fields that make two runs "the same configuration" of one model and cluster
CONFIG_FIELDS = ("dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size", "grad_accum_steps", "recompute")

Run = Mapping[str, Any]


def _degree(value: Any) -> str:
    return "?" if value is None else str(value)


def parallel_label(run: Run) -> str:
    """'DP8 TP1 PP1' for a run or config mapping: the parallel degrees of config_label (CP when > 1
    or unknown, EP when > 1; an unknown degree as '?')."""
    get = run.get
    parts = [f"DP{_degree(get('dp'))}", f"TP{_degree(get('tp'))}", f"PP{_degree(get('pp'))}"]
    cp, ep = get("cp"), get("ep")
    if cp is None or cp > 1:
        parts.append(f"CP{_degree(cp)}")
    if ep is not None and ep > 1:
        parts.append(f"EP{ep}")
    return " ".join(parts)


def config_label(run: Run) -> str:
    """'DP8 TP1 PP1 GAS16 Z1 MBS2' for a run or config mapping (CONFIG_FIELDS).

    A value the run does not give (None or absent) shows as '?', e.g. 'TP?', never as 1. CP appears
    when > 1 or unknown ('CP?': an unknown CP may be context parallelism, so it is not hidden as if
    it were 1); EP when > 1 (an unknown EP is not shown: dense runs do not state it, so 'EP?' would be
    on nearly every label); 'RC:<mode>' when recompute is set and not 'none'."""
    get = run.get
    parts = [parallel_label(run), f"GAS{_degree(get('grad_accum_steps'))}", f"Z{_degree(get('zero_stage'))}",
              f"MBS{_degree(get('micro_batch_size'))}"]
    recompute = get("recompute")
    if recompute and recompute != "none":
        parts.append(f"RC:{recompute}")
    return " ".join(parts)


def effective_mfu(run: Run | None) -> float | None:
    """The MFU a run is shown and ranked by: mfu_derived (the PaLM formula, computed one way for
    every run), else the reported mfu; None for no run or neither."""
    if not run:
        return None
    derived = run.get("mfu_derived")
    return derived if derived is not None else run.get("mfu")


def metric_value(run: Run | None, metric: str) -> float | None:
    """A run's value of a ranking metric (METRICS): effective_mfu for "mfu", else run[metric]."""
    if not run:
        return None
    return effective_mfu(run) if metric == "mfu" else run.get(metric)


def best_key(run: Run | None, metric: str = "tokens_per_sec_per_gpu") -> tuple[int, float, int, float, int]:
    """Sort key of the ONE best-run ranking, smaller first: a run before no run; then the metric
    (higher first; a run without it last), then effective MFU (higher first; without it last), then
    the lower id. `metric` is one of METRICS. `min(runs, key=...)` is the best run."""
    if not run:
        return (1, 0.0, 1, 0.0, 0)
    value = metric_value(run, metric)
    mfu = effective_mfu(run)
    return (0, -(value if value is not None else -math.inf), 0 if mfu is not None else 1,
            -(mfu if mfu is not None else 0.0), int(run.get("id") or 0))


def slice_key(slice_: Mapping[str, Any], most: str = "runs") -> tuple[Any, ...]:
    """Sort key of a (GPU type, sequence length) slice, the one to show first lowest.

    A slice is a mapping with "gpu_type", "seq_len", "runs" (runs recorded in it) and "node_counts"
    (how many distinct node counts have a successful run in it). most="runs": the most runs first
    (the sweep being worked on — the heatmap's default); most="nodes": the most node counts first,
    then the most runs (a scaling curve needs node counts: a slice with one node count has no curve).
    Ties: GPU type, then sequence length, in text / numeric order (the same answer every time).
    Raises ValueError for another `most`."""
    if most not in ("runs", "nodes"):
        raise ValueError(f"most must be 'runs' or 'nodes', got {most!r}")
    runs, nodes = int(slice_.get("runs") or 0), int(slice_.get("node_counts") or 0)
    first = (-runs, -nodes) if most == "runs" else (-nodes, -runs)
    seq = slice_.get("seq_len")
    return (*first, str(slice_.get("gpu_type")), seq is None, int(seq or 0))


def best_slice(slices: Iterable[Mapping[str, Any]], most: str = "runs") -> Mapping[str, Any] | None:
    """The slice `slice_key` puts first; None when there is none."""
    return min(slices, key=lambda s: slice_key(s, most), default=None)
