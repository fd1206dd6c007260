#!/usr/bin/env python
"""Does a recorded run of the same layout at another scale settle "does it fit?" better than the memory
model alone? (service/analytics/fits.fit_shown, issue 25 fourth pass)

On the Ultra-Scale sweep's bench_calibration.csv (its pipeline runs from before nanotron's pipeline fix,
`after_pp_fix` false, retired as bench/recommend_loo.py retires them; `--keep-pre-fix` keeps them), for
each cell (model size × node count) held out: the verdict on every labelled row (Success or OOM) of the
cell is the memory model's (service/analytics/memory.estimate_memory: fits), or "fits" where a successful
run of another cell shows it (fit_shown: same model, GPU type, framework, precision, TP, PP, CP; no less
memory per GPU).
`--smaller` takes the shown-by runs from cells with fewer nodes only (extrapolation in scale: what a user
who ran 1–4 nodes asks about 8). Prints the confusion of both verdicts, the Success rows the model calls
OOM that a record rescues, and every OOM row a record would wrongly call "fits" (the rule's failures).

    PYTHONPATH=$PWD SCALEBOOK_SHARED_DATA=../shared/data .venv/bin/python bench/fit_shown.py [--smaller]
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.memory_accuracy import data_dir, load_rows, predict  # noqa: E402
from core.model import model_size_class  # noqa: E402
from service.analytics.fits import fit_shown  # noqa: E402
from service.analytics.target import CompletedTarget  # noqa: E402


def config_row(i: int, row: dict) -> dict:
    """A sweep row as recommend's configuration rows carry it (the fields fit_shown reads)."""
    run = row["run"]
    return {"first_id": i, "nodes": row["nodes"], "gpu_type": run["gpu_type"], "framework": run["framework"],
            "precision": run["precision"], "model_size_class": model_size_class(run["model_params"]),
            "seq_len": run["seq_len"], "recompute": run["recompute"],
            **{f: run.get(f) for f in ("dp", "tp", "pp", "zero_stage", "micro_batch_size", "grad_accum_steps")},
            "cp": 1}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--smaller", action="store_true", help="shown-by runs from cells with fewer nodes only")
    ap.add_argument("--keep-pre-fix", action="store_true", help="keep the pipeline runs from before the fix")
    args = ap.parse_args()
    path = data_dir() / "nanotron" / "bench_calibration.csv"
    with open(path, newline="") as fh:  # the rows in file order, as load_rows reads them
        pre_fix = [int(float(r["pp"] or 1)) >= 2 and r["after_pp_fix"] == "False" for r in csv.DictReader(fh)]
    loaded = load_rows(path)
    assert len(loaded) == len(pre_fix)
    rows = [r for r, old in zip(predict(loaded), pre_fix, strict=True)
            if r["status"] in ("Success", "OOM") and (args.keep_pre_fix or not old)]
    configs = [config_row(i, r) for i, r in enumerate(rows)]
    confusion = {"model": {}, "model_or_record": {}}
    rescued, wrong = [], []
    for i, row in enumerate(rows):
        run = row["run"]
        size = model_size_class(run["model_params"])
        recorded = [c for j, c in enumerate(configs) if rows[j]["status"] == "Success"
                    and c["model_size_class"] == size and c["nodes"] != row["nodes"]
                    and (not args.smaller or c["nodes"] < row["nodes"])]
        ctx = CompletedTarget(model_params=run["model_params"], nodes=row["nodes"], gpus_per_node=8,
                              gpu_type=run["gpu_type"], seq_len=run["seq_len"], precision=run["precision"],
                              framework=run["framework"], size_class=size)
        cfg = {**{f: configs[i][f] for f in ("dp", "tp", "pp", "cp", "zero_stage", "micro_batch_size",
                                             "grad_accum_steps", "recompute")}}
        model_fits = bool(row["est"].fits)
        shown = fit_shown(cfg, ctx, recorded) if not model_fits else None
        verdict = model_fits or shown is not None
        for name, fits in (("model", model_fits), ("model_or_record", verdict)):
            key = f"{row['status']} called {'fits' if fits else 'OOM'}"
            confusion[name][key] = confusion[name].get(key, 0) + 1
        if shown is not None:
            (rescued if row["status"] == "Success" else wrong).append((row["name"], row["nodes"], shown["nodes"]))
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True,
                            text=True).stdout.strip()
    print(f"commit {commit}; shown-by runs from {'cells with fewer nodes' if args.smaller else 'every other cell'}; "
          f"pre-fix pipeline runs {'kept' if args.keep_pre_fix else 'retired'}")
    for name, conf in confusion.items():
        right = conf.get("Success called fits", 0) + conf.get("OOM called OOM", 0)
        print(f"{name}: {right} of {sum(conf.values())} right ({100 * right / sum(conf.values()):.1f} %); "
              + ", ".join(f"{k}: {v}" for k, v in sorted(conf.items())))
    print(f"Success rows the memory model calls OOM that a record shows fit: {len(rescued)}")
    for name, nodes, by in rescued:
        print(f"  {name} × {nodes} nodes (shown by a run on {by} nodes)")
    print(f"OOM rows a record would call fits (the rule's failures): {len(wrong)}")
    for name, nodes, by in wrong:
        print(f"  {name} × {nodes} nodes (a run on {by} nodes)")


if __name__ == "__main__":
    main()
