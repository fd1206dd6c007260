"""The DuckDB ingest journal (service/journal.py): small writes group-committed, every acknowledged
run visible to every reader, ids in commit order, crash replay; PostgreSQL writes directly."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import sqlalchemy as sa

from service import benchtool, journal, run_configs
from service.db import Database
from tests.test_run_configs import reference, summary

REPO = Path(__file__).resolve().parent.parent
BASE = {"model_params": 8_030_261_248, "num_layers": 32, "hidden_size": 4096, "seq_len": 8192,
        "gpu_type": "H100", "gpus_per_node": 8, "nodes": 2, "tp": 2, "zero_stage": 1, "micro_batch_size": 1,
        "grad_accum_steps": 8, "status": "success", "tokens_per_sec_per_gpu": 4000.0}


def stored_rows(db: Database) -> list[dict]:
    """`runs` read on a connection of its own, bypassing the journal (what is in the file)."""
    with db.engine.connect() as conn:
        return [dict(r) for r in conn.execute(sa.text("SELECT id, run_key FROM runs ORDER BY id")).mappings()]


def journal_lines(db: Database) -> list[list[dict]]:
    path = journal.journal_path(Path(db.url.removeprefix("duckdb:///")))
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_postgresql_has_no_journal(database, backend):
    if backend == "duckdb":
        assert database.journal is not None and database.journal.flush_rows == journal.FLUSH_ROWS
    else:
        assert database.journal is None


#: the journal is DuckDB's: PostgreSQL commits each request (tests/test_api_runs.py)
DUCKDB_ONLY = pytest.mark.parametrize("backend", ["duckdb"], indirect=True)


@DUCKDB_ONLY
def test_small_writes_are_journaled_and_every_reader_sees_them(client, database, backend):
    single = client.post("/api/v1/runs", json={**BASE, "run_key": "j0"})
    few = client.post("/api/v1/runs", json={"runs": [{**BASE, "run_key": f"j{i}", "nodes": i} for i in (1, 2, 3)]})
    assert (single.status_code, few.status_code) == (201, 201)
    ids = [single.json()["id"]] + [r["id"] for r in few.json()["runs"]]
    assert ids == sorted(ids) and len(set(ids)) == 4
    # durable on disk (two lines, one per request), not yet in the DuckDB file
    assert [[r["run_key"] for r in line] for line in journal_lines(database)] == [["j0"], ["j1", "j2", "j3"]]
    assert stored_rows(database) == [] and len(database.journal.pending) == 4
    # a read session moves them in first: the API answers with every acknowledged run
    listed = client.get("/api/v1/runs", params={"sort": "id"}).json()
    assert [r["run_key"] for r in listed["runs"]] == ["j0", "j1", "j2", "j3"]
    assert [r["id"] for r in listed["runs"]] == ids
    assert journal_lines(database) == [] and not database.journal.pending
    assert [r["run_key"] for r in stored_rows(database)] == ["j0", "j1", "j2", "j3"]
    # the answer built from memory is the stored run
    assert client.get(f"/api/v1/runs/{ids[0]}").json() == single.json()
    client.post("/api/v1/runs", json={**BASE, "run_key": "j4"})
    sql = client.post("/api/v1/sql", json={"query": "SELECT count(*) AS n FROM runs"})
    assert sql.status_code == 200 and sql.json()["rows"] == [[5]]  # user SQL sees the journaled run too


def test_retries_and_conflicts_of_journaled_runs(client, backend):
    first = client.post("/api/v1/runs", json={**BASE, "run_key": "r"})
    again = client.post("/api/v1/runs", json={**BASE, "run_key": "r"})
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()
    changed = client.post("/api/v1/runs", json={**BASE, "run_key": "r", "nodes": 4})
    assert changed.status_code == 409 and changed.json()["error"]["details"][0]["value"] == "r"
    mixed = client.post("/api/v1/runs", json={"runs": [{**BASE, "run_key": "r"}, {**BASE, "run_key": "s"}]})
    assert mixed.status_code == 201 and (mixed.json()["created"], mixed.json()["existing"]) == (1, 1)
    twice = client.post("/api/v1/runs", json={"runs": [{**BASE, "run_key": "t"}, {**BASE, "run_key": "t", "nodes": 8}]})
    assert twice.status_code == 409
    assert client.get("/api/v1/runs").json()["total"] == 2


def test_ids_commit_in_order_across_journal_and_batches(client, database, monkeypatch, backend):
    """Singles (journaled on DuckDB), batches (direct) and retries interleaved: ids increase in the
    order the requests were answered, and the run_configs summary (folded behind an id
    watermark on DuckDB, every 40 runs here) equals the one computed from `runs`."""
    monkeypatch.setattr(run_configs, "FOLD_EVERY", 40)
    runs = list(benchtool.generate_runs(600, seed=7, prefix="order"))
    answered: list[int] = []
    i = 0
    for step in range(60):
        size = (1, 1, 3, 1, 30, 1, 20)[step % 7]
        chunk, i = runs[i:i + size], i + size
        resp = client.post("/api/v1/runs", json=chunk[0] if size == 1 else {"runs": chunk},
                           headers={"Prefer": "return=minimal"})
        assert resp.status_code == 201, resp.text
        answered += resp.json()["ids"]
        if step % 11 == 0:  # a retry in between
            assert client.post("/api/v1/runs", json=chunk[0]).status_code == 200
    assert answered == sorted(answered) and len(set(answered)) == len(answered) == i
    stored = stored_rows(database) if backend != "duckdb" else None
    listed = client.get("/api/v1/runs", params={"limit": 1000}).json()
    assert listed["total"] == i and [r["id"] for r in listed["runs"]] == answered
    if stored is not None:
        assert [r["id"] for r in stored] == answered
    assert summary(database) == reference(database)


@DUCKDB_ONLY
def test_journal_rows_zero_commits_each_request(db_url, backend):
    db = Database(db_url, journal_rows=0)
    try:
        db.prepare(auto_upgrade=False)
        assert db.journal is None
        from service import store

        store.ingest(db, [{**BASE, "run_key": "direct"}])
        assert [r["run_key"] for r in stored_rows(db)] == ["direct"]
        assert not journal.journal_path(Path(db_url.removeprefix("duckdb:///"))).exists()
    finally:
        db.dispose()


#: Stores runs through the journal, then dies without closing anything (as a SIGKILL would).
#: argv: url, then "flushed" to flush the first 5 runs but write their journal line back (a crash
#: between a flush's commit and the journal's truncation), then "torn" to leave a cut last line.
CRASH = r"""
import os, sys
from service import store
from service.db import Database
url, mode = sys.argv[1], sys.argv[2:]
db = Database(url, journal_rows=100000)
db.prepare(auto_upgrade=False)
base = {"model_params": 1_340_000_000, "nodes": 1, "gpus_per_node": 8, "status": "success",
        "tokens_per_sec_per_gpu": 40000.0}
