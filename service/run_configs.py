"""The per-configuration summary of successful runs (`run_configs`), kept in step with `runs`.

"What worked on 8 nodes for 8B?" ranks recorded configurations, not runs (DESIGN §4). At 10^6
runs, grouping the ~5·10^5 successful runs of the target's size/node window on every request
took 150–350 ms; this table holds the groups themselves (a few thousand rows), updated in the
same transaction that stores the runs — the materialised-aggregate technique of data warehouses
(an insert-only fact table with additive aggregates plus an arg-max, which merge exactly).

A group is the recommender's key: GROUP_FIELDS below. Successful runs only, with a model size
class and a node count. Per ranking metric ("tps" = tokens_per_sec_per_gpu, "mfu" = mfu_derived
falling back to the reported mfu) the row keeps the number of runs reporting it, its min and
max, and the best run: the highest metric, then the lowest id; runs without the metric rank last
(ties among those go to the lowest id). Counts add, min/max combine, the best is the better of
the two: every merge is exact, whatever order batches commit in.

When the merge happens depends on the backend. PostgreSQL merges every ingest request in its
own transaction (concurrent writers: an id watermark could miss a run that commits late). DuckDB
serialises writes in one process, so an id watermark is exact: ingest only appends runs, every
FOLD_EVERY new runs one aggregate query folds them in (`fold`), and readers add the runs past the
watermark on the fly (`rows`) — a per-request upsert cost DuckDB ~10 ms, 15 % of a batch.
`run_configs_state.folded_through_id` is the watermark.

- `partials(rows)`: the summary rows of a list of new `runs` rows (Python, no database).
- `record(session, rows)`: after an ingest: merge (PostgreSQL) or fold when due (DuckDB).
- `rows(session, ...)`: the summary as it stands, including runs not yet folded in.
- `fold(session)`: DuckDB: merge the runs past the watermark into the table, advance it.
- `rebuild(connection)`: recompute the whole table from `runs` (migration 0004, and
  `scalebook db rebuild-configs` after rows were changed outside scalebook).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.orm import Session

GROUP_FIELDS = ("model_size_class", "nodes", "gpus_per_node", "gpu_type", "seq_len", "dp", "tp", "pp", "cp", "ep",
                "zero_stage", "micro_batch_size", "grad_accum_steps", "recompute")
METRICS = {"tps": "tokens_per_sec_per_gpu", "mfu": "mfu"}
BEST_FIELDS = ("id", "value", "mfu", "tps", "peak_memory_gib", "global_batch_tokens")
COLUMNS = ("config_key", *GROUP_FIELDS, "n_runs",
           *(f"{p}_{f}" for p in METRICS for f in ("n", "min", "max", *(f"best_{b}" for b in BEST_FIELDS))))
_INT_COLUMNS = {"nodes", "gpus_per_node", "seq_len", "dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size",
                "grad_accum_steps", "n_runs", *(f"{p}_{f}" for p in METRICS for f in ("n", "best_id",
                                                                                      "best_global_batch_tokens"))}
_STR_COLUMNS = {"config_key", "gpu_type", "recompute"}
ARROW_SCHEMA = pa.schema([(c, pa.string() if c in _STR_COLUMNS else pa.int64() if c in _INT_COLUMNS else pa.float64())
                          for c in COLUMNS])


def config_key(row: dict[str, Any]) -> str:
    """The group's key as text: its GROUP_FIELDS values as a JSON list (None → null)."""
    return json.dumps([row.get(f) for f in GROUP_FIELDS], separators=(",", ":"))


def _rank(value: float | None, run_id: int) -> tuple:
    """Sort key of a best-run candidate: smaller is better (metric present, higher, lower id)."""
    return (value is None, -(value or 0.0), run_id)


