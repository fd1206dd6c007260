"""Parallelism degrees tp, pp, cp, ep nullable: a degree the input does not state is NULL, not 1.

Until now an unstated degree was stored as 1 and named in extra.assumed_fields (a guess stored as a
value). From 0008 on it is NULL unless the invariants determine it (service/derive.py), and
everything reading the degrees treats NULL as unknown. Existing rows keep their values; the
downgrade sets NULL back to 1 before restoring NOT NULL.

DuckDB refuses ALTER TABLE on a table with indexes ("Cannot alter entry because there are entries
that depend on it"): its indexes on runs are dropped and re-created around the ALTERs; and its
downgrade writes the 1s in an ALTER ... TYPE INTEGER USING coalesce(col, 1), because DuckDB refuses
SET NOT NULL after an UPDATE in the same transaction.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-24 02:40:00
"""
import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

DEGREES = ("tp", "pp", "cp", "ep")

#: the indexes on runs at 0007 that DuckDB makes us drop around ALTER TABLE; (name, columns, unique)
_DUCKDB_INDEXES = (
    ("ux_runs_run_key", ["run_key"], True),
    ("ix_runs_heatmap", ["model_size_class", "nodes", "status"], False),
    ("ix_runs_fingerprint", ["fingerprint", "started_at"], False),
    ("ix_runs_model_name", ["model_name"], False),
    ("ix_runs_started_at", ["started_at"], False),
)


def _alter(nullable: bool) -> None:
    duckdb = op.get_bind().dialect.name == "duckdb"
    if not nullable and not duckdb:
        for col in DEGREES:
            op.execute(sa.text(f"UPDATE runs SET {col} = 1 WHERE {col} IS NULL"))
    if duckdb:
        for name, _, _ in _DUCKDB_INDEXES:
            op.drop_index(name, table_name='runs')
    for col in DEGREES:
        if not nullable and duckdb:
            # DuckDB refuses SET NOT NULL after an UPDATE in the same transaction ("Cannot create
            # index with outstanding updates"): the NULLs become 1 in the ALTER itself
            op.execute(sa.text(f"ALTER TABLE runs ALTER COLUMN {col} TYPE INTEGER USING coalesce({col}, 1)"))
        op.alter_column('runs', col, existing_type=sa.Integer(), nullable=nullable)
    if duckdb:
        for name, cols, unique in _DUCKDB_INDEXES:
            op.create_index(name, 'runs', cols, unique=unique)


def upgrade() -> None:
    _alter(nullable=True)


def downgrade() -> None:
    _alter(nullable=False)
