"""Alembic migrations on both backends (DESIGN §5): upgrade from empty, downgrade/upgrade round
trips, models == migrations (autogenerate finds nothing to do), and a database filled at each
earlier revision upgrades to head without losing a row.

DuckDB cannot reflect indexes, so there the model comparison covers tables and columns only;
PostgreSQL compares everything, indexes included.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from conftest import create_pg_database, drop_pg_database

from service import run_cells, run_configs, store
from service.cli import benchmark as benchtool
from service.db import Database, alembic_config
from service.tables import Base

#: Index-only diff kinds, ignored on DuckDB (no index reflection there).
INDEX_DIFFS = {"add_index", "remove_index", "add_constraint", "remove_constraint"}
#: PostgreSQL-only indexes created by migration 0003 under a dialect check, to be declared in
#: service/tables.py with `.ddl_if(dialect="postgresql")` (see that migration). Tolerated only
#: while service/tables.py does not declare them yet; once it does they are compared like the rest.
PG_ONLY_INDEXES = {"ix_runs_best_tps", "ix_runs_best_mfu", "ix_runs_config", "ix_runs_oom"}


def revisions() -> list[str]:
    """Revision ids, oldest first."""
    script = ScriptDirectory.from_config(alembic_config("duckdb:///:memory:"))
    return [r.revision for r in reversed(list(script.walk_revisions()))]


@pytest.fixture
def empty_url(backend, tmp_path, worker_tag) -> Iterator[str]:
    """URL of a brand-new, empty database on `backend` (no tables, no alembic_version)."""
    if backend == "duckdb":
        yield f"duckdb:///{tmp_path / 'empty.duckdb'}"
        return
    name = f"sbmig_{worker_tag}_{uuid.uuid4().hex[:6]}"
    url = create_pg_database(name)
    try:
        yield url
    finally:
        drop_pg_database(name)


def table_names(db: Database) -> set[str]:
    return set(sa.inspect(db.engine).get_table_names())


def test_revision_chain_is_linear():
    script = ScriptDirectory.from_config(alembic_config("duckdb:///:memory:"))
    assert len(script.get_heads()) == 1, f"several heads: {script.get_heads()} (chain new revisions after the head)"
    assert revisions()[0] == "0001"


def test_upgrade_from_empty(empty_url):
    db = Database(empty_url)
    try:
        assert table_names(db) == set()
        db.upgrade()
        assert db.current_revision() == db.head_revision() == revisions()[-1]
        assert {"runs", "api_tokens", "alembic_version"} <= table_names(db)
        db.check_schema()
    finally:
        db.dispose()


def test_db_current_in_a_fresh_process_on_duckdb(tmp_path):
    import os
    import subprocess
    import sys

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("SCALEBOOK_")},
           "SCALEBOOK_DATABASE_URL": f"duckdb:///{tmp_path / 'fresh.duckdb'}", "COLUMNS": "300"}
    done = subprocess.run([sys.executable, "-m", "service.cli", "db", "current"], env=env, capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr[-500:]
    assert "current: None" in done.stdout


def test_downgrade_upgrade_round_trip(empty_url):
    db = Database(empty_url)
    cfg = alembic_config(empty_url)
    try:
        db.upgrade()
        for expected in reversed([None, *revisions()[:-1]]):  # step down one revision at a time
            command.downgrade(cfg, "-1")
            assert db.current_revision() == expected
        assert not ({"runs", "api_tokens"} & table_names(db))
        db.upgrade()
        command.downgrade(cfg, "base")
        db.upgrade()
        assert db.current_revision() == db.head_revision()
        _insert_runs(db, 5)
        with db.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM runs")).scalar() == 5
    finally:
        db.dispose()


def test_models_and_migrations_agree(empty_url, backend):
    db = Database(empty_url)
    try:
        db.upgrade()
        with db.engine.connect() as conn:
            # duckdb-engine reflects DOUBLE as FLOAT, TEXT as VARCHAR and JSON as VARCHAR: compare
            # types there through information_schema instead (below)
            ctx = MigrationContext.configure(conn, opts={"compare_type": backend != "duckdb",
                                                         "compare_server_default": False})
            diffs = compare_metadata(ctx, Base.metadata)
            if backend == "duckdb":
                declared = _duckdb_column_types(conn)
    finally:
        db.dispose()
    flat = [d for d in _flatten(diffs)]
    if backend == "duckdb":
        flat = [d for d in flat if d[0] not in INDEX_DIFFS]
        wanted = {(t.name, c.name): _duckdb_type(c.type) for t in Base.metadata.tables.values() for c in t.columns}
        assert {k: declared.get(k) for k in wanted} == wanted
    else:
        declared = {ix.name for t in Base.metadata.tables.values() for ix in t.indexes}
        flat = [d for d in flat if not (d[0] == "remove_index" and d[1].name in PG_ONLY_INDEXES - declared)]
    assert flat == [], f"models (service/tables.py) and migrations differ on {backend}: {flat}"


_DUCKDB_ALIASES = {"TEXT": "VARCHAR", "STRING": "VARCHAR", "FLOAT8": "DOUBLE", "INT8": "BIGINT", "INT4": "INTEGER",
                   "INT": "INTEGER", "DATETIME": "TIMESTAMP", "BOOL": "BOOLEAN", "DOUBLE PRECISION": "DOUBLE",
                   "TIMESTAMP WITHOUT TIME ZONE": "TIMESTAMP"}


def _normal(name: str) -> str:
    name = name.split("(")[0].strip().upper()
    return _DUCKDB_ALIASES.get(name, name)


def _duckdb_type(type_: sa.types.TypeEngine) -> str:
    """A model column type as DuckDB stores it (VARCHAR(200) → VARCHAR: DuckDB ignores lengths)."""
    from duckdb_engine import Dialect

    return _normal(type_.compile(dialect=Dialect()))


def _duckdb_column_types(conn) -> dict[tuple[str, str], str]:
    rows = conn.execute(sa.text("SELECT table_name, column_name, data_type FROM information_schema.columns "
                                "WHERE table_schema = current_schema()"))
    return {(t, c): _normal(d) for t, c, d in rows}


def _flatten(diffs: list) -> Iterator[tuple]:
    for d in diffs:
        if isinstance(d, list):  # column-level modifications come as lists of tuples
            yield from d
        else:
            yield d


def _insert_runs(db: Database, n: int, *, seed: int = 0) -> list[dict]:
    """Insert `n` valid runs with plain SQL, using only the columns the `runs` table has at the
    database's current revision (the code of today may know more). Returns the rows inserted."""
    table = sa.Table("runs", sa.MetaData(), autoload_with=db.engine)
    names = {c.name for c in table.columns} - {"id"}
    rows = store.validate_records(list(benchtool.generate_runs(n, seed, prefix=f"mig{seed}")))
    from datetime import datetime

    now = datetime(2026, 1, 2, 3, 4, 5, 678901)
    # before 0008 the degrees were NOT NULL and the code of then stored an unstated one as 1
    not_null_degrees = {c.name for c in table.columns if c.name in ("tp", "pp", "cp", "ep") and not c.nullable}
    payload = []
    for r in rows:
        r["ingested_at"] = now
        for d in not_null_degrees:
            if r.get(d) is None:
                r[d] = 1
        payload.append({k: v for k, v in r.items() if k in names})
    with db.engine.begin() as conn:
        conn.execute(table.insert(), payload)
    return payload


