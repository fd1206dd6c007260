"""Reliability under bad input, concurrency and crashes (DESIGN §7). Bounded: ~2–3 minutes in all.

- (Schemathesis' fuzz of every operation of the OpenAPI spec: tests/test_api_fuzz.py.)
- Hypothesis feeds the nanotron and published-table importers CSVs with hostile cells: they never
  raise, every data row becomes a record or a reject, and the server's validation never crashes
  on what they produce.
- Oversized bodies (Content-Length, chunked, too many runs) get 413 and store nothing.
- 8 writer processes (a quarter of their keys shared, to race on idempotency) and reader threads
  against a live `scalebook serve` for a fixed time, on PostgreSQL and DuckDB: no errors, every
  acknowledged run stored exactly once.
- `scalebook serve` is SIGKILLed during ingest: after a restart every acknowledged run is there.
"""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from conftest import REPO, free_port, shared_data_dir
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service import store
from service.api import create_app
from service.cli import benchmark as benchtool
from service.db import Database
from service.settings import Settings

# -- importers -------------------------------------------------------------------------------------

def _header(kind: str) -> list[str]:
    path = next((shared_data_dir() / ("nanotron" if kind == "nanotron" else "published")).glob("*.csv"))
    with open(path, newline="", encoding="utf-8-sig") as fh:
        return next(csv.reader(fh))


HOSTILE = st.one_of(
    st.sampled_from(["", " ", "nan", "NaN", "inf", "-inf", "-1", "0", "1e400", "-0", "1,000,000", "41%", "~50%",
                     "≈3", "12x", "1.7B", "405B", "1T", "0.5G", "True", "False", "OOM", "Success", "Other", "fail",
                     "bf16", "torch.float8", "H100", "TPU v5p-128", "FULL_SHARD", "selective", "None", "null",
                     "1" * 40, "9" * 400, "\"quoted, cell\"", "a\nb", "\r", "\t", "\\", ";", "'", "1e-320",
                     "2025-13-45", "0x10", "١٢", "½", "😀"]),
    st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=30),
    st.integers(min_value=-10**20, max_value=10**20).map(str),
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
)


def _rows(kind: str):
    header = _header(kind)
    return st.lists(st.lists(HOSTILE, min_size=len(header), max_size=len(header)), min_size=1, max_size=8)


def _check_parser(kind: str, rows: list[list[str]], tmp_path: Path) -> None:
    from ingest.parsers import nanotron, table
    from service.errors import ValidationFailed
    from service.store import validate_records

    header = _header(kind)
    path = tmp_path / f"{kind}.csv"
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.writer(fh)
        writer.writerow(header)
        writer.writerows(rows)
    result = (nanotron.parse_file(path, gpu_type=nanotron.PLAYBOOK_GPU_TYPE) if kind == "nanotron"
              else table.parse_file(path))
    assert len(result.records) + len(result.rejects) == len(rows)
    for reject in result.rejects:
        assert reject.reason and reject.line_no >= 2
    for record in result.records:
        json.dumps(record, allow_nan=False)  # a record is valid JSON for the API
        try:
            validate_records([record])
        except ValidationFailed as exc:
            assert exc.details and all(d.get("message") for d in exc.details)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=_rows("nanotron"))
def test_nanotron_parser_survives_hostile_cells(rows, tmp_path):
    _check_parser("nanotron", rows, tmp_path)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow, HealthCheck.data_too_large])
@given(rows=_rows("table"))
def test_table_parser_survives_hostile_cells(rows, tmp_path):
    _check_parser("table", rows, tmp_path)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                  HealthCheck.too_slow])
@given(column=st.sampled_from(["tp", "dp", "mbs", "tok/s/gpu", "Mem Alloc (GB)", "status", "name", "nodes"]),
       cell=HOSTILE)
