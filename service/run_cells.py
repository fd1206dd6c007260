"""run_cells: the finished runs grouped by everything the recommender's cell queries read, kept by the
database in the same transaction as the runs it derives from (DESIGN §5; migration 0020).

/recommend and /suggest ask five questions of the target's heatmap cell (service/analytics/on_target.py:
the runs measured there, one per configuration, best first, and the cell's status counts; recommend's
recorded OOMs and configurations recorded on the target; suggest's best recorded run). Over `runs` each
is a scan of 10^6 rows on DuckDB (a column store without a usable index for them: 15–90 ms each at load
3–4, every column read costing a pass over the table) and 10–250 ms on PostgreSQL. This table answers
them from a few thousand rows.

One row per group: CELL_COLS (hardware, model size class and MoE flag, nodes, GPUs per node, seq_len,
status, error class, the model's size and dims, framework, precision and the parallel layout) of the runs
MEMBERSHIP_SQL admits — finished (not `running`) and not retired. Per row: n_runs, the lowest id
(min_id), the group's best run by service/ranking.best_order's rule for tokens/s/GPU (tokens/s/GPU, then
MFU — mfu_derived, else the reported — both descending NULLs last, then the lower id: best_id with the
columns an answer shows of it: best_tps, best_mfu, best_model_name, best_source, best_peak_memory_gib,
best_global_batch_tokens) and top_id, the run /suggest calls the best recorded (highest tokens/s/GPU > 0,
then the lower id). `cell_key` = md5 of the CELL_COLS values as text (as run_configs.KEY_SQL: NULL
spelled `\\N`, the size class in millionths), computed in SQL only.

Kept by the write paths that keep run_configs, in their transaction: `add(session, ids)` after an
insert (one `INSERT … SELECT … GROUP BY … ON CONFLICT DO UPDATE` merging the new runs' groups: counts
add, min_id the smaller, the best and top runs the better by the rule above; in key order, so
concurrent PostgreSQL writers lock shared rows in one order), `refreshing(session, conditions)` around
a retire, un-retire, delete or the finish of a running run (the groups of the runs chosen, recomputed
from `runs`; rebuild() past MAX_REFRESH_GROUPS), rebuild() for `scalebook db rebuild-configs` (runs
changed with outside SQL). `recompute(session)` is what rebuild() writes, for tests.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.orm import Session

from core.rules import best_key
from service import bulk, run_configs
from service.tables import Run, RunCell

#: the group a summary row stands for, in key order
CELL_COLS = ("gpu_type", "model_size_class", "is_moe", "nodes", "gpus_per_node", "seq_len", "status", "error_class",
             "model_params", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size",
             "vocab_size", "gated_linear_unit", "framework", "precision", "dp", "tp", "pp", "cp", "ep", "zero_stage",
             "micro_batch_size", "grad_accum_steps", "recompute")
#: the runs a summary row covers (SQL over `runs`): finished (service.lifecycle.FINISHED) and not retired
MEMBERSHIP_SQL = "retired_at IS NULL AND status <> 'running'"
#: a refresh touching more groups than this rebuilds the whole table
MAX_REFRESH_GROUPS = 200
#: the aggregate columns, in table order
VALUE_COLS = ("n_runs", "min_id", "best_id", "best_tps", "best_mfu", "best_model_name", "best_source",
              "best_peak_memory_gib", "best_global_batch_tokens", "top_id")

#: how each CELL_COLS column is read from `runs` (is_moe: NULL read as false, as the heatmap's cells do)
_EXPR = {c: ("coalesce(is_moe, false)" if c == "is_moe" else c) for c in CELL_COLS}


def _key_term(c: str) -> str:
    value = f"CAST(round({_EXPR[c]} * 1000000) AS BIGINT)" if c == "model_size_class" else _EXPR[c]
    return f"coalesce(CAST({value} AS VARCHAR), '\\N')"


#: cell_key of a row of `runs`
KEY_SQL = "md5(concat_ws('|', " + ", ".join(_key_term(c) for c in CELL_COLS) + "))"
_MFU = "coalesce(mfu_derived, mfu)"
#: service/ranking.best_order for tokens/s/GPU, as an aggregate's ORDER BY
_BEST = f"ORDER BY tokens_per_sec_per_gpu DESC NULLS LAST, {_MFU} DESC NULLS LAST, id"
_AGGREGATES = ", ".join([
    "count(*)", "min(id)",
    *(f"(array_agg({x} {_BEST}))[1]" for x in ("id", "tokens_per_sec_per_gpu", _MFU, "model_name", "source",
                                                "peak_memory_gib", "global_batch_tokens")),
    "(array_agg(id ORDER BY tokens_per_sec_per_gpu DESC, id) FILTER (WHERE tokens_per_sec_per_gpu > 0))[1]"])
_TARGET = "cell_key, " + ", ".join(CELL_COLS) + ", " + ", ".join(VALUE_COLS)


def _select(where: str) -> str:
    cols = ", ".join(f"{_EXPR[c]} AS {c}" if _EXPR[c] != c else c for c in CELL_COLS)
    group = ", ".join(_EXPR[c] for c in CELL_COLS)
    return f"SELECT {KEY_SQL} AS k, {cols}, {_AGGREGATES} FROM runs WHERE {MEMBERSHIP_SQL} AND {where} GROUP BY {group}"


def _better(a: str, b: str) -> str:
    """SQL: run `a`'s best is ahead of `b`'s by the best-run rule (tokens/s, MFU descending NULLs last, id)."""
    return (f"CASE WHEN {a}.best_tps IS NOT DISTINCT FROM {b}.best_tps THEN "
            f"CASE WHEN {a}.best_mfu IS NOT DISTINCT FROM {b}.best_mfu THEN {a}.best_id < {b}.best_id "
            f"WHEN {a}.best_mfu IS NULL THEN false WHEN {b}.best_mfu IS NULL THEN true "
            f"ELSE {a}.best_mfu > {b}.best_mfu END "
            f"WHEN {a}.best_tps IS NULL THEN false WHEN {b}.best_tps IS NULL THEN true "
            f"ELSE {a}.best_tps > {b}.best_tps END")


_BEST_COLS = ("best_id", "best_tps", "best_mfu", "best_model_name", "best_source", "best_peak_memory_gib",
              "best_global_batch_tokens")
#: the merge of new runs' groups into stored ones (add). top_id's tokens/s is its group's best_tps (the
#: highest), so the two top runs compare by best_tps, then id
_MERGE_SET = ", ".join(
    ["n_runs = run_cells.n_runs + excluded.n_runs", "min_id = least(run_cells.min_id, excluded.min_id)",
     *(f"{c} = CASE WHEN {_better('excluded', 'run_cells')} THEN excluded.{c} ELSE run_cells.{c} END"
       for c in _BEST_COLS),
     "top_id = CASE WHEN excluded.top_id IS NULL THEN run_cells.top_id WHEN run_cells.top_id IS NULL THEN "
     "excluded.top_id WHEN excluded.best_tps > run_cells.best_tps THEN excluded.top_id "
     "WHEN excluded.best_tps < run_cells.best_tps THEN run_cells.top_id "
     "ELSE least(excluded.top_id, run_cells.top_id) END"])
#: the overwrite of recomputed groups (refresh)
_REPLACE_SET = ", ".join(f"{c} = excluded.{c}" for c in VALUE_COLS)


def _upsert(select: str, merge: bool) -> str:
    return (f"INSERT INTO run_cells ({_TARGET}) {select} ORDER BY 1 "
            f"ON CONFLICT (cell_key) DO UPDATE SET {_MERGE_SET if merge else _REPLACE_SET}")


def add(session: Session, rows: list[dict[str, Any]]) -> None:
    """Merge `rows` (runs just inserted in this transaction, with their ids) into their groups; a run
    MEMBERSHIP_SQL does not admit (running) changes nothing. PostgreSQL: one upsert from `runs` (by id,
    merged by _MERGE_SET, in key order). DuckDB (writes serialised by Database.write_lock; reading the
    new runs back is a pass over the row group they landed in, 10–40 ms, and its ON CONFLICT 5–12 ms):
    the groups' deltas computed here, merged with their stored rows by the same rule (_merge), written
    back (an UPDATE per stored group for a few groups, a DELETE and an Arrow insert for a batch)."""
    if not rows:
        return
    if session.get_bind().dialect.name == "postgresql":
        ids = ", ".join(str(int(r["id"])) for r in rows)
        session.execute(sa.text(_upsert(_select(f"id IN ({ids})"), merge=True)))
        return
    deltas: dict[str, list[Any]] = {}
    for r in rows:
        if r.get("retired_at") is not None or r.get("status") == "running":
            continue
        values = tuple(bool(r.get("is_moe")) if c == "is_moe" else r.get(c) for c in CELL_COLS)
        key = run_configs.key_of(values, CELL_COLS)
        mfu = r.get("mfu_derived") if r.get("mfu_derived") is not None else r.get("mfu")
        tps = r.get("tokens_per_sec_per_gpu")
        one = [values, 1, int(r["id"]), int(r["id"]), tps, mfu, r.get("model_name"), r.get("source"),
               r.get("peak_memory_gib"), r.get("global_batch_tokens"), int(r["id"]) if tps is not None and tps > 0
               else None]
        deltas[key] = one if key not in deltas else _merge(deltas[key], one)
    if not deltas:
        return
    raw: Any = session.connection().connection.driver_connection
    keys = sorted(deltas)
    width = len(VALUE_COLS)
    # an IN list of constants is answered from the primary key's index (as run_configs.add)
    found = raw.execute(f"SELECT cell_key, {', '.join(VALUE_COLS)} FROM run_cells WHERE cell_key IN "
                        f"({', '.join('?' * len(keys))})", keys).fetchall()
    for k, *stored_values in found:
        deltas[k] = _merge([deltas[k][0], *stored_values], deltas[k])
    if len(keys) <= _VALUES_MAX:  # a few groups (a single run): stored ones updated in place, new ones inserted
        stored_keys = {f[0] for f in found}
        for k in keys:
            if k in stored_keys:
                raw.execute(_UPDATE_ONE, [*deltas[k][1:], k])
        new = [(k, *deltas[k][0], *deltas[k][1:]) for k in keys if k not in stored_keys]
        if new:
            row = "(" + ", ".join("?" * (1 + len(CELL_COLS) + width)) + ")"
            raw.execute(f"INSERT INTO run_cells ({_TARGET}) VALUES " + ", ".join([row] * len(new)),
                        [x for m in new for x in m])
        return
    if found:
        raw.execute(f"DELETE FROM run_cells WHERE cell_key IN ({', '.join('?' * len(found))})", [f[0] for f in found])
    merged = [(k, *deltas[k][0], *deltas[k][1:]) for k in keys]
    # many groups (a batch): from one registered Arrow view, as bulk.insert (binding ~40 parameters per
    # group costs DuckDB ~1 ms a group)
    global _ARROW
    if _ARROW is None:
        _ARROW = bulk.arrow_schema(list(RunCell.__table__.columns))
    names = _TARGET.split(", ")
    view = f"_cells_{uuid.uuid4().hex}"
    raw.register(view, pa.table({n: [m[i] for m in merged] for i, n in enumerate(names)}, schema=_ARROW))
    try:
        raw.execute(f"INSERT INTO run_cells ({_TARGET}) SELECT {_TARGET} FROM {view}")
    finally:
        raw.unregister(view)


#: DuckDB: up to this many groups merged by an UPDATE per stored group and one VALUES list for the new ones;
#: more by a DELETE of the stored ones and one insert of every merged row from an Arrow view
_VALUES_MAX = 8
_UPDATE_ONE = "UPDATE run_cells SET " + ", ".join(f"{c} = ?" for c in VALUE_COLS) + " WHERE cell_key = ?"
_ARROW = None  # run_cells' Arrow schema, built on first use


def _merge(a: list[Any], b: list[Any]) -> list[Any]:
    """Two aggregates of one group ([values, *VALUE_COLS]) merged: counts add, min_id the smaller, the best
    run the better by core.rules.best_key (service/ranking's rule), top_id the one with the higher
    tokens/s (best_tps), then the lower id. _MERGE_SET is the same rule in SQL."""
    def rank(x: list[Any]) -> tuple:
        return best_key({"id": x[3], "tokens_per_sec_per_gpu": x[4], "mfu_derived": x[5]})

    best = a if rank(a) <= rank(b) else b
    if a[10] is None or b[10] is None:
        top = b[10] if a[10] is None else a[10]
    elif a[4] != b[4]:
        top = a[10] if a[4] > b[4] else b[10]
    else:
        top = min(a[10], b[10])
    return [a[0], a[1] + b[1], min(a[2], b[2]), *best[3:10], top]


def _groups(session: Session, conditions: list[sa.ColumnElement]) -> set[tuple[str, float | None, int | None]]:
    """(cell_key, model_size_class, nodes) of the groups of the member runs `conditions` choose."""
    query: sa.Select = (sa.select(sa.literal_column(KEY_SQL), Run.model_size_class, Run.nodes)
                        .where(sa.text(MEMBERSHIP_SQL), *conditions).distinct())
    return {(k, size, nodes) for k, size, nodes in session.execute(query)}


@contextlib.contextmanager
def refreshing(session: Session, conditions: list[sa.ColumnElement]) -> Iterator[None]:
    """Around a change of the runs `conditions` choose (retire, un-retire, delete, the finish of a running
    run): their groups, before and after the change, are recomputed from `runs` when the block ends."""
    before = _groups(session, conditions)
    yield
    refresh(session, before | _groups(session, conditions))


def refresh(session: Session, groups: set[tuple[str, float | None, int | None]]) -> None:
    """Recompute the groups `groups` (as _groups gives them) from `runs`: overwritten, or deleted when
    emptied. More than MAX_REFRESH_GROUPS: rebuild()."""
    if not groups:
        return
    if len(groups) > MAX_REFRESH_GROUPS:
        rebuild(session)
        return
    keys = sorted({k for k, _, _ in groups})
    narrow = []  # the size classes and node counts narrow the scan before the key is computed per row
    sizes = sorted({s for _, s, _ in groups if s is not None})
    narrow.append(f"(model_size_class IS NULL OR model_size_class IN ({', '.join(repr(float(s)) for s in sizes)}))"
                  if sizes else "model_size_class IS NULL")
    nodes = sorted({n for _, _, n in groups if n is not None})
    narrow.append(f"(nodes IS NULL OR nodes IN ({', '.join(str(int(n)) for n in nodes)}))" if nodes
                  else "nodes IS NULL")
    where = " AND ".join([*narrow, f"{KEY_SQL} IN :keys"])
    stmt = sa.text(_upsert(_select(where), merge=False) + " RETURNING cell_key").bindparams(
        sa.bindparam("keys", expanding=True))
    kept = {k for (k,) in session.execute(stmt, {"keys": keys})}
    gone = [k for k in keys if k not in kept]
    if gone:
        session.execute(sa.delete(RunCell).where(RunCell.cell_key.in_(gone)))


def rebuild(session: Session) -> int:
    """Rewrite the whole table from `runs` (in the session's transaction); returns its row count."""
    session.execute(sa.delete(RunCell))
    session.execute(sa.text(f"INSERT INTO run_cells ({_TARGET}) {_select('TRUE')}"))
    return int(session.execute(sa.select(sa.func.count()).select_from(RunCell)).scalar_one())


def recompute(session: Session) -> dict[str, tuple]:
    """{cell_key: the row's values after the key} as rebuild() would write them now (tests)."""
    return {r[0]: tuple(r[1:]) for r in session.execute(sa.text(_select("TRUE")))}


def stored(session: Session) -> dict[str, tuple]:
    """{cell_key: the row's values after the key} as run_cells holds them (tests)."""
    cols = ", ".join(_TARGET.split(", ")[1:])
    return {r[0]: tuple(r[1:]) for r in session.execute(sa.text(f"SELECT cell_key, {cols} FROM run_cells"))}
