"""run_configs_state: how far run_configs has taken in the runs (DuckDB folds them in lazily).

One row (id = 1): every successful run with id ≤ folded_through_id is in run_configs. On DuckDB,
ingest no longer merges each request into run_configs: it folds the new runs in every
FOLD_EVERY runs, and readers add the runs not yet folded (service/run_configs.py). run_configs is
rebuilt here, which sets the watermark to the highest stored id: the table then holds every run,
including any written behind scalebook's back since 0004.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23 08:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'run_configs_state',
        sa.Column('id', sa.Integer(), autoincrement=False, nullable=False),
        sa.Column('folded_through_id', sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint('id', name=op.f('pk_run_configs_state')),
    )
    # the fill (service/run_configs.rebuild) is gone with the table: migration 0006 drops both


def downgrade() -> None:
    op.drop_table('run_configs_state')
