"""runs.gated_linear_unit: the model's MLP, gated (SwiGLU/GeGLU, three matrices) or plain (GPT's GELU, two).

A nullable boolean (Megatron-Core's `gated_linear_unit`): the throughput and memory models and the
parameter count from dims use it (core/model.ModelShape.mlp_matrices); NULL means the run did not say
(the models then assume a gated MLP and the answers say so). Stored runs keep NULL except those of
nanotron's bench CSV (source 'nanotron-csv' with extra.hidden_act: nanotron's Llama MLP is gated), which
are set to true — what a re-import of the same file stores.

PostgreSQL: ix_runs_config (0010) is re-made with the column in its key, in throughput.CONFIG_COLS order.
DuckDB refuses ALTER TABLE ... DROP COLUMN on a table with indexes: its indexes on runs are dropped
and re-created around the downgrade (as in 0007 and 0010).

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 14:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None

_DUCKDB_INDEXES = (
    ("ux_runs_run_key", ["run_key"], True),
    ("ix_runs_heatmap", ["model_size_class", "nodes", "status"], False),
    ("ix_runs_fingerprint", ["fingerprint", "started_at"], False),
    ("ix_runs_model_name", ["model_name"], False),
    ("ix_runs_started_at", ["started_at"], False),
)
_OLD_KEY = ["gpu_type", "framework", "precision", "model_params", "num_layers", "hidden_size", "num_heads",
            "num_kv_heads", "ffn_hidden_size", "vocab_size", "seq_len", "nodes", "gpus_per_node", "dp", "tp",
            "pp", "cp", "ep", "zero_stage", "micro_batch_size", "grad_accum_steps", "recompute",
            "model_size_class"]
#: service/analytics/throughput.CONFIG_COLS, the load_configs GROUP BY key, in its order
_NEW_KEY = [*_OLD_KEY[:10], "gated_linear_unit", *_OLD_KEY[10:]]
_INCLUDE = ["tokens_per_sec_per_gpu", "id", "peak_memory_gib", "allreduce_gb_s", "ar_intra_node_gb_s"]
_LIVE_SUCCESS = sa.text("status = 'success' AND retired_at IS NULL")


def _config_index(key: list[str]) -> None:
    op.create_index("ix_runs_config", "runs", key, unique=False, postgresql_include=_INCLUDE,
                    postgresql_where=_LIVE_SUCCESS)


def upgrade() -> None:
    op.add_column('runs', sa.Column('gated_linear_unit', sa.Boolean(), nullable=True))
    postgresql = op.get_bind().dialect.name == "postgresql"
    hidden_act = "(extra ->> 'hidden_act')" if postgresql else "json_extract_string(extra, '$.hidden_act')"
    op.execute(sa.text(f"UPDATE runs SET gated_linear_unit = TRUE WHERE source = 'nanotron-csv' "
                       f"AND {hidden_act} IS NOT NULL"))
    if postgresql:
        op.drop_index("ix_runs_config", table_name="runs")
        _config_index(_NEW_KEY)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.drop_index("ix_runs_config", table_name="runs")
        _config_index(_OLD_KEY)
    if dialect == "duckdb":
        for name, _, _ in _DUCKDB_INDEXES:
            op.drop_index(name, table_name='runs')
    op.drop_column('runs', 'gated_linear_unit')
    if dialect == "duckdb":
        for name, cols, unique in _DUCKDB_INDEXES:
            op.create_index(name, 'runs', cols, unique=unique)
