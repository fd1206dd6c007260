"""Live runs (DESIGN §9): runs.last_heartbeat_at, and the status `running`.

A job may open its run at start (`status = 'running'`), heartbeat it and finish it once. `lost` is not
stored: a running run whose last heartbeat is older than lost_after_s reads as lost when read
(core/lifecycle.py; service/lifecycle.py). `status` is String(16) already, so `running` needs no DDL;
stored runs keep last_heartbeat_at NULL (they were stored finished).

PostgreSQL: a partial index on the open runs (`ix_runs_open`, WHERE status = 'running'), so the Live
view and `status=running|lost` read a handful of index entries at any table size; the bulk insert of
finished runs never touches it. DuckDB has no partial indexes and needs none here.
DuckDB refuses ALTER TABLE ... DROP COLUMN on a table with indexes: its indexes on runs are dropped
and re-created around the downgrade (as in 0007).

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 16:40:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None

_DUCKDB_INDEXES = (
    ("ux_runs_run_key", ["run_key"], True),
    ("ix_runs_heatmap", ["model_size_class", "nodes", "status"], False),
    ("ix_runs_fingerprint", ["fingerprint", "started_at"], False),
    ("ix_runs_model_name", ["model_name"], False),
    ("ix_runs_started_at", ["started_at"], False),
)


def upgrade() -> None:
    op.add_column('runs', sa.Column('last_heartbeat_at', sa.DateTime(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.create_index("ix_runs_open", "runs", ["last_heartbeat_at"], unique=False, postgresql_include=["id"],
                        postgresql_where=sa.text("status = 'running'"))


def downgrade() -> None:
    dialect = op.get_bind().dialect.name
    # the code before 0013 knows no open runs: they are closed as failed runs of unknown cause, and say so
    op.execute(sa.text("UPDATE runs SET status = 'failed', error_class = 'unknown', error_message = "
                       "'still running when the schema was downgraded below 0013 (live runs)' "
                       "WHERE status = 'running'"))
    if dialect == "postgresql":
        op.drop_index("ix_runs_open", table_name="runs")
    if dialect == "duckdb":
        for name, _, _ in _DUCKDB_INDEXES:
            op.drop_index(name, table_name='runs')
    op.drop_column('runs', 'last_heartbeat_at')
    if dialect == "duckdb":
        for name, cols, unique in _DUCKDB_INDEXES:
            op.create_index(name, 'runs', cols, unique=unique)
