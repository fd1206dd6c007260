#!/usr/bin/env python
"""How far off is a prediction, as a function of how far its evidence is? (issue 25 item 3)

The recommender's interval (service/analytics/anchor.interval_halves) widens with the distance from the
target to the nearest recorded run of the candidate's exact layout (TP, PP, CP, ZeRO, micro-batch,
recompute; recommend's distance units: |ln size ratio| + |ln nodes ratio| + |ln seq ratio| + hardware),
and gives a layout with no run within SUPPORT_DISTANCE a much lower pessimistic end. This script
measures what those constants should be, on the Ultra-Scale sweep (<data>/nanotron/bench_calibration.csv,
as bench/recommend_loo.py), under extrapolation: six holdouts — every run above 1, 2 or 4 nodes, or every
run of one model size — each fitted on the rest through the real store; for every configuration of a
held-out cell that ran successfully, recommend.scored's anchored prediction against the measured
tokens/s/GPU. Printed per evidence-distance bin: how many, the 10th / 20th / 50th / 90th percentiles of
ln(measured / predicted), the 80th percentile of its absolute value, the share of configurations slower
than 70 % of their cell's best, and the interval's own median log half-widths (below, above) and its
coverage (the share inside [lo, hi]).

Usage: PYTHONPATH=$PWD .venv/bin/python bench/interval_calibration.py
"""

from __future__ import annotations

import math
import statistics
import sys
import tempfile
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.recommend_loo import GBT, GPU, KEY, RETIRE, SEQ, cell_of, held_in_prior, load, retired  # noqa: E402
from service import retire, store  # noqa: E402
from service.analytics import recommend as rec  # noqa: E402
from service.cli import benchmark as benchtool  # noqa: E402
from service.db import Database  # noqa: E402

HOLDOUTS: dict[str, Callable[[tuple[float, int]], bool]] = {
    "nodes > 1": lambda c: c[1] > 1, "nodes > 2": lambda c: c[1] > 2, "nodes > 4": lambda c: c[1] > 4,
    "size 1.34B": lambda c: c[0] == 1.34, "size 3.57B": lambda c: c[0] == 3.57, "size 8.86B": lambda c: c[0] == 8.86}
BINS = ((0.0, 0.7), (0.7, 1.0), (1.0, 1.5), (1.5, 2.0), (2.0, math.inf))


def _key(cfg: dict) -> tuple:
    return tuple((cfg.get(k) or (0 if k == "zero_stage" else 1)) for k in KEY)


def observations(records: list[dict], workdir: Path) -> list[dict]:
    """One row per (holdout, configuration that ran in a held-out cell): residual, evidence distance,
    interval half-widths, relative speed in its cell."""
    out: list[dict] = []
    for name, held in HOLDOUTS.items():
        db = Database(f"duckdb:///{workdir / (name.replace(' ', '_').replace('>', 'gt') + '.duckdb')}")
        db.upgrade()
        db.prepare()
        try:
            with db.session(write=True) as s:
                store.store_runs(s, [r for r in records if not held(cell_of(r))])
            with db.session(write=True) as s:
                retire.retire(s, None, RETIRE, "before nanotron's pipeline-engine fix")
            with held_in_prior(db):
                for size, nodes in sorted({cell_of(r) for r in records if held(cell_of(r))}):
                    truth = [r for r in records if cell_of(r) == (size, nodes) and not retired(r)
                             and r["status"] == "success"]
                    measured: dict[tuple, float] = defaultdict(float)
                    for r in truth:
                        measured[_key(r)] = max(measured[_key(r)], r["tokens_per_sec_per_gpu"])
                    best = max(measured.values())
                    dims = next(r for r in truth if r.get("hidden_size"))
                    with db.session() as s:
                        prep = rec.prepare(s, rec.Target(
                            model_params=int(size * 1e9), nodes=nodes, gpu_type=GPU, seq_len=SEQ,
                            global_batch_tokens=GBT,
                            num_layers=dims["num_layers"], hidden_size=dims["hidden_size"], num_heads=dims["num_heads"],
                            num_kv_heads=dims.get("num_kv_heads"), vocab_size=dims.get("vocab_size"),
                            gated_linear_unit=dims.get("gated_linear_unit")))
                        items = rec.scored(prep)
                    for item in items:
                        real = measured.get(_key(item.config))
                        if not real:
                            continue
                        p = item.predicted
                        tps = p["tokens_per_sec_per_gpu"]
                        out.append({"holdout": name, "residual": math.log(real / tps), "rel": real / best,
                                    "distance": p["evidence_distance"],
                                    "lower": math.log(tps / p["interval"][0]),
                                    "upper": math.log(p["interval"][1] / tps),
                                    "inside": p["interval"][0] <= real <= p["interval"][1]})
        finally:
            db.dispose()
    return out


def _q(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, max(0, round(q * (len(values) - 1))))]


def main() -> int:
    records = load()
    with tempfile.TemporaryDirectory() as tmp:
        obs = observations(records, Path(tmp))
    print(f"commit {benchtool.commit()}; {len(obs)} (holdout, configuration) pairs that ran\n")
    print("| evidence distance | n | q10 | q20 | median | q90 | q80 of abs | slower than 70 % of best "
          "| interval below / above (median) | inside |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for lo, hi in BINS:
        sub = [o for o in obs if lo <= (math.inf if o["distance"] is None else o["distance"]) < hi
               or (hi == math.inf and o["distance"] is None)]
        if not sub:
            continue
        res = [o["residual"] for o in sub]
        label = f"{lo:g}–{hi:g}" if hi < math.inf else f"≥ {lo:g} or never"
        print(f"| {label} | {len(sub)} | {_q(res, .1):+.2f} | {_q(res, .2):+.2f} | {statistics.median(res):+.2f} "
              f"| {_q(res, .9):+.2f} | {_q([abs(x) for x in res], .8):.2f} "
              f"| {100 * sum(o['rel'] < 0.7 for o in sub) / len(sub):.0f} % "
              f"| {statistics.median(o['lower'] for o in sub):.2f} / {statistics.median(o['upper'] for o in sub):.2f} "
              f"| {100 * sum(o['inside'] for o in sub) / len(sub):.0f} % |")
    print("\ncompetitive configurations only (at least 70 % of their cell's best):\n")
    print("| evidence distance | n | median | q80 of abs | inside |")
    print("|---|---|---|---|---|")
    for lo, hi in BINS:
        sub = [o for o in obs if o["rel"] >= 0.7 and (lo <= (math.inf if o["distance"] is None else o["distance"]) < hi
               or (hi == math.inf and o["distance"] is None))]
        if sub:
            res = [o["residual"] for o in sub]
            label = f"{lo:g}–{hi:g}" if hi < math.inf else f"≥ {lo:g} or never"
            print(f"| {label} | {len(sub)} | {statistics.median(res):+.2f} | {_q([abs(x) for x in res], .8):.2f} "
                  f"| {100 * sum(o['inside'] for o in sub) / len(sub):.0f} % |")
    print("\n| holdout | n | median | q80 of abs | inside |")
    print("|---|---|---|---|---|")
    for name in HOLDOUTS:
        sub = [o for o in obs if o["holdout"] == name]
        res = [o["residual"] for o in sub]
        print(f"| {name} | {len(sub)} | {statistics.median(res):+.2f} | {_q([abs(x) for x in res], .8):.2f} "
              f"| {100 * sum(o['inside'] for o in sub) / len(sub):.0f} % |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
