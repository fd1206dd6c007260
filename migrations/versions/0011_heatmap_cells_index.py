"""PostgreSQL: indexes for the heatmap at 10^6 runs — its per-cell counts by an index-only scan, and
its best run per cell on the dashboard's default slice.

The heatmap (service/analytics/heatmap.py, `_cells_lateral`) counts each cell's runs by status
(GROUP BY model_size_class, nodes over the live runs) before its LATERAL top-1 per cell. ix_runs_heatmap
(0001) has the key but not retired_at, so PostgreSQL read the whole table: at 10^6 runs a parallel
seq scan of ~80,000 pages, ~300 ms of a 350 ms request (bench/RESULTS.md). ix_runs_cells holds the
key and the live-runs predicate of that query (and the two columns of the dashboard's default slice,
gpu_type and seq_len, as INCLUDE so a filtered count is an index-only scan too):
(model_size_class, nodes, status) INCLUDE (gpu_type, seq_len) WHERE retired_at IS NULL AND
model_size_class IS NOT NULL AND nodes IS NOT NULL. Measured at 10^6 runs: the count ~300 ms → ~60 ms.

The best run per cell is a LATERAL top-1 walking ix_runs_best_tps (0003), keyed (model_size_class,
nodes, tokens/s …). Filtered to a slice (gpu_type, seq_len: the dashboard's default view), each
cell's walk skipped every run of other slices on the heap: ~800 per cell, 3 ms × 125 cells at 10^6
runs, 456 ms in all. ix_runs_best_tps_slice leads with the slice, (gpu_type, seq_len,
model_size_class, nodes, tokens_per_sec_per_gpu DESC NULLS LAST, COALESCE(mfu_derived, mfu) DESC
NULLS LAST, id) WHERE status = 'success', so that top-1 is one index probe: 133 ms in all. Ranked
by MFU the filtered view still walks ix_runs_best_mfu (tokens/s is the default metric).

PostgreSQL only (DuckDB answers the same queries from its columnar scan); a no-op on DuckDB.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-24 05:45:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None

LIVE_CELLS = sa.text("retired_at IS NULL AND model_size_class IS NOT NULL AND nodes IS NOT NULL")
SUCCESS = sa.text("status = 'success'")


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.create_index("ix_runs_cells", "runs", ["model_size_class", "nodes", "status"],
                        postgresql_include=["gpu_type", "seq_len"], postgresql_where=LIVE_CELLS)
        op.create_index("ix_runs_best_tps_slice", "runs",
                        ["gpu_type", "seq_len", "model_size_class", "nodes",
                         sa.text("tokens_per_sec_per_gpu DESC NULLS LAST"),
                         sa.text("COALESCE(mfu_derived, mfu) DESC NULLS LAST"), "id"],
                        postgresql_where=SUCCESS)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_runs_best_tps_slice", table_name="runs")
        op.drop_index("ix_runs_cells", table_name="runs")
