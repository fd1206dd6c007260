"""PostgreSQL role for user SQL: scalebook_reader (NOLOGIN, SELECT on runs only).

POST /api/v1/sql runs user queries under `SET LOCAL ROLE scalebook_reader` inside a read-only
transaction (service/analytics/sql.py), so that even a query that got past the parser cannot read
api_tokens, read or write server files, or write anything.

PostgreSQL only; a no-op on DuckDB. Roles are cluster-wide: the role is created once (if missing,
race-safe) and each database grants it SELECT on its own runs table. A migrating user that may not
create roles (neither superuser nor CREATEROLE) skips the role with a warning; the SQL endpoint then
answers 503 with the statements that create it. Downgrade revokes the grants and leaves the role
(other databases of the cluster may use it).

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-23 04:10:00
"""
import logging

import sqlalchemy as sa
from alembic import op

revision = '0002'
down_revision = '0001'
branch_labels = None
depends_on = None

ROLE = "scalebook_reader"
log = logging.getLogger("alembic.runtime.migration")


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    me = bind.execute(sa.text("SELECT rolsuper, rolcreaterole FROM pg_roles WHERE rolname = current_user")).one()
    exists = bind.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": ROLE}).scalar() is not None
    if not exists:
        if not (me.rolsuper or me.rolcreaterole):
            log.warning("cannot create role %s (current user is neither superuser nor CREATEROLE): "
                        "POST /api/v1/sql will answer 503 until it exists", ROLE)
            return
        # concurrent migrations of several databases may race on this cluster-wide object
        op.execute(f"""
            DO $$ BEGIN
                CREATE ROLE {ROLE} NOLOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT NOREPLICATION NOBYPASSRLS;
            EXCEPTION WHEN duplicate_object OR unique_violation THEN NULL;
            END $$""")
    if not me.rolsuper:
        member = bind.execute(sa.text("SELECT pg_has_role(current_user, :r, 'MEMBER')"), {"r": ROLE}).scalar()
        if not member:
            op.execute(f"GRANT {ROLE} TO CURRENT_USER")
    op.execute(f"DO $$ BEGIN EXECUTE format('GRANT USAGE ON SCHEMA %I TO {ROLE}', current_schema()); END $$")
    op.execute(f"GRANT SELECT ON runs TO {ROLE}")
    op.execute(f"REVOKE ALL ON api_tokens, alembic_version FROM {ROLE}")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    if bind.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": ROLE}).scalar() is None:
        return
    op.execute(f"REVOKE ALL ON runs FROM {ROLE}")
    op.execute(f"DO $$ BEGIN EXECUTE format('REVOKE USAGE ON SCHEMA %I FROM {ROLE}', current_schema()); END $$")
