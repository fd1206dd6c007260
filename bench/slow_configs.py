#!/usr/bin/env python
"""How far off are the slow configurations? The throughput model on configurations far below their cell's best.

scalebook is judged on single-node runs (2–8 GPUs, small models and batches) whose slow configurations an
earlier model predicted 2–3× too fast (issue 25). The fit keeps only the configurations within
COMPETITIVE_FRACTION of their cell's best (service/analytics/throughput.competitive), so nothing in the
fitted checks looks at the slow ones. This bench does, on the nearest data in hand: the Ultra-Scale sweep
(<data>/nanotron/bench_calibration.csv, as bench/recommend_loo.py loads, stores and retires it; <data> =
$SCALEBOOK_SHARED_DATA, else <repo>/../shared/data), the model fitted on the `--nodes` cells (default 1:
single-node, 8 H100s) with the PRIOR re-derived from those runs (bench/recommend_loo.held_in_prior), every
configuration of those cells predicted, and again with each model size left out. The errors are reported
by band of the configuration's measured tokens/s/GPU over its cell's best (throughput.cell_key, any global
batch); a
configuration below 10 % of its cell's best (a hung pipeline: one run at 1/80 of its siblings) is counted
apart. Signed error = predicted / measured − 1: positive is predicted too fast.

Usage: PYTHONPATH=$PWD .venv/bin/python bench/slow_configs.py [--nodes 1] [--verbose]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.recommend_loo import RETIRE, held_in_prior, load  # noqa: E402
from service import retire, store  # noqa: E402
from service.analytics import throughput as th  # noqa: E402
from service.cli import benchmark as benchtool  # noqa: E402
from service.db import Database  # noqa: E402

#: bands of a configuration's tokens/s/GPU over its cell's best: the fitted ones (≥ COMPETITIVE_FRACTION),
#: the slow ones, the very slow ones; below HUNG a configuration is counted apart
BANDS = ((0.7, 1.01), (0.5, 0.7), (0.1, 0.5))
HUNG = 0.1


def _size(r: dict[str, Any]) -> float:
    return round(r["model_params"] / 1e9, 2)


def errors(train: list[dict[str, Any]], test: list[dict[str, Any]]) -> list[tuple[float, float, dict]]:
    """(fraction of the cell's best, signed error, row) of every test configuration, the model fitted on train."""
    model = th.Model(train)
    best: dict[tuple, float] = {}
    for r in test:
        best[_target(r)] = max(best.get(_target(r), 0.0), float(r["tokens_per_sec_per_gpu"]))
    out = []
    for r in test:
        pred = model.predict(r, r["framework"])["tokens_per_sec_per_gpu"]
        out.append((r["tokens_per_sec_per_gpu"] / best[_target(r)], pred / r["tokens_per_sec_per_gpu"] - 1, r))
    return out


def _target(r: dict[str, Any]) -> tuple:
    """The cell without its global batch (throughput.cell_key less the batch): the few runs of the sweep at
    another batch are banded against the same best, so that a hung one is not the best of a cell of its own."""
    return th.cell_key(r)[:-1]


def table(label: str, errs: list[tuple[float, float, dict]]) -> None:
    cells = []
    for lo, hi in BANDS:
        es = [e for f, e, _ in errs if lo <= f < hi]
        cells.append(f"{len(es)} | {100 * statistics.mean(abs(e) for e in es):.1f} % | "
                     f"{100 * statistics.mean(es):+.1f} %" if es else "0 | – | –")
    hung = sum(1 for f, _, _ in errs if f < HUNG)
    print(f"| {label} | " + " | ".join(cells) + f" | {hung} |")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1, help="the node count whose cells are fitted and checked")
    parser.add_argument("--verbose", action="store_true", help="list the configurations below 70 %%")
    args = parser.parse_args(argv)
    records = [r for r in load() if int(r["nodes"]) == args.nodes]
    with tempfile.TemporaryDirectory() as tmp:
        db = Database(f"duckdb:///{Path(tmp) / 'slow.duckdb'}")
        db.upgrade()
        db.prepare()
        with db.session(write=True) as s:
            store.store_runs(s, records)
        with db.session(write=True) as s:
            retire.retire(s, None, RETIRE, "before nanotron's pipeline-engine fix")
        with db.session() as s:
            rows = th.load_configs(s)
        print(f"commit {benchtool.commit()}; {len(rows)} configurations on {args.nodes} node(s)\n")
        print("| fitted on | ≥ 70 %: n | mean abs | signed | 50–70 %: n | mean abs | signed | 10–50 %: n | "
              "mean abs | signed | below 10 % |")
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        with held_in_prior(db):
            every = errors(rows, rows)
            table(f"{args.nodes}-node cells (all sizes)", every)
            for size in sorted({_size(r) for r in rows}):
                table(f"the other sizes ({size:g}B left out)",
                      errors([r for r in rows if _size(r) != size], [r for r in rows if _size(r) == size]))
    if args.verbose:
        print()
        for f, e, r in sorted(every, key=lambda x: x[0]):
            if HUNG <= f < 0.7:
                print(f"{_size(r):g}B dp{r['dp']} tp{r['tp']} pp{r['pp']} z{r['zero_stage']} "
                      f"mbs{r['micro_batch_size']} gas{r['grad_accum_steps']}: {100 * f:.0f} % of best, "
                      f"predicted {100 * e:+.0f} %")
    return 0


if __name__ == "__main__":
    sys.exit(main())
