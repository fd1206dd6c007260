"""The heatmap on both backends against a reference computed here from the `runs` rows alone, and
on DuckDB the in-memory heatmap kept current by id watermark (heatmap_summary.py), which must
answer exactly what a full aggregate answers after every kind of write.

Reference: group runs with a size class and a node count by (model_size_class, nodes), after the
filters; count successes, OOMs and all; the best run is the success with the highest metric
(none last), then the highest MFU (mfu_derived, else mfu; none last), then the lowest id.
"""

from __future__ import annotations

from datetime import datetime

import pytest
import sqlalchemy as sa

from service import benchtool, store
from service.analytics import heatmap as hm
from service.db import Database

METRICS = ("tokens_per_sec_per_gpu", "mfu")


def _mfu(r):
    return r["mfu_derived"] if r["mfu_derived"] is not None else r["mfu"]


def reference(db: Database, filters: hm.HeatmapFilters, metric: str) -> list[tuple]:
    """[(model_size_class, nodes, best id | None, n_success, n_oom, n_failed)] sorted by cell."""
    db.flush()
    with db.engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(sa.text("SELECT * FROM runs")).mappings()]
    wanted = {"gpu_type": filters.gpu_type, "seq_len": filters.seq_len, "framework": filters.framework,
              "global_batch_tokens": filters.global_batch_tokens, "precision": filters.precision}
    cells: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["model_size_class"] is None or r["nodes"] is None:
            continue
        if any(v is not None and r[f] != v for f, v in wanted.items()):
            continue
        if filters.started_after and (r["started_at"] is None or r["started_at"] < filters.started_after):
            continue
        if filters.started_before and (r["started_at"] is None or r["started_at"] >= filters.started_before):
            continue
        cells.setdefault((r["model_size_class"], r["nodes"]), []).append(r)
    out = []
    for (msc, nodes), runs in sorted(cells.items()):
        ok = [r for r in runs if r["status"] == "success"]
        value = _mfu if metric == "mfu" else (lambda r: r["tokens_per_sec_per_gpu"])
        ranked = sorted(ok, key=lambda r: (value(r) is None, -(value(r) or 0.0), _mfu(r) is None,
                                           -(_mfu(r) or 0.0), r["id"]))
        n_oom = sum(r["status"] == "oom" for r in runs)
        out.append((msc, nodes, ranked[0]["id"] if ranked else None, len(ok), n_oom, len(runs) - len(ok) - n_oom))
    return out


def answered(db: Database, filters: hm.HeatmapFilters, metric: str, *, summary: bool) -> list[dict]:
    with db.session() as s:
        return hm.heatmap(s, filters, metric, kept=db.kept if summary else None)


def as_tuples(cells: list[dict]) -> list[tuple]:
    return [(c["model_size_class"], c["nodes"], c["best"]["id"] if c["best"] else None, c["n_success"],
             c["n_oom"], c["n_failed"]) for c in cells]


def filter_sets(db: Database) -> list[hm.HeatmapFilters]:
    """No filter, and filters built from values that are stored (so each selects some runs)."""
    with db.engine.connect() as conn:
        gpu, seq, fw = conn.execute(sa.text(
            "SELECT gpu_type, seq_len, framework FROM runs WHERE gpu_type IS NOT NULL AND seq_len IS NOT NULL "
            "AND framework IS NOT NULL ORDER BY id LIMIT 1")).one()
    return [hm.HeatmapFilters(), hm.HeatmapFilters(gpu_type=gpu), hm.HeatmapFilters(seq_len=seq, framework=fw),
            hm.HeatmapFilters(started_after=datetime(2025, 6, 1))]


def check_all(db: Database, filters: list[hm.HeatmapFilters]) -> None:
    for f in filters:
        for metric in METRICS:
            ref = reference(db, f, metric)
            scan = answered(db, f, metric, summary=False)
            kept = answered(db, f, metric, summary=True)
            assert as_tuples(scan) == ref, (f, metric)
            assert kept == scan, (f, metric)  # every field of every cell, best rows included


def test_heatmap_equals_the_reference_after_every_ingest_path(database):
    """Bulk batches, a small batch, single runs, re-sent runs; heatmaps asked between the writes
    (so DuckDB's kept heatmaps merge each step's runs into what they held)."""
    runs = list(benchtool.generate_runs(1500, seed=21, prefix="hm"))
    with database.session(write=True) as s:
        store.store_runs(s, runs[:800], bulk=True)
    filters = filter_sets(database)
    check_all(database, filters)
    with database.session(write=True) as s:
        store.store_runs(s, runs[800:812])
    for r in runs[812:830]:
        store.ingest(database, [r])  # DuckDB: through the ingest journal
    check_all(database, filters)
    with database.session(write=True) as s:  # half already stored: only the new half counts
        store.store_runs(s, runs[700:1500], bulk=True)
    check_all(database, filters)
    kept = database.kept
    if database.is_duckdb:
        with database.engine.connect() as conn:
            newest = conn.execute(sa.text("SELECT max(id) FROM runs")).scalar()
        keys = [k for k in kept.keys() if k[0] == "heatmap"]
        assert len(keys) == len(filters) * len(METRICS)
        assert {kept.watermark(k) for k in keys} == {newest}
    else:
        assert kept is None  # PostgreSQL aggregates on every request


