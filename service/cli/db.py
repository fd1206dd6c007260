"""`scalebook db …`: schema management.

service.db (SQLAlchemy, duckdb_engine, Alembic: ~1 s of imports) is imported by each command, not by
this module: every `scalebook` command loads this module, and the client commands never touch the
database."""

from __future__ import annotations

import typer

from service.cli.base import app, console, fail
from service.errors import ScalebookError
from service.settings import get_settings

db_app = typer.Typer(help="Database schema: upgrade, current revision, check, rebuild-configs.", no_args_is_help=True)
app.add_typer(db_app, name="db")


@db_app.command("upgrade")
def upgrade(revision: str = typer.Argument("head", help="target Alembic revision")) -> None:
    """Run the Alembic migrations on SCALEBOOK_DATABASE_URL (default: the embedded DuckDB file)."""
    from service.db import Database

    url = get_settings().url
    db = Database(url)
    try:
        db.wait_until_ready(timeout_s=30)
        db.upgrade(revision)
        shown = db.engine.url.render_as_string(hide_password=True)
        console.print(f"database {shown} at revision {db.current_revision()}")
    except ScalebookError as exc:
        fail(exc.message)
    finally:
        db.dispose()


@db_app.command("current")
def current() -> None:
    """Print the database's revision and the code's head revision."""
    from service.db import Database

    db = Database(get_settings().url)
    try:
        console.print(f"current: {db.current_revision()}  head: {db.head_revision()}")
    finally:
        db.dispose()


@db_app.command("check")
def check() -> None:
    """Exit 1 with the fixing command when the schema is not at head."""
    from service.db import Database

    db = Database(get_settings().url)
    try:
        db.check_schema()
        console.print("schema is at head")
    except ScalebookError as exc:
        fail(exc.message)
    finally:
        db.dispose()


@db_app.command("rebuild-configs")
def rebuild_configs() -> None:
    """Rebuild run_configs (the per-configuration summary of the successful runs) and run_cells (the
    finished runs grouped for the recommender's cell queries) from `runs`.

    Every scalebook write keeps it in its own transaction; this is for runs changed with outside
    SQL (DELETE/UPDATE on `runs` behind scalebook's back), after which /recommend and /suggest would
    read a summary that no longer matches the runs."""
    from service import run_cells, run_configs
    from service.db import Database

    db = Database(get_settings().url)
    try:
        db.check_schema()
        with db.session(write=True) as session:
            n = run_configs.rebuild(session)
            cells = run_cells.rebuild(session)
        console.print(f"run_configs rebuilt: {n:,} configurations; run_cells: {cells:,} groups")
    except ScalebookError as exc:
        fail(exc.message)
    finally:
        db.dispose()
