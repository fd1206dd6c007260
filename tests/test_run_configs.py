"""run_configs, the per-configuration summary kept in the write transaction (service/run_configs.py,
migration 0018; issue 25 item 4), on both backends: after every write path — batches, single runs, a
resend, retire, un-retire, delete, concurrent writers — it equals a recompute from `runs`, and the
recommender reads the same rows from it as from the per-request aggregate it replaces."""

from __future__ import annotations

import math
import threading

import pytest
import sqlalchemy as sa

from service import retire, run_cells, run_configs, store
from service.analytics import throughput as th
from service.cli import benchmark as benchtool
from service.db import Database


@pytest.fixture(scope="module")
def synthetic() -> list[dict]:
    """600 realistic runs (the bench generator: ≈82 % success, OOMs, NCCL errors, published layouts,
    recorded bandwidths on the nanotron rows)."""
    return list(benchtool.generate_runs(600, seed=7))


def assert_summary_is_recompute(database: Database) -> dict[str, tuple]:
    """run_configs == rebuild()'s rows (floats to 1e-9 relative: running sums vs one SUM), and run_cells
    (service/run_cells.py, kept by the same write paths) == its rebuild() exactly; returns run_configs'."""
    with database.session() as s:
        kept, fresh = run_configs.stored(s), run_configs.recompute(s)
        assert run_cells.stored(s) == run_cells.recompute(s)
    assert kept.keys() == fresh.keys()
    for key, row in kept.items():
        for a, b in zip(row, fresh[key], strict=True):
            if isinstance(a, float) or isinstance(b, float):
                assert math.isclose(a, b, rel_tol=1e-9), (key, row, fresh[key])
            else:
                assert a == b, (key, row, fresh[key])
    return kept


def assert_reader_agrees(database: Database) -> None:
    """The recommender's configuration rows from run_configs == the aggregate of `runs` per request."""
    with database.session() as s:
        assert th.read_configs(s) == th.read_configs(s, exclude=sa.false())


def test_summary_follows_every_write_path(database, synthetic):
    runs = synthetic
    store.ingest(database, runs[:300])                       # one batch
    for r in runs[300:320]:                                   # single runs
        store.ingest(database, [r])
    store.ingest(database, runs[280:450])                    # stored + new: only the new ones count
    kept = assert_summary_is_recompute(database)
    assert len(kept) > 20 and sum(v[len(run_configs.CONFIG_COLS)] for v in kept.values()) > 100
    assert_reader_agrees(database)

    with database.session(write=True) as s:                  # retire by a filter, then un-retire half
        retired = retire.retire(s, None, {"gpu_type": "H100-SXM-80GB", "nodes": 2}, "test")
    assert retired
    assert_summary_is_recompute(database)
    with database.session(write=True) as s:
        retire.unretire(s, retired[: len(retired) // 2], None)
    assert_summary_is_recompute(database)
    assert_reader_agrees(database)

    with database.session(write=True) as s:                  # delete: a group's best and first run go
        ids = [i for (i,) in s.execute(sa.text("SELECT first_id FROM run_configs ORDER BY config_key LIMIT 5"))]
        best = [i for (i,) in s.execute(sa.text(
            "SELECT min(r.id) FROM runs r JOIN run_configs c ON r.tokens_per_sec_per_gpu = c.tokens_per_sec_per_gpu "
            "GROUP BY c.config_key ORDER BY c.config_key LIMIT 5"))]
        assert retire.delete(s, ids + best, None)
    assert_summary_is_recompute(database)

    store.ingest(database, runs[450:])                       # and inserts after all that
    assert_summary_is_recompute(database)
    assert_reader_agrees(database)


def test_a_group_emptied_by_retirement_leaves_and_comes_back(database, synthetic):
    ok = [r for r in synthetic if r["status"] == "success" and r.get("precision")][:1]
    store.ingest(database, ok)
    with database.session() as s:
        assert len(run_configs.stored(s)) == 1
    with database.session(write=True) as s:
        retire.retire(s, None, {"run_key": ok[0]["run_key"]}, "test")
    with database.session() as s:
        assert run_configs.stored(s) == {}
    with database.session(write=True) as s:
        retire.unretire(s, None, {"run_key": ok[0]["run_key"]})
    assert len(assert_summary_is_recompute(database)) == 1


def test_failed_runs_change_nothing(database, synthetic):
    failed = [r for r in synthetic if r["status"] != "success"][:40]
    store.ingest(database, failed)
    with database.session() as s:
        assert run_configs.stored(s) == {}


def test_a_wide_refresh_rebuilds(database, synthetic, monkeypatch):
    store.ingest(database, synthetic[:200])
    monkeypatch.setattr(run_configs, "MAX_REFRESH_GROUPS", 1)
    with database.session(write=True) as s:
        assert retire.retire(s, None, {"nodes_min": 1}, "everything")
    with database.session() as s:
        assert run_configs.stored(s) == {}
    with database.session(write=True) as s:
        retire.unretire(s, None, {"nodes_min": 1})
    assert assert_summary_is_recompute(database)


def test_rebuild_after_outside_sql(database, synthetic):
    """Runs deleted with outside SQL leave the summary behind until `scalebook db rebuild-configs`."""
    store.ingest(database, synthetic[:200])
    with database.session(write=True) as s:
        s.execute(sa.text("DELETE FROM runs WHERE id % 3 = 0"))
    with database.session() as s:
        assert run_configs.stored(s) != run_configs.recompute(s)
    with database.session(write=True) as s:
        run_configs.rebuild(s)
        assert run_cells.stored(s) != run_cells.recompute(s)
        run_cells.rebuild(s)
    assert_summary_is_recompute(database)


def test_concurrent_writers_keep_it_exact(database, synthetic):
    """Writers in parallel whose batches share configurations (PostgreSQL: concurrent transactions
    merging into the same rows, locked in key order; DuckDB: serialised writes)."""
    chunks = [synthetic[i::6] for i in range(6)]
    errors: list[BaseException] = []

    def write(chunk: list[dict]) -> None:
        try:
            for i in range(0, len(chunk), 25):
                store.ingest(database, chunk[i:i + 25])
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(c,)) for c in chunks]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert_summary_is_recompute(database)
    assert_reader_agrees(database)


