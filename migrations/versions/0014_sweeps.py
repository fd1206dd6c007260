"""Sweeps (issue 29): the sweeps table, and runs.sweep and runs.tags.

- sweeps: a named search for one target's best configuration (strategy grid or suggest, a budget,
  the target as JSON, the grid's listed values, the expected-improvement stop threshold). Only the
  definition: its progress is read from the runs that name it.
- sweep_leases: each configuration handed to an agent (POST /sweeps/{name}/next), unique on
  (sweep, config_key, attempt): the database, not an API process, keeps two agents from one configuration.
- runs.sweep: the sweep a run belongs to, by name (nullable; ix_runs_sweep on PostgreSQL only: DuckDB
  cannot drop a column whose index was dropped in the same transaction, as the downgrade would).
- runs.tags: free labels, a JSON list of strings (nullable).

DuckDB refuses ALTER TABLE ... DROP COLUMN on a table with indexes: its indexes on runs are dropped
and re-created around the downgrade (as in 0007, 0012 and 0013).

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-26 16:50:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
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
    op.execute(sa.schema.CreateSequence(sa.Sequence("sweeps_id_seq")))
    op.create_table(
        'sweeps',
        sa.Column('id', sa.BigInteger(), server_default=sa.text("nextval('sweeps_id_seq')"), nullable=False),
        sa.Column('name', sa.String(length=200), nullable=False),
        sa.Column('created_at', sa.DateTime(), nullable=False),
        sa.Column('strategy', sa.String(length=16), nullable=False),
        sa.Column('budget', sa.Integer(), nullable=False),
        sa.Column('target', sa.JSON(), nullable=False),
        sa.Column('grid', sa.JSON(), nullable=True),
        sa.Column('min_expected_improvement', sa.Double(), nullable=True),
        sa.Column('description', sa.Text(), nullable=True),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_sweeps')),
    )
    op.create_index('ux_sweeps_name', 'sweeps', ['name'], unique=True)
    op.execute(sa.schema.CreateSequence(sa.Sequence("sweep_leases_id_seq")))
    op.create_table(
        'sweep_leases',
        sa.Column('id', sa.BigInteger(), server_default=sa.text("nextval('sweep_leases_id_seq')"), nullable=False),
        sa.Column('sweep', sa.String(length=200), nullable=False),
        sa.Column('config_key', sa.String(length=200), nullable=False),
        sa.Column('attempt', sa.Integer(), nullable=False),
        sa.Column('run_key', sa.String(length=200), nullable=False),
        sa.Column('config', sa.JSON(), nullable=False),
        sa.Column('predicted', sa.JSON(), nullable=True),
        sa.Column('leased_at', sa.DateTime(), nullable=False),
        sa.Column('agent', sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_sweep_leases')),
    )
    op.create_index('ux_sweep_leases_config', 'sweep_leases', ['sweep', 'config_key', 'attempt'], unique=True)
    op.create_index('ux_sweep_leases_run_key', 'sweep_leases', ['run_key'], unique=True)
    op.add_column('runs', sa.Column('sweep', sa.String(length=200), nullable=True))
    op.add_column('runs', sa.Column('tags', sa.JSON(), nullable=True))
    if op.get_bind().dialect.name == "postgresql":
        op.create_index('ix_runs_sweep', 'runs', ['sweep'], unique=False)


def downgrade() -> None:
    duckdb = op.get_bind().dialect.name == "duckdb"
    if not duckdb:
        op.drop_index('ix_runs_sweep', table_name='runs')
    if duckdb:
        for name, _, _ in _DUCKDB_INDEXES:
            op.drop_index(name, table_name='runs')
    op.drop_column('runs', 'tags')
    op.drop_column('runs', 'sweep')
    if duckdb:
        for name, cols, unique in _DUCKDB_INDEXES:
            op.create_index(name, 'runs', cols, unique=unique)
    op.drop_index('ux_sweep_leases_run_key', table_name='sweep_leases')
    op.drop_index('ux_sweep_leases_config', table_name='sweep_leases')
    op.drop_table('sweep_leases')
    op.execute(sa.schema.DropSequence(sa.Sequence("sweep_leases_id_seq")))
    op.drop_index('ux_sweeps_name', table_name='sweeps')
    op.drop_table('sweeps')
    op.execute(sa.schema.DropSequence(sa.Sequence("sweeps_id_seq")))
