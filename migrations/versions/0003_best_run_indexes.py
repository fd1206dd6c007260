"""PostgreSQL partial indexes for the heatmap and the recommender (performance).

`GET /api/v1/heatmap` picks, per (model_size_class, nodes) cell, the successful run with the highest
metric. On PostgreSQL that is a LATERAL top-1 per cell (service/analytics/heatmap.py); these indexes
make each top-1 read one index entry instead of every successful run of the cell (~20 ms for
the 436 cells of 10^6 runs, instead of ~650 ms):

- ix_runs_best_tps: (model_size_class, nodes, tokens_per_sec_per_gpu DESC NULLS LAST,
  COALESCE(mfu_derived, mfu) DESC NULLS LAST, id) WHERE status = 'success'
- ix_runs_best_mfu: (model_size_class, nodes, COALESCE(mfu_derived, mfu) DESC NULLS LAST, id)
  WHERE status = 'success'

Each key is the heatmap's full ranking (metric, then MFU, then id), so the top-1 is the first
entry of the cell even where many runs tie (e.g. published rows without a throughput).

`GET /api/v1/recommend` aggregates the successful runs of a size/node window by configuration
(service/analytics/recommend.py). ix_runs_config covers that aggregate and is ordered by its
GROUP BY key, so PostgreSQL reads it with an index-only scan (~150 bytes per run instead of the
table rows) and groups the presorted entries without hashing (~170 ms for 4.6·10^5 runs):

- ix_runs_config: (model_size_class, nodes, gpus_per_node, gpu_type, seq_len, dp, tp, pp, cp, ep,
  zero_stage, micro_batch_size, grad_accum_steps, recompute) INCLUDE (the metric columns, id)
  WHERE status = 'success'
- ix_runs_oom: (model_size_class) INCLUDE (the sharding columns) WHERE status = 'oom': the recorded
  OOMs of the target's size class that veto adapted configurations

PostgreSQL only (partial and expression indexes): a no-op on DuckDB, whose heatmap is one columnar
scan with arg_min and which cannot use such indexes.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-23 04:30:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0003'
down_revision = '0002'
branch_labels = None
depends_on = None

SUCCESS = sa.text("status = 'success'")


#: the recommender's GROUP BY key (service.analytics.recommend.GROUP_FIELDS, same order) and
#: the columns its aggregate reads besides
CONFIG_KEY = ["model_size_class", "nodes", "gpus_per_node", "gpu_type", "seq_len", "dp", "tp", "pp", "cp", "ep",
              "zero_stage", "micro_batch_size", "grad_accum_steps", "recompute"]
CONFIG_INCLUDE = ["tokens_per_sec_per_gpu", "mfu_derived", "mfu", "global_batch_tokens", "peak_memory_gib", "id"]

#: columns of the recorded OOMs the recommender checks candidates against
OOM_INCLUDE = ["tp", "pp", "cp", "zero_stage", "micro_batch_size", "recompute", "seq_len", "dp"]


def upgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.create_index("ix_runs_best_tps", "runs",
                    ["model_size_class", "nodes", sa.text("tokens_per_sec_per_gpu DESC NULLS LAST"),
                     sa.text("COALESCE(mfu_derived, mfu) DESC NULLS LAST"), "id"],
                    postgresql_where=SUCCESS)
    op.create_index("ix_runs_best_mfu", "runs",
                    ["model_size_class", "nodes", sa.text("COALESCE(mfu_derived, mfu) DESC NULLS LAST"), "id"],
                    postgresql_where=SUCCESS)
    op.create_index("ix_runs_config", "runs", CONFIG_KEY, postgresql_include=CONFIG_INCLUDE,
                    postgresql_where=SUCCESS)
    op.create_index("ix_runs_oom", "runs", ["model_size_class"], postgresql_include=OOM_INCLUDE,
                    postgresql_where=sa.text("status = 'oom'"))


def downgrade() -> None:
    if op.get_bind().dialect.name != "postgresql":
        return
    op.drop_index("ix_runs_oom", table_name="runs")
    op.drop_index("ix_runs_config", table_name="runs")
    op.drop_index("ix_runs_best_mfu", table_name="runs")
    op.drop_index("ix_runs_best_tps", table_name="runs")
