"""One copy of the rules every layer shares about a run: its status list, its config label and which
run is "best". The CLI, the API (heatmap, recommend, drill-downs) and the dashboard use these.

- STATUSES: the run statuses (defined with the run record in ingest/record.py, stdlib only).
- `config_label(run)`: the Ultra-Scale Playbook's cell text, "DP8 TP1 PP1 GAS16 Z1 MBS2".
- The best-run ranking: the higher metric first (runs without it last), then the higher MFU
  (mfu_derived, falling back to the reported mfu; runs without it last), then the lower id.
  `rank_key` is the Python form, `best_order` the SQL ORDER BY; both implement that one rule.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import QueryableAttribute

from ingest.record import STATUSES

__all__ = ["METRICS", "STATUSES", "best_order", "config_label", "effective_mfu", "rank_key"]

#: ranking metrics: tokens_per_sec_per_gpu, or mfu (mfu_derived, falling back to the reported mfu)
METRICS = ("tokens_per_sec_per_gpu", "mfu")


def _degree(value: Any) -> str:
    return "?" if value is None else str(value)


def config_label(run: Mapping[str, Any]) -> str:
    """'DP8 TP1 PP1 GAS16 Z1 MBS2' for a run or config mapping (dp, tp, pp, cp, ep, zero_stage,
    micro_batch_size, grad_accum_steps, recompute). A degree the run does not give (None) shows as
    '?', e.g. 'TP?', never as 1. CP appears when > 1 or unknown ('CP?'); EP when > 1 (an unknown EP
    is not shown: dense runs do not state it, so 'EP?' would be on nearly every label); 'RC:<mode>'
    when recompute is set and not 'none'."""
    get = run.get
    parts = [f"DP{_degree(get('dp'))}", f"TP{_degree(get('tp'))}", f"PP{_degree(get('pp'))}"]
    cp, ep = get("cp"), get("ep")
    if cp is None or cp > 1:
        parts.append(f"CP{_degree(cp)}")
    if ep is not None and ep > 1:
        parts.append(f"EP{ep}")
    parts += [f"GAS{_degree(get('grad_accum_steps'))}", f"Z{_degree(get('zero_stage'))}",
              f"MBS{_degree(get('micro_batch_size'))}"]
    recompute = get("recompute")
    if recompute and recompute != "none":
        parts.append(f"RC:{recompute}")
    return " ".join(parts)


def effective_mfu(run: Mapping[str, Any]) -> float | None:
    """The MFU a run is ranked by: mfu_derived (computed one way for every run), else the reported mfu."""
    derived = run.get("mfu_derived")
    return derived if derived is not None else run.get("mfu")


def rank_key(run: Mapping[str, Any], metric: str = "tokens_per_sec_per_gpu") -> tuple:
    """Sort key of the best-run ranking, smaller is better: (metric missing, −metric, MFU missing,
    −MFU, id). `metric` is one of METRICS."""
    mfu = effective_mfu(run)
    value = mfu if metric == "mfu" else run.get(metric)
    return (value is None, -(value or 0.0), mfu is None, -(mfu or 0.0), run["id"])


#: a SQL expression or an ORM column attribute (Run.id)
SqlExpr = sa.ColumnElement[Any] | QueryableAttribute[Any]


def best_order(value: SqlExpr, mfu: SqlExpr, run_id: SqlExpr) -> list[sa.ColumnElement[Any]]:
    """The ranking as a SQL ORDER BY over the columns given: value DESC NULLS LAST, MFU DESC NULLS
    LAST, id ASC (the same order as `rank_key`)."""
    return [value.desc().nulls_last(), mfu.desc().nulls_last(), run_id.asc()]