def test_nanotron_real_rows_with_one_hostile_cell(column, cell, tmp_path):
    """Real sweep rows with one cell replaced: still one record or one reject per row."""
    source = shared_data_dir() / "nanotron" / "bench_sample.csv"
    with open(source, newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        header = next(reader)
        rows = [next(reader) for _ in range(5)]
    index = header.index(column)
    for row in rows:
        row[index] = cell
    _check_parser("nanotron", rows, tmp_path)


# -- oversized bodies ------------------------------------------------------------------------------

SMALL = Settings(database_url=None, max_body_bytes=64 * 1024, max_batch_runs=50)
RUN = {"model_params": 8_000_000_000, "nodes": 1, "gpus_per_node": 8, "dp": 8, "status": "success",
       "tokens_per_sec_per_gpu": 4000.0}


def _count(database) -> int:
    with database.engine.connect() as conn:
        return conn.execute(sa.text("SELECT count(*) FROM runs")).scalar()


def test_oversized_bodies_get_413(database):
    from fastapi.testclient import TestClient

    with TestClient(create_app(database, SMALL)) as client:
        big = {"runs": [{**RUN, "run_key": f"big-{i}", "name": "x" * 1000} for i in range(100)]}
        resp = client.post("/api/v1/runs", json=big)
        assert resp.status_code == 413
        assert resp.json()["error"]["code"] == "payload_too_large"
        many = {"runs": [{**RUN, "run_key": f"many-{i}"} for i in range(51)]}
        resp = client.post("/api/v1/runs", json=many)
        assert resp.status_code == 413 and "50" in resp.json()["error"]["message"]
        assert client.post("/api/v1/runs", json={**RUN, "name": "y" * 70_000}).status_code == 413
    assert _count(database) == 0


def test_oversized_chunked_body_gets_413(database):
    """A streamed body without Content-Length is cut off at the limit, on a real server."""
    from conftest import LiveServer

    def chunks():
        yield b'{"runs": ['
        for i in range(2000):
            yield (json.dumps({**RUN, "run_key": f"chunk-{i}"}) + ",").encode()
        yield json.dumps(RUN).encode() + b"]}"

    with LiveServer(create_app(database, SMALL)) as server:
        resp = httpx.post(f"{server.url}/api/v1/runs", content=chunks(), timeout=30,
                          headers={"content-type": "application/json"})
        assert resp.status_code == 413
        assert httpx.get(f"{server.url}/api/v1/health").status_code == 200
    assert _count(database) == 0


# -- values no column can hold ---------------------------------------------------------------------

@pytest.mark.parametrize("run", [
    {"vocab_size": 46_998_167_761_055},                       # beyond INTEGER
    {"nodes": 100_000, "gpus_per_node": 100_000},              # derived world_size beyond INTEGER
    {"model_params": 2**63},                                   # beyond BIGINT
    {"dp": 2**30, "micro_batch_size": 2**30, "grad_accum_steps": 2**30, "seq_len": 2**30},  # derived batch
    {"name": "a\u0000b"},                                      # NUL: PostgreSQL text cannot hold it
], ids=["int32", "derived-world", "int64", "derived-batch", "nul"])
def test_values_beyond_the_columns_are_422(client, run):
    """Found by the fuzzer: these were 503/500 database errors; now 422 naming the field."""
    resp = client.post("/api/v1/runs", json={"runs": [run] * 21})  # bulk path (Arrow / COPY)
    assert resp.status_code == 422, resp.text
    resp = client.post("/api/v1/runs", json=run)  # single-run path
    assert resp.status_code == 422 and resp.json()["error"]["details"][0]["field"], resp.text
    assert client.get("/api/v1/runs").json()["total"] == 0


@pytest.mark.parametrize("moment", ["0001-01-01T00:00:00+14:00", "9999-12-31T23:59:59-14:00"])
def test_timestamps_beyond_utc_range_are_422(client, moment):
    """Found by the fuzzer: converting to UTC overflowed (500); now 422 naming started_at."""
    resp = client.post("/api/v1/runs", json={"started_at": moment})
    assert resp.status_code == 422 and resp.json()["error"]["details"][0]["field"] == "started_at"


# -- a live `scalebook serve` ----------------------------------------------------------------------

class Serve:
    """`scalebook serve` in a subprocess on a free loopback port over `url`."""

    def __init__(self, url: str, tmp_path: Path, **settings: str):
        self.url, self.port = url, free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if not k.startswith("SCALEBOOK_")}
        env["SCALEBOOK_DATABASE_URL"] = url
        env.update({f"SCALEBOOK_{k.upper()}": v for k, v in settings.items()})
        self.log = open(tmp_path / f"serve-{self.port}.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(self.port),
                                      "--log-level", "warning"], env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                     cwd=REPO)
        deadline = time.monotonic() + 60
        while True:
            assert self.proc.poll() is None, f"scalebook serve exited: {Path(self.log.name).read_text()[-2000:]}"
            try:
                if httpx.get(f"{self.base}/api/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "scalebook serve not healthy in 60 s"
            time.sleep(0.1)

    def stop(self, sig: int = signal.SIGINT) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


#: One writer process: posts runs with keys w<id>-<n> (and shared s<n>, raced by two writers),
#: singles and batches of up to 20, re-posts some acknowledged batches (idempotent retries): a fixed
#: number of requests (no wall-clock budget). Prints {"acked": [keys answered 200/201], "errors": [...]}.
WRITER = r"""
import json, random, sys, time, httpx
base, wid, requests = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
rng = random.Random(wid)
def run(key):
    h = sum(map(ord, key))
    nodes = 1 + h % 8
    return {"run_key": key, "model_params": 8_000_000_000, "nodes": nodes, "gpus_per_node": 8, "dp": 8 * nodes,
            "seq_len": 4096, "status": "success", "tokens_per_sec_per_gpu": 1000.0 + h % 997, "source": "writer"}
acked, errors, sent, n = [], [], [], 0
with httpx.Client(base_url=base, timeout=60) as client:
    for _ in range(requests):
        size = rng.choice([1, 1, 1, 5, 20])
        keys = []
        for _ in range(size):
            if rng.random() < 0.25:
                keys.append(f"s{(wid // 2)}-{n}")  # writers 2k and 2k+1 race on these
            else:
                keys.append(f"w{wid}-{n}")
            n += 1
        if sent and rng.random() < 0.1:
            keys = rng.choice(sent)  # an idempotent retry
        body = run(keys[0]) if len(keys) == 1 else {"runs": [run(k) for k in keys]}
        try:
            resp = client.post("/api/v1/runs", json=body)
        except httpx.HTTPError as exc:
            errors.append(f"{type(exc).__name__}: {exc}")
            continue
        if resp.status_code in (200, 201):
            acked.extend(keys)
            sent.append(keys)
        else:
            errors.append(f"HTTP {resp.status_code}: {resp.text[:300]}")
print(json.dumps({"acked": acked, "errors": errors}))
"""


def _readers(base: str, stop: threading.Event, errors: list[str], counts: list[int]) -> list[threading.Thread]:
    paths = ["/api/v1/runs?limit=50", "/api/v1/runs?status=success&sort=-tokens_per_sec_per_gpu&limit=20",
             "/api/v1/heatmap", "/api/v1/recommend?model_params=8B&nodes=4", "/api/v1/health"]

    def read(offset: int) -> None:
        with httpx.Client(base_url=base, timeout=30) as client:
            i = offset
            while not stop.is_set():
                path = paths[i % len(paths)]
                i += 1
                try:
                    resp = client.get(path)
                    if resp.status_code != 200:
                        errors.append(f"GET {path}: HTTP {resp.status_code} {resp.text[:200]}")
                except httpx.HTTPError as exc:
                    errors.append(f"GET {path}: {type(exc).__name__}")
                counts.append(1)

    return [threading.Thread(target=read, args=(k,), daemon=True) for k in range(2)]


def _stored_keys(url: str) -> tuple[int, set[str]]:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            keys = [r[0] for r in conn.execute(sa.text("SELECT run_key FROM runs"))]
    finally:
        engine.dispose()
    return len(keys), set(keys)


@pytest.mark.integration
@pytest.mark.slow
def test_concurrent_writers_and_readers(db_url, tmp_path):
    """8 writer processes (40 requests each) + 2 readers on a live server: no errors, each acked run once."""
    server = Serve(db_url, tmp_path)
    stop, read_errors, reads = threading.Event(), [], []
    readers = _readers(server.base, stop, read_errors, reads)
    try:
        writers = [subprocess.Popen([sys.executable, "-c", WRITER, server.base, str(w), "40"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for w in range(8)]
        for t in readers:
            t.start()
        results = []
        for w in writers:
            out, err = w.communicate(timeout=600)
            assert w.returncode == 0, err[-2000:]
            results.append(json.loads(out))
        stop.set()
        for t in readers:
            t.join(timeout=30)
    finally:
        stop.set()
        server.stop()
    errors = [e for r in results for e in r["errors"]]
    assert errors == [], errors[:5]
    assert read_errors == [], read_errors[:5]
    acked = {k for r in results for k in r["acked"]}
    assert len(acked) >= 8 * 40 // 2 and reads  # every request acked keys (retries re-ack some)
    count, stored = _stored_keys(db_url)
    assert stored == acked  # every acknowledged run, nothing else
    assert count == len(acked)  # ... each stored once


#: Posts singles and batches of 10 and of 50 until killed; prints each acknowledged key as it is acked.
KILL_WRITER = r"""
import sys, httpx
base = sys.argv[1]
n, sizes = 0, [50, 1, 10, 1, 1, 10]
with httpx.Client(base_url=base, timeout=10) as client:
    for step in range(10**9):
        size = sizes[step % len(sizes)]
        keys = [f"k-{n + i}" for i in range(size)]
        n += size
        runs = [{"run_key": k, "model_params": 1_340_000_000, "nodes": 1, "gpus_per_node": 8, "dp": 8,
                 "status": "success", "tokens_per_sec_per_gpu": 40000.0 + len(k)} for k in keys]
        try:
            resp = client.post("/api/v1/runs", json=runs[0] if size == 1 else {"runs": runs})
        except httpx.HTTPError:
            break
        if resp.status_code in (200, 201):
            print("\n".join(keys), flush=True)
"""


@pytest.mark.integration
@pytest.mark.slow
def test_sigkill_during_ingest_loses_no_acknowledged_run(db_url, tmp_path):
    """SIGKILL `scalebook serve` mid-ingest; after a restart every acknowledged run is stored
    (an acknowledged run is a committed one: the database's own WAL holds it)."""
    server = Serve(db_url, tmp_path)
    writer = subprocess.Popen([sys.executable, "-c", KILL_WRITER, server.base], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True)
    time.sleep(4)
    server.stop(signal.SIGKILL)
    out, _ = writer.communicate(timeout=30)
    acked = set(out.split())
    assert len(acked) > 50, "the writer got too few acknowledgements before the kill"
    restarted = Serve(db_url, tmp_path)  # replays the DuckDB WAL
    try:
        health = httpx.get(f"{restarted.base}/api/v1/health").json()
        assert health["runs"] >= len(acked)
        resp = httpx.post(f"{restarted.base}/api/v1/runs", json={**RUN, "run_key": "after-restart"})
        assert resp.status_code == 201
    finally:
        restarted.stop()
    count, stored = _stored_keys(db_url)
    assert acked <= stored
    assert count == len(stored)


# -- the benchmark tool ----------------------------------------------------------------------------

@pytest.mark.integration
def test_bench_smoke(tmp_path):
    """`scalebook bench` runs end to end on a small N and prints its one JSON object (no timing
    assertions: the figures at 10^6 runs are in bench/RESULTS.md)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALEBOOK_")}
    done = subprocess.run([sys.executable, "-m", "service.cli", "bench", "--runs", "2000", "--backend", "duckdb",
                           "--json", "--single-posts", "50", "--query-calls", "3"],
                          env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout)
    assert {"backend", "stored_runs", "ingest_batch_runs_per_s", "ingest_single_post_p50_ms",
            "ingest_single_post_p99_ms", "heatmap_ms", "recommend_ms", "heatmap_first_ms", "recommend_first_ms",
            "heatmap_after_post_ms", "recommend_after_post_ms", "suggest_ms", "suggest_first_ms",
            "suggest_after_post_ms"} <= set(result)
    assert result["backend"] == "duckdb" and result["stored_runs"] == 2000
    assert result["heatmap_cells"] > 10 and result["recommend_candidates"] > 0


def test_bench_on_an_existing_database(tmp_path):
    """`scalebook bench --database URL` times a database that is already filled (bench/grow.py's 10^6
    runs): no batched ingest, fresh run_keys for its single POSTs, the database kept."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALEBOOK_")}
    url = f"duckdb:///{tmp_path / 'kept.duckdb'}"
    db = Database(url)
    db.upgrade()
    with db.session(write=True) as session:
        store.store_runs(session, list(benchtool.generate_runs(300, 5)))
    db.dispose()
    for _ in range(2):  # twice: the second run's POSTs must not collide with the first's
        done = subprocess.run([sys.executable, "-m", "service.cli", "bench", "--database", url, "--json",
                               "--single-posts", "5", "--query-calls", "1"],
                              env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path, check=False)
        assert done.returncode == 0, done.stderr[-2000:]
        result = json.loads(done.stdout)
        assert result["ingest_batch_runs_per_s"] is None and result["database"] == url
        assert result["stored_runs"] >= 305 and result["recommend_candidates"] > 0