def _snapshot(db: Database, columns: list[str]) -> list[tuple]:
    with db.engine.connect() as conn:
        cols = ", ".join(columns)
        return [tuple(r) for r in conn.execute(sa.text(f"SELECT id, {cols} FROM runs ORDER BY id"))]


#: the first revision whose tables the code keeps in step with `runs` (0018: run_configs, 0020: run_cells):
#: runs written with plain SQL at or after it are outside the summaries until `rebuild`
SUMMARIES_FROM = 18


def _fill(db: Database, seed: int) -> tuple[list[str], list[tuple]]:
    """40 runs and an API token written with plain SQL at the database's revision; returns the runs'
    columns at that revision and the snapshot of those rows (id first)."""
    inserted = _insert_runs(db, 40, seed=seed)
    columns = sorted(inserted[0])
    with db.engine.begin() as conn:
        conn.execute(sa.text("INSERT INTO api_tokens (name, scope, token_hash, prefix, created_at) "
                             "VALUES (:name, 'read', :h, :prefix, :now)"),
                     {"name": f"t{seed}", "h": f"{seed:064d}", "prefix": f"sb_{seed}",
                      "now": inserted[0]["ingested_at"]})
    keys = {r["run_key"] for r in inserted}
    rows = [row for row in _snapshot(db, [*columns]) if row[1 + columns.index("run_key")] in keys]
    assert len(rows) == 40
    return columns, rows


