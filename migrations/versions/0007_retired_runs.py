"""Retired runs: runs.retired_at and runs.retired_reason.

A retired run stays stored and queryable (GET /api/v1/runs, SQL) but leaves every analytic
(heatmap, recommend, suggest, scaling, plan, regressions, the throughput model's fit). Set and
cleared by POST /api/v1/runs/retire and /unretire (by ids or by a filter, e.g. nanotron runs made
before the pipeline-engine fix: extra.after_pp_fix = false).

Revision ID: 0007
Revises: 0005
Create Date: 2026-11-24 01:40:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('runs', sa.Column('retired_at', sa.DateTime(), nullable=True))
    op.add_column('runs', sa.Column('retired_reason', sa.Text(), nullable=True))


#: the indexes on runs that DuckDB makes us drop around ALTER TABLE ... DROP COLUMN ("Cannot
#: alter entry because there are entries that depend on it"); (name, columns, unique)
_DUCKDB_INDEXES = (
    ("ux_runs_run_key", ["run_key"], True),
    ("ix_runs_heatmap", ["model_size_class", "nodes", "status"], False),
    ("ix_runs_fingerprint", ["fingerprint", "started_at"], False),
    ("ix_runs_model_name", ["model_name"], False),
    ("ix_runs_started_at", ["started_at"], False),
)


def downgrade() -> None:
    duckdb = op.get_bind().dialect.name == "duckdb"
    if duckdb:
        for name, _, _ in _DUCKDB_INDEXES:
            op.drop_index(name, table_name='runs')
    op.drop_column('runs', 'retired_reason')
    op.drop_column('runs', 'retired_at')
    if duckdb:
        for name, cols, unique in _DUCKDB_INDEXES:
            op.create_index(name, 'runs', cols, unique=unique)
