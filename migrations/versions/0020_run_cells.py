"""run_cells: the finished, not retired runs grouped by what the recommender's cell queries read, kept in
the write transaction.

One row per group (service/run_cells.CELL_COLS: GPU type, size class, MoE flag, nodes, GPUs per node,
seq_len, status, error class, the model, framework, precision and layout) of the runs not running and not
retired: n_runs, the lowest id, the best run (tokens/s/GPU, then MFU, descending NULLs last, then the
lower id) with what an answer shows of it, and the run with the highest tokens/s/GPU > 0. Keyed by
cell_key = md5 of the group's values as text (NULL as `\\N`, the size class in millionths). From this
revision on every write path keeps it in the transaction that changes the runs (service/run_cells.py);
filled here from the runs stored. /recommend and /suggest answer their questions about the target's cell
from it instead of scanning `runs` (issue 25 item 4).

The SQL here is a frozen copy of service/run_cells.py's at this revision (a migration does not follow
later code).

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-26 19:50:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0020'
down_revision = '0019'
branch_labels = None
depends_on = None

_FILL = (
    'INSERT INTO run_cells (cell_key, gpu_type, model_size_class, is_moe, nodes, gpus_per_node, seq_len, '
    'status, error_class, model_params, num_layers, hidden_size, num_heads, num_kv_heads, ffn_hidden_size'
    ', vocab_size, gated_linear_unit, framework, precision, dp, tp, pp, cp, ep, zero_stage, micro_batch_s'
    'ize, grad_accum_steps, recompute, n_runs, min_id, best_id, best_tps, best_mfu, best_model_name, best'
    "_source, best_peak_memory_gib, best_global_batch_tokens, top_id) SELECT md5(concat_ws('|', coalesce("
    "CAST(gpu_type AS VARCHAR), '\\N'), coalesce(CAST(CAST(round(model_size_class * 1000000) AS BIGINT) AS"
    " VARCHAR), '\\N'), coalesce(CAST(coalesce(is_moe, false) AS VARCHAR), '\\N'), coalesce(CAST(nodes AS V"
    "ARCHAR), '\\N'), coalesce(CAST(gpus_per_node AS VARCHAR), '\\N'), coalesce(CAST(seq_len AS VARCHAR), '"
    "\\N'), coalesce(CAST(status AS VARCHAR), '\\N'), coalesce(CAST(error_class AS VARCHAR), '\\N'), coalesc"
    "e(CAST(model_params AS VARCHAR), '\\N'), coalesce(CAST(num_layers AS VARCHAR), '\\N'), coalesce(CAST(h"
    "idden_size AS VARCHAR), '\\N'), coalesce(CAST(num_heads AS VARCHAR), '\\N'), coalesce(CAST(num_kv_head"
    "s AS VARCHAR), '\\N'), coalesce(CAST(ffn_hidden_size AS VARCHAR), '\\N'), coalesce(CAST(vocab_size AS "
    "VARCHAR), '\\N'), coalesce(CAST(gated_linear_unit AS VARCHAR), '\\N'), coalesce(CAST(framework AS VARC"
    "HAR), '\\N'), coalesce(CAST(precision AS VARCHAR), '\\N'), coalesce(CAST(dp AS VARCHAR), '\\N'), coales"
    "ce(CAST(tp AS VARCHAR), '\\N'), coalesce(CAST(pp AS VARCHAR), '\\N'), coalesce(CAST(cp AS VARCHAR), '\\"
    "N'), coalesce(CAST(ep AS VARCHAR), '\\N'), coalesce(CAST(zero_stage AS VARCHAR), '\\N'), coalesce(CAST"
    "(micro_batch_size AS VARCHAR), '\\N'), coalesce(CAST(grad_accum_steps AS VARCHAR), '\\N'), coalesce(CA"
    "ST(recompute AS VARCHAR), '\\N'))) AS k, gpu_type, model_size_class, coalesce(is_moe, false) AS is_mo"
    'e, nodes, gpus_per_node, seq_len, status, error_class, model_params, num_layers, hidden_size, num_he'
    'ads, num_kv_heads, ffn_hidden_size, vocab_size, gated_linear_unit, framework, precision, dp, tp, pp,'
    ' cp, ep, zero_stage, micro_batch_size, grad_accum_steps, recompute, count(*), min(id), (array_agg(id'
    ' ORDER BY tokens_per_sec_per_gpu DESC NULLS LAST, coalesce(mfu_derived, mfu) DESC NULLS LAST, id))[1'
    '], (array_agg(tokens_per_sec_per_gpu ORDER BY tokens_per_sec_per_gpu DESC NULLS LAST, coalesce(mfu_d'
    'erived, mfu) DESC NULLS LAST, id))[1], (array_agg(coalesce(mfu_derived, mfu) ORDER BY tokens_per_sec'
    '_per_gpu DESC NULLS LAST, coalesce(mfu_derived, mfu) DESC NULLS LAST, id))[1], (array_agg(model_name'
    ' ORDER BY tokens_per_sec_per_gpu DESC NULLS LAST, coalesce(mfu_derived, mfu) DESC NULLS LAST, id))[1'
    '], (array_agg(source ORDER BY tokens_per_sec_per_gpu DESC NULLS LAST, coalesce(mfu_derived, mfu) DES'
    'C NULLS LAST, id))[1], (array_agg(peak_memory_gib ORDER BY tokens_per_sec_per_gpu DESC NULLS LAST, c'
    'oalesce(mfu_derived, mfu) DESC NULLS LAST, id))[1], (array_agg(global_batch_tokens ORDER BY tokens_p'
    'er_sec_per_gpu DESC NULLS LAST, coalesce(mfu_derived, mfu) DESC NULLS LAST, id))[1], (array_agg(id O'
    'RDER BY tokens_per_sec_per_gpu DESC, id) FILTER (WHERE tokens_per_sec_per_gpu > 0))[1] FROM runs WHE'
    "RE retired_at IS NULL AND status <> 'running' AND TRUE GROUP BY gpu_type, model_size_class, coalesce"
    '(is_moe, false), nodes, gpus_per_node, seq_len, status, error_class, model_params, num_layers, hidde'
    'n_size, num_heads, num_kv_heads, ffn_hidden_size, vocab_size, gated_linear_unit, framework, precisio'
    'n, dp, tp, pp, cp, ep, zero_stage, micro_batch_size, grad_accum_steps, recompute'
)


def upgrade() -> None:
    op.create_table(
        'run_cells',
        sa.Column('cell_key', sa.String(length=32), nullable=False),
        sa.Column('gpu_type', sa.String(length=100), nullable=True),
        sa.Column('model_size_class', sa.Double(), nullable=True),
        sa.Column('is_moe', sa.Boolean(), nullable=False),
        sa.Column('nodes', sa.Integer(), nullable=True),
        sa.Column('gpus_per_node', sa.Integer(), nullable=True),
        sa.Column('seq_len', sa.Integer(), nullable=True),
        sa.Column('status', sa.String(length=16), nullable=False),
        sa.Column('error_class', sa.String(length=64), nullable=True),
        sa.Column('model_params', sa.BigInteger(), nullable=True),
        sa.Column('num_layers', sa.Integer(), nullable=True),
        sa.Column('hidden_size', sa.Integer(), nullable=True),
        sa.Column('num_heads', sa.Integer(), nullable=True),
        sa.Column('num_kv_heads', sa.Integer(), nullable=True),
        sa.Column('ffn_hidden_size', sa.Integer(), nullable=True),
        sa.Column('vocab_size', sa.Integer(), nullable=True),
        sa.Column('gated_linear_unit', sa.Boolean(), nullable=True),
        sa.Column('framework', sa.String(length=200), nullable=True),
        sa.Column('precision', sa.String(length=32), nullable=True),
        sa.Column('dp', sa.Integer(), nullable=True),
        sa.Column('tp', sa.Integer(), nullable=True),
        sa.Column('pp', sa.Integer(), nullable=True),
        sa.Column('cp', sa.Integer(), nullable=True),
        sa.Column('ep', sa.Integer(), nullable=True),
        sa.Column('zero_stage', sa.Integer(), nullable=True),
        sa.Column('micro_batch_size', sa.Integer(), nullable=True),
        sa.Column('grad_accum_steps', sa.Integer(), nullable=True),
        sa.Column('recompute', sa.String(length=16), nullable=True),
        sa.Column('n_runs', sa.BigInteger(), nullable=False),
        sa.Column('min_id', sa.BigInteger(), nullable=False),
        sa.Column('best_id', sa.BigInteger(), nullable=False),
        sa.Column('best_tps', sa.Double(), nullable=True),
        sa.Column('best_mfu', sa.Double(), nullable=True),
        sa.Column('best_model_name', sa.String(length=200), nullable=True),
        sa.Column('best_source', sa.String(length=64), nullable=True),
        sa.Column('best_peak_memory_gib', sa.Double(), nullable=True),
        sa.Column('best_global_batch_tokens', sa.BigInteger(), nullable=True),
        sa.Column('top_id', sa.BigInteger(), nullable=True),
        sa.PrimaryKeyConstraint('cell_key', name=op.f('pk_run_cells')),
    )
    op.execute(sa.text(_FILL))


def downgrade() -> None:
    op.drop_table('run_cells')