def _check_upgraded(db: Database, filled: dict[str, tuple[list[str], list[tuple]]]) -> None:
    """At head: the rows written at each revision are intact on that revision's columns, the tokens
    are there, the summaries equal their recomputation, and today's code stores new runs."""
    assert db.current_revision() == db.head_revision()
    for revision, (columns, rows) in filled.items():
        ids = {row[0] for row in rows}
        now = [row for row in _snapshot(db, columns) if row[0] in ids]
        assert now == rows, f"rows written at revision {revision} changed by the upgrade"
    with db.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM api_tokens")).scalar() == len(filled)
    assert "run_configs_state" not in sa.inspect(db.engine).get_table_names()  # 0006 (run_configs: 0018)
    with db.session() as session:  # 0018 and 0020 filled the summaries from the runs stored
        assert run_configs.stored(session) == run_configs.recompute(session)
        assert run_cells.stored(session) == run_cells.recompute(session) and run_cells.stored(session)
    with db.session(write=True) as session:  # and the upgraded database takes new runs through today's code
        _, created, _ = store.store_runs(session, list(benchtool.generate_runs(30, 99, prefix="after")))
    assert created == 30
    with db.engine.connect() as conn:
        ids = [r[0] for r in conn.execute(sa.text("SELECT id FROM runs ORDER BY id"))]
    assert len(ids) == len(set(ids)) == 40 * len(filled) + 30
    with db.session() as session:  # and today's write path keeps it
        kept, fresh = run_configs.stored(session), run_configs.recompute(session)
        assert run_cells.stored(session) == run_cells.recompute(session)
    assert kept.keys() == fresh.keys() and len(kept) > 5


def test_database_filled_at_each_earlier_revision_upgrades_intact(empty_url):
    """Walk the chain one revision at a time up to SUMMARIES_FROM, writing runs and a token at every
    revision with that revision's columns, then upgrade to head: every row of every revision is intact
    and 0018/0020 summarise them all. (One walk, not one database per revision: each revision's rows
    still go through every later migration.)"""
    walk = [r for r in revisions()[:-1] if int(r) < SUMMARIES_FROM]
    db = Database(empty_url)
    try:
        filled = {}
        for seed, revision in enumerate(walk, start=1):
            db.upgrade(revision)
            filled[revision] = _fill(db, seed)
        db.upgrade()
        _check_upgraded(db, filled)
    finally:
        db.dispose()


@pytest.mark.parametrize("revision", [r for r in revisions()[:-1] if int(r) >= SUMMARIES_FROM] or ["<none>"])
def test_database_filled_at_a_summarised_revision_upgrades_intact(empty_url, revision):
    """Upgrade to `revision` (at or after SUMMARIES_FROM), fill it, upgrade to head: every row is intact
    once `rebuild` has taken in the runs written behind the code's back."""
    if revision == "<none>":
        pytest.skip("no revision at or after SUMMARIES_FROM below head")
    db = Database(empty_url)
    try:
        db.upgrade(revision)
        filled = {revision: _fill(db, int(revision))}
        db.upgrade()
        with db.session(write=True) as session:  # runs written with plain SQL: rebuild-configs
            run_configs.rebuild(session)
            run_cells.rebuild(session)
        _check_upgraded(db, filled)
    finally:
        db.dispose()


