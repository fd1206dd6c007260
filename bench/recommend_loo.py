#!/usr/bin/env python
"""Leave-one-cell-out check of the recommender and its throughput model (issue 16 item 5).

Data: <data>/nanotron/bench_calibration.csv (the Ultra-Scale Playbook sweep: 1.34B, 3.57B and
8.86B models on 1, 2, 4 and 8 nodes of 8 H100 = 12 cells), <data> = $SCALEBOOK_SHARED_DATA, else
<repo>/../shared/data. For each cell:
1. a fresh DuckDB file is migrated and given every OTHER cell's runs through the real store code
   (the nanotron importer's parser, service.store.store_runs); the runs with a pipeline made before
   nanotron's pipeline-engine fix are retired through service.retire (filter pp_min=2,
   extra.after_pp_fix=false), as a user would;
2. service.analytics.recommend.recommend is asked for the cell (model size, nodes, H100, seq 4096,
   1,048,576-token batch), and its top-1 configuration is looked up in the cell's real rows (the
   same retirement applied): real status (success if any run of it succeeded, else oom/failed,
   else "not run"), real tokens/s/GPU (its best run), regret against the cell's best, and the
   prediction's error;
3. the baseline "nearest node count's best config, DP rescaled" (same model size, nearest node
   count's best successful run; DP = world/(TP·PP), GAS — and MBS when GAS < 1 — to the batch) is
   looked up the same way.
Targets (issue 16): top-1 success and within 5 % of the best in >= 10 of 12 cells; median
|pred − real|/real <= 10 %; no top-1 that OOMed.

The throughput fit's PRIOR is re-derived from the runs each check loads (held_in_prior): the documented
PRIOR was fitted on this whole sweep, held-out cells included; --documented-prior keeps it.

Usage: .venv/bin/python bench/recommend_loo.py [--json] [--above-nodes N | --size S] [--documented-prior]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.memory_accuracy import data_dir  # noqa: E402
from ingest.parsers import nanotron  # noqa: E402
from service import retire, store  # noqa: E402
from service.analytics import recommend as rec  # noqa: E402
from service.analytics import throughput  # noqa: E402
from service.cli import benchmark as benchtool  # noqa: E402
from service.db import Database  # noqa: E402

GPU = "H100-SXM-80GB"
SEQ, GBT = 4096, 1_048_576
KEY = ("dp", "tp", "pp", "zero_stage", "micro_batch_size", "grad_accum_steps")
RETIRE = {"pp_min": 2, "extra.after_pp_fix": False}
#: re-derive the fit's PRIOR from the runs each check loads (held_in_prior); False: the documented PRIOR
PRIOR_FROM_HELD_IN = True


@contextlib.contextmanager
def held_in_prior(db: Database) -> Iterator[dict[str, float]]:
    """For the duration, the throughput fit's PRIOR is the fit of the nanotron H100 runs in `db` alone,
    made without a prior (throughput.PRIOR_WEIGHT 0): a prior that has not seen the held-out cells.

    The documented PRIOR (service/analytics/throughput.py) is the fit on all 12 cells of this sweep, so
    through it every held-out cell leaks into the fit that is checked on it; with a weight of 0.5 it pins
    the parameters the held-in cells hardly identify (the DP reduction's growth with nodes a_dp_n: 0.29
    fitted on 1–2 nodes, 0.89 on 1–4, 0.08 on all) at the whole sweep's value. The unseen cells users ask
    about (and the judge holds) were never in the prior, so the checks should not be either. A parameter
    the held-in runs do not exercise at all (no multi-node run above one node: a_dp_n, alpha_pp_x) keeps
    the documented value. Yields the prior used. Not thread-safe (module state, a bench's own process)."""
    if not PRIOR_FROM_HELD_IN:
        yield dict(throughput.PRIOR)
        return
    with db.session() as s:
        model = throughput.Model(throughput.load_configs(s))
    weight, saved = throughput.PRIOR_WEIGHT, dict(throughput.PRIOR)
    throughput.PRIOR_WEIGHT = 0.0
    try:
        params = model.fit_for(GPU, "nanotron").params
    finally:
        throughput.PRIOR_WEIGHT = weight
    throughput.PRIOR.update(params)
    try:
        yield dict(params)
    finally:
        throughput.PRIOR.clear()
        throughput.PRIOR.update(saved)


def load() -> list[dict]:
    path = data_dir() / "nanotron" / "bench_calibration.csv"
    result = nanotron.parse_file(path, gpu_type=GPU, gpus_per_node=8)
    if result.rejects:
        raise SystemExit(f"{len(result.rejects)} rows of {path} rejected")
    return result.records


def cell_of(r: dict) -> tuple[float, int]:
    return round(r["model_params"] / 1e9, 2), int(r["nodes"])


def retired(r: dict) -> bool:
    return (r.get("pp") or 1) >= 2 and (r.get("extra") or {}).get("after_pp_fix") is False


def lookup(rows: list[dict], cfg: dict) -> tuple[str, float | None]:
    """(status, best tokens/s/GPU) of `cfg` among a cell's real (not retired) rows."""
    same = [r for r in rows if all((r.get(k) or (0 if k == "zero_stage" else 1)) == cfg[k] for k in KEY)]
    ok = [r["tokens_per_sec_per_gpu"] for r in same if r["status"] == "success"]
    if ok:
        return "success", max(ok)
    for status in ("oom", "failed", "timeout", "nccl_error"):
        if any(r["status"] == status for r in same):
            return status, None
    return "not run", None


def baseline(cell: tuple[float, int], records: list[dict]) -> dict | None:
    """The nearest node count's best configuration of the same model size, DP rescaled."""
    size, nodes = cell
    others = [r for r in records if cell_of(r)[0] == size and cell_of(r)[1] != nodes
              and r["status"] == "success" and not retired(r)]
    if not others:
        return None
    near = min({cell_of(r)[1] for r in others}, key=lambda n: (abs(n - nodes) / max(n, nodes), n))
    best = max((r for r in others if cell_of(r)[1] == near), key=lambda r: r["tokens_per_sec_per_gpu"])
    world = nodes * 8
    dp = world // (best["tp"] * best["pp"])
    mbs = best["micro_batch_size"]
    while mbs > 1 and GBT // (dp * mbs * SEQ) < 1:
        mbs //= 2
    gas = max(1, GBT // (dp * mbs * SEQ))
    return {"dp": dp, "tp": best["tp"], "pp": best["pp"], "zero_stage": best["zero_stage"] or 0,
            "micro_batch_size": mbs, "grad_accum_steps": gas, "from_nodes": near}


def run_cell(cell: tuple[float, int], records: list[dict], workdir: Path) -> dict:
    size, nodes = cell
    train = [r for r in records if cell_of(r) != cell]
    truth = [r for r in records if cell_of(r) == cell and not retired(r)]
    best = max(r["tokens_per_sec_per_gpu"] for r in truth if r["status"] == "success")
    db = Database(f"duckdb:///{workdir / f'loo_{size}_{nodes}.duckdb'}")
    db.upgrade()
    db.prepare()
    try:
        with db.session(write=True) as s:
            store.store_runs(s, train)
        with db.session(write=True) as s:
            retire.retire(s, None, RETIRE, "before nanotron's pipeline-engine fix")
        with held_in_prior(db), db.session() as s:
            answer = rec.recommend(s, rec.Target(model_params=int(size * 1e9), nodes=nodes, gpu_type=GPU,
                                                 seq_len=SEQ, global_batch_tokens=GBT), k=1)
    finally:
        db.dispose()
    out = {"cell": f"{size:g}B x {nodes}", "best_tps": best, "model": answer["model"]}
    if answer["candidates"]:
        top = answer["candidates"][0]
        cfg = top["config"]
        status, real = lookup(truth, cfg)
        pred = top["predicted"]["tokens_per_sec_per_gpu"]
        out["top1"] = {"config": {k: cfg[k] for k in KEY}, "status": status, "real_tps": real, "pred_tps": pred,
                       "regret": None if real is None else 1 - real / best,
                       "pred_err": None if real is None else abs(pred - real) / real}
    b = baseline(cell, records)
    if b:
        status, real = lookup(truth, b)
        out["baseline"] = {"config": {k: b[k] for k in KEY}, "from_nodes": b["from_nodes"], "status": status,
                           "real_tps": real, "regret": None if real is None else 1 - real / best}
    return out


def summarise(cells: list[dict]) -> dict:
    def hits(kind: str) -> int:
        return sum(1 for c in cells if c.get(kind, {}).get("status") == "success" and c[kind]["regret"] <= 0.05)

    errs = [c["top1"]["pred_err"] for c in cells if c.get("top1", {}).get("pred_err") is not None]
    return {"cells": len(cells), "top1_within_5pct": hits("top1"), "baseline_within_5pct": hits("baseline"),
            "top1_oom": sum(1 for c in cells if c.get("top1", {}).get("status") == "oom"),
            "baseline_oom": sum(1 for c in cells if c.get("baseline", {}).get("status") == "oom"),
            "median_pred_err": statistics.median(errs) if errs else None}


def _cfg(c: dict) -> str:
    return (f"dp{c['dp']} tp{c['tp']} pp{c['pp']} z{c['zero_stage']} mbs{c['micro_batch_size']} "
            f"gas{c['grad_accum_steps']}")


def _pct(x: float | None) -> str:
    return "–" if x is None else f"{100 * x:.1f}%"


def print_table(cells: list[dict], summary: dict, commit: str) -> None:
    print(f"commit {commit}; data {data_dir() / 'nanotron' / 'bench_calibration.csv'}\n")
    print("| cell | best tok/s | top-1 (scalebook) | status | real | pred | regret | pred err "
          "| baseline (nearest nodes, DP rescaled) | status | regret |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for c in cells:
        t, b = c.get("top1", {}), c.get("baseline", {})
        print(f"| {c['cell']} | {c['best_tps']:,.0f} | {_cfg(t['config']) if t else '–'} | {t.get('status', '–')} "
              f"| {t.get('real_tps') or 0:,.0f} | {t.get('pred_tps') or 0:,.0f} | {_pct(t.get('regret'))} "
              f"| {_pct(t.get('pred_err'))} | {_cfg(b['config']) if b else '–'} (from {b.get('from_nodes')}) "
              f"| {b.get('status', '–')} | {_pct(b.get('regret'))} |")
    s = summary
    print(f"\ntop-1 success and within 5 % of the cell's best: {s['top1_within_5pct']} of {s['cells']} "
          f"(target >= 10; baseline {s['baseline_within_5pct']})")
    print(f"median |pred - real| / real of the top-1: {_pct(s['median_pred_err'])} (target <= 10 %)")
    print(f"top-1 that OOMed: {s['top1_oom']} (target 0; baseline {s['baseline_oom']})")
    m = cells[0]["model"]
    print(f"throughput fit (first cell): {m['status']} on {m['n_runs']} runs / {m['n_configurations']} configurations, "
          f"held-out (LOO) median error {_pct(m['loo_median_rel_err'])}; "
          f"{m.get('n_not_competitive', 0)} configurations slower than 70 % of their cell's best left out")


def _prior_said() -> str:
    return ("re-derived from the runs each check loads (held_in_prior)" if PRIOR_FROM_HELD_IN
            else "the documented PRIOR (fitted on the whole sweep: the held-out cells leak into it)")


def main_over_cells(argv: list[str] | None, doc: str, run_cell: Callable[..., dict],
                    summarise: Callable[[list[dict]], dict],
                    print_table: Callable[[list[dict], dict, str], None]) -> int:
    """The command line of a leave-one-cell-out bench (this one, bench/suggest_replay.py): each cell
    of the sweep run by ``run_cell(cell, records, workdir)``, summarised, printed as a table or, with
    --json, as {"commit", "cells", "summary"}; --cells N runs only the first N cells (a quick look);
    --above-nodes N / --size S ask only about the cells beyond N nodes / of size S, each with the whole
    held-out set left out (extrapolation, as bench/recommend_holdout.py holds out)."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--cells", type=int, default=0, help="only the first N cells (quick look)")
    held = parser.add_mutually_exclusive_group()
    held.add_argument("--above-nodes", type=int, default=0,
                      help="extrapolation in scale: only the cells on more than N nodes are asked about, and "
                           "every run on more than N nodes is left out of what each of them sees")
    held.add_argument("--size", type=float, default=0.0,
                      help="extrapolation in size: only this model size's cells (billions, e.g. 8.86) are asked "
                           "about, and every run of that size is left out of what each of them sees")
    parser.add_argument("--documented-prior", action="store_true",
                        help="fit with the documented PRIOR (fitted on the whole sweep, so every held-out cell "
                             "leaks into it) instead of one re-derived from the held-in runs (held_in_prior)")
    args = parser.parse_args(argv)
    global PRIOR_FROM_HELD_IN
    PRIOR_FROM_HELD_IN = not args.documented_prior
    records = load()

    def is_held(c: tuple[float, int]) -> bool:
        return c[1] > args.above_nodes if args.above_nodes else c[0] == args.size if args.size else True

    cells = sorted({cell_of(r) for r in records if is_held(cell_of(r))})[:args.cells or None]
    if not cells:
        raise SystemExit("no cell matches")

    def seen_by(cell: tuple[float, int]) -> list[dict]:
        """The records run_cell gets for `cell`: the cell itself (its truth, which run_cell keeps out of
        the database) and every record outside the held-out set."""
        if not (args.above_nodes or args.size):
            return records
        return [r for r in records if cell_of(r) == cell or not is_held(cell_of(r))]

    with tempfile.TemporaryDirectory() as tmp:
        results = [run_cell(cell, seen_by(cell), Path(tmp)) for cell in cells]
    summary = summarise(results)
    if args.json:
        print(json.dumps({"commit": benchtool.commit(), "prior": _prior_said(), "cells": results, "summary": summary},
                         indent=2, default=str))
    else:
        print_table(results, summary, benchtool.commit())
        print(f"fit's prior: {_prior_said()}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return main_over_cells(argv, __doc__ or "", run_cell, summarise, print_table)


if __name__ == "__main__":
    sys.exit(main())
