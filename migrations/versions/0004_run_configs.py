"""run_configs: the per-configuration summary of successful runs (performance of /recommend).

One row per recorded configuration (the recommender's GROUP BY key: model_size_class, nodes,
gpus_per_node, gpu_type, seq_len, dp, tp, pp, cp, ep, zero_stage, micro_batch_size,
grad_accum_steps, recompute), keyed by `config_key` (those values as a JSON list), with the
number of successful runs and, per ranking metric (tps_, mfu_), the count reporting it, its
min/max and the best run's id and figures. Maintained in the ingest transaction from then on
(service/run_configs.py); filled here from the runs already stored.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23 07:10:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

GROUP_COLUMNS = [
    sa.Column('model_size_class', sa.Double(), nullable=False),
    sa.Column('nodes', sa.Integer(), nullable=False),
    sa.Column('gpus_per_node', sa.Integer(), nullable=True),
    sa.Column('gpu_type', sa.String(length=100), nullable=True),
    sa.Column('seq_len', sa.Integer(), nullable=True),
    sa.Column('dp', sa.Integer(), nullable=True),
    sa.Column('tp', sa.Integer(), nullable=False),
    sa.Column('pp', sa.Integer(), nullable=False),
    sa.Column('cp', sa.Integer(), nullable=False),
    sa.Column('ep', sa.Integer(), nullable=False),
    sa.Column('zero_stage', sa.Integer(), nullable=True),
    sa.Column('micro_batch_size', sa.Integer(), nullable=True),
    sa.Column('grad_accum_steps', sa.Integer(), nullable=True),
    sa.Column('recompute', sa.String(length=16), nullable=True),
]


def _metric_columns(p: str) -> list[sa.Column]:
    return [
        sa.Column(f'{p}_n', sa.BigInteger(), nullable=False),
        sa.Column(f'{p}_min', sa.Double(), nullable=True),
        sa.Column(f'{p}_max', sa.Double(), nullable=True),
        sa.Column(f'{p}_best_id', sa.BigInteger(), nullable=False),
        sa.Column(f'{p}_best_value', sa.Double(), nullable=True),
        sa.Column(f'{p}_best_mfu', sa.Double(), nullable=True),
        sa.Column(f'{p}_best_tps', sa.Double(), nullable=True),
        sa.Column(f'{p}_best_peak_memory_gib', sa.Double(), nullable=True),
        sa.Column(f'{p}_best_global_batch_tokens', sa.BigInteger(), nullable=True),
    ]


def upgrade() -> None:
    op.create_table(
        'run_configs',
        sa.Column('config_key', sa.String(length=500), nullable=False),
        *GROUP_COLUMNS,
        sa.Column('n_runs', sa.BigInteger(), nullable=False),
        *_metric_columns('tps'),
        *_metric_columns('mfu'),
        sa.PrimaryKeyConstraint('config_key', name=op.f('pk_run_configs')),
    )
    op.create_index('ix_run_configs_window', 'run_configs', ['model_size_class', 'nodes'])
    # filled from the runs by service/run_configs.rebuild until that module went; 0006 drops the table


def downgrade() -> None:
    op.drop_index('ix_run_configs_window', table_name='run_configs')
    op.drop_table('run_configs')