def test_0008_degrees_nullable_and_downgrade_fills_null_with_1(empty_url):
    """0008 makes tp/pp/cp/ep nullable (a degree not stated is NULL); a 0007 database keeps its
    values; the downgrade to 0007 writes 1 where NULL before restoring NOT NULL."""
    db = Database(empty_url)
    try:
        db.upgrade("0007")
        inserted = _insert_runs(db, 10, seed=8)
        before = _snapshot(db, ["tp", "pp", "cp", "ep"])
        assert all(None not in row[1:] for row in before)
        db.upgrade("0008")
        assert _snapshot(db, ["tp", "pp", "cp", "ep"]) == before
        cols = {c["name"]: c for c in sa.inspect(db.engine).get_columns("runs")}
        assert all(cols[d]["nullable"] for d in ("tp", "pp", "cp", "ep"))
        with db.engine.begin() as conn:
            conn.execute(sa.text("UPDATE runs SET tp = NULL, ep = NULL WHERE id = :id"), {"id": before[0][0]})
        db.dispose()
        command.downgrade(alembic_config(empty_url), "0007")
        db = Database(empty_url)
        assert db.current_revision() == "0007"
        after = _snapshot(db, ["tp", "pp", "cp", "ep"])
        assert after[0] == (before[0][0], 1, before[0][2], before[0][3], 1) and after[1:] == before[1:]
        cols = {c["name"]: c for c in sa.inspect(db.engine).get_columns("runs")}
        assert not any(cols[d]["nullable"] for d in ("tp", "pp", "cp", "ep"))
        assert len(inserted) == 10
    finally:
        db.dispose()


#: extra values of a recorded bandwidth and the number the column gets (None: not a number)
_BANDWIDTH_CASES = ((12.5, 12.5), (40, 40.0), ("17.25", 17.25), (" 3e1 ", 30.0), ("fast", None), (True, None),
                    ("nan", None), ("inf", None), ("1_000", None), ("1e999", None), ("1e-400", 0.0), (None, None))


def test_0010_backfills_recorded_bandwidths_as_the_write_path_derives_them(empty_url):
    """0010 copies extra.allreduce_gb_s / ar_intra_node_gb_s into their columns when they are numbers
    (JSON number or numeric text, finite); the write path of today stores the same value for the
    same extra."""
    db = Database(empty_url)
    try:
        db.upgrade("0009")
        table = sa.Table("runs", sa.MetaData(), autoload_with=db.engine)
        rows = _insert_runs(db, len(_BANDWIDTH_CASES), seed=10)
        with db.engine.begin() as conn:
            for row, (value, _) in zip(rows, _BANDWIDTH_CASES):
                extra = {"allreduce_gb_s": value, "ar_intra_node_gb_s": value} if value is not None else None
                conn.execute(table.update().where(table.c.run_key == row["run_key"]).values(extra=extra))
        db.upgrade("0010")
        with db.engine.connect() as conn:
            got = {k: (a, b) for k, a, b in conn.execute(sa.text(
                "SELECT run_key, allreduce_gb_s, ar_intra_node_gb_s FROM runs"))}
        assert [got[r["run_key"]] for r in rows] == [(want, want) for _, want in _BANDWIDTH_CASES]
        db.upgrade()  # today's write path writes today's columns
        payloads = list(benchtool.generate_runs(len(_BANDWIDTH_CASES), 11, prefix="bw"))
        for payload, (value, _) in zip(payloads, _BANDWIDTH_CASES):
            payload["extra"] = {"allreduce_gb_s": value, "ar_intra_node_gb_s": value}
        with db.session(write=True) as session:
            stored, _, _ = store.store_runs(session, payloads)
        with db.engine.connect() as conn:
            got = {k: (a, b) for k, a, b in conn.execute(sa.text(
                "SELECT run_key, allreduce_gb_s, ar_intra_node_gb_s FROM runs"))}
        assert [got[r.run_key] for r in stored] == [(want, want) for _, want in _BANDWIDTH_CASES]
    finally:
        db.dispose()


