"""run_configs: the per-configuration summary of the successful runs, kept in the write transaction.

One row per configuration (service/run_configs.CONFIG_COLS) of the successful, not retired runs with
a precision, tokens/s/GPU > 0, seq_len, micro-batch, GAS and model size class: n_runs, best
tokens/s/GPU, first id, highest peak memory, and per recorded bandwidth its sum and count. Keyed by
config_key = md5 of the configuration's values as text (NULL as `\\N`, the size class in millionths).
From this revision on every write path keeps it in the transaction that changes the runs
(service/run_configs.py); filled here from the runs stored. The recommender and /suggest read it
instead of aggregating every successful run per request (issue 25 item 4; 0004–0006 had a table of
this kind, kept behind an id watermark on DuckDB, and dropped it).

PostgreSQL: ix_runs_config (0010, 0012), the covering index of that per-request aggregate, has no
reader left and is dropped (one index fewer for every insert); downgrade re-creates it.

The SQL here is a frozen copy of service/run_configs.py's at this revision (a migration does not
follow later code).

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-26 17:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0018'
down_revision = '0017'
branch_labels = None
depends_on = None

_KEY = ["gpu_type", "framework", "precision", "model_params", "num_layers", "hidden_size", "num_heads",
        "num_kv_heads", "ffn_hidden_size", "vocab_size", "gated_linear_unit", "seq_len", "nodes", "gpus_per_node",
        "dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size", "grad_accum_steps", "recompute",
        "model_size_class"]
_INCLUDE = ["tokens_per_sec_per_gpu", "id", "peak_memory_gib", "allreduce_gb_s", "ar_intra_node_gb_s"]
_MEMBERSHIP = ("status = 'success' AND retired_at IS NULL AND precision IS NOT NULL "
               "AND tokens_per_sec_per_gpu > 0 AND seq_len IS NOT NULL AND micro_batch_size IS NOT NULL "
               "AND grad_accum_steps IS NOT NULL AND model_size_class IS NOT NULL")
_KEY_SQL = "md5(concat_ws('|', " + ", ".join(
    "coalesce(CAST({} AS VARCHAR), '\\N')".format(
        f"CAST(round({c} * 1000000) AS BIGINT)" if c == "model_size_class" else c) for c in _KEY) + "))"
_COLS = ", ".join(_KEY)
_FILL = (f"INSERT INTO run_configs (config_key, {_COLS}, n_runs, tokens_per_sec_per_gpu, first_id, peak_memory_gib, "
         "allreduce_gb_s_sum, allreduce_gb_s_n, ar_intra_node_gb_s_sum, ar_intra_node_gb_s_n) "
         f"SELECT {_KEY_SQL}, {_COLS}, count(*), max(tokens_per_sec_per_gpu), min(id), max(peak_memory_gib), "
         "coalesce(sum(allreduce_gb_s), 0), count(allreduce_gb_s), coalesce(sum(ar_intra_node_gb_s), 0), "
         f"count(ar_intra_node_gb_s) FROM runs WHERE {_MEMBERSHIP} GROUP BY {_COLS}")


def upgrade() -> None:
    op.create_table(
        'run_configs',
        sa.Column('config_key', sa.String(length=32), nullable=False),
        sa.Column('gpu_type', sa.String(length=100), nullable=True),
        sa.Column('framework', sa.String(length=200), nullable=True),
        sa.Column('precision', sa.String(length=32), nullable=True),
        sa.Column('model_params', sa.BigInteger(), nullable=True),
        sa.Column('num_layers', sa.Integer(), nullable=True),
        sa.Column('hidden_size', sa.Integer(), nullable=True),
        sa.Column('num_heads', sa.Integer(), nullable=True),
        sa.Column('num_kv_heads', sa.Integer(), nullable=True),
        sa.Column('ffn_hidden_size', sa.Integer(), nullable=True),
        sa.Column('vocab_size', sa.Integer(), nullable=True),
        sa.Column('gated_linear_unit', sa.Boolean(), nullable=True),
        sa.Column('seq_len', sa.Integer(), nullable=True),
        sa.Column('nodes', sa.Integer(), nullable=True),
        sa.Column('gpus_per_node', sa.Integer(), nullable=True),
        sa.Column('dp', sa.Integer(), nullable=True),
        sa.Column('tp', sa.Integer(), nullable=True),
        sa.Column('pp', sa.Integer(), nullable=True),
        sa.Column('cp', sa.Integer(), nullable=True),
        sa.Column('ep', sa.Integer(), nullable=True),
        sa.Column('zero_stage', sa.Integer(), nullable=True),
        sa.Column('micro_batch_size', sa.Integer(), nullable=True),
        sa.Column('grad_accum_steps', sa.Integer(), nullable=True),
        sa.Column('recompute', sa.String(length=16), nullable=True),
        sa.Column('model_size_class', sa.Double(), nullable=True),
        sa.Column('n_runs', sa.BigInteger(), nullable=False),
        sa.Column('tokens_per_sec_per_gpu', sa.Double(), nullable=False),
        sa.Column('first_id', sa.BigInteger(), nullable=False),
        sa.Column('peak_memory_gib', sa.Double(), nullable=True),
        sa.Column('allreduce_gb_s_sum', sa.Double(), nullable=False),
        sa.Column('allreduce_gb_s_n', sa.BigInteger(), nullable=False),
        sa.Column('ar_intra_node_gb_s_sum', sa.Double(), nullable=False),
        sa.Column('ar_intra_node_gb_s_n', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('config_key', name=op.f('pk_run_configs')),
    )
    op.execute(sa.text(_FILL))
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_runs_config", table_name="runs")


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.create_index("ix_runs_config", "runs", _KEY, unique=False, postgresql_include=_INCLUDE,
                        postgresql_where=sa.text("status = 'success' AND retired_at IS NULL"))
    op.drop_table('run_configs')
