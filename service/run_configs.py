"""run_configs: the per-configuration summary of the successful runs, kept by the database in the same
transaction as the runs it derives from (DESIGN §5; migration 0018).

One row per configuration (CONFIG_COLS: hardware, framework, precision, model, seq_len, nodes and
the parallel layout) of the runs that MEMBERSHIP admits — successful (`running`, `lost` and failed
runs never enter), not retired, with a precision, a tokens/s/GPU > 0, a seq_len, a micro-batch, a
GAS and a model size class: the rows the throughput fit and the recommender read
(service/analytics/throughput.read_configs), which without this table aggregated every successful
run per request (0.1–0.4 s at 10^6 runs). Per row: n_runs, the best tokens/s/GPU, the first run id,
the highest peak memory, and the sum and count of each recorded bandwidth (allreduce_gb_s,
ar_intra_node_gb_s: their mean is sum / count).

`config_key` is md5 of the CONFIG_COLS values as text, '|'-separated, NULL spelled `\\N`, the size
class in millionths (KEY_SQL in SQL, key_of in Python: the same text on both backends, tested).

Every write path keeps it, in its own transaction:
- inserts (service/store.store_runs, any batch size): `add(session, rows)` after the insert. PostgreSQL:
  one `INSERT … SELECT … GROUP BY … ON CONFLICT (config_key) DO UPDATE` that merges the new runs'
  groups (counts and sums add, best and peak take the larger, first id the smaller), in key order
  (concurrent writers lock the rows they share in one order: no deadlock). DuckDB (one writer at a
  time): the deltas computed in Python, UPDATE by key, INSERT of new groups (its ON CONFLICT costs
  5–12 ms a statement at 10^6 runs);
- anything that changes which runs a row covers (retire, un-retire, delete: service/retire.py; a
  status change): `with refreshing(session, conditions): <the change>` recomputes from `runs`
  the groups of the runs the conditions choose, before and after the change (rebuild() past
  MAX_REFRESH_GROUPS groups);
- `scalebook db rebuild-configs` and migration 0018: rebuild(), the whole table from `runs` (for
  writes made behind scalebook's back with outside SQL).
`recompute(session)` is what rebuild() writes, for tests: run_configs must equal it. A later migration
that changes the configuration columns, status or retirement of stored runs must rebuild the table
(its own frozen copy of migration 0018's fill), as 0018 fills it.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from sqlalchemy.orm import Session

from service import bulk
from service.tables import Run, RunConfig

#: the configuration a summary row stands for (the throughput fit's GROUP BY key), in index order
CONFIG_COLS = ("gpu_type", "framework", "precision", "model_params", "num_layers", "hidden_size", "num_heads",
               "num_kv_heads", "ffn_hidden_size", "vocab_size", "gated_linear_unit", "seq_len", "nodes",
               "gpus_per_node", "dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size", "grad_accum_steps",
               "recompute", "model_size_class")
#: (summary column, runs column) of the recorded bandwidths whose mean the fit reads
BANDWIDTHS = (("allreduce_gb_s", "allreduce_gb_s"), ("ar_intra_node_gb_s", "ar_intra_node_gb_s"))
#: a refresh touching more groups than this rebuilds the whole table (one scan instead of a long OR)
MAX_REFRESH_GROUPS = 200

_COLS_SQL = ", ".join(CONFIG_COLS)
#: the runs a summary row covers (SQL over `runs`)
MEMBERSHIP_SQL = ("status = 'success' AND retired_at IS NULL AND precision IS NOT NULL "
                  "AND tokens_per_sec_per_gpu > 0 AND seq_len IS NOT NULL AND micro_batch_size IS NOT NULL "
                  "AND grad_accum_steps IS NOT NULL AND model_size_class IS NOT NULL")
#: the CONFIG_COLS of type DOUBLE: in the key as an integer number of millionths (a float's text differs
#: between the backends, PostgreSQL's 470 against DuckDB's 470.0; size classes have 2 significant figures)
_DOUBLE_COLS = ("model_size_class",)
#: the CONFIG_COLS of type BOOLEAN: 'true' / 'false' in the key, as both backends cast them to text
_BOOL_COLS = ("gated_linear_unit", "is_moe")


def _key_term(c: str) -> str:
    value = f"CAST(round({c} * 1000000) AS BIGINT)" if c in _DOUBLE_COLS else c
    return f"coalesce(CAST({value} AS VARCHAR), '\\N')"


#: config_key of a row of `runs` (or of run_configs: same column names); key_of() in Python
KEY_SQL = "md5(concat_ws('|', " + ", ".join(_key_term(c) for c in CONFIG_COLS) + "))"


def key_of(values: tuple, cols: tuple[str, ...] = CONFIG_COLS) -> str:
    """KEY_SQL of CONFIG_COLS `values` (Python values as stored), computed here (`cols`: another summary's
    key columns, service/run_cells.py's)."""
    parts = []
    for c, v in zip(cols, values, strict=True):
        if v is None:
            parts.append("\\N")
        elif c in _BOOL_COLS:
            parts.append("true" if v else "false")
        elif c in _DOUBLE_COLS:
            parts.append(str(int(round(float(v) * 1000000))))
        else:
            parts.append(str(v))
    return hashlib.md5("|".join(parts).encode()).hexdigest()


def member(row: dict[str, Any]) -> bool:
    """MEMBERSHIP_SQL for a row about to be inserted (not retired): whether it enters its summary row."""
    tps = row.get("tokens_per_sec_per_gpu")
    return (row.get("status") == "success" and row.get("retired_at") is None and row.get("precision") is not None
            and tps is not None and tps > 0 and all(row.get(c) is not None for c in _REQUIRED))


#: the columns MEMBERSHIP_SQL requires (beyond status, retirement, precision and tokens/s)
_REQUIRED = ("seq_len", "micro_batch_size", "grad_accum_steps", "model_size_class")
_AGGREGATES = ("count(*), max(tokens_per_sec_per_gpu), min(id), max(peak_memory_gib), "
               + ", ".join(f"coalesce(sum({r}), 0), count({r})" for _, r in BANDWIDTHS))
_TARGET = ("config_key, " + _COLS_SQL + ", n_runs, tokens_per_sec_per_gpu, first_id, peak_memory_gib, "
           + ", ".join(f"{s}_sum, {s}_n" for s, _ in BANDWIDTHS))


def _select(where: str) -> str:
    return (f"SELECT {KEY_SQL} AS k, {_COLS_SQL}, {_AGGREGATES} FROM runs WHERE {MEMBERSHIP_SQL} AND {where} "
            f"GROUP BY {_COLS_SQL}")


#: the merge of new runs into their groups (add)
_MERGE_SET = ", ".join(
    ["n_runs = run_configs.n_runs + excluded.n_runs",
     "tokens_per_sec_per_gpu = greatest(run_configs.tokens_per_sec_per_gpu, excluded.tokens_per_sec_per_gpu)",
     "first_id = least(run_configs.first_id, excluded.first_id)",
     "peak_memory_gib = greatest(run_configs.peak_memory_gib, excluded.peak_memory_gib)"]
    + [f"{s}_{p} = run_configs.{s}_{p} + excluded.{s}_{p}" for s, _ in BANDWIDTHS for p in ("sum", "n")])
#: the overwrite of recomputed groups (refresh)
_REPLACE_SET = ", ".join(f"{c} = excluded.{c}" for c in _TARGET.split(", ")[1 + len(CONFIG_COLS):])


def _upsert(select: str, merge: bool) -> str:
    return (f"INSERT INTO run_configs ({_TARGET}) {select} ORDER BY 1 "
            f"ON CONFLICT (config_key) DO UPDATE SET {_MERGE_SET if merge else _REPLACE_SET}")


#: PostgreSQL: the new runs' groups merged in one statement, in key order (concurrent writers sharing rows
#: lock them in one order)
_ADD_SQL = _upsert(_select("id = ANY(:ids)"), merge=True)
_VALUE_COLS = ("n_runs", "tokens_per_sec_per_gpu", "first_id", "peak_memory_gib",
               *(f"{s}_{p}" for s, _ in BANDWIDTHS for p in ("sum", "n")))
#: DuckDB: the merge of one group's delta into its row (an ON CONFLICT upsert costs DuckDB 5–12 ms per
#: statement at 10^6 runs, an UPDATE by key ~1 ms)
_MERGE_ONE = ("UPDATE run_configs SET n_runs = n_runs + ?, "
              "tokens_per_sec_per_gpu = greatest(tokens_per_sec_per_gpu, ?), first_id = least(first_id, ?), "
              "peak_memory_gib = greatest(peak_memory_gib, ?), "
              + ", ".join(f"{s}_{p} = {s}_{p} + ?" for s, _ in BANDWIDTHS for p in ("sum", "n"))
              + " WHERE config_key = ?")
#: DuckDB: the merge of many groups' deltas from an Arrow view {view} (one UPDATE, then the new groups)
_MERGE_MANY = ("UPDATE run_configs SET n_runs = run_configs.n_runs + d.n_runs, "
               "tokens_per_sec_per_gpu = greatest(run_configs.tokens_per_sec_per_gpu, d.tokens_per_sec_per_gpu), "
               "first_id = least(run_configs.first_id, d.first_id), "
               "peak_memory_gib = greatest(run_configs.peak_memory_gib, d.peak_memory_gib), "
               + ", ".join(f"{s}_{p} = run_configs.{s}_{p} + d.{s}_{p}" for s, _ in BANDWIDTHS for p in ("sum", "n"))
               + " FROM {view} AS d WHERE run_configs.config_key = d.config_key")
_INSERT_NEW = (f"INSERT INTO run_configs ({_TARGET}) SELECT {_TARGET} FROM {{view}} AS d "
               "WHERE NOT EXISTS (SELECT 1 FROM run_configs c WHERE c.config_key = d.config_key)")
_ARROW = None  # the delta table's Arrow schema (run_configs' columns), built on first use


#: per-key UPDATEs up to this many groups, one UPDATE … FROM (VALUES …) beyond
_MERGE_ONE_MAX = 8


def _deltas(rows: list[dict[str, Any]]) -> dict[str, list[Any]]:
    """{config_key: [CONFIG_COLS values, n_runs, best tokens/s, first id, peak memory, bandwidth sums and
    counts]} of the member rows (with their ids): what `add` merges."""
    by_values: dict[tuple, list[Any]] = {}
    for r in rows:
        values = tuple(r.get(c) for c in CONFIG_COLS)
        tps, peak = float(r["tokens_per_sec_per_gpu"]), r.get("peak_memory_gib")
        bws = [r.get(col) for _, col in BANDWIDTHS]
        d = by_values.get(values)
        if d is None:
            by_values[values] = [values, 1, tps, int(r["id"]), None if peak is None else float(peak),
                                 *(x for bw in bws for x in ((0.0, 0) if bw is None else (float(bw), 1)))]
            continue
        d[1] += 1
        d[2] = max(d[2], tps)
        d[3] = min(d[3], int(r["id"]))
        if peak is not None:
            d[4] = float(peak) if d[4] is None else max(d[4], float(peak))
        for i, bw in enumerate(bws):
            if bw is not None:
                d[5 + 2 * i] += float(bw)
                d[6 + 2 * i] += 1
    return {key_of(values): d for values, d in by_values.items()}


def add(session: Session, rows: list[dict[str, Any]]) -> None:
    """Merge `rows` (runs just inserted in this transaction, with their ids) into their summary rows:
    those MEMBERSHIP admits (member()); the others change nothing. PostgreSQL: one upsert from `runs`
    (_ADD_SQL). DuckDB (writes serialised by Database.write_lock): the groups' deltas computed here, an
    UPDATE of the rows that exist and an INSERT of the others."""
    members = [r for r in rows if member(r)]
    if not members:
        return
    if session.get_bind().dialect.name == "postgresql":
        session.execute(sa.text(_ADD_SQL), {"ids": [int(r["id"]) for r in members]})
        return
    deltas = _deltas(members)
    raw: Any = session.connection().connection.driver_connection
    keys = sorted(deltas)
    if len(keys) > _MERGE_ONE_MAX:  # set-based, from an Arrow view (as bulk.insert: binding ~10 parameters per
        _merge_many(raw, keys, deltas)  # group was 3-4× slower)
        return
    # an IN list of constants is answered from the primary key's index (as bulk.stored_hashes does)
    found = {k for (k,) in raw.execute(f"SELECT config_key FROM run_configs WHERE config_key IN "
                                       f"({', '.join('?' * len(keys))})", keys).fetchall()}
    for k in keys:
        if k in found:
            raw.execute(_MERGE_ONE, [*deltas[k][1:], k])
    new = [k for k in keys if k not in found]
    if new:
        width = 1 + len(CONFIG_COLS) + len(_VALUE_COLS)
        raw.execute(f"INSERT INTO run_configs ({_TARGET}) VALUES "
                    + ", ".join(["(" + ", ".join("?" * width) + ")"] * len(new)),
                    [x for k in new for x in (k, *deltas[k][0], *deltas[k][1:])])


def _merge_many(raw: Any, keys: list[str], deltas: dict[str, list[Any]]) -> None:
    """DuckDB: the deltas of `keys` merged through one registered Arrow view (UPDATE, then INSERT)."""
    global _ARROW
    if _ARROW is None:
        _ARROW = bulk.arrow_schema(list(RunConfig.__table__.columns))
    names = _TARGET.split(", ")
    columns: dict[str, list[Any]] = {n: [] for n in names}
    for k in keys:
        for n, v in zip(names, (k, *deltas[k][0], *deltas[k][1:]), strict=True):
            columns[n].append(v)
    view = f"_configs_{uuid.uuid4().hex}"
    raw.register(view, pa.table(columns, schema=_ARROW))
    try:
        updated = raw.execute(_MERGE_MANY.format(view=view)).fetchone()[0]
        if updated < len(keys):  # new configurations (rare once a sweep's layouts are recorded)
            raw.execute(_INSERT_NEW.format(view=view))
    finally:
        raw.unregister(view)


def _groups(session: Session, conditions: list[sa.ColumnElement]) -> set[tuple[str, float | None]]:
    """(config_key, model_size_class) of the summary groups of the member runs `conditions` choose."""
    query: sa.Select = (sa.select(sa.literal_column(KEY_SQL), Run.model_size_class)
             .where(sa.text(MEMBERSHIP_SQL), *conditions).distinct())
    return {(k, size) for k, size in session.execute(query)}


@contextlib.contextmanager
def refreshing(session: Session, conditions: list[sa.ColumnElement]) -> Iterator[None]:
    """Around a change of the runs `conditions` choose (retire, un-retire, delete, a status or
    column update): the summary groups of those runs, before and after the change, are recomputed
    from `runs` when the block ends (in the same transaction)."""
    before = _groups(session, conditions)
    yield
    refresh(session, before | _groups(session, conditions))


def refresh(session: Session, groups: set[tuple[str, float | None]]) -> None:
    """Recompute the summary rows `groups` ((config_key, model_size_class), as _groups gives them)
    from `runs`: recomputed groups are overwritten, emptied ones deleted. More than
    MAX_REFRESH_GROUPS: rebuild()."""
    if not groups:
        return
    if len(groups) > MAX_REFRESH_GROUPS:
        rebuild(session)
        return
    keys = sorted({k for k, _ in groups})
    sizes = ", ".join(repr(float(s)) for s in sorted({s for _, s in groups if s is not None}) or [0.0])
    # the size classes (a member run always has one) narrow the scan before the key is computed per row
    where = f"model_size_class IN ({sizes}) AND {KEY_SQL} IN :keys"
    stmt = sa.text(_upsert(_select(where), merge=False) + " RETURNING config_key").bindparams(
        sa.bindparam("keys", expanding=True))
    kept = {k for (k,) in session.execute(stmt, {"keys": keys})}
    gone = [k for k in keys if k not in kept]
    if gone:
        session.execute(sa.delete(RunConfig).where(RunConfig.config_key.in_(gone)))


def rebuild(session: Session) -> int:
    """Rewrite the whole summary from `runs` (in the session's transaction); returns its row count."""
    session.execute(sa.delete(RunConfig))
    session.execute(sa.text(f"INSERT INTO run_configs ({_TARGET}) {_select('TRUE')}"))
    return int(session.execute(sa.select(sa.func.count()).select_from(RunConfig)).scalar_one())


def recompute(session: Session) -> dict[str, tuple]:
    """{config_key: the row's values after the key} as rebuild() would write them now (tests)."""
    return {r[0]: tuple(r[1:]) for r in session.execute(sa.text(_select("TRUE")))}


def stored(session: Session) -> dict[str, tuple]:
    """{config_key: the row's values after the key} as run_configs holds them (tests)."""
    cols = ", ".join(_TARGET.split(", ")[1:])
    return {r[0]: tuple(r[1:]) for r in session.execute(sa.text(f"SELECT config_key, {cols} FROM run_configs"))}
