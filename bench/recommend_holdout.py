#!/usr/bin/env python
"""Extrapolation check of the recommender: a whole node count or a whole model size held out.

bench/recommend_loo.py leaves one cell out, so the other sizes at the same node count (and the
other node counts of the same size) stay in. scalebook is judged on cells beyond the recorded
ones (more nodes, bigger models); this script removes every run at one node count (`--nodes N`)
or of one model size (`--size 8.86`), then asks service.analytics.recommend for each held-out
cell — with the evidence anchoring (service/analytics/anchor.py) and with the throughput model
alone — and looks the top-1 up in the cell's real rows, as recommend_loo.py does (same data,
same retirement of pre-fix pipeline runs, same lookup; "not run" counts as a miss).

Usage: PYTHONPATH=$PWD .venv/bin/python bench/recommend_holdout.py (--nodes 8 | --size 8.86)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import recommend_loo as loo  # noqa: E402
from bench.recommend_loo import GBT, GPU, KEY, RETIRE, SEQ, _cfg, _pct, cell_of, held_in_prior, load, lookup, retired  # noqa: E402
from service import retire, store  # noqa: E402
from service.analytics import recommend as rec  # noqa: E402
from service.cli import benchmark as benchtool  # noqa: E402
from service.db import Database  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--nodes", type=int, help="hold out every run at this node count")
    group.add_argument("--size", type=float, help="hold out every run of this model size (billions, e.g. 8.86)")
    group.add_argument("--above-nodes", type=int,
                       help="hold out every run on more than this many nodes (fit on the small scales, "
                            "recommend for every larger one)")
    parser.add_argument("--documented-prior", action="store_true",
                        help="fit with the documented PRIOR (fitted on the whole sweep, held-out cells included) "
                             "instead of one re-derived from the held-in runs (recommend_loo.held_in_prior)")
    args = parser.parse_args(argv)
    loo.PRIOR_FROM_HELD_IN = not args.documented_prior
    records = load()
    if args.above_nodes:
        def held(c: tuple[float, int]) -> bool:
            return c[1] > args.above_nodes
    elif args.nodes:
        def held(c: tuple[float, int]) -> bool:
            return c[1] == args.nodes
    else:
        def held(c: tuple[float, int]) -> bool:
            return c[0] == args.size
    cells = sorted({cell_of(r) for r in records if held(cell_of(r))})
    if not cells:
        raise SystemExit("no cell matches")
    commit = benchtool.commit()
    what = (f"nodes > {args.above_nodes}" if args.above_nodes else f"nodes {args.nodes}" if args.nodes
            else f"size {args.size}B")
    prior = "documented PRIOR" if args.documented_prior else "PRIOR re-derived from the held-in runs"
    print(f"commit {commit}; held out: {what}; {prior}\n")
    print("| cell | best tok/s | ranking | top-1 | status | regret | pred | pred err |")
    print("|---|---|---|---|---|---|---|---|")
    summary: dict[bool, tuple[int, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        db = Database(f"duckdb:///{Path(tmp) / 'holdout.duckdb'}")
        db.upgrade()
        db.prepare()
        try:
            with db.session(write=True) as s:
                store.store_runs(s, [r for r in records if not held(cell_of(r))])
            with db.session(write=True) as s:
                retire.retire(s, None, RETIRE, "before nanotron's pipeline-engine fix")
            with held_in_prior(db):
                for anchor in (True, False):
                    hits, errs = 0, []
                    for size, nodes in cells:
                        truth = [r for r in records if cell_of(r) == (size, nodes) and not retired(r)]
                        best = max(r["tokens_per_sec_per_gpu"] for r in truth if r["status"] == "success")
                        dims = next(r for r in truth if r.get("hidden_size"))
                        with db.session() as s:
                            answer = rec.recommend(s, rec.Target(
                                model_params=int(size * 1e9), nodes=nodes, gpu_type=GPU, seq_len=SEQ,
                                global_batch_tokens=GBT, num_layers=dims["num_layers"], hidden_size=dims["hidden_size"],
                                num_heads=dims["num_heads"], num_kv_heads=dims.get("num_kv_heads"),
                                vocab_size=dims.get("vocab_size")), k=1, anchor=anchor)
                        top = answer["candidates"][0]
                        cfg = {k: top["config"][k] for k in KEY}
                        status, real = lookup(truth, cfg)
                        pred = top["predicted"]["tokens_per_sec_per_gpu"]
                        regret = None if real is None else 1 - real / best
                        hits += int(status == "success" and regret is not None and regret <= 0.05)
                        if real:
                            errs.append(abs(pred - real) / real)
                        print(f"| {size:g}B x {nodes} | {best:,.0f} | {'anchored' if anchor else 'model alone'} "
                              f"| {_cfg(cfg)} | {status} | {_pct(regret)} | {pred:,.0f} "
                              f"| {_pct(None if real is None else abs(pred - real) / real)} |")
                    summary[anchor] = (hits, errs)
        finally:
            db.dispose()
    for anchor, (hits, errs) in summary.items():
        print(f"\n{'anchored' if anchor else 'model alone'}: top-1 success and within 5 % in {hits} of {len(cells)}; "
              f"median |pred - real| / real {_pct(statistics.median(errs) if errs else None)}", end="")
    print()
    return 0


if __name__ == "__main__":
    sys.exit(main())