def test_rebuild_configs_command(database, synthetic, db_url, monkeypatch):
    from typer.testing import CliRunner

    from service.cli import app
    from service.settings import get_settings

    store.ingest(database, synthetic[:100])
    with database.session(write=True) as s:
        s.execute(sa.text("DELETE FROM run_configs"))
        s.execute(sa.text("DELETE FROM run_cells"))
    monkeypatch.setenv("SCALEBOOK_DATABASE_URL", db_url)
    database.dispose()
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["db", "rebuild-configs"])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    assert "configurations" in result.output
    assert assert_summary_is_recompute(database)


def test_python_and_sql_keys_agree(database, synthetic):
    """key_of (the DuckDB insert path's key) == KEY_SQL (refresh, rebuild, migration 0018, PostgreSQL's
    insert path) for every configuration stored, and for the values whose text differs between the
    backends (a whole float: PostgreSQL 470, DuckDB 470.0; booleans; NULLs)."""
    store.ingest(database, synthetic)
    with database.session(write=True) as s:
        s.execute(sa.text("UPDATE runs SET model_size_class = 470.0, gated_linear_unit = FALSE WHERE id % 5 = 0"))
        s.execute(sa.text("UPDATE runs SET model_size_class = 0.35, gated_linear_unit = NULL WHERE id % 5 = 1"))
        cols = ", ".join(run_configs.CONFIG_COLS)
        rows = s.execute(sa.text(f"SELECT DISTINCT {run_configs.KEY_SQL}, {cols} FROM runs")).all()
    assert len(rows) > 50
    assert [run_configs.key_of(tuple(r[1:])) for r in rows] == [r[0] for r in rows]


def test_an_open_run_enters_when_it_finishes(database, synthetic):
    """A `running` run is in no summary row; finished as a success (the same run_key, DESIGN §9) it
    enters its configuration's."""
    done = next(r for r in synthetic if r["status"] == "success" and r.get("precision") and r.get("micro_batch_size")
                and r.get("grad_accum_steps"))
    opening = {k: v for k, v in done.items()
               if k not in ("tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu", "hfu", "step_time_s",
                            "peak_memory_gib")}
    store.ingest(database, [{**opening, "status": "running"}])
    with database.session() as s:
        assert run_configs.stored(s) == {}
    store.ingest(database, [done])
    assert len(assert_summary_is_recompute(database)) == 1


def test_fetch_ordered_orders_as_python_sorts(database):
    """db.fetch_ordered (read_configs' reading of run_configs: DuckDB's columns ordered by numpy's lexsort,
    PostgreSQL's rows by Python's sorts) gives fetch_rows' tuples in the order of Python's stable sorts, last column
    first, each column's values ascending (strings by code point, whatever the collation), NULLs last."""
    from service.db import fetch_ordered, fetch_rows

    texts = ["a", "B", "b", "Z", "é", "É", "ä", "", "a b", "a-b", None]
    rows = [(texts[(3 * i) % len(texts)], [True, False, None][i % 3], [3, -1, None, 10, 3][i % 5],
             [0.5, None, -2.0, 0.5][i % 4], i) for i in range(60)]
    with database.session(write=True) as s:
        s.execute(sa.text("CREATE TEMPORARY TABLE t_order (s VARCHAR, b BOOLEAN, i INTEGER, f DOUBLE PRECISION, "
                          "n INTEGER)"))
        for r in rows:
            s.execute(sa.text("INSERT INTO t_order VALUES (:s, :b, :i, :f, :n)"),
                      dict(zip(("s", "b", "i", "f", "n"), r)))
        sql = "SELECT s, b, i, f, n FROM t_order"
        got = fetch_ordered(s, sql, ("s", "b", "i", "f"))
        fetched = fetch_rows(s, sql)
        s.execute(sa.text("DROP TABLE t_order"))
    expected = sorted(fetched, key=lambda r: r[4])
    for i in reversed(range(4)):
        expected = sorted((r for r in expected if r[i] is not None), key=lambda r: r[i]) + \
            [r for r in expected if r[i] is None]
    assert got == expected
    assert [tuple(map(type, r)) for r in got] == [tuple(map(type, r)) for r in expected]
