"""POST /api/v1/sql and `scalebook sql` on both backends: hostile queries are refused with a clear
4xx and leave the data, the schema and the file system untouched; the timeout and the row cap hold;
good queries answer what the raw CSV says (computed here with the csv module)."""

from __future__ import annotations

import csv
import json
from collections import Counter

import pytest
import sqlalchemy as sa
from conftest import playbook_sample
from typer.testing import CliRunner

from service.analytics import sql as user_sql
from service.errors import QueryRejected

N_SAMPLE = 312  # rows in nanotron/bench_sample.csv


def sample_rows(data_dir):
    with open(data_dir / "nanotron" / "bench_sample.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def sql(client, query):
    return client.post("/api/v1/sql", json={"query": query})


def hostile_queries(out):
    """(query, a phrase the refusal must contain) — the refusal names what was refused."""
    return [
        ("INSERT INTO runs (id, run_key) VALUES (999999, 'x')", "only SELECT"),
        ("UPDATE runs SET nodes = 1", "only SELECT"),
        ("DELETE FROM runs", "only SELECT"),
        ("DROP TABLE runs", "only SELECT"),
        ("CREATE TABLE stolen (a int)", "only SELECT"),
        ("CREATE TABLE stolen AS SELECT * FROM runs", "only SELECT"),
        ("ALTER TABLE runs ADD COLUMN z int", "only SELECT"),
        ("TRUNCATE runs", "only SELECT"),
        ("MERGE INTO runs USING runs r ON true WHEN MATCHED THEN DELETE", "only SELECT"),
        (f"COPY runs TO '{out}/copy.csv'", "only SELECT"),
        (f"COPY (SELECT 1) TO PROGRAM 'touch {out}/pwned'", "only SELECT"),
        ("SELECT * FROM read_csv('/etc/passwd')", "read_csv"),
        ("SELECT * FROM read_csv_auto('/etc/passwd')", "read_csv_auto"),
        ("SELECT * FROM read_text('/etc/passwd')", "read_text"),
        ("SELECT * FROM read_parquet('/tmp/x.parquet')", "read_parquet"),
        ("SELECT * FROM glob('/etc/*')", ""),
        ("SELECT * FROM '/etc/passwd'", "not allowed"),
        ("SELECT pg_read_file('/etc/passwd')", "pg_read_file"),
        ("SELECT pg_read_binary_file('/etc/passwd')", "pg_read_binary_file"),
        ("SELECT pg_ls_dir('.')", "pg_ls_dir"),
        ("SELECT lo_import('/etc/passwd')", "lo_import"),
        ("SELECT * FROM dblink('dbname=postgres', 'SELECT 1') AS t(a int)", "dblink"),
        ("SELECT current_setting('data_directory')", "current_setting"),
        ("SELECT set_config('role', 'postgres', true)", "set_config"),
        ("SELECT getenv('HOME')", "getenv"),
        ("SELECT nextval('runs_id_seq')", "nextval"),
        ("SELECT pg_sleep(30)", "pg_sleep"),
        ("SELECT query_to_xml('SELECT * FROM api_tokens', true, true, '')", "query_to_xml"),
        ("SELECT * FROM query('SELECT * FROM api_tokens')", "query"),
        (f"ATTACH '{out}/other.db' AS other", ""),
        ("INSTALL httpfs", ""),
        ("LOAD httpfs", "only SELECT"),
        ("SET enable_external_access = true", "only SELECT"),
        ("SET statement_timeout = 0", "only SELECT"),
        ("PRAGMA database_list", "only SELECT"),
        ("CALL pragma_version()", "only SELECT"),
        (f"EXPORT DATABASE '{out}/export'", ""),
        ("VACUUM", "only SELECT"),
        ("CHECKPOINT", "only SELECT"),
        ("BEGIN", "only SELECT"),
        ("EXPLAIN ANALYZE DELETE FROM runs", "only SELECT"),
        ("SELECT 1; DROP TABLE runs", "exactly one"),
        ("SELECT * FROM runs /* harmless? */; DELETE FROM runs", "exactly one"),
        ("SELECT 1 /* /* */ ; DELETE FROM runs; /* */", ""),
        ("SELECT * FROM api_tokens", "api_tokens"),
        ("SELECT * FROM runs UNION ALL SELECT * FROM api_tokens", "api_tokens"),
        ("SELECT (SELECT token_hash FROM api_tokens LIMIT 1)", "api_tokens"),
        ("WITH a AS (SELECT * FROM api_tokens), api_tokens AS (SELECT 1) SELECT * FROM a", "api_tokens"),
        ("SELECT * FROM (WITH api_tokens AS (SELECT 1 AS x) SELECT * FROM api_tokens) s, api_tokens", "api_tokens"),
        ('WITH "API_TOKENS" AS (SELECT 1) SELECT * FROM api_tokens', "api_tokens"),
        ("SELECT * FROM pg_catalog.pg_authid", "schema-qualified"),
        ("SELECT * FROM pg_authid", "pg_authid"),
        ("SELECT * FROM information_schema.tables", "schema-qualified"),
        ("SELECT * FROM main.runs", "schema-qualified"),
        ("SELECT * FROM duckdb_settings()", "duckdb_settings"),
        ("SELECT * FROM duckdb_tables()", "duckdb_tables"),
        ("SELECT * FROM duckdb_secrets()", "duckdb_secrets"),
        ("SELECT * FROM pragma_table_info('api_tokens')", "pragma_table_info"),
        ("SELECT * FROM sqlite_master", "sqlite_master"),
        ("SELECT * INTO newtable FROM runs", "INTO"),
        ("WITH x AS (DELETE FROM runs RETURNING *) SELECT * FROM x", "DELETE"),
        ("WITH x AS (INSERT INTO runs (id) VALUES (1) RETURNING *) SELECT * FROM x", "INSERT"),
        ("SELECT * FROM runs FOR UPDATE", "FOR UPDATE"),
        ('SELECT * FROM "RUNS"', "RUNS"),
        ('SELECT * FROM runs"; DROP TABLE runs', ""),
        ('SELECT * FROM "runs""; DROP TABLE runs --"', "not allowed"),
        ("SELECT 'a\\' , (SELECT token_hash FROM api_tokens) --'", "api_tokens"),
        ("SELECT pg_catalog.pg_read_file('/etc/passwd')", "pg_read_file"),
        ('SELECT U&"\\0070g_read_file"(\'/etc/passwd\')', "not allowed"),
        ("SELECT txid_current()", "txid_current"),
        ("SELECT * FROM runs, LATERAL enable_profiling() t", "enable_profiling"),
        ("SELECT * FROM enable_logging()", "enable_logging"),
        ("SELECT ts_rewrite('a'::tsquery, 'SELECT * FROM api_tokens')", "ts_rewrite"),
        ("SELECT brin_summarize_new_values('ix_runs_heatmap')", "brin_summarize_new_values"),
        ("", ""),
        ("SELECT " + "(" * 3000 + "1" + ")" * 3000, "nested too deeply"),
        ("SELECT " + "1 + " * 3000 + "1", "characters long"),
    ]


def test_hostile_queries_are_refused_and_nothing_changes(nanotron_client, database, backend, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    max_id = sql(nanotron_client, "SELECT max(id) FROM runs").json()["rows"][0][0]  # ids persist across PG tests
    failures = []
    for query, phrase in hostile_queries(out):
        r = sql(nanotron_client, query)
        body = r.json()
        if not (400 <= r.status_code < 500) or "error" not in body:
            failures.append(f"{query!r}: HTTP {r.status_code} {body}")
            continue
        err = body["error"]
        if err["code"] not in ("query_rejected", "validation_error") or not err["message"]:
            failures.append(f"{query!r}: {err}")
        elif phrase and phrase.lower() not in err["message"].lower():
            failures.append(f"{query!r}: message {err['message']!r} does not name {phrase!r}")
    assert not failures, "\n".join(failures)

    # the data, the schema, the sequences and the file system are untouched
    assert sql(nanotron_client, "SELECT count(*) FROM runs").json()["rows"] == [[N_SAMPLE]]
    assert list(out.iterdir()) == []
    with database.engine.connect() as conn:
        tables = set(sa.inspect(conn).get_table_names())
        assert {"runs", "api_tokens"} <= tables and not tables & {"stolen", "newtable", "x"}
        assert conn.scalar(sa.text("SELECT count(*) FROM runs")) == N_SAMPLE
        assert conn.scalar(sa.text("SELECT max(id) FROM runs")) == max_id
        if backend == "duckdb":  # user SQL runs in a sandbox of its own: the service's instance is untouched
            assert conn.scalar(sa.text("SELECT current_setting('enable_external_access')")) is True
    # the service still ingests (DuckDB: the Arrow bulk path works with external access off), and the
    # run-id sequence was never advanced by a query
    batch = [{"model_params": 8_000_000_000, "nodes": 1, "gpus_per_node": 8, "tp": 1, "run_key": f"after-{i}",
              "status": "success", "tokens_per_sec_per_gpu": 1000.0 + i} for i in range(25)]
    r = nanotron_client.post("/api/v1/runs", json={"runs": batch})
    assert r.status_code == 201, r.text
    assert min(run["id"] for run in r.json()["runs"]) == max_id + 1


def test_sandbox_holds_without_the_parser(database, backend, nanotron_client):
    """Second layer alone (execute_sandboxed skips sqlglot): no writes, no files, no other table of
    ours on either backend (issue 14 item 1: the sandbox holds only runs, by construction)."""
    hidden = ["api_tokens", "alembic_version", "run_configs"]
    refused = ["DELETE FROM runs", "SELECT 1; DELETE FROM runs", "DROP TABLE runs",
               "WITH x AS (DELETE FROM runs RETURNING *) SELECT * FROM x", "SELECT nextval('runs_id_seq')",
               "SELECT * FROM runs FOR UPDATE", "CREATE TABLE stolen AS SELECT 1", "SELECT * INTO stolen FROM runs"]
    refused += [f"SELECT * FROM {t}" for t in hidden]
    refused += [f"WITH RECURSIVE {t} AS (SELECT * FROM {t}) SELECT * FROM {t}" for t in hidden]
    if backend == "postgresql":
        refused += ["SELECT pg_read_file('/etc/passwd')", "COPY runs TO '/tmp/sb.csv'",
                    "SELECT lo_import('/etc/passwd')", "SELECT pg_ls_dir('.')",
                    "SELECT set_config('role', 'postgres', false)", "SET ROLE postgres"]
    else:
        refused += ["SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM read_text('/etc/passwd')",
                    "SELECT * FROM '/etc/passwd'", "INSTALL httpfs", "ATTACH '/tmp/sb_other.db'",
                    "SET memory_limit = '100GB'", "SELECT getenv('HOME')"]
    for query in refused:
        with pytest.raises(QueryRejected):
            user_sql.execute_sandboxed(database, query, timeout_s=5, max_rows=10)
    columns, rows = user_sql.execute_sandboxed(database, "SELECT count(*) AS n FROM runs", timeout_s=5, max_rows=10)
    assert (columns, rows) == (["n"], [[N_SAMPLE]])
    if backend == "postgresql":
        _, rows = user_sql.execute_sandboxed(database, "SELECT current_user", timeout_s=5, max_rows=10)
        assert rows == [[user_sql.READER_ROLE]]


def test_timeout_cuts_off_an_enormous_cross_join(nanotron_client, settings, backend):
    settings.sql_timeout_s = 0.5
    queries = ["SELECT count(*) FROM runs a, runs b, runs c, runs d"]  # 312⁴ ≈ 9.5e9 rows
    if backend == "duckdb":
        queries.append("SELECT count(*) FROM runs a, runs b, range(1000000000) r")
    for query in queries:
        r = sql(nanotron_client, query)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["code"] == "query_rejected"
        assert "exceeded the 0.5 s timeout" in r.json()["error"]["message"]
    ok = sql(nanotron_client, "SELECT count(*) FROM runs")  # the service is fine afterwards
    assert ok.status_code == 200 and ok.json()["rows"] == [[N_SAMPLE]]


def test_row_cap_truncates(nanotron_client, settings):
    settings.sql_max_rows = 100
    low, high = sql(nanotron_client, "SELECT min(id), max(id) FROM runs").json()["rows"][0]
    body = sql(nanotron_client, "SELECT id FROM runs ORDER BY id").json()
    assert body["truncated"] is True and body["row_count"] == 100
    assert body["rows"] == [[i] for i in range(low, low + 100)]  # the first rows, in the query's order
    body = sql(nanotron_client, "SELECT id FROM runs ORDER BY id DESC LIMIT 100").json()
    assert body["truncated"] is False and body["rows"][0] == [high]
    body = sql(nanotron_client, "SELECT a.id, b.id FROM runs a, runs b").json()  # 97,344 rows, streamed
    assert body["truncated"] is True and len(body["rows"]) == 100


def test_good_queries_answer_what_the_csv_says(nanotron_client, data_dir):
    rows = sample_rows(data_dir)
    status_map = {"Success": "success", "OOM": "oom", "Other": "failed"}

    body = sql(nanotron_client, "SELECT nodes, status, count(*) AS n FROM runs GROUP BY nodes, status "
                                "ORDER BY nodes, status").json()
    assert body["columns"] == ["nodes", "status", "n"]
    expected = Counter((int(float(r["nodes"])), status_map[r["status"]]) for r in rows)
    assert {(n, s): c for n, s, c in body["rows"]} == dict(expected)
    assert body["row_count"] == len(expected) and body["truncated"] is False and body["elapsed_ms"] >= 0

    best = {}
    for r in rows:
        if r["status"] == "Success":
            n = int(float(r["nodes"]))
            best[n] = max(best.get(n, 0.0), float(r["tok/s/gpu"]))
    window = sql(nanotron_client, """
        WITH ranked AS (
            SELECT nodes, name, tokens_per_sec_per_gpu AS tps,
                   row_number() OVER (PARTITION BY nodes ORDER BY tokens_per_sec_per_gpu DESC, id) AS rk
            FROM runs WHERE status = 'success')
        SELECT nodes, tps FROM ranked WHERE rk = 1 ORDER BY nodes""").json()
    assert {n: pytest.approx(t) for n, t in window["rows"]} == best

    modes = sql(nanotron_client, "SELECT extra->>'tp_mode' AS tp_mode, count(*) AS n FROM runs GROUP BY 1").json()
    assert dict(map(tuple, modes["rows"])) == dict(Counter(r["tp_mode"] for r in rows))

    one = sql(nanotron_client, "SELECT id, extra, ingested_at, started_at, mfu FROM runs ORDER BY id LIMIT 1").json()
    run_id, extra, ingested_at, started_at, mfu = one["rows"][0]
    assert isinstance(extra, dict) and extra["job_id"] == rows[0]["job_id"]  # JSON comes back as JSON on both
    assert isinstance(ingested_at, str) and ingested_at[:2] == "20" and "T" in ingested_at  # ISO 8601
    assert started_at is None and mfu == pytest.approx(float(rows[0]["mfu"]) / 100)

    odd = sql(nanotron_client, "SELECT CAST('NaN' AS DOUBLE PRECISION) AS nan, CAST(1.25 AS DECIMAL(10, 2)) AS d, "
                               "'it''s 100%' AS s").json()
    assert odd["rows"] == [[None, 1.25, "it's 100%"]]
    recursive = sql(nanotron_client, "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t WHERE n < 5) "
                                     "SELECT sum(n) FROM t").json()
    assert recursive["rows"] == [[15]]


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)  # the reader role is a PostgreSQL object
def test_postgres_without_reader_role_refuses_with_503(client, backend, monkeypatch):
    monkeypatch.setattr(user_sql, "READER_ROLE", "scalebook_reader_that_does_not_exist")
    r = sql(client, "SELECT count(*) FROM runs")
    assert r.status_code == 503 and r.json()["error"]["code"] == "sql_unavailable"
    assert "CREATE ROLE" in r.json()["error"]["message"]


@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
def test_migration_made_a_least_privilege_reader_role(database, backend):
    with database.engine.connect() as conn:
        role = conn.execute(sa.text("SELECT rolcanlogin, rolsuper, rolcreaterole FROM pg_roles "
                                    "WHERE rolname = 'scalebook_reader'")).one()
        assert tuple(role) == (True, False, False)  # LOGIN since 0009: user SQL's own pool logs in as it
        assert not conn.scalar(sa.text("SELECT count(*) FROM pg_auth_members m JOIN pg_roles r ON r.oid = m.member "
                                       "WHERE r.rolname = 'scalebook_reader'"))  # member of no role
        assert conn.scalar(sa.text("SELECT has_table_privilege('scalebook_reader', 'runs', 'SELECT')"))
        for table, privilege in [("runs", "INSERT"), ("runs", "UPDATE"), ("runs", "DELETE"),
                                 ("api_tokens", "SELECT"), ("alembic_version", "SELECT")]:
            assert not conn.scalar(sa.text(f"SELECT has_table_privilege('scalebook_reader', '{table}', '{privilege}')"))


def test_request_validation(client):
    assert client.post("/api/v1/sql", json={}).status_code == 422
    assert client.post("/api/v1/sql", json={"query": "SELECT 1", "extra": 1}).status_code == 422
    r = client.post("/api/v1/sql", json={"query": "SELECT count(*) FROM runs"})
    assert r.status_code == 200 and r.json()["rows"] == [[0]]


def test_sql_cli_formats(live_api, data_dir):
    import httpx
    from conftest import post_records

    from service.cli import app

    with httpx.Client(base_url=live_api, timeout=120) as http:
        stored, _ = post_records(http, playbook_sample(data_dir).records)
    assert stored == N_SAMPLE
    runner = CliRunner()
    query = "SELECT nodes, count(*) AS n FROM runs GROUP BY nodes ORDER BY nodes"
    expected = sorted(Counter(int(float(r["nodes"])) for r in sample_rows(data_dir)).items())

    result = runner.invoke(app, ["sql", query, "--format", "json"])
    assert result.exit_code == 0, result.output
    assert [tuple(r) for r in json.loads(result.stdout)["rows"]] == expected

    result = runner.invoke(app, ["sql", query, "--format", "csv"])
    assert result.exit_code == 0, result.output
    lines = list(csv.reader(result.stdout.splitlines()))
    assert lines[0] == ["nodes", "n"] and [(int(a), int(b)) for a, b in lines[1:]] == expected

    result = runner.invoke(app, ["sql", query])
    assert result.exit_code == 0 and "row(s)" in result.stdout

    result = runner.invoke(app, ["sql", "DELETE FROM runs"])
    assert result.exit_code == 1 and "only SELECT" in result.output


@pytest.mark.parametrize(("query", "missing", "suggested"), [
    ("SELECT tokens_per_sec_per_gup FROM runs", "tokens_per_sec_per_gup", ["tokens_per_sec_per_gpu"]),
    ("SELECT model_name, nodse FROM runs", "nodse", ["nodes"]),
    ("SELECT id FROM runs WHERE mfu_derivd > 0.3", "mfu_derivd", ["mfu_derived"]),
    ("SELECT modle, nodes FROM runs", "modle", ["model_name", "model_params", "model_size_class"]),
    ("WITH t AS (SELECT nodes FROM runs) SELECT nodez FROM t", "nodez", ["nodes"]),
])
def test_a_mistyped_column_gets_the_runs_columns_nearest_to_it(client, query, missing, suggested):
    """On DuckDB the sandbox holds only the columns a query names, so the database's own hint
    ("candidate bindings") offered the query's other columns (`nodse` → model_name): the answer
    names the missing column and the nearest columns of the whole runs table, on both backends."""
    client.post("/api/v1/runs", json={"model_params": 8_000_000_000, "nodes": 1, "gpus_per_node": 8, "dp": 8})
    r = sql(client, query)
    assert r.status_code == 400
    err = r.json()["error"]
    assert err["code"] == "query_rejected" and err["details"][0]["value"] == missing
    hint = " or ".join(repr(c) for c in suggested)
    assert err["message"] == f"runs has no column {missing!r}; did you mean {hint}?"
    assert "Candidate bindings" not in err["message"] and "LINE 1" not in err["message"]
    # aliases and CTE columns are not mistaken for missing columns
    ok = sql(client, "WITH t AS (SELECT nodes AS n FROM runs) SELECT n, count(*) AS c FROM t GROUP BY n ORDER BY c")
    assert ok.status_code == 200 and ok.json()["rows"] == [[1, 1]]
