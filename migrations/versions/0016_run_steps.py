"""run_steps: the step-level series of live runs (DESIGN §9; core/steps.py).

One row per (run_id, step) — the primary key, so a step sent twice is stored once — with the step's
figures (step_time_s, tokens_per_sec_per_gpu, tflops_per_gpu, mfu, loss, grad_norm, learning_rate,
peak_memory_gib), when the job measured it (recorded_at) and when it arrived (received_at). No foreign
key: DuckDB refuses to delete a run a foreign key points at; deleting a run deletes its steps in the
same transaction (service/retire.py).

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-26 17:00:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0016'
down_revision = '0015'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'run_steps',
        sa.Column('run_id', sa.BigInteger(), nullable=False),
        sa.Column('step', sa.BigInteger(), nullable=False),
        sa.Column('received_at', sa.DateTime(), nullable=False),
        sa.Column('recorded_at', sa.DateTime(), nullable=True),
        *(sa.Column(name, sa.Double(), nullable=True) for name in (
            'step_time_s', 'tokens_per_sec_per_gpu', 'tflops_per_gpu', 'mfu', 'loss', 'grad_norm', 'learning_rate',
            'peak_memory_gib')),
        sa.PrimaryKeyConstraint('run_id', 'step', name='pk_run_steps'),
    )


def downgrade() -> None:
    op.drop_table('run_steps')
