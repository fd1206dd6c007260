"""run_configs: the per-configuration summary of the successful runs, kept by the database in the same
transaction as the runs it derives from (DESIGN §5; migration 0013).

One row per configuration (CONFIG_COLS: hardware, framework, precision, model, seq_len, nodes and
the parallel layout) of the runs that MEMBERSHIP admits — successful (`running`, `lost` and failed
runs never enter), not retired, with a precision, a tokens/s/GPU > 0, a seq_len, a micro-batch, a
GAS and a model size class: the rows the throughput fit and the recommender read
(service/analytics/throughput.read_configs), which without this table aggregated every successful
run per request (0.1–0.4 s at 10^6 runs). Per row: n_runs, the best tokens/s/GPU, the first run id,
the highest peak memory, and the sum and count of each recorded bandwidth (allreduce_gb_s,
ar_intra_node_gb_s: their mean is sum / count).

`config_key` is md5 of the CONFIG_COLS values as text, NULL spelled `\\N` (KEY_SQL): one key per
GROUP BY group, computed by the database in every statement, so that the insert, the refresh and
the rebuild agree whatever the Python types.

Every write path keeps it, in its own transaction:
- inserts (service/store.store_runs, any batch size): `add(session, ids)` after the insert — one
  `INSERT … SELECT … GROUP BY … ON CONFLICT (config_key) DO UPDATE` that merges the new runs'
  groups (counts and sums add, best and peak take the larger, first id the smaller), in key order
  (concurrent PostgreSQL writers lock the rows they share in one order: no deadlock);
- anything that changes which runs a row covers (retire, un-retire, delete: service/retire.py; a
  status change): `with refreshing(session, conditions): <the change>` recomputes from `runs`
  the groups of the runs the conditions choose, before and after the change (rebuild() past
  MAX_REFRESH_GROUPS groups);
- `scalebook db rebuild-configs` and migration 0013: rebuild(), the whole table from `runs` (for
  writes made behind scalebook's back with outside SQL).
`recompute(session)` is what rebuild() writes, for tests: run_configs must equal it.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import sqlalchemy as sa
from sqlalchemy.orm import Session

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
#: config_key of a row of `runs` (or of run_configs: same column names)
KEY_SQL = ("md5(concat_ws('|', "
           + ", ".join(f"coalesce(CAST({c} AS VARCHAR), '\\N')" for c in CONFIG_COLS) + "))")
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


#: (the id range lets DuckDB skip the row groups before it by their zone maps)
_ADD = _upsert(_select("id BETWEEN :lo AND :hi AND id IN (SELECT unnest(:ids))"), merge=True)


def add(session: Session, ids: list[int]) -> None:
    """Merge the runs `ids`, just inserted in this transaction, into their summary rows (those
    MEMBERSHIP admits; the others change nothing)."""
    if not ids:
        return
    values = [int(i) for i in ids]
    session.execute(sa.text(_ADD), {"ids": values, "lo": min(values), "hi": max(values)})


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
