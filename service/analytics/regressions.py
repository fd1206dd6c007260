"""Performance regressions: successful runs far below the history of their fingerprint (DESIGN §4).

A run's fingerprint (runs.fingerprint, service/derive.py FINGERPRINT_FIELDS) hashes its config,
hardware and software versions (framework, torch, CUDA, NCCL), so runs with one fingerprint are
repeats of one experiment. Each successful run with at least `min_history` earlier successful runs
of its fingerprint (ordered by coalesce(started_at, ingested_at), then id; at most the `window` most
recent of them) is compared with that history by the robust z-score (Iglewicz & Hoaglin 1993,
"How to Detect and Handle Outliers", ASQC Basic References in Quality Control vol. 16):

    z = (x − median) / (1.4826 · MAD),   MAD = median(|h − median|) over the history h

(1.4826·MAD estimates the standard deviation of normal data). A run is flagged when z < −threshold
(default 3.5, Iglewicz & Hoaglin's cut-off for modified z-scores). When MAD = 0 (the history repeats
one value, or more than half of it does) z is undefined: the run is then flagged when it is more
than `min_drop` (default 10 %) below the median (`method: "relative_drop"`, z null).

Only higher-is-better metrics are checked: tokens_per_sec_per_gpu (tokens/s per GPU), mfu
(coalesce(mfu_derived, mfu), fraction), tflops_per_gpu (TFLOP/s per GPU). SQL work: one GROUP BY
finds the fingerprints with ≥ min_history + 1 successful runs having the metric (and, with `since`,
a run at or after it); only their runs are fetched.
"""

from __future__ import annotations

import statistics
from datetime import datetime
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from service.errors import BadRequest
from service.tables import Run

METRICS = ("tokens_per_sec_per_gpu", "mfu", "tflops_per_gpu")
MAD_TO_SIGMA = 1.4826
CONFIG_FIELDS = ("model_name", "model_size_class", "gpu_type", "gpus_per_node", "nodes", "world_size", "seq_len",
                 "dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size", "grad_accum_steps", "recompute",
                 "precision", "framework", "framework_version", "torch_version", "cuda_version", "nccl_version")


def _metric(metric: str) -> sa.ColumnElement:
    if metric == "mfu":
        return sa.func.coalesce(Run.mfu_derived, Run.mfu)
    if metric in METRICS:
        return getattr(Run, metric)
    raise BadRequest(f"unknown metric '{metric}'; one of {', '.join(METRICS)} (higher is better)",
                     [{"field": "metric", "value": metric, "message": "unknown metric"}])


def robust_z(x: float, history: list[float]) -> tuple[float, float, float | None]:
    """(median, MAD, z) of x against history; z is None when MAD = 0 (Iglewicz & Hoaglin 1993)."""
    med = statistics.median(history)
    mad = statistics.median(abs(h - med) for h in history)
    z = (x - med) / (MAD_TO_SIGMA * mad) if mad > 0 else None
    return med, mad, z


def find_regressions(session: Session, *, metric: str = "tokens_per_sec_per_gpu", threshold: float = 3.5,
                     min_history: int = 3, since: datetime | None = None, min_drop: float = 0.10,
                     window: int = 200, limit: int = 500) -> dict[str, Any]:
    """Successful runs far below their fingerprint's earlier runs.

    `threshold`: flag when robust z < −threshold; `min_history`: earlier runs needed (≥ 2); `since`:
    only runs that started at or after it are judged (their history may be older); `min_drop`: the
    relative drop (fraction) that flags a run when the history's MAD is 0; `window`: most recent
    earlier runs used as history. Returns {"metric", "threshold", "min_history", "min_drop", "since",
    "fingerprints_checked", "runs_checked", "flags": [{"run_id", "name", "started_at", "value",
    "baseline_median", "mad", "n_history", "z" (None for relative_drop), "drop_pct" (percent below the
    median), "method" ("robust_z" | "relative_drop"), "fingerprint", "history_run_ids" (last 10),
    "config"}]} with flags most severe first (largest drop). Raises BadRequest for bad parameters.
    """
    value = _metric(metric)
    if threshold <= 0 or min_history < 2 or not (0 < min_drop < 1) or window < min_history:
        raise BadRequest("need threshold > 0, min_history >= 2, 0 < min_drop < 1 and window >= min_history",
                         [{"field": "threshold", "value": threshold, "message": "out of range"}])
    when = sa.func.coalesce(Run.started_at, Run.ingested_at)
    base = [Run.status == "success", Run.retired_at.is_(None), Run.fingerprint.is_not(None), value.is_not(None)]
    fps = sa.select(Run.fingerprint).where(*base).group_by(Run.fingerprint).having(sa.func.count() >= min_history + 1)
    if since is not None:
        fps = fps.having(sa.func.max(when) >= since)
    rows = session.execute(
        sa.select(Run.id, Run.fingerprint, Run.name, Run.started_at, when.label("when"), value.label("value"),
                  *[getattr(Run, f) for f in CONFIG_FIELDS])
        .where(*base, Run.fingerprint.in_(fps))
        .order_by(Run.fingerprint, when, Run.id)).mappings().all()

    flags: list[dict[str, Any]] = []
    checked = 0
    history: list[dict[str, Any]] = []
    current = None
    for row in rows:
        if row["fingerprint"] != current:
            current, history = row["fingerprint"], []
        past = history[-window:]
        if len(past) >= min_history and (since is None or row["when"] >= since):
            checked += 1
            flag = _judge(row, past, threshold, min_drop)
            if flag:
                flags.append(flag)
        history.append(dict(row))
    flags.sort(key=lambda f: (-(f["drop_pct"] or 0.0), f["run_id"]))
    return {"metric": metric, "threshold": threshold, "min_history": min_history, "min_drop": min_drop,
            "since": since, "fingerprints_checked": len({r["fingerprint"] for r in rows}),
            "runs_checked": checked, "flags": flags[:limit]}


def _judge(row: Any, past: list[Any], threshold: float, min_drop: float) -> dict[str, Any] | None:
    x = float(row["value"])
    values = [float(p["value"]) for p in past]
    med, mad, z = robust_z(x, values)
    if z is not None:
        flagged, method = z < -threshold, "robust_z"
    else:
        flagged, method = med > 0 and x < med * (1.0 - min_drop), "relative_drop"
    if not flagged:
        return None
    return {
        "run_id": row["id"], "name": row["name"], "started_at": row["started_at"], "value": x,
        "baseline_median": med, "mad": mad, "n_history": len(values), "z": z,
        "drop_pct": 100.0 * (med - x) / med if med else None, "method": method,
        "fingerprint": row["fingerprint"], "history_run_ids": [p["id"] for p in past[-10:]],
        "config": {f: row[f] for f in CONFIG_FIELDS},
    }
