"""Initial schema: the runs table (DESIGN §2) and api_tokens.

Revision ID: 0001
Revises:
Create Date: 2026-11-23 03:40:56.655390
"""
import sqlalchemy as sa
from alembic import op

revision = '0001'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    # DuckDB has no IDENTITY columns: ids come from sequences (created first, dropped last).
    op.execute(sa.schema.CreateSequence(sa.Sequence("api_tokens_id_seq")))
    op.execute(sa.schema.CreateSequence(sa.Sequence("runs_id_seq")))
    op.create_table('api_tokens',
    sa.Column('id', sa.BigInteger(), server_default=sa.text("nextval('api_tokens_id_seq')"), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('scope', sa.String(length=16), nullable=False),
    sa.Column('token_hash', sa.String(length=64), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('created_at', sa.DateTime(), nullable=False),
    sa.Column('revoked_at', sa.DateTime(), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_tokens'))
    )
    op.create_index('ux_api_tokens_token_hash', 'api_tokens', ['token_hash'], unique=True)
    op.create_table('runs',
    sa.Column('id', sa.BigInteger(), server_default=sa.text("nextval('runs_id_seq')"), nullable=False),
    sa.Column('run_key', sa.String(length=200), nullable=False),
    sa.Column('content_hash', sa.String(length=64), nullable=False),
    sa.Column('ingested_at', sa.DateTime(), nullable=False),
    sa.Column('name', sa.Text(), nullable=True),
    sa.Column('started_at', sa.DateTime(), nullable=True),
    sa.Column('source', sa.String(length=64), nullable=False),
    sa.Column('model_name', sa.String(length=200), nullable=True),
    sa.Column('model_params', sa.BigInteger(), nullable=True),
    sa.Column('num_layers', sa.Integer(), nullable=True),
    sa.Column('hidden_size', sa.Integer(), nullable=True),
    sa.Column('num_heads', sa.Integer(), nullable=True),
    sa.Column('num_kv_heads', sa.Integer(), nullable=True),
    sa.Column('ffn_hidden_size', sa.Integer(), nullable=True),
    sa.Column('vocab_size', sa.Integer(), nullable=True),
    sa.Column('seq_len', sa.Integer(), nullable=True),
    sa.Column('gpu_type', sa.String(length=100), nullable=True),
    sa.Column('gpus_per_node', sa.Integer(), nullable=True),
    sa.Column('nodes', sa.Integer(), nullable=True),
    sa.Column('world_size', sa.Integer(), nullable=True),
    sa.Column('dp', sa.Integer(), nullable=True),
    sa.Column('tp', sa.Integer(), nullable=False),
    sa.Column('pp', sa.Integer(), nullable=False),
    sa.Column('cp', sa.Integer(), nullable=False),
    sa.Column('ep', sa.Integer(), nullable=False),
    sa.Column('zero_stage', sa.Integer(), nullable=True),
    sa.Column('micro_batch_size', sa.Integer(), nullable=True),
    sa.Column('grad_accum_steps', sa.Integer(), nullable=True),
    sa.Column('global_batch_tokens', sa.BigInteger(), nullable=True),
    sa.Column('recompute', sa.String(length=16), nullable=True),
    sa.Column('precision', sa.String(length=32), nullable=True),
    sa.Column('framework', sa.String(length=200), nullable=True),
    sa.Column('framework_version', sa.String(length=100), nullable=True),
    sa.Column('torch_version', sa.String(length=100), nullable=True),
    sa.Column('cuda_version', sa.String(length=100), nullable=True),
    sa.Column('nccl_version', sa.String(length=100), nullable=True),
    sa.Column('status', sa.String(length=16), nullable=False),
    sa.Column('tokens_per_sec_per_gpu', sa.Double(), nullable=True),
    sa.Column('tflops_per_gpu', sa.Double(), nullable=True),
    sa.Column('mfu', sa.Double(), nullable=True),
    sa.Column('hfu', sa.Double(), nullable=True),
    sa.Column('peak_memory_gib', sa.Double(), nullable=True),
    sa.Column('reserved_memory_gib', sa.Double(), nullable=True),
    sa.Column('step_time_s', sa.Double(), nullable=True),
    sa.Column('error_class', sa.String(length=64), nullable=True),
    sa.Column('error_message', sa.Text(), nullable=True),
    sa.Column('extra', sa.JSON(), nullable=True),
    sa.Column('model_size_class', sa.Double(), nullable=True),
    sa.Column('mfu_derived', sa.Double(), nullable=True),
    sa.Column('hfu_derived', sa.Double(), nullable=True),
    sa.Column('mfu_method', sa.String(length=64), nullable=True),
    sa.Column('peak_tflops', sa.Double(), nullable=True),
    sa.Column('fingerprint', sa.String(length=64), nullable=True),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_runs'))
    )
    op.create_index('ix_runs_fingerprint', 'runs', ['fingerprint', 'started_at'], unique=False)
    op.create_index('ix_runs_heatmap', 'runs', ['model_size_class', 'nodes', 'status'], unique=False)
    op.create_index('ix_runs_model_name', 'runs', ['model_name'], unique=False)
    op.create_index('ix_runs_started_at', 'runs', ['started_at'], unique=False)
    op.create_index('ux_runs_run_key', 'runs', ['run_key'], unique=True)


def downgrade() -> None:
    op.drop_index('ux_runs_run_key', table_name='runs')
    op.drop_index('ix_runs_started_at', table_name='runs')
    op.drop_index('ix_runs_model_name', table_name='runs')
    op.drop_index('ix_runs_heatmap', table_name='runs')
    op.drop_index('ix_runs_fingerprint', table_name='runs')
    op.drop_table('runs')
    op.drop_index('ux_api_tokens_token_hash', table_name='api_tokens')
    op.drop_table('api_tokens')
    op.execute(sa.schema.DropSequence(sa.Sequence("runs_id_seq")))
    op.execute(sa.schema.DropSequence(sa.Sequence("api_tokens_id_seq")))
