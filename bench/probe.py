"""Replay the adversarial probe of issue 14 against a real `scalebook serve`, on DuckDB and PostgreSQL.

    PYTHONPATH=$PWD .venv/bin/python bench/probe.py [--backend duckdb|postgresql|both] [--pg-admin-url URL]

For each backend: a fresh database (a DuckDB file in a temporary directory; a PostgreSQL database
created and dropped through --pg-admin-url), `scalebook db upgrade`, three tokens made with
`scalebook token create --direct` (admin, write, read), `scalebook serve --host 0.0.0.0` (so the
public-server rules apply), 40 runs stored with the write token. Then every case of five categories:

- sql:     hostile queries for POST /api/v1/sql with a read token: writes, DDL, COPY, ATTACH, INSTALL,
           SET, set_config, file readers (read_csv, read_text, pg_read_file, lo_import, …), catalogs,
           the WITH RECURSIVE shadowing trick on every other table and catalog name, huge answers, CPU
           bombs. Held: a 4xx with the one error body, no token hash in it, and within 30 s.
- matrix:  every endpoint × credential (none, malformed, unknown, revoked, read, write, admin). Held: 401
           without a valid token, 403 below the endpoint's scope, otherwise neither and no 5xx.
- inputs:  bad bodies and parameters (NaN/Infinity/1e309 in fields and `extra`, wrong types, unknown
           enums, non-JSON bodies, foreign Origins, oversized and over-long batches, degrees beyond any
           cluster or model). Held: the expected 4xx, and nothing stored.
- auth:    the public-server rules: the last admin token cannot be revoked (409); `scalebook serve`
           refuses "", 0.0.0.0 and :: without tokens.
- health:  after everything, the server still answers and holds exactly the runs stored.

Prints tried / held / broke per category and backend, the broken cases, and exits 1 if any broke.
The probe asserts no time: "within 30 s" only tells a hung request from an answer.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import sqlalchemy as sa

REPO = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get("SCALEBOOK_TEST_PG_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")

#: every table and catalog name a query could try to reach, by backend
OTHER_NAMES = ["api_tokens", "alembic_version", "run_configs", "run_configs_state", "sqlite_master",
               "sqlite_schema", "duckdb_databases", "duckdb_tables", "duckdb_settings", "duckdb_columns",
               "duckdb_secrets", "duckdb_extensions", "duckdb_views", "information_schema.tables", "pg_settings",
               "pg_roles", "pg_authid", "pg_shadow", "pg_user", "pg_tables", "pg_stat_activity", "pg_database",
               "pg_file_settings", "pg_hba_file_rules", "pg_class", "pg_proc", "pragma_database_list"]


#: queries a database may answer (200) as long as the answer is bounded: CPU and nesting bombs
BOUNDED = ("runs a, runs b", "::jsonb", "WITH RECURSIVE t(n)")


def sql_cases(backend: str) -> list[str]:
    """The hostile SQL list. A query containing one of BOUNDED may be answered; every other one must be
    refused."""
    rows = "range(5)" if backend == "duckdb" else "generate_series(1, 5)"
    cases = [
        "INSERT INTO runs (id, run_key) VALUES (999999, 'x')", "UPDATE runs SET nodes = 1", "DELETE FROM runs",
        "DROP TABLE runs", "CREATE TABLE stolen AS SELECT * FROM runs", "ALTER TABLE runs ADD COLUMN z int",
        "TRUNCATE runs", "COPY runs TO '/tmp/probe_copy.csv'", "COPY (SELECT 1) TO PROGRAM 'touch /tmp/probe_pwned'",
        "COPY api_tokens TO STDOUT", "ATTACH '/tmp/probe_other.duckdb' AS o", "ATTACH ':memory:' AS m",
        "DETACH runs", "INSTALL httpfs", "LOAD httpfs", "SET enable_external_access = true",
        "SET memory_limit = '100GB'", "RESET ALL", "PRAGMA database_list", "CALL pragma_version()",
        "SELECT set_config('role', 'postgres', false)", "SELECT set_config('search_path', 'pg_catalog', false)",
        "SET ROLE postgres", "SET SESSION AUTHORIZATION postgres", "SELECT current_setting('data_directory')",
        "SELECT pg_read_file('/etc/passwd')", "SELECT pg_read_binary_file('/etc/passwd')", "SELECT pg_ls_dir('.')",
        "SELECT pg_stat_file('/etc/passwd')", "SELECT lo_import('/etc/passwd')", "SELECT lo_export(1, '/tmp/x')",
        "SELECT * FROM dblink('dbname=postgres', 'SELECT 1') AS t(a int)", "SELECT pg_sleep(60)",
        "SELECT * FROM read_csv('/etc/passwd')", "SELECT * FROM read_csv_auto('/etc/passwd')",
        "SELECT * FROM read_text('/etc/passwd')", "SELECT * FROM read_blob('/etc/passwd')",
        "SELECT * FROM read_parquet('/tmp/x.parquet')", "SELECT * FROM read_json('/etc/passwd')",
        "SELECT * FROM '/etc/passwd'", "SELECT * FROM glob('/etc/*')", "SELECT getenv('HOME')",
        "SELECT * FROM sniff_csv('/etc/passwd')", "SELECT * FROM query('SELECT * FROM api_tokens')",
        "SELECT * FROM query_table('api_tokens')", "SELECT nextval('runs_id_seq')", "SELECT * FROM runs FOR UPDATE",
        "SELECT * INTO stolen FROM runs", "WITH x AS (DELETE FROM runs RETURNING *) SELECT * FROM x",
        "SELECT 1; DELETE FROM runs", "SELECT * FROM public.api_tokens", "SELECT * FROM main.api_tokens",
        'SELECT * FROM "api_tokens"', "SELECT * FROM runs, LATERAL (SELECT * FROM api_tokens) t",
        "SELECT (SELECT token_hash FROM api_tokens LIMIT 1)",
        "SELECT * FROM runs WHERE id IN (SELECT id FROM api_tokens)",
        "SELECT 'a\\' , (SELECT token_hash FROM api_tokens) --'", "EXPLAIN ANALYZE DELETE FROM runs",
        "SELECT txid_current()", "SELECT * FROM enable_profiling()", "SELECT checkpoint()",
        # huge answers and CPU / memory bombs
        f"SELECT repeat('x', 100000000) FROM {rows}", f"SELECT repeat('x', 20000000) AS s FROM {rows}",
        "SELECT count(*) FROM runs a, runs b, runs c, runs d, runs e, runs f, runs g",
        "WITH RECURSIVE t(n) AS (SELECT 1 UNION ALL SELECT n + 1 FROM t) SELECT count(*) FROM t",
        "WITH RECURSIVE t(n, s) AS (SELECT 1, 'x' UNION ALL SELECT n + 1, s || s FROM t WHERE n < 40) "
        "SELECT max(length(s)) FROM t",
        "SELECT range(1000000000)", "SELECT lpad('x', 1000000000, 'y')",
        "SELECT repeat('x', 600000000) || repeat('x', 600000000)",
        "SELECT (repeat('[', 300000) || repeat(']', 300000))::jsonb",
        "SELECT " + "(" * 3000 + "1" + ")" * 3000, "SELECT " + "1 + " * 5000 + "1",
    ]
    for name in OTHER_NAMES:  # the shadowing trick (item 1) and its variants, on every other name
        short = name.split(".")[-1]
        cases += [f"WITH RECURSIVE {short} AS (SELECT * FROM {name}) SELECT * FROM {short}",
                  f"WITH {short} AS (SELECT * FROM {name}) SELECT * FROM {short}",
                  f"WITH RECURSIVE {short} AS (SELECT * FROM {name} UNION ALL SELECT * FROM {short}) "
                  f"SELECT * FROM {short}",
                  f"WITH RECURSIVE a AS (SELECT 1), {short} AS (SELECT * FROM {name}) SELECT * FROM {short}",
                  f"SELECT * FROM {name}", f"SELECT * FROM runs JOIN {name} ON true"]
    return cases


#: (method, path, JSON body, scope needed: None = open)
ENDPOINTS = [
    ("GET", "/api/v1/health", None, None),
    ("GET", "/api/v1/runs", None, "read"), ("GET", "/api/v1/runs/1", None, "read"),
    ("POST", "/api/v1/runs", {"run_key": "matrix-{cred}", "nodes": 1, "gpus_per_node": 8}, "write"),
    ("GET", "/api/v1/heatmap", None, "read"), ("GET", "/api/v1/recommend?model_params=8B&nodes=8", None, "read"),
    ("GET", "/api/v1/scaling?model_params=8B", None, "read"), ("GET", "/api/v1/regressions", None, "read"),
    ("GET", "/api/v1/plan?model_params=3B&tokens=11T&days=28&peak_tflops=720&mfu=0.3", None, "read"),
    ("POST", "/api/v1/memory", {"model_params": 8_000_000_000, "seq_len": 4096}, "read"),
    ("POST", "/api/v1/sql", {"query": "SELECT count(*) FROM runs"}, "read"),
    ("GET", "/api/v1/tokens", None, "admin"), ("POST", "/api/v1/tokens", {"scope": "read", "name": "m"}, "admin"),
    ("DELETE", "/api/v1/tokens/999999", None, "admin"),
]
RANK = {"read": 0, "write": 1, "admin": 2}


def input_cases() -> list[tuple[str, str, str, bytes, dict[str, Any], tuple[int, ...]]]:
    """(name, method, path, raw body, extra headers, accepted statuses)."""
    j = {"Content-Type": "application/json"}
    run = '{"run_key": "bad-%s", "nodes": 1, %s}'
    cases = []
    for lit in ("NaN", "Infinity", "-Infinity", "1e309"):
        for field in ("tokens_per_sec_per_gpu", "mfu", "peak_memory_gib", "step_time_s", "nodes"):
            cases.append((f"{field}={lit}", "POST", "/api/v1/runs", (run % (field, f'"{field}": {lit}')).encode(), j,
                          (422,)))
        cases.append((f"extra {lit}", "POST", "/api/v1/runs",
                      (run % ("x", f'"extra": {{"a": [{{"b": {lit}}}]}}')).encode(), j, (422,)))
        bad_item = run % ("y", f'"extra": {{"l": {lit}}}')
        cases.append((f"batch extra {lit}", "POST", "/api/v1/runs",
                      f'{{"runs": [{{"run_key": "ok-{lit}", "nodes": 1}}, {bad_item}]}}'.encode(), j, (422,)))
        cases.append((f"memory extra {lit}", "POST", "/api/v1/memory",
                      f'{{"model_params": 8000000000, "seq_len": 4096, "extra": {{"x": {lit}}}}}'.encode(), j, (422,)))
    for field, value in [("status", '"exploded"'), ("recompute", '"some"'), ("error_class", '"x"'),
                         ("nodes", '"eight"'), ("nodes", "-1"), ("nodes", "99999999999"), ("zero_stage", "4"),
                         ("mfu", "1.5"), ("nodes", "[8]"), ("model_params", "1e30"),
                         ("started_at", '"10000-01-01"'), ("unknown_field", "1"),
                         ("run_key", '""'), ("extra", "[1]"), ("name", '"' + "x" * 3000 + '"')]:
        cases.append((f"{field}={value[:20]}", "POST", "/api/v1/runs",
                      (run % (field, f'"{field}": {value}')).encode(), j, (422,)))
    body = json.dumps({"run_key": "ct", "nodes": 1}).encode()
    for ct in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "text/html"):
        cases.append((f"Content-Type {ct}", "POST", "/api/v1/runs", body, {"Content-Type": ct}, (415,)))
    for origin in ("http://evil.example", "null", "http://127.0.0.1.evil.example"):
        cases.append((f"Origin {origin} text/plain", "POST", "/api/v1/runs", body,
                      {"Content-Type": "text/plain", "Origin": origin}, (403, 415)))
        cases.append((f"Origin {origin} json", "POST", "/api/v1/runs", body, {**j, "Origin": origin}, (403,)))
        cases.append((f"Origin {origin} sql", "POST", "/api/v1/sql", b'{"query": "SELECT 1"}', {**j, "Origin": origin},
                      (403,)))
    cases.append(("20 MB body", "POST", "/api/v1/runs", b'{"runs": [' + b" " * 20_000_000 + b"]}", j, (413,)))
    cases.append(("1001-run batch", "POST", "/api/v1/runs",
                  json.dumps({"runs": [{"run_key": f"b{i}", "nodes": 1} for i in range(1001)]}).encode(), j,
                  (413, 422)))
    cases.append(("not JSON", "POST", "/api/v1/runs", b"{nope", j, (400, 422)))
    mem = {"num_layers": 32, "hidden_size": 4096, "num_heads": 32, "vocab_size": 128256, "seq_len": 4096}
    for field, value in [("pp", 1_000_000), ("pp", 64), ("tp", 64), ("cp", 10**6), ("dp", 10**9), ("ep", 10**6),
                         ("num_layers", 10**9), ("micro_batch_size", 10**12), ("grad_accum_steps", 10**12),
                         ("seq_len", 10**12), ("hidden_size", 10**9), ("vocab_size", 10**12)]:
        cases.append((f"memory {field}={value}", "POST", "/api/v1/memory",
                      json.dumps({**mem, field: value}).encode(), j, (422,)))
    for query in ("model_params=8B&nodes=1000000", "model_params=8B&nodes=100000&gpus_per_node=1024",
                  "model_params=8B&nodes=8&num_layers=1000000000", "model_params=8B&nodes=8&seq_len=100000000000",
                  "model_params=8B&nodes=8&k=100000", "model_params=1e40&nodes=8", "model_params=8B&nodes=0"):
        cases.append((f"recommend {query}", "GET", f"/api/v1/recommend?{query}", b"", {}, (400, 422)))
    for query in ("model_params=8B&tokens=1T&days=10&peak_tflops=1e300", "model_params=8B&tokens=1T&days=1e9",
                  "model_params=8B&tokens=1T&days=10&gpus_per_node=100000", "model_params=8B&tokens=1e400&days=10",
                  "model_params=8B&tokens=1T&days=nan"):
        cases.append((f"plan {query}", "GET", f"/api/v1/plan?{query}", b"", {}, (400, 422)))
    for value in ("Bearer \xa0", "Bearer", "Bearer \xa0\xa0x", "Basic dXNlcjpwYXNz", "Bearer a b", "Bearer \x7f",
                  "Bearer " + "a" * 5000):
        cases.append((f"Authorization {value[:12]!r}", "GET", "/api/v1/runs", b"",
                      {"Authorization": value.encode("latin-1")}, (401,)))
    return cases


# -- the server ------------------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def scalebook(*args: str, env: dict[str, str], timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "service.cli", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, cwd=REPO)


class Server:
    def __init__(self, backend: str, pg_admin: str, workdir: Path):
        self.backend, self.pg_admin, self.workdir = backend, pg_admin, workdir
        self.dbname = f"sbprobe_{os.getpid()}"
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("SCALEBOOK_")}
        self.env["PYTHONPATH"] = str(REPO) + os.pathsep + self.env.get("PYTHONPATH", "")
        self.env["COLUMNS"] = "300"
        self.proc: subprocess.Popen | None = None

    def __enter__(self) -> Server:
        if self.backend == "duckdb":
            self.url = f"duckdb:///{self.workdir / 'probe.duckdb'}"
        else:
            admin = sa.create_engine(self.pg_admin, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)'))
                conn.execute(sa.text(f'CREATE DATABASE "{self.dbname}"'))
            admin.dispose()
            self.url = sa.make_url(self.pg_admin).set(database=self.dbname).render_as_string(hide_password=False)
        self.env["SCALEBOOK_DATABASE_URL"] = self.url
        done = scalebook("db", "upgrade", env=self.env)
        assert done.returncode == 0, done.stderr
        self.tokens = {}
        for scope in ("admin", "write", "read", "read"):
            made = scalebook("token", "create", "--scope", scope, "--name", f"probe-{scope}", "--direct", env=self.env)
            assert made.returncode == 0, made.stderr
            key = scope if scope not in self.tokens else "revoked"
            self.tokens[key] = made.stdout.strip().split()[-1]
        self.port = free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--host", "0.0.0.0", "--port",
                                      str(self.port), "--log-level", "warning"], env=self.env, cwd=REPO,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited: {self.proc.stderr.read()}")
            try:
                if httpx.get(f"{self.base}/api/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.3)
        self.http = httpx.Client(base_url=self.base, timeout=60)
        listed = self.http.get("/api/v1/tokens", headers=self.auth("admin")).json()["tokens"]
        revoked_id = [t["id"] for t in listed if self.tokens["revoked"].startswith(t["prefix"])][-1]
        assert self.http.delete(f"/api/v1/tokens/{revoked_id}", headers=self.auth("admin")).status_code == 200
        return self

    def auth(self, who: str) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.tokens[who]}"}

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.backend == "postgresql":
            admin = sa.create_engine(self.pg_admin, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{self.dbname}" WITH (FORCE)'))
            admin.dispose()


# -- the probe ---------------------------------------------------------------------------------------
def is_error_body(resp: httpx.Response) -> bool:
    try:
        err = resp.json()["error"]
        return bool(err["code"]) and bool(err["message"]) and isinstance(err["details"], list)
    except (ValueError, KeyError, TypeError):
        return False


def probe(backend: str, pg_admin: str) -> dict[str, list[tuple[str, bool, str]]]:
    results: dict[str, list[tuple[str, bool, str]]] = defaultdict(list)
    with tempfile.TemporaryDirectory(prefix="sbprobe-") as tmp, Server(backend, pg_admin, Path(tmp)) as srv:
        http = srv.http
        hashes = [hashlib.sha256(t.encode()).hexdigest() for t in srv.tokens.values()]
        runs = [{"run_key": f"probe-{i}", "model_params": 8_000_000_000, "nodes": 1 + i % 4, "gpus_per_node": 8,
                 "dp": 8 * (1 + i % 4), "seq_len": 4096, "gpu_type": "H100-SXM-80GB", "status": "success",
                 "tokens_per_sec_per_gpu": 1000.0 + i} for i in range(40)]
        stored = http.post("/api/v1/runs", json={"runs": runs}, headers=srv.auth("write"))
        assert stored.status_code == 201, stored.text
        expected_runs = 40

        for query in sql_cases(backend):
            start = time.monotonic()
            try:
                r = http.post("/api/v1/sql", json={"query": query}, headers=srv.auth("read"), timeout=30)
            except httpx.TimeoutException:
                results["sql"].append((query[:100], False, "no answer in 30 s"))
                continue
            took = time.monotonic() - start
            leak = any(h in r.text for h in hashes)
            held = 400 <= r.status_code < 500 and is_error_body(r) and not leak
            if any(b in query for b in BOUNDED):  # answered or refused, within the timeout and the byte cap
                held = held or (r.status_code == 200 and not leak and len(r.content) <= 16 * 2**20 + 4096)
                held = held and took < 5 + 10
            results["sql"].append((query[:100], held, f"HTTP {r.status_code} in {took:.1f}s{' LEAK' if leak else ''}"
                                                      f" {r.text[:120]!r}"))

        creds = {"none": {}, "malformed": {"Authorization": "Bearer \xa0".encode("latin-1")},
                 "unknown": {"Authorization": "Bearer sb_x"},
                 "revoked": srv.auth("revoked"), "read": srv.auth("read"), "write": srv.auth("write"),
                 "admin": srv.auth("admin")}
        for method, path, body, scope in ENDPOINTS:
            for cred, headers in creds.items():
                data = json.loads(json.dumps(body).replace("{cred}", cred)) if body is not None else None
                r = http.request(method, path, json=data, headers=headers)
                if scope is None:
                    want = "open"
                    held = r.status_code < 400
                elif cred in ("none", "malformed", "unknown", "revoked"):
                    want = "401"
                    held = r.status_code == 401
                elif RANK[cred] < RANK[scope]:
                    want = "403"
                    held = r.status_code == 403
                else:
                    want = "served"
                    held = r.status_code not in (401, 403) and r.status_code < 500
                held = held and (r.status_code < 400 or is_error_body(r))
                if r.status_code in (200, 201) and path == "/api/v1/runs" and method == "POST":
                    expected_runs += r.status_code == 201
                results["matrix"].append((f"{method} {path} as {cred} (want {want})", held, f"HTTP {r.status_code}"))
        # the tokens the matrix created are revoked again, except the probe's own
        for t in http.get("/api/v1/tokens", headers=srv.auth("admin")).json()["tokens"]:
            if t["name"] == "m" and t["revoked_at"] is None:
                http.delete(f"/api/v1/tokens/{t['id']}", headers=srv.auth("admin"))

        for name, method, path, raw, headers, accepted in input_cases():
            hdrs = {**srv.auth("admin"), **headers}
            try:
                r = http.request(method, path, content=raw or None, headers=hdrs)
                held = r.status_code in accepted and is_error_body(r)
                note = f"HTTP {r.status_code} {r.text[:120]!r}"
            except httpx.HTTPError as exc:
                held, note = False, f"{type(exc).__name__}: {exc}"
            results["inputs"].append((name, held, note))

        admins = [t for t in http.get("/api/v1/tokens", headers=srv.auth("admin")).json()["tokens"]
                  if t["scope"] == "admin" and t["revoked_at"] is None]
        r = http.delete(f"/api/v1/tokens/{admins[0]['id']}", headers=srv.auth("admin"))
        results["auth"].append(("revoke the last admin token of a public server",
                                r.status_code == 409 and len(admins) == 1, f"HTTP {r.status_code}"))
        results["auth"].append(("anonymous request to the public server", http.get("/api/v1/runs").status_code == 401,
                                ""))
        results["auth"].append(("anonymous token creation", http.post("/api/v1/tokens", json={"scope": "admin"})
                                .status_code == 401, ""))
        for host in ("", "0.0.0.0", "::"):
            env = {**srv.env, "SCALEBOOK_DATABASE_URL": f"duckdb:///{Path(tmp) / 'empty.duckdb'}"}
            done = scalebook("serve", "--host", host, "--port", str(free_port()), env=env, timeout=60)
            results["auth"].append((f"serve --host {host!r} without tokens", done.returncode != 0
                                    and "refusing to bind" in done.stderr, done.stderr.strip()[-120:]))

        health = http.get("/api/v1/health").json()
        results["health"].append(("server answers after the probe", health.get("status") == "ok", str(health)))
        count = http.post("/api/v1/sql", json={"query": "SELECT count(*) FROM runs"}, headers=srv.auth("read"))
        n = count.json()["rows"][0][0] if count.status_code == 200 else None
        results["health"].append(("exactly the runs stored, nothing else", n == expected_runs,
                                  f"{n} runs, {expected_runs} expected"))
        results["health"].append(("no file written by a query", not any(Path("/tmp").glob("probe_*")), ""))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--backend", choices=["duckdb", "postgresql", "both"], default="both")
    parser.add_argument("--pg-admin-url", default=PG_ADMIN)
    args = parser.parse_args()
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=REPO).stdout.strip()
    backends = ["duckdb", "postgresql"] if args.backend == "both" else [args.backend]
    total_broke = 0
    print(f"probe at commit {commit}")
    for backend in backends:
        started = time.monotonic()
        results = probe(backend, args.pg_admin_url)
        print(f"\n{backend} ({time.monotonic() - started:.0f} s)")
        print(f"  {'category':<10} {'tried':>6} {'held':>6} {'broke':>6}")
        for category, cases in results.items():
            broke = [c for c in cases if not c[1]]
            total_broke += len(broke)
            print(f"  {category:<10} {len(cases):>6} {len(cases) - len(broke):>6} {len(broke):>6}")
        for category, cases in results.items():
            for name, held, note in cases:
                if not held:
                    print(f"  BROKE {category}: {name}: {note}")
    print(f"\n{total_broke} broke")
    shutil.rmtree(Path(tempfile.gettempdir()) / "probe_pwned", ignore_errors=True)
    return 1 if total_broke else 0


if __name__ == "__main__":
    sys.exit(main())
