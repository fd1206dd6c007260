"""run_configs, the per-configuration summary maintained at ingest, on DuckDB and PostgreSQL.

The reference is computed here from the `runs` rows alone, independently of service/run_configs.py:
group the successful runs by the recommender's key, count, min/max, and pick the best run by
sorting (highest metric, then lowest id; runs without the metric last).
"""

from __future__ import annotations

import concurrent.futures
import random

import pytest
import sqlalchemy as sa

from service import benchtool, run_configs, store
from service.db import Database

KEY = ("model_size_class", "nodes", "gpus_per_node", "gpu_type", "seq_len", "dp", "tp", "pp", "cp", "ep",
       "zero_stage", "micro_batch_size", "grad_accum_steps", "recompute")


def reference(db: Database) -> dict[tuple, dict]:
    """{group key: {n_runs, tps_n/min/max/best_id, mfu_n/min/max/best_id}} from `runs`."""
    db.flush()  # runs still in a DuckDB ingest journal move into `runs` first
    with db.engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(sa.text("SELECT * FROM runs")).mappings()]
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        if r["status"] == "success" and r["model_size_class"] is not None and r["nodes"] is not None:
            groups.setdefault(tuple(r[f] for f in KEY), []).append(r)
    out = {}
    for key, runs in groups.items():
        g = {"n_runs": len(runs)}
        for p, get in (("tps", lambda r: r["tokens_per_sec_per_gpu"]),
                       ("mfu", lambda r: r["mfu_derived"] if r["mfu_derived"] is not None else r["mfu"])):
            values = [get(r) for r in runs if get(r) is not None]
            with_value = sorted((r for r in runs if get(r) is not None), key=lambda r: (-get(r), r["id"]))
            best = with_value[0] if with_value else min(runs, key=lambda r: r["id"])
            g.update({f"{p}_n": len(values), f"{p}_min": min(values, default=None),
                      f"{p}_max": max(values, default=None), f"{p}_best_id": best["id"],
                      f"{p}_best_peak_memory_gib": best["peak_memory_gib"]})
        out[key] = g
    return out


def summary(db: Database, *, stored_only: bool = False) -> dict[tuple, dict]:
    """The summary as /recommend reads it (run_configs.rows: on DuckDB with the runs not yet
    folded in), or with `stored_only` the table alone, in the shape of `reference`."""
    if stored_only:
        with db.engine.connect() as conn:
            rows = [dict(r) for r in conn.execute(sa.text("SELECT * FROM run_configs")).mappings()]
    else:
        with db.session() as s:
            rows = run_configs.rows(s)
    keys = [r["config_key"] for r in rows]
    assert len(keys) == len(set(keys))
    fields = ["n_runs"] + [f"{p}_{f}" for p in ("tps", "mfu")
                           for f in ("n", "min", "max", "best_id", "best_peak_memory_gib")]
    return {tuple(r[f] for f in KEY): {f: r[f] for f in fields} for r in rows}


def test_summary_follows_every_ingest_path(database):
    """Bulk batches, small batches, single runs, re-sent runs: the summary equals the reference."""
    runs = list(benchtool.generate_runs(1600, seed=11, prefix="cfg"))
    with database.session(write=True) as s:
        store.store_runs(s, runs[:1000], bulk=True)
    with database.session(write=True) as s:
        store.store_runs(s, runs[1000:1012])
    for r in runs[1012:1040]:
        with database.session(write=True) as s:
            store.store_runs(s, [r])
    with database.session(write=True) as s:  # half already stored: only the new half counts
        store.store_runs(s, runs[900:1600], bulk=True)
    ref = reference(database)
    assert len(ref) > 100  # the generator spreads runs over many configurations
    assert summary(database) == ref


def test_duckdb_folds_in_bulk_and_readers_see_every_run(database, monkeypatch):
    """DuckDB appends runs and folds them into the table once FOLD_EVERY have gathered; readers
    add the runs past the watermark. PostgreSQL merges every request: its table is always whole."""
    monkeypatch.setattr(run_configs, "FOLD_EVERY", 250)
    runs = list(benchtool.generate_runs(700, seed=15, prefix="fold"))
    for start in range(0, 600, 100):
        with database.session(write=True) as s:
            store.store_runs(s, runs[start:start + 100], bulk=True)
    with database.session(write=True) as s:  # a successful run: it changes the summary
        store.store_runs(s, [next(r for r in runs[600:] if r["status"] == "success")])
    ref = reference(database)
    assert summary(database) == ref
    with database.engine.connect() as conn:
        mark = conn.execute(sa.text("SELECT folded_through_id FROM run_configs_state")).scalar()
        ids = sorted(r for (r,) in conn.execute(sa.text("SELECT id FROM runs")))
    if database.is_duckdb:  # folded after 300 runs (≥ 250 past 0) and after 600; the last one waits
        assert mark == ids[599] and summary(database, stored_only=True) != ref
        with database.session(write=True) as s:
            assert run_configs.fold(s) > 0
        with database.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT folded_through_id FROM run_configs_state")).scalar() == ids[-1]
    assert summary(database, stored_only=True) == ref


def test_summary_after_a_refused_request_is_unchanged(database):
    runs = list(benchtool.generate_runs(50, seed=12, prefix="cfgrej"))
    with database.session(write=True) as s:
        store.store_runs(s, runs[:30])
    before = summary(database)
    bad = [dict(r) for r in runs[30:]] + [{**runs[0], "nodes": 999}]  # changed content: 409, nothing stored
    with pytest.raises(Exception, match="conflict"):
        with database.session(write=True) as s:
            store.store_runs(s, bad)
    assert summary(database) == before == reference(database)


