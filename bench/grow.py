#!/usr/bin/env python
"""Grow a scalebook database to N runs by SQL duplication (for timing at 10^6 runs without
ingesting 10^6 runs through the API).

The runs stored so far (ids ≤ the current maximum: the "base") are copied with
`INSERT INTO runs (<every column but id>) SELECT … FROM runs WHERE id <= <base max>` until the table
holds at least N runs; each copy k gets run_key `<run_key>~<k>` (unique) and a fresh id from the
table's sequence (so later API writes keep drawing free ids), everything else as stored. Derived
tables kept in the write transaction (run_configs) are rebuilt at the end
(service/run_configs.rebuild), as `scalebook db rebuild-configs` does. PostgreSQL: VACUUM
ANALYZE runs afterwards (the state autovacuum reaches; `scalebook bench` does the same after its load).

Usage:
    PYTHONPATH=$PWD .venv/bin/python bench/grow.py --url duckdb:////path/t1m.duckdb --runs 1000000
    PYTHONPATH=$PWD .venv/bin/python bench/grow.py --url postgresql://postgres@127.0.0.1:5432/t1m --runs 1000000
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import sqlalchemy as sa  # noqa: E402

from service.db import Database  # noqa: E402
from service.settings import normalise_url  # noqa: E402
from service.tables import Run  # noqa: E402


def grow(url: str, runs: int) -> dict[str, int]:
    """Copy the stored runs until at least `runs` are stored; returns {before, after, copies}."""
    db = Database(normalise_url(url))
    db.upgrade()
    names = [c.name for c in Run.__table__.columns if c.name != "id"]
    try:
        with db.session(write=True) as s:
            base_max, before = s.execute(sa.text("SELECT max(id), count(*) FROM runs")).one()
        if not before:
            raise SystemExit("the database holds no runs to copy")
        copies = 0
        total = before
        while total < runs:
            copies += 1
            select = ", ".join(f"run_key || '~{copies}'" if n == "run_key" else n for n in names)
            with db.session(write=True) as s:
                s.execute(sa.text(f"INSERT INTO runs ({', '.join(names)}) SELECT {select} FROM runs "
                                  f"WHERE id <= {int(base_max)} ORDER BY id LIMIT {int(runs - total)}"))
            total = min(runs, total + before)
            print(f"copy {copies}: {total:,} runs", file=sys.stderr)
        try:
            from service import run_configs
        except ImportError:  # a tree without the summary table
            run_configs = None  # type: ignore[assignment]
        if run_configs is not None:
            with db.session(write=True) as s:
                run_configs.rebuild(s)
                try:
                    from service import run_cells
                except ImportError:  # a tree without it
                    pass
                else:
                    run_cells.rebuild(s)
        if db.engine.dialect.name == "postgresql":
            with db.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                conn.execute(sa.text("VACUUM ANALYZE"))
        else:
            with db.engine.connect() as conn:
                conn.execute(sa.text("CHECKPOINT"))
        with db.session() as s:
            after = s.execute(sa.text("SELECT count(*) FROM runs")).scalar_one()
        return {"before": int(before), "after": int(after), "copies": copies}
    finally:
        db.dispose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--url", required=True, help="the database (SCALEBOOK_DATABASE_URL form)")
    ap.add_argument("--runs", type=int, default=1_000_000, help="how many runs to reach")
    args = ap.parse_args()
    t0 = time.perf_counter()
    out = grow(args.url, args.runs)
    print(f"{out['before']:,} → {out['after']:,} runs ({out['copies']} copies) in {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    main()