def test_later_runs_replace_a_cell_best_only_by_the_ranking(database):
    """A tie on the metric goes to the higher MFU, then to the lower id, whichever request stored
    the runs; a cell that had only failures gets its first success; a success without the metric
    ranks after one with it. (A GPU type outside the catalog has no derived MFU, so the reported
    MFU breaks the tie.)"""
    base = {"model_params": 8_000_000_000, "nodes": 2, "gpus_per_node": 8, "gpu_type": "Lab-GPU-9", "tp": 2, "pp": 1,
            "dp": 8, "zero_stage": 1, "micro_batch_size": 2, "grad_accum_steps": 4, "seq_len": 4096}
    steps = [
        [{**base, "run_key": "a", "status": "success", "tokens_per_sec_per_gpu": 5000.0, "mfu": 0.40},
         {**base, "run_key": "f", "nodes": 4, "dp": 16, "status": "oom", "error_class": "oom_gpu"}],
        [{**base, "run_key": "b", "status": "success", "tokens_per_sec_per_gpu": 5000.0, "mfu": 0.30}],
        [{**base, "run_key": "c", "status": "success", "tokens_per_sec_per_gpu": 5000.0, "mfu": 0.45},
         {**base, "run_key": "g", "nodes": 4, "dp": 16, "status": "success"}],
        [{**base, "run_key": "h", "nodes": 4, "dp": 16, "status": "success", "tokens_per_sec_per_gpu": 10.0}],
    ]
    expected_best = [("a", None), ("a", None), ("c", "g"), ("c", "h")]
    for step, (best2, best4) in zip(steps, expected_best):
        with database.session(write=True) as s:
            store.store_runs(s, step)
        with database.engine.connect() as conn:
            ids = dict(conn.execute(sa.text("SELECT run_key, id FROM runs")).all())
        for metric in ("tokens_per_sec_per_gpu",):
            cells = {c["nodes"]: c for c in answered(database, hm.HeatmapFilters(), metric, summary=True)}
            assert cells[2]["best"]["id"] == ids[best2]
            assert (cells[4]["best"] or {}).get("id") == (ids[best4] if best4 else None)
            assert as_tuples(cells.values()) == reference(database, hm.HeatmapFilters(), metric)


@pytest.mark.parametrize("backend", ["duckdb"])
def test_runs_deleted_outside_scalebook_rebuild_the_kept_heatmap(database):
    """SQL run behind scalebook's back deletes runs the kept heatmap counted: the next request
    sees the count below its watermark change and aggregates everything again."""
    runs = list(benchtool.generate_runs(400, seed=22, prefix="hmdel"))
    with database.session(write=True) as s:
        store.store_runs(s, runs, bulk=True)
    before = answered(database, hm.HeatmapFilters(), "tokens_per_sec_per_gpu", summary=True)
    with database.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM runs WHERE id % 3 = 0"))
    after = answered(database, hm.HeatmapFilters(), "tokens_per_sec_per_gpu", summary=True)
    assert after != before
    assert as_tuples(after) == reference(database, hm.HeatmapFilters(), "tokens_per_sec_per_gpu")


@pytest.mark.parametrize("backend", ["duckdb"])
def test_kept_heatmaps_are_bounded_and_shared_per_file(database, monkeypatch):
    from service.analytics import kept as kept_module

    with database.session(write=True) as s:
        store.store_runs(s, list(benchtool.generate_runs(100, seed=23, prefix="hmlru")), bulk=True)
    other = Database(database.url)  # a second Database of the same file in this process shares it
    try:
        assert other.kept is database.kept
    finally:
        other.dispose()
    kept = database.kept
    assert isinstance(kept, kept_module.KeptAggregates)
    monkeypatch.setattr(kept, "_max", 3)
    for seq_len in (1024, 2048, 4096, 8192, 16384):
        answered(database, hm.HeatmapFilters(seq_len=seq_len), "mfu", summary=True)
    assert [k[2][1] for k in kept.keys()] == [4096, 8192, 16384]  # the least recently used left


