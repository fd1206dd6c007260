"""The one write path on both backends (issue 13, issue 14 items 2, 9 and 10): batches that mix
stored and new runs, concurrent identical writes, the empty batch, and what database errors map to."""

from __future__ import annotations

import threading

import pytest
import sqlalchemy as sa
from test_api_runs import assert_error_shape, run

from service import store


def batch(keys, **over):
    return {"runs": [run(run_key=k, nodes=1 + sum(map(ord, k)) % 8, **over) for k in keys]}


@pytest.mark.parametrize("stored, added", [(20, 1), (1, 1), (25, 3), (0, 21)])
def test_batch_of_stored_runs_plus_new_ones_is_201(client, stored, added):
    """Issue 14 item 2: 20 stored + 1 new failed on DuckDB with ResourceInUseException."""
    keys = [f"s{i}" for i in range(stored)]
    if keys:
        assert client.post("/api/v1/runs", json=batch(keys)).status_code == 201
    more = keys + [f"n{i}" for i in range(added)]
    r = client.post("/api/v1/runs", json=batch(more))
    assert r.status_code == 201, r.text
    body = r.json()
    assert (body["created"], body["existing"]) == (added, stored)
    assert [x["run_key"] for x in body["runs"]] == more
    again = client.post("/api/v1/runs", json=batch(more))  # a retry of the whole batch: nothing new
    assert again.status_code == 200 and again.json()["created"] == 0
    assert [x["id"] for x in again.json()["runs"]] == [x["id"] for x in body["runs"]]
    assert client.get("/api/v1/runs").json()["total"] == stored + added


def test_empty_batch_is_an_empty_200(client):
    """Issue 14 item 10: {"runs": []} built invalid SQL on PostgreSQL (503). An empty batch stores
    nothing and says so."""
    r = client.post("/api/v1/runs", json={"runs": []})
    assert r.status_code == 200, r.text
    assert r.json() == {"runs": [], "created": 0, "existing": 0}
    minimal = client.post("/api/v1/runs", json={"runs": []}, headers={"Prefer": "return=minimal"})
    assert minimal.status_code == 200 and minimal.json() == {"ids": [], "created": 0, "existing": 0}


def test_conflicting_key_in_a_mixed_batch_stores_nothing(client):
    assert client.post("/api/v1/runs", json=batch(["a", "b"])).status_code == 201
    body = batch(["c", "a", "b"])
    body["runs"][1]["tokens_per_sec_per_gpu"] = 1.0  # "a" with different content
    r = client.post("/api/v1/runs", json=body)
    assert r.status_code == 409
    assert_error_shape(r.json(), "conflict")
    assert [d["value"] for d in r.json()["error"]["details"]] == ["a"]
    assert client.get("/api/v1/runs").json()["total"] == 2  # "c" was not stored either


def test_concurrent_identical_writes_never_conflict(database):
    """Issue 14 item 9: 8 writers posting overlapping run_keys with the content already stored (or
    being stored by another writer) get 201/200 — never a 409 or an error."""
    keys = [f"k{i}" for i in range(200)]
    payloads = batch(keys)["runs"]
    errors: list[BaseException] = []
    results: list[tuple[int, int]] = []
    start = threading.Barrier(8)

    def writer(w: int) -> None:
        try:
            start.wait()
            for round_ in range(6):
                lo = (w * 13 + round_ * 17) % 160
                chunk = payloads[lo:lo + 40]
                stored, created, existing = store.ingest(database, chunk)
                assert [s.run_key for s in stored] == [p["run_key"] for p in chunk]
                results.append((created, existing))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    with database.session() as session:
        n = session.scalar(sa.text("SELECT count(*) FROM runs"))
    written = {p["run_key"] for w in range(8) for round_ in range(6)
               for p in payloads[(w * 13 + round_ * 17) % 160:(w * 13 + round_ * 17) % 160 + 40]}
    assert n == len(written)
    assert sum(c for c, _ in results) == len(written)  # each run created exactly once