def test_ties_and_missing_metrics_pick_the_lowest_id(database):
    """Equal throughput → the earlier run; no throughput at all → the earliest run of the group."""
    base = {"model_params": 8_000_000_000, "nodes": 2, "gpus_per_node": 8, "gpu_type": "H100", "tp": 2,
            "pp": 1, "dp": 8, "zero_stage": 1, "micro_batch_size": 2, "grad_accum_steps": 4, "seq_len": 4096,
            "status": "success"}
    tied = [{**base, "run_key": f"tie-{i}", "tokens_per_sec_per_gpu": 5000.0} for i in range(3)]
    bare = [{**base, "run_key": f"bare-{i}", "nodes": 4, "dp": 16} for i in range(3)]
    for r in tied + bare:
        with database.session(write=True) as s:
            store.store_runs(s, [r])
    with database.engine.connect() as conn:
        ids = dict(conn.execute(sa.text("SELECT run_key, id FROM runs")).all())
    for fold in (False, True):  # DuckDB: aggregated on the fly (not folded yet), then from the table
        if fold:
            with database.session(write=True) as s:
                run_configs.fold(s)
        with database.session() as s:
            rows = {r["nodes"]: r for r in run_configs.rows(s)}
        assert rows[2]["tps_best_id"] == ids["tie-0"] and rows[2]["tps_n"] == 3 and rows[2]["n_runs"] == 3
        assert rows[4]["tps_best_id"] == ids["bare-0"] and rows[4]["tps_n"] == 0 and rows[4]["tps_max"] is None
        assert summary(database) == reference(database)


def test_concurrent_writers_keep_the_summary_exact(database):
    """Four threads storing overlapping batches of the same configurations at once."""
    runs = list(benchtool.generate_runs(800, seed=13, prefix="cfgconc"))
    random.Random(0).shuffle(runs)
    chunks = [runs[i:i + 100] + runs[(i + 300) % 800:(i + 300) % 800 + 20] for i in range(0, 800, 100)]

    def write(chunk):
        with database.session(write=True) as s:
            store.store_runs(s, chunk, bulk=True)

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        for f in [pool.submit(write, c) for c in chunks]:
            f.result()
    assert summary(database) == reference(database)


def test_rebuild_recomputes_the_same_table(database):
    runs = list(benchtool.generate_runs(700, seed=14, prefix="cfgreb"))
    with database.session(write=True) as s:
        store.store_runs(s, runs, bulk=True)
    maintained = summary(database)
    with database.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM run_configs"))
    assert summary(database, stored_only=True) == {}
    with database.engine.begin() as conn:
        n = run_configs.rebuild(conn, chunk=97)  # odd chunk size: groups split across chunks
    assert n == len(maintained) and summary(database, stored_only=True) == maintained == reference(database)
    assert summary(database) == maintained  # the watermark moved: nothing is counted twice


def test_cli_rebuild_configs_after_an_outside_delete(database, monkeypatch):
    """Rows deleted behind scalebook's back: `scalebook db rebuild-configs` brings the summary back
    in step with them."""
    from typer.testing import CliRunner

    from service.cli import app
    from service.settings import get_settings

    runs = list(benchtool.generate_runs(300, seed=15, prefix="cfgcli"))
    with database.session(write=True) as s:
        store.store_runs(s, runs, bulk=True)
    with database.session(write=True) as s:  # DuckDB: into the table now, not at the next fold
        run_configs.fold(s)
    with database.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM runs WHERE id % 3 = 0"))
    assert summary(database) != reference(database)
    monkeypatch.setenv("SCALEBOOK_DATABASE_URL", database.url)
    get_settings.cache_clear()  # settings are read once per process
    try:
        result = CliRunner().invoke(app, ["db", "rebuild-configs"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    assert f"{len(reference(database))} configurations" in result.output
    assert summary(database) == reference(database)


def test_single_run_requests_store_runs_and_summary_together(database):
    """store.ingest of one run — on PostgreSQL one autocommit statement writing runs and
    run_configs (service/store_one_pg.py), on DuckDB the ingest journal: every run stored once,
    the summary equal to the reference; a resend answers 'existing', changed content 409, and
    two threads sending the same new run at once store it once (one 'created', one 'existing')."""
    from service.errors import Conflict

    runs = list(benchtool.generate_runs(120, seed=16, prefix="cfgone"))
    answers = [store.ingest(database, [r]) for r in runs[:100]]
    assert [(created, existing) for _, created, existing in answers] == [(1, 0)] * 100
    ids = [stored[0].id for stored, _, _ in answers]
    assert ids == sorted(ids) and len(set(ids)) == 100
    again, created, existing = store.ingest(database, [runs[5]])
    assert (created, existing) == (0, 1) and again[0].id == ids[5]
    with pytest.raises(Conflict):
        store.ingest(database, [{**runs[5], "nodes": runs[5]["nodes"] * 2}])

    def send(run):
        return store.ingest(database, [run])[1:]

    for run in runs[100:]:
        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            outcomes = sorted(pool.map(send, [run, dict(run)]))
        assert outcomes == [(0, 1), (1, 0)]
    with database.session() as s:
        stored = s.execute(sa.text("SELECT run_key, count(*) FROM runs GROUP BY run_key")).all()
    assert len(stored) == 120 and {n for _, n in stored} == {1}
    assert summary(database) == reference(database)