def test_recommender_indexes_follow_its_group_by_keys():
    """ix_runs_oom (PostgreSQL) is keyed by the GROUP BY key of the query it serves, in its order (what
    lets PostgreSQL group the index entries without sorting); run_configs has the configuration
    columns of the throughput fit's GROUP BY key (ix_runs_config, which served that aggregate per
    request, went with 0018)."""
    from service.analytics import throughput as th
    from service.tables import Run, RunConfig

    assert "ix_runs_config" not in {ix.name for ix in Run.__table__.indexes}
    indexes = {ix.name: [c.name for c in ix.expressions] for ix in Run.__table__.indexes if ix.name == "ix_runs_oom"}
    assert indexes["ix_runs_oom"] == ["gpu_type", "model_size_class", "seq_len", "dp", "tp", "pp", "cp",
                                      "zero_stage", "micro_batch_size", "recompute"]
    assert [c.name for c in RunConfig.__table__.columns][1:1 + len(th.CONFIG_COLS)] == list(th.CONFIG_COLS)


@pytest.mark.parametrize("backend", ["postgresql"])  # a PostgreSQL index (DuckDB aggregates from its columns)
def test_heatmap_can_be_answered_from_its_indexes(empty_url, backend):
    """On PostgreSQL the heatmap's per-cell count (the query it sends, filtered by the dashboard's
    default slice or not) may be an index-only scan of ix_runs_cells: the index's predicate is implied
    by the query's conditions (else PostgreSQL could not use it, whatever the table size)."""
    from sqlalchemy.dialects import postgresql

    from service.analytics import heatmap as hm

    db = Database(empty_url)
    try:
        db.upgrade()
        _insert_runs(db, 50, seed=5)
        for filters in (hm.HeatmapFilters(), hm.HeatmapFilters(gpu_type="H100-SXM-80GB", seq_len=4096)):
            query = hm._cells_lateral(hm.metric_expr("tokens_per_sec_per_gpu"), filters.conditions())
            sql = str(query.compile(dialect=postgresql.dialect(), compile_kwargs={"literal_binds": True}))
            with db.engine.begin() as conn:
                conn.execute(sa.text("SET LOCAL enable_seqscan = off"))
                conn.execute(sa.text("SET LOCAL enable_bitmapscan = off"))
                plan = "\n".join(r[0] for r in conn.execute(sa.text("EXPLAIN " + sql)))
            assert "ix_runs_cells" in plan, plan
            if filters.gpu_type:  # the slice's best run per cell: one probe of the slice's index
                assert "ix_runs_best_tps_slice" in plan, plan
    finally:
        db.dispose()


def test_0012_gated_linear_unit_backfills_nanotron_rows_and_downgrades(empty_url, data_dir):
    """0012 adds runs.gated_linear_unit: stored nanotron bench rows (which name their Llama config's
    hidden_act) get true, as a re-import of the file stores; every other run keeps NULL (not said);
    the downgrade drops the column and keeps the runs."""
    db = Database(empty_url)
    try:
        db.upgrade("0011")
        others = _insert_runs(db, 5, seed=12)
        table = sa.Table("runs", sa.MetaData(), autoload_with=db.engine)
        nanotron_row = {**others[0], "run_key": "nanotron-csv:1:abc", "source": "nanotron-csv",
                        "extra": {"hidden_act": "silu"}}
        with db.engine.begin() as conn:
            conn.execute(table.insert(), [nanotron_row])
        db.upgrade("0012")
        with db.engine.connect() as conn:
            got = dict(conn.execute(sa.text("SELECT run_key, gated_linear_unit FROM runs")).all())
        assert got.pop("nanotron-csv:1:abc") is True
        assert set(got) == {r["run_key"] for r in others} and set(got.values()) == {None}
        db.dispose()
        command.downgrade(alembic_config(empty_url), "0011")
        db = Database(empty_url)
        cols = {c["name"] for c in sa.inspect(db.engine).get_columns("runs")}
        assert "gated_linear_unit" not in cols
        with db.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM runs")).scalar() == 6
    finally:
        db.dispose()


