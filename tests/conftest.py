"""Shared fixtures: every database test runs on a real DuckDB file AND a real PostgreSQL.

- `backend` is parametrised over "duckdb" and "postgresql"; `database` is a migrated, empty
  `service.db.Database` on that backend (DuckDB: a copy of a migrated template file in tmp_path;
  PostgreSQL: a per-worker database, truncated before each test).
- PostgreSQL comes from SCALEBOOK_TEST_PG_URL (default postgresql+psycopg://postgres@127.0.0.1:5432/postgres).
  It is required: a missing server fails the run (CI must test both backends), it is never skipped.
- `live_api` serves the app on a free loopback port in a thread, for CLI, client and dashboard tests.
"""

from __future__ import annotations

import os
import shutil
import socket
import threading
import time
from pathlib import Path

import pytest
import sqlalchemy as sa
import uvicorn

from service.api import create_app
from service.db import Database
from service.settings import Settings
from service.tables import Base

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN_URL = os.environ.get("SCALEBOOK_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")


def shared_data_dir() -> Path:
    """SCALEBOOK_SHARED_DATA, else ../shared/data beside the repo, else the shipped examples/data."""
    env = os.environ.get("SCALEBOOK_SHARED_DATA")
    if env:
        return Path(env)
    shared = REPO.parent / "shared" / "data"
    return shared if shared.is_dir() else REPO / "examples" / "data"


#: the suite's longest files, longest first (their tests' seconds, summed, on the 2-core CI machine:
#: 2026-11-27, `--junitxml`): run before the rest, so that `-n 2 --dist loadfile` does not leave one worker
#: alone on a long file at the end (longest first is the classic greedy schedule, Graham 1969)
LONGEST_FILES = ("test_api_fuzz.py", "test_reliability.py", "test_pages_e2e.py", "test_integrations.py",
                 "test_agent.py", "test_security.py", "test_tokens.py", "test_lifecycle.py", "test_dashboard_pages.py",
                 "test_migrations.py", "test_client.py", "test_live_agents.py", "test_heatmap_e2e.py")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The LONGEST_FILES' tests first, in that order; every file's own tests keep their order."""
    rank = {name: i for i, name in enumerate(LONGEST_FILES)}
    items.sort(key=lambda item: rank.get(item.path.name, len(rank)))


@pytest.fixture(scope="session")
def data_dir() -> Path:
    return shared_data_dir()


def _pg_url(dbname: str) -> str:
    return sa.engine.make_url(PG_ADMIN_URL).set(database=dbname).render_as_string(hide_password=False)


def create_pg_database(name: str) -> str:
    """(Re)create a PostgreSQL database; returns its URL. Fails loudly when PostgreSQL is down."""
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
    except sa.exc.OperationalError as exc:
        pytest.fail(f"PostgreSQL is required for the test suite and is not reachable at {PG_ADMIN_URL}: {exc.orig}. "
                    "Start it: pg_ctlcluster --skip-systemctl-redirect $(ls /etc/postgresql) main start", pytrace=False)
    finally:
        admin.dispose()
    return _pg_url(name)


def drop_pg_database(name: str) -> None:
    admin = sa.create_engine(PG_ADMIN_URL, isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@pytest.fixture(scope="session")
def worker_tag(request) -> str:
    wid = getattr(request.config, "workerinput", {}).get("workerid", "main")
    return f"{wid}_{os.getpid()}"


@pytest.fixture(scope="session")
def pg_session_url(worker_tag):
    name = f"sbtest_{worker_tag}"
    url = create_pg_database(name)
    db = Database(url)
    db.upgrade()
    db.dispose()
    yield url
    drop_pg_database(name)


@pytest.fixture(scope="session")
def duckdb_template(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("template") / "template.duckdb"
    db = Database(f"duckdb:///{path}")
    db.upgrade()
    db.dispose()
    return path


@pytest.fixture(params=["duckdb", "postgresql"])
def backend(request) -> str:
    return request.param


@pytest.fixture
def db_url(backend, tmp_path, request) -> str:
    """URL of a migrated, empty database on `backend`."""
    if backend == "duckdb":
        template = request.getfixturevalue("duckdb_template")
        path = tmp_path / "scalebook.duckdb"
        shutil.copy(template, path)
        return f"duckdb:///{path}"
    url = request.getfixturevalue("pg_session_url")
    engine = sa.create_engine(url)
    with engine.begin() as conn:
        # every table of the models (runs, api_tokens, run_configs, ...)
        conn.execute(sa.text("TRUNCATE " + ", ".join(t.name for t in Base.metadata.sorted_tables)))
    engine.dispose()
    return url


@pytest.fixture
def database(db_url):
    db = Database(db_url)
    db.prepare(auto_upgrade=False)
    yield db
    db.dispose()


@pytest.fixture
def settings() -> Settings:
    return Settings(database_url=None)


@pytest.fixture
def client(database, settings):
    from fastapi.testclient import TestClient

    with TestClient(create_app(database, settings)) as c:
        yield c


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """uvicorn serving an app in a background thread on 127.0.0.1:<free port>."""

    def __init__(self, app):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            if time.monotonic() > deadline:
                raise RuntimeError("live server did not start")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=10)


@pytest.fixture
def live_api(database, settings, monkeypatch):
    """A real HTTP server over `database`; SCALEBOOK_API_URL points at it for the test."""
    with LiveServer(create_app(database, settings)) as server:
        monkeypatch.setenv("SCALEBOOK_API_URL", server.url)
        monkeypatch.delenv("SCALEBOOK_TOKEN", raising=False)
        yield server.url


def playbook_sample(data_dir: Path):
    """The shipped nanotron sample parsed as its importer is told to: the Ultra-Scale Playbook sweep
    ran on H100 SXM (the file does not say which GPU)."""
    from ingest.parsers import nanotron

    return nanotron.parse_file(data_dir / "nanotron" / "bench_sample.csv", gpu_type=nanotron.PLAYBOOK_GPU_TYPE)


def post_records(client, records: list[dict], batch: int = 500) -> tuple[int, list[dict]]:
    """POST parser records through the API in batches (TestClient or httpx.Client); rows the API
    rejects (422 details[].index) are set aside and the rest resent. Returns (stored, rejected)."""
    stored, rejected = 0, []
    for start in range(0, len(records), batch):
        pending = records[start:start + batch]
        while pending:
            r = client.post("/api/v1/runs", json={"runs": pending})
            if r.status_code in (200, 201):
                stored += r.json()["created"]
                break
            assert r.status_code == 422, r.text
            bad = {d["index"] for d in r.json()["error"]["details"]}
            rejected += [p for i, p in enumerate(pending) if i in bad]
            pending = [p for i, p in enumerate(pending) if i not in bad]
    return stored, rejected


@pytest.fixture
def nanotron_client(client, data_dir):
    """`client` with the Ultra-Scale Playbook nanotron sample loaded through the API."""

    stored, rejected = post_records(client, playbook_sample(data_dir).records)
    assert rejected == [] and stored > 0
    return client
