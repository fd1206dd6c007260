"""Filter choices computed from the data (distinct values of run fields).

The dashboard has no "distinct values" endpoint to call, so the choices come from the runs it can
see cheaply: the newest page of GET /runs (up to 1,000 runs: the current sweep) together with
the best run of every heatmap cell (one per model size × nodes, so every size and node count is
covered whatever the number of runs).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import date, datetime
from typing import Any

Run = Mapping[str, Any]

OPTION_FIELDS = ("gpu_type", "seq_len", "global_batch_tokens", "framework", "precision", "model_name", "nodes",
                 "source", "status", "error_class", "model_size_class", "gpus_per_node", "dp", "tp", "pp", "cp",
                 "ep", "zero_stage", "micro_batch_size", "grad_accum_steps", "recompute")


def distinct(runs: Iterable[Run], field: str) -> list[Any]:
    """Sorted distinct non-null values of ``field`` (numbers numerically, text alphabetically)."""
    values = {r.get(field) for r in runs if r.get(field) is not None and r.get(field) != ""}
    return sorted(values, key=lambda v: (not isinstance(v, (int, float)), v if isinstance(v, (int, float)) else str(v)))


def collect_runs(page_runs: Iterable[Run], cells: Iterable[Mapping[str, Any]]) -> list[Run]:
    """The runs the options are computed from: a runs page plus the heatmap cells' best runs."""
    runs = list(page_runs)
    seen = {r.get("id") for r in runs}
    for cell in cells:
        best = cell.get("best")
        if best and best.get("id") not in seen:
            runs.append(best)
            seen.add(best.get("id"))
    return runs


def options(runs: Iterable[Run]) -> dict[str, list[Any]]:
    """``{field: distinct values}`` for every field in :data:`OPTION_FIELDS`, plus ``dates``:
    the first and last ``started_at`` day seen (empty when no run has a start time)."""
    runs = list(runs)
    out = {f: distinct(runs, f) for f in OPTION_FIELDS}
    days = sorted(d for r in runs if (d := parse_day(r.get("started_at"))) is not None)
    out["dates"] = [days[0], days[-1]] if days else []
    return out


def parse_day(value: Any) -> date | None:
    """The calendar day of an ISO timestamp (or date); None when absent or unreadable."""
    if value is None:
        return None
    if isinstance(value, datetime):
        return value.date()
    if isinstance(value, date):
        return value
    try:
        return datetime.fromisoformat(str(value).replace("Z", "+00:00")).date()
    except ValueError:
        return None


def date_bounds(after: date | None, before: date | None) -> dict[str, str | None]:
    """Query parameters for a date range, both ends inclusive: started_after = after 00:00,
    started_before = the day after ``before`` 00:00 (the API's upper bound is exclusive)."""
    from datetime import timedelta

    return {"started_after": f"{after.isoformat()}T00:00:00" if after else None,
            "started_before": f"{(before + timedelta(days=1)).isoformat()}T00:00:00" if before else None}