def test_database_errors_map_to_500_not_503(client, database):
    """Issue 13 item 4: an error from the database that is our bug (here: a table dropped under
    the service) is a 500 with the one error body — not a 503 that clients would retry forever."""
    assert client.post("/api/v1/runs", json=run(run_key="x")).status_code == 201
    # DuckDB (a file of this test's own): drop the table; PostgreSQL (shared by the worker's
    # tests): rename it away and back (DuckDB cannot rename an indexed table)
    hide = "DROP TABLE runs" if database.is_duckdb else "ALTER TABLE runs RENAME TO runs_hidden"
    with database.engine.begin() as conn:
        conn.execute(sa.text(hide))
    try:
        r = client.get("/api/v1/runs")
        assert r.status_code == 500, r.text
        assert_error_shape(r.json(), "internal_error")
        assert client.get("/api/v1/heatmap").status_code == 500
    finally:
        if not database.is_duckdb:
            with database.engine.begin() as conn:
                conn.execute(sa.text("ALTER TABLE runs_hidden RENAME TO runs"))


def test_unreachable_database_is_503(settings):
    from conftest import free_port
    from fastapi.testclient import TestClient

    from service.api import create_app
    from service.db import Database

    db = Database(f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/nowhere?connect_timeout=2")
    try:
        with TestClient(create_app(db, settings)) as c:
            r = c.get("/api/v1/runs")
        assert r.status_code == 503
        assert_error_shape(r.json(), "database_unavailable")
    finally:
        db.dispose()


def test_reimport_of_a_file_with_one_row_added_stores_that_row(live_api, data_dir, tmp_path):
    """Issue 14 item 2 through the importer: `scalebook import table` of an already imported file
    with one row added (a new run among stored ones) stores exactly that row."""
    import csv
    import json

    from typer.testing import CliRunner

    from service.cli import app

    source = data_dir / "published" / "llmfoundry_mpt_benchmarks.csv"
    with open(source, newline="") as fh:
        reader = csv.DictReader(fh)
        fields, rows = reader.fieldnames, list(reader)
    path = tmp_path / "table.csv"

    def write(table_rows):
        with open(path, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields)
            writer.writeheader()
            writer.writerows(table_rows)

    def run_import() -> dict:
        result = CliRunner().invoke(app, ["import", "table", str(path), "--rejects", str(tmp_path / "r.csv"),
                                          "--json"])
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    write(rows[:-1])
    first = run_import()
    assert first["stored"] > 20
    write(rows)
    again = run_import()
    assert again["stored"] == 1 and again["rejected"] == first["rejected"]


def test_a_batch_mixing_int_and_float_values_in_a_double_column_is_stored(database):
    """The bulk insert sends each column as one array (binary on PostgreSQL, one Python type per
    list): a DOUBLE column whose rows hold ints and floats — e.g. a catalog peak of 989 next to
    312.5 — is stored as those numbers on both backends."""
    from datetime import datetime

    from service import bulk

    rows = store.validate_records([run(run_key=k) for k in ("i", "f", "n")])
    for r, value in zip(rows, (989, 312.5, None)):
        r["peak_tflops"], r["ingested_at"] = value, datetime(2026, 1, 1)
    with database.session(write=True) as session:
        ids = bulk.insert(session, rows)
    assert set(ids) == {"i", "f", "n"}
    with database.session() as session:
        got = dict(session.execute(sa.text("SELECT run_key, peak_tflops FROM runs")).all())
    assert got == {"i": 989.0, "f": 312.5, "n": None}


def test_a_client_that_disconnects_mid_body_is_not_logged_as_our_error(live_api, caplog):
    """A job killed while it posts (a torchrun rank SIGTERMed) leaves a half-sent body: nothing is
    stored and nothing is logged as an unhandled error; the server goes on answering."""
    import logging
    import socket
    import time
    from urllib.parse import urlsplit

    import httpx

    url = urlsplit(live_api)
    caplog.set_level(logging.INFO, logger="scalebook.api")
    with socket.create_connection((url.hostname, url.port)) as sock:
        sock.sendall(b"POST /api/v1/runs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 5000\r\n\r\n{\"runs\": [")
    for _ in range(100):  # the server notices the disconnect on its own schedule
        if any("disconnected" in r.getMessage() for r in caplog.records):
            break
        time.sleep(0.05)
    assert any("client disconnected" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert httpx.get(f"{live_api}/api/v1/runs", timeout=10).json()["total"] == 0


@pytest.mark.parametrize("backend", ["postgresql"])
def test_service_connections_run_without_jit(database, backend):
    """PostgreSQL's JIT cost the heatmap ~130 ms at 10^6 runs (bench/RESULTS.md): every connection of
    the service's pool has it off, set per connection (not through the URL's `options`)."""
    import sqlalchemy as sa

    with database.engine.connect() as conn:
        assert conn.execute(sa.text("SHOW jit")).scalar() == "off"
