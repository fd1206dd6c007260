"""Drop run_configs and run_configs_state: the per-configuration summary is computed per request.

The summary was kept in step with `runs` by the ingest path (merged on PostgreSQL, folded every
20,000 runs behind an id watermark on DuckDB). The recommender now reads `runs` per request, so
nothing reads or writes these tables; `runs` and `api_tokens` are untouched. Downgrade recreates
the two tables empty (revision 0005's code refilled run_configs with `scalebook db rebuild-configs`).

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-24 01:30:00
"""
import importlib

from alembic import op

revision = '0006'
down_revision = '0005'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index('ix_run_configs_window', table_name='run_configs')
    op.drop_table('run_configs')
    op.drop_table('run_configs_state')


def downgrade() -> None:
    for name in ('0004_run_configs', '0005_run_configs_state'):
        importlib.import_module(f'migrations.versions.{name}').upgrade()
