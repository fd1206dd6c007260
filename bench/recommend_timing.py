#!/usr/bin/env python
"""Latency of /recommend and /suggest (the throughput model fitted per request) at 10^5–10^6 runs.

Fills a fresh database (DuckDB file, or --url for PostgreSQL) with N generated runs
(service/benchtool.generate_runs: the shipped examples' configurations with jitter) plus the shipped
nanotron sample, then times GET /api/v1/recommend and /api/v1/suggest through the app (TestClient)
for a few targets; prints the median and p90 in ms with the commit. Issue 16's budget: /recommend
<= 150 ms p50 at 10^6 runs.

Usage: .venv/bin/python bench/recommend_timing.py [--runs 100000] [--calls 10] [--url URL]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import sqlalchemy as sa  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from service import store  # noqa: E402
from service.api import create_app  # noqa: E402
from service.cli import benchmark as benchtool  # noqa: E402
from service.db import Database  # noqa: E402
from service.settings import Settings  # noqa: E402
from service.tables import Run  # noqa: E402

TARGETS = [{"model_params": "8B", "nodes": 8, "gpu_type": "H100"},
           {"model_params": "70B", "nodes": 16, "gpu_type": "H100"},
           {"model_params": "1.34B", "nodes": 4, "gpu_type": "H100", "seq_len": 4096}]


def fill(db: Database, n: int) -> None:
    batch = 50_000
    for start in range(0, n, batch):
        runs = list(benchtool.generate_runs(min(batch, n - start), seed=start, prefix=f"t{start}"))
        with db.session(write=True) as s:
            store.store_runs(s, runs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=100_000)
    parser.add_argument("--calls", type=int, default=10)
    parser.add_argument("--url", default=None, help="database URL (default: a DuckDB file in a temp dir)")
    parser.add_argument("--no-fill", action="store_true", help="time the runs already in --url")
    args = parser.parse_args(argv)
    commit = benchtool.commit()
    with tempfile.TemporaryDirectory() as tmp:
        db = Database(args.url or f"duckdb:///{Path(tmp) / 'timing.duckdb'}")
        db.upgrade()
        db.prepare()
        t0 = time.perf_counter()
        if not args.no_fill:
            fill(db, args.runs)
        with db.session() as s:
            stored = s.scalar(sa.select(sa.func.count()).select_from(Run))
        print(f"commit {commit}; {db.dialect}; {stored:,} runs (filled in {time.perf_counter() - t0:.0f} s)")
        with TestClient(create_app(db, Settings(database_url=None))) as api:
            for path in ("/api/v1/recommend", "/api/v1/suggest"):
                for target in TARGETS:
                    times = []
                    for _ in range(args.calls):
                        t = time.perf_counter()
                        r = api.get(path, params=target)
                        times.append(1000 * (time.perf_counter() - t))
                        assert r.status_code == 200, r.text
                    times.sort()
                    print(f"{path:<20} {target}: p50 {statistics.median(times):.0f} ms, "
                          f"p90 {times[int(0.9 * (len(times) - 1))]:.0f} ms")
        db.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
