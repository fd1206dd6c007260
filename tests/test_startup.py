"""Start-up: an embedded DuckDB is migrated by the server itself; a stale PostgreSQL schema makes
the server refuse to start with the command that fixes it; `scalebook db upgrade` fixes it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import httpx
import pytest
from conftest import create_pg_database, drop_pg_database, free_port

from service.db import Database
from service.errors import StaleSchema

SCALEBOOK = [sys.executable, "-m", "service.cli"]


def run_cli(args, env, timeout=60):
    return subprocess.run([*SCALEBOOK, *args], env={**os.environ, **env}, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.integration
def test_stale_postgres_schema_refused_then_fixed(worker_tag):
    name = f"sbstale_{worker_tag}"
    url = create_pg_database(name)
    try:
        db = Database(url)
        with pytest.raises(StaleSchema) as err:
            db.prepare()
        assert "scalebook db upgrade" in str(err.value.message)
        db.dispose()
        env = {"SCALEBOOK_DATABASE_URL": url}
        refused = run_cli(["serve", "--port", str(free_port())], env)
        assert refused.returncode != 0
        assert "scalebook db upgrade" in refused.stderr + refused.stdout
        upgraded = run_cli(["db", "upgrade"], env)
        assert upgraded.returncode == 0, upgraded.stderr
        check = run_cli(["db", "check"], env)
        assert check.returncode == 0 and "head" in check.stdout
    finally:
        drop_pg_database(name)


@pytest.mark.integration
def test_embedded_duckdb_is_migrated_by_serve(tmp_path):
    port = free_port()
    env = {**os.environ, "SCALEBOOK_DATA_DIR": str(tmp_path / "data")}
    env.pop("SCALEBOOK_DATABASE_URL", None)
    proc = subprocess.Popen([*SCALEBOOK, "serve", "--port", str(port)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                body = httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).json()
                break
            except httpx.TransportError:
                assert proc.poll() is None, proc.stdout.read()
                assert time.monotonic() < deadline
                time.sleep(0.2)
        assert body["backend"] == "duckdb" and body["schema_revision"]
        assert (tmp_path / "data" / "scalebook.duckdb").exists()
    finally:
        proc.terminate()
        proc.wait(timeout=10)
