"""Operations commands: `scalebook token create|list|revoke` and `scalebook bench`.

Token commands go through the API (SCALEBOOK_API_URL, authenticated with SCALEBOOK_TOKEN), because
a DuckDB file is owned by the process serving it. `--direct` works on SCALEBOOK_DATABASE_URL (or
the embedded DuckDB file) instead, for when no server runs — e.g. to create the first admin token
before `scalebook serve --host 0.0.0.0`.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import typer
from rich.table import Table

from service.cli.base import app, call, console, err_console, fail, print_json
from service.cli.progress import QUIET, progress

token_app = typer.Typer(help="API tokens: create (shown once), list, revoke.", no_args_is_help=True)
app.add_typer(token_app, name="token")

_DIRECT = typer.Option(False, "--direct", help="operate on SCALEBOOK_DATABASE_URL directly (no server running)")
_JSON = typer.Option(False, "--json", help="print JSON")


def _open_direct():
    """The database named by the settings, prepared (DuckDB migrated, PostgreSQL schema checked).

    Fails with a readable message when the DuckDB file is held by a running server."""
    from service.db import Database
    from service.errors import ScalebookError
    from service.settings import get_settings

    db = Database(get_settings().url)
    try:
        with db.engine.connect():
            pass
    except Exception as exc:  # noqa: BLE001 - any connect failure is reported the same way
        db.dispose()
        hint = (" (the DuckDB file is in use: a server owns it; drop --direct to go through its API)"
                if "lock" in str(exc).lower() else "")
        fail(f"cannot open {get_settings().url}{hint}: {getattr(exc, 'orig', exc)}")
    try:
        db.prepare()
    except ScalebookError as exc:
        db.dispose()
        fail(exc.message)
    return db


def _token_dict(row: Any, plain: str | None = None) -> dict[str, Any]:
    out = {"id": row.id, "name": row.name, "scope": row.scope, "prefix": row.prefix,
           "created_at": row.created_at.isoformat(),
           "revoked_at": row.revoked_at.isoformat() if row.revoked_at else None}
    if plain is not None:
        out["token"] = plain
        out.pop("revoked_at")
    return out


@token_app.command("create")
def token_create(
    scope: str = typer.Option(..., "--scope", help="read | write | admin"),
    name: str = typer.Option(None, "--name", help="free text (default: '<scope> token')"),
    direct: bool = _DIRECT,
    as_json: bool = _JSON,
) -> None:
    """Create a token and print it ONCE (only its hash is stored).

    Prints the plain token alone on stdout (so `export SCALEBOOK_TOKEN=$(scalebook token create
    --scope write)` works); the id and scope go to stderr. --json prints the whole record.
    """
    if scope not in ("read", "write", "admin"):
        fail(f"--scope must be read, write or admin, got '{scope}'", code=2)
    name = name or f"{scope} token"
    if direct:
        from service import auth

        db = _open_direct()
        try:
            with db.session(write=True) as session:
                row, plain = auth.create_token(session, name, scope)
                body = _token_dict(row, plain)
        finally:
            db.dispose()
    else:
        body = call("POST", "/tokens", json={"name": name, "scope": scope})
    if as_json:
        print_json(body)
        return
    sys.stdout.write(body["token"] + "\n")
    err_console.print(f"token {body['id']} '{body['name']}' (scope {body['scope']}) created; "
                      "it is shown once: store it now (SCALEBOOK_TOKEN)")


@token_app.command("list")
def token_list(direct: bool = _DIRECT, as_json: bool = _JSON) -> None:
    """List tokens (id, name, scope, prefix, created, revoked); never the secrets."""
    if direct:
        from service import auth

        db = _open_direct()
        try:
            with db.session() as session:
                tokens = [_token_dict(t) for t in auth.list_tokens(session)]
        finally:
            db.dispose()
    else:
        tokens = call("GET", "/tokens")["tokens"]
    if as_json:
        print_json(tokens)
        return
    if not tokens:
        console.print("no tokens: the API is open to anyone who can reach it")
        return
    table = Table()
    for col in ("id", "name", "scope", "prefix", "created", "revoked"):
        table.add_column(col)
    for t in tokens:
        table.add_row(str(t["id"]), t["name"], t["scope"], t["prefix"] + "…", str(t["created_at"])[:19],
                      str(t["revoked_at"])[:19] if t.get("revoked_at") else "")
    console.print(table)


@token_app.command("revoke")
def token_revoke(token_id: int = typer.Argument(..., help="the token's id (see `scalebook token list`)"),
                 direct: bool = _DIRECT, as_json: bool = _JSON) -> None:
    """Revoke a token: requests carrying it get 401 from then on."""
    if direct:
        from service import auth
        from service.errors import ScalebookError

        db = _open_direct()
        try:
            with db.session(write=True) as session:
                body = _token_dict(auth.revoke_token(session, token_id))
        except ScalebookError as exc:
            fail(exc.message)
        finally:
            db.dispose()
    else:
        body = call("DELETE", f"/tokens/{token_id}")
    if as_json:
        print_json(body)
        return
    console.print(f"token {body['id']} '{body['name']}' revoked at {str(body['revoked_at'])[:19]}")


@app.command("bench")
def bench(
    runs: int = typer.Option(100_000, "--runs", min=1, help="how many synthetic runs to store"),
    backend: str = typer.Option("duckdb", "--backend", help="duckdb | postgres"),
    as_json: bool = typer.Option(False, "--json", help="print only the JSON result"),
    keep: bool = typer.Option(False, "--keep", help="keep the database (its URL is printed)"),
    pg_url: str = typer.Option("postgresql://postgres@127.0.0.1:5432/postgres", "--pg-url",
                               help="PostgreSQL server to create the bench database on (postgres backend)"),
    seed: int = typer.Option(0, "--seed", help="generator seed"),
    single_posts: int = typer.Option(500, "--single-posts", min=1, help="single POSTs timed for p50/p99"),
    query_calls: int = typer.Option(20, "--query-calls", min=1, help="heatmap/recommend calls timed (median)"),
    database: str = typer.Option(None, "--database",
                                 help="time an existing database instead (e.g. grown to 10^6 runs by bench/grow.py): "
                                      "migrated to head, kept; no batched ingest, --runs ignored"),
    quiet: bool = QUIET,
) -> None:
    """Benchmark a real `scalebook serve` on a fresh database with N realistic synthetic runs.

    Ingests through the API in batches of 1,000, then times single POSTs and heatmap/recommend
    calls (client-side wall time). Prints one JSON object: backend, stored_runs,
    ingest_batch_runs_per_s, ingest_single_post_p50_ms, ingest_single_post_p99_ms, heatmap_ms,
    recommend_ms (plus details). Exits 1 when the server cannot be started.
    """
    from service.cli import benchmark as benchtool

    if backend in ("postgresql", "pg"):
        backend = "postgres"
    if backend not in ("duckdb", "postgres"):
        fail(f"--backend must be duckdb or postgres, got '{backend}'", code=2)
    log = (lambda msg: None) if as_json else (lambda msg: err_console.print(msg))
    try:
        if database:
            backend = "postgres" if database.startswith("postgres") else "duckdb"
        result = benchtool.run_bench(runs, backend, keep=keep, pg_url=pg_url, seed=seed, database=database or None,
                                     single_posts=single_posts, query_calls=query_calls, log=log,
                                     progress=lambda what, total: progress(what, total, quiet=quiet))
    except benchtool.BenchError as exc:
        fail(str(exc))
    sys.stdout.write(json.dumps(result) + "\n")