def test_api_heatmap_sees_each_post_at_once(client, database):
    """Through the API (DuckDB: journaled single POSTs, kept heatmap): every POST is in the next
    GET /heatmap, which equals the reference."""
    runs = list(benchtool.generate_runs(60, seed=24, prefix="hmapi"))
    assert client.post("/api/v1/runs", json={"runs": runs[:40]}).status_code == 201
    for r in runs[40:]:
        assert client.post("/api/v1/runs", json=r).status_code == 201
        body = client.get("/api/v1/heatmap").json()
        got = [(c["model_size_class"], c["nodes"], c["best"]["id"] if c["best"] else None, c["n_success"],
                c["n_oom"], c["n_failed"]) for c in body["cells"]]
        assert got == reference(database, hm.HeatmapFilters(), "tokens_per_sec_per_gpu")
        with database.engine.connect() as conn:
            placed = conn.execute(sa.text(
                "SELECT count(*) FROM runs WHERE model_size_class IS NOT NULL AND nodes IS NOT NULL")).scalar()
        assert sum(c["n_success"] + c["n_oom"] + c["n_failed"] for c in body["cells"]) == placed


@pytest.mark.parametrize("backend", ["duckdb"])
def test_a_kept_value_already_answered_is_never_changed(database):
    """Merges build new values: a value handed to one request stays as it was while a later
    request merges newer runs (the request may still be reading it)."""
    import copy

    runs = list(benchtool.generate_runs(900, seed=26, prefix="hmcow"))
    with database.session(write=True) as s:
        store.store_runs(s, runs[:600], bulk=True)

    def kept_values():
        answered(database, hm.HeatmapFilters(), "mfu", summary=True)
        answered(database, hm.HeatmapFilters(), "tokens_per_sec_per_gpu", summary=True)
        return {key: database.kept._entries[key[0]][key].value for key in database.kept.keys()}

    first = kept_values()
    frozen = copy.deepcopy(first)
    with database.session(write=True) as s:
        store.store_runs(s, runs[600:], bulk=True)
    second = kept_values()
    assert first == frozen  # untouched by the merges of the second round
    assert any(second[key] != first[key] for key in first if key in second)


@pytest.mark.parametrize("backend", ["duckdb"])
def test_no_request_waits_for_a_connection_while_holding_a_kept_lock(database):
    """Every pooled connection held by requests that are about to read kept aggregates, and a
    heatmap request without a connection yet: all finish (none holds a lock while it waits for
    the pool, which would deadlock until the pool's 30 s timeout)."""
    import threading

    with database.session(write=True) as s:
        store.store_runs(s, list(benchtool.generate_runs(500, seed=27, prefix="hmpool")), bulk=True)
    holders = database.engine.pool.size() + database.engine.pool._max_overflow
    ready, go, errors = threading.Barrier(holders + 1), threading.Event(), []

    def holding_a_connection():
        try:
            with database.session() as s:
                s.execute(sa.text("SELECT 1"))
                ready.wait()
                go.wait(timeout=60)
                hm.heatmap(s, hm.HeatmapFilters(), "tokens_per_sec_per_gpu", kept=database.kept)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    def heatmap_request():
        try:
            answered(database, hm.HeatmapFilters(), "mfu", summary=True)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=holding_a_connection) for _ in range(holders)]
    for t in threads:
        t.start()
    ready.wait()
    heat = threading.Thread(target=heatmap_request)
    heat.start()
    import time

    time.sleep(0.3)  # the heatmap request is now waiting for a connection
    go.set()
    for t in [*threads, heat]:
        t.join(timeout=25)
    assert not any(t.is_alive() for t in [*threads, heat]) and errors == []


@pytest.mark.parametrize("backend", ["duckdb"])
def test_a_session_older_than_the_kept_aggregate_gets_its_own_snapshot(database):
    """A request whose snapshot predates the kept heatmap (a concurrent request stored runs and
    moved it on) answers as of its own snapshot, and the kept heatmap stays at the newer id."""
    runs = list(benchtool.generate_runs(500, seed=28, prefix="hmold"))
    with database.session(write=True) as s:
        store.store_runs(s, runs[:300], bulk=True)
    filters = hm.HeatmapFilters()
    with database.session() as old:
        old.execute(sa.text("SELECT count(*) FROM runs")).scalar()  # the snapshot is taken here
        with database.session(write=True) as s:
            store.store_runs(s, runs[300:], bulk=True)
        newer = answered(database, filters, "tokens_per_sec_per_gpu", summary=True)
        key = next(k for k in database.kept.keys() if k[0] == "heatmap")
        mark = database.kept.watermark(key)
        mine = hm.heatmap(old, filters, kept=database.kept)
        assert mine == hm.heatmap(old, filters) != newer
        assert sum(c["n_success"] + c["n_oom"] + c["n_failed"] for c in mine) < \
            sum(c["n_success"] + c["n_oom"] + c["n_failed"] for c in newer)
    assert database.kept.watermark(key) == mark
    assert answered(database, filters, "tokens_per_sec_per_gpu", summary=True) == newer
