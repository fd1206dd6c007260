"""sweep_leases.slot: the budget slot a lease takes, unique per (sweep, slot, attempt).

POST /api/v1/sweeps/{name}/next numbers a sweep's configurations 1..budget; with this unique index two
agents (on any number of API processes) cannot both take the last slot, as (sweep, config_key, attempt)
keeps them from one configuration (service/sweep_leases.py). Leases stored before it are numbered in
hand-out order (a second attempt takes its configuration's slot). The column stays nullable in the schema
(DuckDB cannot ALTER … SET NOT NULL on an indexed table); the write path always sets it.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-26 17:10:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0019'
down_revision = '0018'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('sweep_leases', sa.Column('slot', sa.Integer(), nullable=True))
    op.execute(sa.text(
        "UPDATE sweep_leases SET slot = s.slot FROM ("
        " SELECT sweep, config_key, dense_rank() OVER (PARTITION BY sweep ORDER BY min(id)) AS slot"
        " FROM sweep_leases GROUP BY sweep, config_key) AS s"
        " WHERE sweep_leases.sweep = s.sweep AND sweep_leases.config_key = s.config_key"))
    op.create_index('ux_sweep_leases_slot', 'sweep_leases', ['sweep', 'slot', 'attempt'], unique=True)


_COLUMNS = "id, sweep, config_key, attempt, run_key, config, predicted, leased_at, agent"


def downgrade() -> None:
    op.drop_index('ux_sweep_leases_slot', table_name='sweep_leases')
    if op.get_bind().dialect.name == "postgresql":
        op.drop_column('sweep_leases', 'slot')
        return
    # DuckDB cannot drop a column whose index was dropped in the same transaction: the table is rebuilt
    # without it (0014's definition), rows and ids kept
    op.create_table(
        'sweep_leases_0014',
        sa.Column('id', sa.BigInteger(), server_default=sa.text("nextval('sweep_leases_id_seq')"), nullable=False),
        sa.Column('sweep', sa.String(length=200), nullable=False),
        sa.Column('config_key', sa.String(length=200), nullable=False),
        sa.Column('attempt', sa.Integer(), nullable=False),
        sa.Column('run_key', sa.String(length=200), nullable=False),
        sa.Column('config', sa.JSON(), nullable=False),
        sa.Column('predicted', sa.JSON(), nullable=True),
        sa.Column('leased_at', sa.DateTime(), nullable=False),
        sa.Column('agent', sa.String(length=200), nullable=True),
        sa.PrimaryKeyConstraint('id', name='pk_sweep_leases_0014'),
    )
    op.execute(sa.text(f"INSERT INTO sweep_leases_0014 ({_COLUMNS}) SELECT {_COLUMNS} FROM sweep_leases"))
    op.drop_table('sweep_leases')
    op.rename_table('sweep_leases_0014', 'sweep_leases')
    op.create_index('ux_sweep_leases_config', 'sweep_leases', ['sweep', 'config_key', 'attempt'], unique=True)
    op.create_index('ux_sweep_leases_run_key', 'sweep_leases', ['run_key'], unique=True)
