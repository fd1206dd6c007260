"""runs.is_moe: a mixture-of-experts run, so the heatmap keeps MoE and dense models of one size apart.

The heatmap's cell was (model_size_class, nodes): Qwen3-30B-A3B (MoE) and MPT-30B (dense) shared the
30B cells and only the faster of the two showed; GPT-OSS-120B sat in the dense 175B row (issue 30,
item 2). From 0017 the write path stores core.model.is_moe in ``runs.is_moe`` (service/derive.py) and the
heatmap's cell is (model_size_class, is_moe, nodes).

Backfill: every stored run gets the flag the write path of 0017 derives — true when expert
parallelism ep > 1, when extra declares experts (a truthy ``num_experts`` or ``moe``), when extra's
``active_params`` is a positive number, or when the model name carries an active-parameter token
("Qwen3-30B-A3B", "Qwen3_235B_a22B": core.model._ACTIVE, case-insensitive); false otherwise. The
column's server default is false (a run inserted by outside SQL is dense unless it says).

PostgreSQL: ix_runs_cells (0011) is re-made with is_moe in its key, (model_size_class, is_moe, nodes,
status), so the heatmap's per-cell count stays an index-only scan. DuckDB refuses ALTER TABLE ...
DROP COLUMN on a table with indexes: its indexes on runs are dropped and re-created around the
downgrade (as in 0007, 0010, 0012).

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-26 17:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0017'
down_revision = '0016'
branch_labels = None
depends_on = None

_DUCKDB_INDEXES = (
    ("ux_runs_run_key", ["run_key"], True),
    ("ix_runs_heatmap", ["model_size_class", "nodes", "status"], False),
    ("ix_runs_fingerprint", ["fingerprint", "started_at"], False),
    ("ix_runs_model_name", ["model_name"], False),
    ("ix_runs_started_at", ["started_at"], False),
)
_LIVE_CELLS = sa.text("retired_at IS NULL AND model_size_class IS NOT NULL AND nodes IS NOT NULL")
#: core.model._ACTIVE at 0017 as a POSIX/RE2 pattern (both backends), matched case-insensitively
_ACTIVE = r"(^|[-_ .])a[0-9]+(\.[0-9]+)?b($|[-_ .)])"
#: JSON values Python's bool() calls false, as ->> / json_extract_string write them
_FALSY = "('false', '0', '0.0', '', '[]', '{}', 'null')"


def _moe_condition(postgresql: bool) -> str:
    """SQL of core.model.is_moe at 0017 over a stored run (ep, extra, model_name)."""
    if postgresql:
        text = "(extra ->> '{key}')"
        number = ("CASE WHEN json_typeof(extra -> 'active_params') = 'number' "
                  "THEN (extra ->> 'active_params')::float8 > 0 ELSE false END")
        name = f"model_name ~* '{_ACTIVE}'"
    else:
        text = "json_extract_string(extra, '$.{key}')"
        number = ("CASE WHEN json_type(extra, '$.active_params') IN ('UBIGINT', 'BIGINT', 'DOUBLE') "
                  "THEN CAST(json_extract_string(extra, '$.active_params') AS DOUBLE) > 0 ELSE false END")
        name = f"regexp_matches(model_name, '{_ACTIVE}', 'i')"
    declared = " OR ".join(f"({text.format(key=key)} IS NOT NULL AND {text.format(key=key)} NOT IN {_FALSY})"
                           for key in ("num_experts", "moe"))
    return f"ep > 1 OR {declared} OR {number} OR {name}"


def upgrade() -> None:
    postgresql = op.get_bind().dialect.name == "postgresql"
    op.add_column('runs', sa.Column('is_moe', sa.Boolean(), server_default=sa.false(), nullable=True))
    op.execute(sa.text("UPDATE runs SET is_moe = FALSE WHERE is_moe IS NULL"))
    op.execute(sa.text(f"UPDATE runs SET is_moe = TRUE WHERE {_moe_condition(postgresql)}"))
    if postgresql:
        op.drop_index("ix_runs_cells", table_name="runs")
        op.create_index("ix_runs_cells", "runs", ["model_size_class", "is_moe", "nodes", "status"],
                        postgresql_include=["gpu_type", "seq_len"], postgresql_where=_LIVE_CELLS)


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    if dialect == "postgresql":
        op.drop_index("ix_runs_cells", table_name="runs")
        op.create_index("ix_runs_cells", "runs", ["model_size_class", "nodes", "status"],
                        postgresql_include=["gpu_type", "seq_len"], postgresql_where=_LIVE_CELLS)
    if dialect == "duckdb":
        for name, _, _ in _DUCKDB_INDEXES:
            op.drop_index(name, table_name='runs')
    op.drop_column('runs', 'is_moe')
    if dialect == "duckdb":
        for name, cols, unique in _DUCKDB_INDEXES:
            op.create_index(name, 'runs', cols, unique=unique)
