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
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column('runs', sa.Column('retired_at', sa.DateTime(), nullable=True))
    op.add_column('runs', sa.Column('retired_reason', sa.Text(), nullable=True))


def downgrade() -> None:
    op.drop_column('runs', 'retired_reason')
    op.drop_column('runs', 'retired_at')
