"""Filter choices computed from the data (distinct values of run fields).

The dashboard has no "distinct values" endpoint, so the choices come from ONE read-only query
through POST /api/v1/sql (:func:`options_sql`): every distinct value of each field of
:data:`OPTION_FIELDS` with its run count, the first and last start time, and the most-recorded
(gpu_type, seq_len) pair (the landing page's default slice). :func:`from_sql` turns the answer into
``{field: sorted values}``. Where the SQL endpoint is unavailable the older way still works:
:func:`options` over the newest runs plus the heatmap cells' best runs (:func:`collect_runs`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import date, datetime
from typing import Any

Run = Mapping[str, Any]

OPTION_FIELDS = ("gpu_type", "seq_len", "global_batch_tokens", "framework", "precision", "model_name", "nodes",
                 "source", "status", "error_class", "model_size_class", "gpus_per_node", "dp", "tp", "pp", "cp",
                 "ep", "zero_stage", "micro_batch_size", "grad_accum_steps", "recompute")


#: fields whose values are numbers (the SQL answer carries them as doubles)
NUMERIC_FIELDS = {"seq_len", "global_batch_tokens", "nodes", "model_size_class", "gpus_per_node", "dp", "tp", "pp",
                  "cp", "ep", "zero_stage", "micro_batch_size", "grad_accum_steps"}


def options_sql(fields: Iterable[str] = OPTION_FIELDS) -> str:
    """One SELECT over ``runs`` answering ``(field, txt, num, n)`` rows: each distinct non-null value of
    each field with its run count (text in ``txt``, numbers in ``num``), the rows ``("started_min", …)`` /
    ``("started_max", …)`` with the first and last ``started_at`` as text, and ``("slice", gpu_type,
    seq_len, n)``: the most-recorded (GPU type, sequence length) pair among the runs the heatmap counts
    (GET /heatmap/slices' first, same count). Field names come from our own list, never from the user."""
    parts = []
    for f in fields:
        if f in NUMERIC_FIELDS:
            parts.append(f"select '{f}' as field, cast(null as varchar) as txt, cast({f} as double precision) as num, "
                         f"count(*) as n from runs where {f} is not null group by {f}")
        else:
            parts.append(f"select '{f}' as field, cast({f} as varchar) as txt, cast(null as double precision) as num, "
                         f"count(*) as n from runs where {f} is not null group by {f}")
    parts.append("select 'started_min', cast(min(started_at) as varchar), cast(null as double precision), count(*) "
                 "from runs")
    parts.append("select 'started_max', cast(max(started_at) as varchar), cast(null as double precision), count(*) "
                 "from runs")
    # the slice's runs are those the heatmap counts (service/analytics/heatmap.HeatmapFilters: a size
    # class and a node count, not retired, not still running), so the page and `scalebook heatmap`
    # name the same slice with the same number of runs
    parts.append("select * from (select 'slice' as field, cast(gpu_type as varchar) as txt, "
                 "cast(seq_len as double precision) as num, count(*) as n from runs where gpu_type is not null and "
                 "seq_len is not null and model_size_class is not null and nodes is not null and retired_at is null "
                 "and status <> 'running' group by gpu_type, seq_len order by n desc, txt, num limit 1) as top_slice")
    return "\nunion all\n".join(parts)


def from_sql(body: Mapping[str, Any]) -> dict[str, Any]:
    """Options from the answer of :func:`options_sql` (``{"columns", "rows"}``): ``{field: sorted
    distinct values}`` (numbers as int when whole), ``dates`` ([first, last] day or []),
    ``counts`` (``{field: {value: runs}}``) and ``slice`` ((gpu_type, seq_len, runs) or None)."""
    values: dict[str, list[Any]] = {f: [] for f in OPTION_FIELDS}
    counts: dict[str, dict[Any, int]] = {}
    bounds: dict[str, date | None] = {}
    top: tuple[str, int, int] | None = None
    for field, txt, num, n in body.get("rows", []):
        if field in ("started_min", "started_max"):
            bounds[field] = parse_day(txt)
            continue
        if field == "slice":
            top = (txt, int(num), int(n)) if txt is not None and num is not None else None
            continue
        value: Any = txt
        if num is not None:
            value = int(num) if float(num).is_integer() and field != "model_size_class" else float(num)
        values.setdefault(field, []).append(value)
        counts.setdefault(field, {})[value] = int(n)
    out: dict[str, Any] = {f: distinct([{f: v} for v in vs], f) for f, vs in values.items()}
    lo, hi = bounds.get("started_min"), bounds.get("started_max")
    out["dates"] = [lo, hi] if lo and hi else []
    out["counts"] = counts
    out["slice"] = top
    return out


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