path = db.journal.path
store.ingest(db, [{**base, "run_key": f"c{i}", "dp": 8} for i in range(5)])
if "flushed" in mode:
    kept = path.read_bytes()
    db.flush()
    with open(path, "ab") as fh:
        fh.write(kept)
for i in range(5, 40):
    store.ingest(db, [{**base, "run_key": f"c{i}", "dp": 8 * (1 + i % 4), "nodes": 1 + i % 4}])
if "torn" in mode:
    with open(path, "ab") as fh:
        fh.write(b'[{"run_key": "never-acknowledged", "id": 99')
print(len(db.journal.pending), flush=True)
os._exit(0)
"""


@DUCKDB_ONLY
@pytest.mark.parametrize("mode", [[], ["flushed", "torn"]], ids=["crash", "crash-after-flush-torn-line"])
def test_replay_after_a_crash(db_url, backend, mode):
    out = subprocess.run([sys.executable, "-c", CRASH, db_url, *mode], cwd=REPO, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    path = journal.journal_path(Path(db_url.removeprefix("duckdb:///")))
    assert int(out.stdout.split()[-1]) == (35 if mode else 40) and path.stat().st_size > 0
    db = Database(db_url)
    try:
        assert len(stored_rows(db)) == (5 if mode else 0)  # the crash left the rest in the journal only
        db.prepare(auto_upgrade=False)  # replays
        rows = stored_rows(db)
        assert [r["run_key"] for r in rows] == [f"c{i}" for i in range(40)]  # each once, in id order
        assert path.stat().st_size == 0 and not db.journal.pending
        rejects = path.with_name(path.name + ".rejects")
        assert (rejects.read_text().strip() if mode else not rejects.exists()) in (
            True, '[{"run_key": "never-acknowledged", "id": 99')
        assert summary(db) == reference(db) and sum(g["n_runs"] for g in summary(db).values()) == 40
        from service import store

        more, created, _ = store.ingest(db, [{**BASE, "run_key": "after"}])
        assert created == 1 and more[0].id > rows[-1]["id"]
    finally:
        db.dispose()


@DUCKDB_ONLY
def test_a_replay_that_fails_keeps_the_journal_and_its_lock_free(db_url, backend):
    """A journal line the database refuses (here: an id already taken by another run) makes the
    open fail with the database's error; the journal stays on disk, and once the line is mended
    the next open replays it."""
    from service import store

    db = Database(db_url, journal_rows=100000)
    db.prepare(auto_upgrade=False)
    (first,), _, _ = store.ingest(db, [{**BASE, "run_key": "kept"}])
    db.dispose()  # flushes: "kept" is stored with first.id
    path = journal.journal_path(Path(db_url.removeprefix("duckdb:///")))
    line = {k: (v.isoformat() if hasattr(v, "isoformat") else v) for k, v in dict(first).items()}
    path.write_text(json.dumps([{**line, "run_key": "clash"}]) + "\n")  # same id, another key
    broken = Database(db_url)
    try:
        with pytest.raises(Exception, match="(?i)constraint|duplicate|conflict"):
            broken.prepare(auto_upgrade=False)
        assert path.stat().st_size > 0
    finally:
        broken.dispose()
    path.write_text(json.dumps([{**line, "run_key": "clash", "id": first.id + 1000}]) + "\n")
    mended = Database(db_url)
    try:
        mended.prepare(auto_upgrade=False)
        assert [r["run_key"] for r in stored_rows(mended)] == ["kept", "clash"]
        assert path.stat().st_size == 0
    finally:
        mended.dispose()


@DUCKDB_ONLY
def test_journal_survives_the_pool_and_failed_disk_writes(database, backend, monkeypatch):
    """Found in review: (1) the journal's connection must not be one the pool may close (a burst of
    concurrent sessions closes the surplus); (2) a write or fdatasync that fails is cut back out
    of the file, so a retry is not journaled twice and a later line is not glued to a partial
    one; (3) a journal that cannot be emptied after a flush does not make the flushed runs
    pending again."""
    import os
    import threading

    from service import store

    barrier = threading.Barrier(12)

    def read(i: int) -> None:
        with database.session() as s:
            s.execute(sa.text("SELECT count(*) FROM runs")).scalar()
            barrier.wait()

    threads = [threading.Thread(target=read, args=(i,)) for i in range(12)]
    [t.start() for t in threads]
    [t.join() for t in threads]
    assert store.ingest(database, [{**BASE, "run_key": "after-burst"}])[1] == 1

    real_sync, calls = os.fdatasync, []

    def failing_sync(fd: int) -> None:
        calls.append(fd)
        if len(calls) == 1:
            raise OSError(5, "EIO")
        real_sync(fd)

    monkeypatch.setattr(os, "fdatasync", failing_sync)
    with pytest.raises(Exception, match="cannot write the ingest journal"):
        store.ingest(database, [{**BASE, "run_key": "retried"}])
    assert store.ingest(database, [{**BASE, "run_key": "retried"}])[1] == 1  # the client's retry
    assert [[r["run_key"] for r in line] for line in journal_lines(database)] == [["after-burst"], ["retried"]]

    real_truncate = os.ftruncate
    monkeypatch.setattr(os, "ftruncate", lambda fd, size: (_ for _ in ()).throw(OSError(5, "EIO")) if size == 0
                        else real_truncate(fd, size))
    assert database.flush() == 2 and not database.journal.pending
    monkeypatch.setattr(os, "ftruncate", real_truncate)
    keys = [r["run_key"] for r in stored_rows(database)]
    assert keys == ["after-burst", "retried"]
    store.ingest(database, [{**BASE, "run_key": "later"}])
    assert [r["run_key"] for r in stored_rows(database)] == keys  # journaled, not yet flushed
    with database.session() as s:  # a session flushes first: the stale file did not bring anything back
        assert [k for (k,) in s.execute(sa.text("SELECT run_key FROM runs ORDER BY id"))] == [*keys, "later"]
