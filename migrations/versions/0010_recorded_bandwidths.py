"""Recorded collective bandwidths in columns of their own (runs.allreduce_gb_s, runs.ar_intra_node_gb_s);
PostgreSQL indexes that cover the recommender's two queries.

The throughput fit (service/analytics/throughput.load_configs) averages the all-reduce bus bandwidths
a run recorded (nanotron's "AllReduce (GB/s)" and "AR Intra-node (GB/s)", kept in extra as
allreduce_gb_s / ar_intra_node_gb_s). Read out of the JSON on every request that cost ~10 ms on
DuckDB and ~60 ms on PostgreSQL at 10^5 runs (each row's JSON text parsed twice). From 0010 the
write path copies them into two DOUBLE columns (service/derive.py: a JSON number or numeric text,
else NULL; extra keeps them as reported), and this revision backfills the stored runs from extra
with the same rule. Downgrade drops the columns (extra still holds the values).

PostgreSQL: ix_runs_config and ix_runs_oom (0003) are re-made for the queries /recommend runs today
(service/analytics/throughput.read_configs, service/analytics/recommend._oom_rows), so that each is an
index-only scan whose entries come in GROUP BY order (a GroupAggregate, no sort, no hash):

- ix_runs_config: CONFIG_COLS (the GROUP BY key, same order) INCLUDE (tokens_per_sec_per_gpu, id,
  peak_memory_gib, the two bandwidths) WHERE status = 'success' AND retired_at IS NULL
  (10^5 runs: ~350 ms seq scan + hash aggregate → ~40 ms; the 0003 index served a query since gone);
- ix_runs_oom: (gpu_type, model_size_class, seq_len, dp, tp, pp, cp, zero_stage, micro_batch_size,
  recompute) INCLUDE (id) WHERE status = 'oom' AND retired_at IS NULL (~65 ms bitmap heap scan → ~5 ms).

DuckDB refuses ALTER TABLE ... DROP COLUMN on a table with indexes: its indexes on runs are dropped
and re-created around the downgrade (as in 0007).

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-24 04:45:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None

COLUMNS = ("allreduce_gb_s", "ar_intra_node_gb_s")
#: a number as JSON numbers and numeric strings write it (what float() reads, less inf/nan)
_NUMERIC = r"^\s*[-+]?([0-9]+\.?[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?\s*$"

#: the indexes on runs that DuckDB makes us drop around ALTER TABLE ... DROP COLUMN; (name, columns, unique)
_DUCKDB_INDEXES = (
    ("ux_runs_run_key", ["run_key"], True),
    ("ix_runs_heatmap", ["model_size_class", "nodes", "status"], False),
    ("ix_runs_fingerprint", ["fingerprint", "started_at"], False),
    ("ix_runs_model_name", ["model_name"], False),
    ("ix_runs_started_at", ["started_at"], False),
)


#: service/analytics/throughput.CONFIG_COLS, the load_configs GROUP BY key, in its order
CONFIG_KEY = ["gpu_type", "framework", "precision", "model_params", "num_layers", "hidden_size", "num_heads",
              "num_kv_heads", "ffn_hidden_size", "vocab_size", "seq_len", "nodes", "gpus_per_node", "dp", "tp",
              "pp", "cp", "ep", "zero_stage", "micro_batch_size", "grad_accum_steps", "recompute",
              "model_size_class"]
CONFIG_INCLUDE = ["tokens_per_sec_per_gpu", "id", "peak_memory_gib", *COLUMNS]
#: service/analytics/recommend._oom_rows' GROUP BY key, in its order
OOM_KEY = ["gpu_type", "model_size_class", "seq_len", "dp", "tp", "pp", "cp", "zero_stage", "micro_batch_size",
           "recompute"]
LIVE_SUCCESS = sa.text("status = 'success' AND retired_at IS NULL")
LIVE_OOM = sa.text("status = 'oom' AND retired_at IS NULL")
#: the 0003 definitions, restored by the downgrade
OLD_CONFIG_KEY = ["model_size_class", "nodes", "gpus_per_node", "gpu_type", "seq_len", "dp", "tp", "pp", "cp", "ep",
                  "zero_stage", "micro_batch_size", "grad_accum_steps", "recompute"]
OLD_CONFIG_INCLUDE = ["tokens_per_sec_per_gpu", "mfu_derived", "mfu", "global_batch_tokens", "peak_memory_gib", "id"]
OLD_OOM_INCLUDE = ["tp", "pp", "cp", "zero_stage", "micro_batch_size", "recompute", "seq_len", "dp"]


def _value(key: str, duckdb: bool) -> str:
    """SQL for extra[key] as DOUBLE when it is a number (JSON number or numeric text), else NULL."""
    if duckdb:  # the regex first: TRY_CAST would read '1_000' as 1000 (derive._number does not)
        text = f"json_extract_string(extra, '$.{key}')"
        return f"CASE WHEN regexp_full_match({text}, '{_NUMERIC}') THEN TRY_CAST({text} AS DOUBLE) END"
    # through numeric, as Python's float() reads it: beyond DOUBLE's range is not a number (inf → NULL),
    # below its smallest subnormal is 0.0 (a plain cast would abort the upgrade on '1e999' or '1e-400')
    text = f"(extra ->> '{key}')"
    number = f"CAST({text} AS NUMERIC)"
    return (f"CASE WHEN {text} ~ '{_NUMERIC}' THEN CASE WHEN abs({number}) >= 1.7976931348623157e308 THEN NULL "
            f"WHEN abs({number}) < 4.9e-324 THEN 0.0 ELSE CAST({number} AS DOUBLE PRECISION) END END")


def upgrade() -> None:
    duckdb = op.get_bind().dialect.name == "duckdb"
    for col in COLUMNS:
        op.add_column('runs', sa.Column(col, sa.Double(), nullable=True))
    sets = ", ".join(f"{col} = {_value(col, duckdb)}" for col in COLUMNS)
    op.execute(sa.text(f"UPDATE runs SET {sets} WHERE extra IS NOT NULL"))
    if duckdb:  # NaN/inf are not numbers here (TRY_CAST reads 'nan', 'inf'); PostgreSQL's regex already refuses them
        for col in COLUMNS:
            op.execute(sa.text(f"UPDATE runs SET {col} = NULL WHERE NOT isfinite({col})"))
    if not duckdb:
        op.drop_index("ix_runs_config", table_name="runs")
        op.drop_index("ix_runs_oom", table_name="runs")
        op.create_index("ix_runs_config", "runs", CONFIG_KEY, postgresql_include=CONFIG_INCLUDE,
                        postgresql_where=LIVE_SUCCESS)
        op.create_index("ix_runs_oom", "runs", OOM_KEY, postgresql_include=["id"], postgresql_where=LIVE_OOM)


def downgrade() -> None:
    duckdb = op.get_bind().dialect.name == "duckdb"
    if not duckdb:
        op.drop_index("ix_runs_config", table_name="runs")
        op.drop_index("ix_runs_oom", table_name="runs")
        op.create_index("ix_runs_config", "runs", OLD_CONFIG_KEY, postgresql_include=OLD_CONFIG_INCLUDE,
                        postgresql_where=sa.text("status = 'success'"))
        op.create_index("ix_runs_oom", "runs", ["model_size_class"], postgresql_include=OLD_OOM_INCLUDE,
                        postgresql_where=sa.text("status = 'oom'"))
    if duckdb:
        for name, _, _ in _DUCKDB_INDEXES:
            op.drop_index(name, table_name='runs')
    for col in reversed(COLUMNS):
        op.drop_column('runs', col)
    if duckdb:
        for name, cols, unique in _DUCKDB_INDEXES:
            op.create_index(name, 'runs', cols, unique=unique)