def partials(rows: Iterable[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """{config_key: summary row} of the successful runs among `rows` (`runs` row dicts with ids).

    Rows that failed, or lack model_size_class or nodes, are not part of any group.
    """
    out: dict[str, dict[str, Any]] = {}
    for r in rows:
        if r.get("status") != "success" or r.get("model_size_class") is None or r.get("nodes") is None:
            continue
        mfu = r.get("mfu_derived") if r.get("mfu_derived") is not None else r.get("mfu")
        tps = r.get("tokens_per_sec_per_gpu")
        one = {"config_key": config_key(r), **{f: r.get(f) for f in GROUP_FIELDS}, "n_runs": 1}
        for p, value in (("tps", tps), ("mfu", mfu)):
            one.update({f"{p}_n": int(value is not None), f"{p}_min": value, f"{p}_max": value,
                        f"{p}_best_id": r["id"], f"{p}_best_value": value, f"{p}_best_mfu": mfu,
                        f"{p}_best_tps": tps, f"{p}_best_peak_memory_gib": r.get("peak_memory_gib"),
                        f"{p}_best_global_batch_tokens": r.get("global_batch_tokens")})
        seen = out.get(one["config_key"])
        out[one["config_key"]] = one if seen is None else merge(seen, one)
    return out


def merge(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Two summary rows of the same group combined (the Python twin of the SQL in `record`)."""
    out = dict(a)
    out["n_runs"] = a["n_runs"] + b["n_runs"]
    for p in METRICS:
        out[f"{p}_n"] = a[f"{p}_n"] + b[f"{p}_n"]
        lows = [v for v in (a[f"{p}_min"], b[f"{p}_min"]) if v is not None]
        highs = [v for v in (a[f"{p}_max"], b[f"{p}_max"]) if v is not None]
        out[f"{p}_min"] = min(lows) if lows else None
        out[f"{p}_max"] = max(highs) if highs else None
        if _rank(b[f"{p}_best_value"], b[f"{p}_best_id"]) < _rank(a[f"{p}_best_value"], a[f"{p}_best_id"]):
            out.update({f"{p}_best_{f}": b[f"{p}_best_{f}"] for f in BEST_FIELDS})
    return out


def _better(p: str) -> str:
    """SQL: the incoming (EXCLUDED) best run of metric prefix `p` beats the stored one."""
    new, old = f"EXCLUDED.{p}_best_value", f"run_configs.{p}_best_value"
    new_id, old_id = f"EXCLUDED.{p}_best_id", f"run_configs.{p}_best_id"
    return (f"(({new} IS NOT NULL AND ({old} IS NULL OR {new} > {old} OR ({new} = {old} AND {new_id} < {old_id})))"
            f" OR ({new} IS NULL AND {old} IS NULL AND {new_id} < {old_id}))")


def _on_conflict() -> str:
    sets = ["n_runs = run_configs.n_runs + EXCLUDED.n_runs"]
    for p in METRICS:
        sets += [f"{p}_n = run_configs.{p}_n + EXCLUDED.{p}_n",
                 # LEAST/GREATEST skip NULLs on both PostgreSQL and DuckDB
                 f"{p}_min = LEAST(run_configs.{p}_min, EXCLUDED.{p}_min)",
                 f"{p}_max = GREATEST(run_configs.{p}_max, EXCLUDED.{p}_max)"]
        sets += [f"{p}_best_{f} = CASE WHEN {_better(p)} THEN EXCLUDED.{p}_best_{f} ELSE run_configs.{p}_best_{f} END"
                 for f in BEST_FIELDS]
    return f"ON CONFLICT (config_key) DO UPDATE SET {', '.join(sets)}"


_UPSERT_TAIL = _on_conflict()
_COLS = ", ".join(COLUMNS)


def record(session: Session, rows: list[dict[str, Any]]) -> int:
    """After `rows` (just inserted, ids set) were stored, inside the caller's transaction: on
    PostgreSQL merge their successful runs into run_configs; on DuckDB fold the runs past the
    watermark in once FOLD_EVERY of them have gathered. Returns the number of groups written.

    One `INSERT … ON CONFLICT (config_key) DO UPDATE` with the merge in SQL: PostgreSQL takes the
    rows as one array per column (unnest), sorted by key so concurrent writers lock groups in the
    same order (no deadlock); DuckDB (writes serialised by Database) takes them from an Arrow table.
    """
    conn = session.connection()
    if conn.dialect.name in LAZY_DIALECTS:
        newest = max((r["id"] for r in rows), default=0)
        return fold(session) if newest - _watermark(conn) >= FOLD_EVERY else 0
    groups = partials(rows)
    _write(conn, [groups[k] for k in sorted(groups)], _UPSERT_TAIL)
    return len(groups)


#: backends whose ingest folds runs into run_configs in bulk (one writer process, serialised
#: writes: ids are committed in order, so "id > watermark" is exactly the runs not yet folded)
LAZY_DIALECTS = ("duckdb",)
#: DuckDB folds once this many runs have been stored past the watermark; readers aggregate at
#: most about this many runs on the fly. The trade-off, measured at 10^6 runs: a fold costs
#: ~75 ms at 5,000 runs and ~100 ms at 10,000 (mostly the upsert of ~1,600–1,800 groups), i.e.
#: ~15 / ~10 ms per 1,000-run batch; the on-the-fly aggregate for /recommend grows with the runs
#: past the watermark (~10 ms and ~1,200 groups at 7,000 runs).
FOLD_EVERY = 10_000


def _watermark(conn: sa.Connection) -> int:
    """run_configs_state.folded_through_id; 0 when the row is missing (an emptied table)."""
    value = conn.execute(sa.text("SELECT folded_through_id FROM run_configs_state WHERE id = 1")).scalar()
    return int(value or 0)


def _set_watermark(conn: sa.Connection, run_id: int) -> None:
    conn.execute(sa.text("DELETE FROM run_configs_state"))
    conn.execute(sa.text("INSERT INTO run_configs_state (id, folded_through_id) VALUES (1, :id)"), {"id": run_id})


def fold(session: Session) -> int:
    """DuckDB: merge the successful runs past the watermark into run_configs and move the
    watermark to the newest run. Call inside a write session (writes are serialised, so no run
    with a lower id can commit later). Returns the number of groups written; 0 on PostgreSQL,
    whose table is merged at every ingest."""
    conn = session.connection()
    if conn.dialect.name not in LAZY_DIALECTS:
        return 0
    start = _watermark(conn)
    newest = conn.execute(sa.text("SELECT max(id) FROM runs WHERE id > :start"), {"start": start}).scalar()
    if newest is None:
        return 0
    groups = list(_pending(conn, start, None).values())
    for g in groups:
        g["config_key"] = config_key(g)
    _write(conn, sorted(groups, key=lambda g: g["config_key"]), _UPSERT_TAIL)
    _set_watermark(conn, int(newest))
    return len(groups)


def rows(session: Session, size_range: tuple[float, float] | None = None,
         nodes_range: tuple[int, int] | None = None) -> list[dict[str, Any]]:
    """The summary rows (dicts with COLUMNS) of the groups whose model_size_class and nodes lie in
    the given inclusive ranges (all groups without them): the stored rows, plus on DuckDB the
    runs past the watermark, aggregated on the fly and merged. Read-only."""
    conn = session.connection()
    sql = f"SELECT {_COLS} FROM run_configs WHERE TRUE{_literal_window(size_range, nodes_range)}"
    if conn.dialect.name in LAZY_DIALECTS:  # the driver's fetchall: SQLAlchemy fetches DuckDB rows one by one
        values_list = conn.connection.driver_connection.execute(sql).fetchall()
    else:
        values_list = conn.execute(sa.text(sql)).all()
    n_group = len(GROUP_FIELDS)
    # keyed by the GROUP_FIELDS values (config_key is their JSON text: the same groups)
    found = {values[1:1 + n_group]: dict(zip(COLUMNS, values)) for values in values_list}
    if conn.dialect.name in LAZY_DIALECTS:
        for key, part in _pending(conn, _watermark(conn), (size_range, nodes_range)).items():
            if key in found:
                found[key] = merge(found[key], part)
            else:
                part["config_key"] = config_key(part)
                found[key] = part
    return list(found.values())


def _best_sql(p: str, value: str) -> str:
    """The best run's fields for metric prefix `p`, as one struct (a struct is never NULL, so
    arg_min keeps rows whose fields are): highest value, then lowest id; no value ranks last."""
    fields = {"id": "id", "value": value, "mfu": "mfu_v", "tps": "tokens_per_sec_per_gpu",
              "peak_memory_gib": "peak_memory_gib", "global_batch_tokens": "global_batch_tokens"}
    struct = ", ".join(f'"{f}" := {fields[f]}' for f in BEST_FIELDS)
    return (f"arg_min(struct_pack({struct}), ({value} IS NULL, -coalesce({value}, 0.0), id)) AS {p}_best, "
            f"count({value}) AS {p}_n, min({value}) AS {p}_min, max({value}) AS {p}_max")


#: The aggregate of the runs past the watermark, one flat row per group in COLUMNS order after
#: config_key (the best-run structs are taken apart in SQL: DuckDB converts a struct to a Python
#: dict ~10x slower than plain columns).
_PENDING = (f"SELECT {', '.join(GROUP_FIELDS)}, n_runs, "
            + ", ".join(f"{p}_n, {p}_min, {p}_max, " + ", ".join(f"{p}_best.{f}" for f in BEST_FIELDS) for p in METRICS)
            + f" FROM (SELECT {', '.join(GROUP_FIELDS)}, count(*) AS n_runs, "
            f"{_best_sql('tps', 'tokens_per_sec_per_gpu')}, {_best_sql('mfu', 'mfu_v')} "
            "FROM (SELECT *, coalesce(mfu_derived, mfu) AS mfu_v FROM runs "
            "WHERE id > {start} AND status = 'success' AND model_size_class IS NOT NULL AND nodes IS NOT NULL{where}) "
            f"AS fresh GROUP BY {', '.join(GROUP_FIELDS)}) AS grouped")


def _literal_window(size_range, nodes_range) -> str:
    """The window as SQL with number literals (floats and ints built here, never text)."""
    where = ""
    if size_range:
        where += f" AND model_size_class BETWEEN {float(size_range[0])!r} AND {float(size_range[1])!r}"
    if nodes_range:
        where += f" AND nodes BETWEEN {int(nodes_range[0])} AND {int(nodes_range[1])}"
    return where


def _pending(conn: sa.Connection, start: int, window) -> dict[tuple, dict[str, Any]]:
    """{GROUP_FIELDS values: summary row without config_key} of the successful runs with id > `start` (DuckDB), in the
    given (size_range, nodes_range) window or all of them: one aggregate query, the same
    figures as `partials` over those runs. The bounds are inlined as number literals: DuckDB
    prunes row groups by their min/max (zone maps) on literal filters but not on bound
    parameters — at 10^6 runs 3 of 10 row groups read instead of all, ~14 ms instead of ~44 ms."""
    sql = _PENDING.format(start=int(start), where=_literal_window(*window) if window else "")
    n_group = len(GROUP_FIELDS)
    return {values[:n_group]: dict(zip(COLUMNS[1:], values))
            for values in conn.connection.driver_connection.execute(sql).fetchall()}


def _write(conn: sa.Connection, ordered: list[dict[str, Any]], tail: str) -> None:
    """INSERT summary rows (+ `tail`, the ON CONFLICT clause or nothing), set-based."""
    if not ordered:
        return
    raw = conn.connection.driver_connection
    if conn.dialect.name == "duckdb":
        view = "_run_configs_in"
        raw.register(view, pa.Table.from_pylist(ordered, schema=ARROW_SCHEMA))
        try:
            raw.execute(f"INSERT INTO run_configs ({_COLS}) SELECT {_COLS} FROM {view} {tail}")
        finally:
            raw.unregister(view)
        return
    with raw.cursor() as cur:
        cur.execute(_PG_UNNEST + tail, [_pg_array(c, [g[c] for g in ordered]) for c in COLUMNS])


def _pg_type(column: str) -> str:
    return "text" if column in _STR_COLUMNS else "int8" if column in _INT_COLUMNS else "float8"


#: PostgreSQL: the rows arrive as one array per column, unnested in order. The statement text is
#: the same whatever the number of rows, so psycopg parses it once and the server can prepare it;
#: a multi-row VALUES list with one parameter per value cost ~40 % of a 1,000-run batch request in
#: psycopg's query parsing alone.
_PG_UNNEST = (f"INSERT INTO run_configs ({_COLS}) SELECT * FROM unnest("
              + ", ".join(f"%s::{_pg_type(c)}[]" for c in COLUMNS) + f") AS t({_COLS}) ")


def _pg_array(column: str, values: list[Any]) -> list[Any]:
    """One column's values as a list psycopg sends as a single array of one element type
    (integral floats such as a reported 1200 would otherwise make a mixed int/float list)."""
    if column in _STR_COLUMNS:
        return values
    cast = int if column in _INT_COLUMNS else float
    return [None if v is None else cast(v) for v in values]


def rebuild(connection: sa.Connection, chunk: int = 50_000) -> int:
    """Recompute run_configs from every successful run (deletes what is there first). Streams
    the runs in id order, `chunk` at a time, through `partials`/`merge`. Returns the number of
    groups written. Runs inside the connection's transaction; the caller commits."""
    cols = ["id", "status", "tokens_per_sec_per_gpu", "mfu", "mfu_derived", "peak_memory_gib",
            "global_batch_tokens", *GROUP_FIELDS]
    query = sa.text(f"SELECT {', '.join(dict.fromkeys(cols))} FROM runs WHERE status = 'success' "
                    "AND model_size_class IS NOT NULL AND nodes IS NOT NULL AND id <= :newest ORDER BY id")
    groups: dict[str, dict[str, Any]] = {}
    newest = int(connection.execute(sa.text("SELECT coalesce(max(id), 0) FROM runs")).scalar())
    result = connection.execute(query.execution_options(stream_results=True, max_row_buffer=chunk),
                                {"newest": newest})
    for batch in result.mappings().partitions(chunk):
        for key, part in partials(batch).items():
            groups[key] = part if key not in groups else merge(groups[key], part)
    connection.execute(sa.text("DELETE FROM run_configs"))
    _write(connection, [groups[k] for k in sorted(groups)], "")
    if sa.inspect(connection).has_table("run_configs_state"):  # migration 0005 and later
        _set_watermark(connection, newest)
    return len(groups)
