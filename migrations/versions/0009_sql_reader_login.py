"""PostgreSQL: scalebook_reader becomes a LOGIN role used by the user-SQL pool (DESIGN §7).

User SQL no longer runs on the service's connections under `SET LOCAL ROLE` (a superuser or
CREATEROLE session could leave that role with `set_config('role', …)`): it runs on connections logged
in as scalebook_reader itself (service/analytics/sql.py), a role that owns nothing, is a member of no
role, may SELECT runs only and is read-only by default. This revision:

- makes the role LOGIN (with the password in SCALEBOOK_SQL_READER_PASSWORD when set; without one it
  can log in only where pg_hba trusts it, e.g. local trust or peer), CONNECTION LIMIT 16, and
  `default_transaction_read_only = on`, `idle_in_transaction_session_timeout = 60s` for it;
- revokes every privilege it may have on the other tables and sequences of the schema, and grants
  SELECT on runs again (the least privilege of 0002, restated for tables created since).

Needs a superuser or CREATEROLE user (like 0002); otherwise it warns and the SQL endpoint answers 503
naming the statements. PostgreSQL only; a no-op on DuckDB. Downgrade makes the role NOLOGIN again.

Revision ID: 0009
Revises: 0005
Create Date: 2026-11-24 02:00:00
"""
import logging
import os
import time

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

ROLE = "scalebook_reader"
log = logging.getLogger("alembic.runtime.migration")


def _alter_role(bind: sa.Connection, statement: str) -> None:
    """Run one ALTER ROLE; the role is cluster-wide, so another database's upgrade may alter it at
    the same moment ("tuple concurrently updated"): retried a few times inside a savepoint."""
    for attempt in range(6):
        try:
            with bind.begin_nested():
                bind.exec_driver_sql(statement)  # no bind-parameter parsing of a quoted password
            return
        except sa.exc.DBAPIError as exc:
            if "concurrently updated" not in str(exc.orig) or attempt == 5:
                raise
            time.sleep(0.1 * (attempt + 1))


def upgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    me = bind.execute(sa.text("SELECT rolsuper, rolcreaterole FROM pg_roles WHERE rolname = current_user")).one()
    if bind.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": ROLE}).scalar() is None:
        log.warning("role %s is missing: POST /api/v1/sql will answer 503 until it exists", ROLE)
        return
    if me.rolsuper or me.rolcreaterole:
        password = os.environ.get("SCALEBOOK_SQL_READER_PASSWORD")
        with_password = " PASSWORD " + bind.execute(sa.text("SELECT quote_literal(:p)"), {"p": password}).scalar() \
            if password else ""
        _alter_role(bind, f"ALTER ROLE {ROLE} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOREPLICATION NOBYPASSRLS "
                          f"CONNECTION LIMIT 16{with_password}")
        _alter_role(bind, f"ALTER ROLE {ROLE} SET default_transaction_read_only = on")
        _alter_role(bind, f"ALTER ROLE {ROLE} SET idle_in_transaction_session_timeout = '60s'")
    else:
        log.warning("cannot make role %s LOGIN (current user is neither superuser nor CREATEROLE): "
                    "POST /api/v1/sql will answer 503 until it can log in", ROLE)
    op.execute(f"""
        DO $$ BEGIN
            EXECUTE format('REVOKE ALL ON ALL TABLES IN SCHEMA %I FROM {ROLE}', current_schema());
            EXECUTE format('REVOKE ALL ON ALL SEQUENCES IN SCHEMA %I FROM {ROLE}', current_schema());
            EXECUTE format('REVOKE CREATE ON SCHEMA %I FROM {ROLE}', current_schema());
        END $$""")
    op.execute(f"GRANT SELECT ON runs TO {ROLE}")


def downgrade() -> None:
    bind = op.get_bind()
    if bind.dialect.name != "postgresql":
        return
    if bind.execute(sa.text("SELECT 1 FROM pg_roles WHERE rolname = :r"), {"r": ROLE}).scalar() is None:
        return
    me = bind.execute(sa.text("SELECT rolsuper, rolcreaterole FROM pg_roles WHERE rolname = current_user")).one()
    if me.rolsuper or me.rolcreaterole:
        op.execute(f"ALTER ROLE {ROLE} NOLOGIN")
