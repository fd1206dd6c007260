"""PostgreSQL: an index that answers the heatmap's per-cell counts by an index-only scan.

The heatmap (service/analytics/heatmap.py, `_cells_lateral`) counts each cell's runs by status
(GROUP BY model_size_class, nodes over the live runs) before its LATERAL top-1 per cell. ix_runs_heatmap
(0001) has the key but not retired_at, so PostgreSQL read the whole table: at 10^6 runs a parallel
seq scan of ~80,000 pages, ~300 ms of a 350 ms request (bench/RESULTS.md). ix_runs_cells holds the
key and the live-runs predicate of that query (and the two columns of the dashboard's default slice,
gpu_type and seq_len, as INCLUDE so a filtered count is an index-only scan too):
(model_size_class, nodes, status) INCLUDE (gpu_type, seq_len) WHERE retired_at IS NULL AND
model_size_class IS NOT NULL AND nodes IS NOT NULL. Measured at 10^6 runs: the count ~300 ms → ~60 ms.

PostgreSQL only (DuckDB answers the same aggregate from its columnar scan); a no-op on DuckDB.

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


def upgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.create_index("ix_runs_cells", "runs", ["model_size_class", "nodes", "status"],
                        postgresql_include=["gpu_type", "seq_len"], postgresql_where=LIVE_CELLS)


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_runs_cells", table_name="runs")
