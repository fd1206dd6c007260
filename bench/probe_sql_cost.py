"""What the DuckDB user-SQL sandbox costs (service/analytics/sql.py): time per query at 10^5 and 10^6 runs.

    PYTHONPATH=$PWD .venv/bin/python bench/probe_sql_cost.py [--runs 100000 1000000] [--repeat 3]

Builds a migrated DuckDB file per N with N synthetic runs (copied inside DuckDB from 1,000 generated
by service.benchtool, run_key made unique), then times `run_query` for typical queries: the sandbox
(a fresh in-memory DuckDB, runs exported as Arrow: streamed when the query names runs once, else
materialised, only the columns named) against the same SQL run directly on the service's connection
(what the code did before issue 14, with no isolation). Prints median milliseconds with the commit;
asserts nothing.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from service import store
from service.analytics import sql as user_sql
from service.cli import benchmark as benchtool
from service.db import Database

QUERIES = {
    "count": "SELECT count(*) FROM runs",
    "group by nodes": "SELECT nodes, max(tokens_per_sec_per_gpu) AS best FROM runs WHERE status = 'success' "
                      "GROUP BY nodes ORDER BY nodes",
    "top 20 rows, 6 cols": "SELECT id, model_name, nodes, dp, tp, tokens_per_sec_per_gpu FROM runs "
                           "ORDER BY tokens_per_sec_per_gpu DESC NULLS LAST LIMIT 20",
    "SELECT * LIMIT 100": "SELECT * FROM runs LIMIT 100",
    "CTE window (materialised)": "WITH r AS (SELECT nodes, tokens_per_sec_per_gpu AS t, row_number() OVER "
                                 "(PARTITION BY nodes ORDER BY tokens_per_sec_per_gpu DESC) AS k FROM runs) "
                                 "SELECT nodes, t FROM r WHERE k = 1 ORDER BY nodes",
}


def build(n: int, workdir: Path) -> Database:
    db = Database(f"duckdb:///{workdir / f'cost_{n}.duckdb'}")
    db.prepare()
    with db.session(write=True) as session:
        store.store_runs(session, list(benchtool.generate_runs(1000, 7, prefix="cost")))
    with db.engine.connect() as conn:
        raw = conn.connection.driver_connection
        columns = [c for c in user_sql.RUN_COLUMNS if c != "id"]
        select = ", ".join("run_key || '-' || g.i::VARCHAR" if c == "run_key" else f'"{c}"' for c in columns)
        raw.execute(f"INSERT INTO runs ({', '.join(columns)}) SELECT {select} FROM runs, range({n // 1000 - 1}) g(i)")
    return db


def direct(db: Database, sql: str) -> None:
    with db.engine.connect() as conn:
        con = conn.connection.driver_connection
        con.execute(sql).fetchmany(10_001)


def timed(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, nargs="+", default=[100_000, 1_000_000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    commit = benchtool.commit()
    print(f"commit {commit}; median of {args.repeat}; milliseconds")
    with tempfile.TemporaryDirectory(prefix="sbcost-") as tmp:
        for n in args.runs:
            db = build(n, Path(tmp))
            with db.session() as session:
                count = session.scalar(__import__("sqlalchemy").text("SELECT count(*) FROM runs"))
            print(f"\n{count:,} runs")
            print(f"  {'query':<28} {'sandbox':>9} {'direct':>9}")
            for name, query in QUERIES.items():
                checked = user_sql.check_query(query, "duckdb")
                sandbox = timed(
                    lambda q=query, db=db: user_sql.run_query(db, q, timeout_s=120, max_rows=10_000), args.repeat
                )
                plain = timed(lambda q=checked, db=db: direct(db, q), args.repeat)
                print(f"  {name:<28} {sandbox:>9.1f} {plain:>9.1f}")
            db.dispose()


if __name__ == "__main__":
    main()