def test_0015_relabels_stored_runs_with_the_new_failure_classes(empty_url):
    """0015 (issue 27): stored runs whose message is a host OOM kill, a divergence, a refused layout or a
    lost node take the new class (status unchanged); other runs keep theirs; the downgrade maps back."""
    db = Database(empty_url)
    try:
        db.upgrade("0014")
        base = _insert_runs(db, 1, seed=14)[0]
        cases = {  # run_key: (status, class before, message, class after)
            "host": ("oom", "oom_gpu", "slurmstepd: error: Detected 1 oom-kill event(s) in StepId=9411285.0.",
                     "oom_host"),
            "gpu": ("oom", "oom_gpu", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",
                    "oom_gpu"),
            "scale": ("failed", "unknown", "Exception: Current loss scale already at minimum - cannot decrease "
                      "scale anymore. Exiting run.", "divergence"),
            "layout": ("failed", "unknown", "AssertionError: 96 is not divisible by 64", "invalid_config"),
            "node": ("failed", "scheduler_cancelled", "slurmstepd: error: *** JOB 313 ON hgx-17 CANCELLED AT "
                     "2025-01-20T17:45:02 DUE TO NODE FAILURE, SEE SLURMCTLD LOG FOR DETAILS ***", "node_failure"),
            "other": ("failed", "unknown", "ValueError: something else", "unknown"),
        }
        table = sa.Table("runs", sa.MetaData(), autoload_with=db.engine)
        rows = [{**base, "run_key": key, "status": status, "error_class": before, "error_message": message}
                for key, (status, before, message, _) in cases.items()]
        with db.engine.begin() as conn:
            conn.execute(table.delete())
            conn.execute(table.insert(), rows)
        db.upgrade("0015")
        with db.engine.connect() as conn:
            got = {k: (s, c) for k, s, c in conn.execute(sa.text("SELECT run_key, status, error_class FROM runs"))}
        assert got == {key: (status, after) for key, (status, _, _, after) in cases.items()}
        db.dispose()
        command.downgrade(alembic_config(empty_url), "0014")
        db = Database(empty_url)
        with db.engine.connect() as conn:
            back = dict(conn.execute(sa.text("SELECT run_key, error_class FROM runs")).all())
        assert back == {key: before for key, (_, before, _, _) in cases.items()}
    finally:
        db.dispose()


#: (model_name, ep, extra) of stored runs and whether they are mixture-of-experts (core.model.is_moe)
_MOE_CASES = (
    ("Qwen3_30B_a3B", 8, None), ("Qwen3-30B-A3B", None, None), ("Qwen3_235B_a22B (tokendrop)", 1, None),
    ("GPT OSS 120B", 8, None), ("mixtral", None, {"num_experts": 8}), ("custom", None, {"moe": True}),
    ("custom", None, {"active_params": 2_000_000_000}), ("MPT-30b", None, None), ("llama", 1, {"moe": False}),
    ("llama", 1, {"num_experts": 0}), ("llama", None, {"active_params": "3B"}), ("Llama-3-8B", 1, None),
    ("A100 run", 1, None), (None, None, None),
)


def test_0017_moe_flag_backfills_as_the_write_path_derives_it(empty_url):
    """0017 adds runs.is_moe: each stored run gets the flag today's write path derives for the same
    model name, EP and extra (core.model.is_moe, service/derive.py); the downgrade keeps the runs."""
    from core.model import is_moe

    db = Database(empty_url)
    try:
        db.upgrade("0016")
        rows = _insert_runs(db, len(_MOE_CASES), seed=13)
        table = sa.Table("runs", sa.MetaData(), autoload_with=db.engine)
        with db.engine.begin() as conn:
            for row, (name, ep, extra) in zip(rows, _MOE_CASES):
                conn.execute(table.update().where(table.c.run_key == row["run_key"])
                             .values(model_name=name, ep=ep, extra=extra))
        db.upgrade("0017")
        with db.engine.connect() as conn:
            got = dict(conn.execute(sa.text("SELECT run_key, is_moe FROM runs")).all())
        want = [is_moe({"model_name": name, "ep": ep}, extra) for name, ep, extra in _MOE_CASES]
        assert [got[r["run_key"]] for r in rows] == want
        assert want == [True] * 7 + [False] * 7
        db.dispose()
        command.downgrade(alembic_config(empty_url), "0016")
        db = Database(empty_url)
        assert "is_moe" not in {c["name"] for c in sa.inspect(db.engine).get_columns("runs")}
        with db.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT count(*) FROM runs")).scalar() == len(_MOE_CASES)
    finally:
        db.dispose()
