#!/usr/bin/env python
"""Replay of the Ultra-Scale Playbook sweep with /suggest (issue 17 item 3).

For each of the 12 cells of <data>/nanotron/bench_calibration.csv (see bench/recommend_loo.py for
<data>, the cells and the retirement of pre-fix pipeline runs): a fresh DuckDB file holds the
other cells' runs; then, through the API (FastAPI's TestClient on the real app), GET /suggest?n=1
is asked for one configuration, which is "run" by looking it up in the cell's real rows (not
retired): its runs are POSTed as recorded (successes, OOMs and failures alike); a configuration
the sweep never ran counts as a wasted run and is POSTed as a failed run saying so (so it is not
suggested again). This repeats until a run within 5 % of the cell's best tokens/s/GPU is recorded
or 30 runs have gone. Baselines: the cell's configurations in random order (median of 20
shuffles) and the recommender's ranked list for the cell (GET /recommend?k=30 before any run).
Targets: median <= 5 runs per cell, every cell <= 15, fewer OOMs than the random order.

Usage: .venv/bin/python bench/suggest_replay.py [--json] [--above-nodes N | --size S]

With --above-nodes N (or --size S) only the cells beyond N nodes (of size S) are replayed, and each
replay sees none of the held-out runs: /suggest at scales (sizes) it has no run of, as users ask it.
"""

from __future__ import annotations

import random
import statistics
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from fastapi.testclient import TestClient  # noqa: E402

from bench.recommend_loo import (  # noqa: E402
    GBT,
    GPU,
    KEY,
    RETIRE,
    SEQ,
    cell_of,
    data_dir,
    held_in_prior,
    main_over_cells,
    retired,
)
from service import retire, store  # noqa: E402
from service.api import create_app  # noqa: E402
from service.db import Database  # noqa: E402
from service.settings import Settings  # noqa: E402

LIMIT = 30
WITHIN = 0.05


def _key(cfg: dict) -> tuple:
    return tuple((cfg.get(k) or (0 if k == "zero_stage" else 1)) for k in KEY)


def _strip(rec: dict, n: int) -> dict:
    """A sweep row as a new run record for the replay (its own run_key)."""
    out = dict(rec)
    out["run_key"] = f"replay:{rec['run_key']}:{n}"
    return out


def walk(order: list[tuple], by_cfg: dict[tuple, list[dict]], best: float) -> tuple[int, int, bool]:
    """(runs used, OOMs met, hit) walking configurations in `order` until a hit or LIMIT."""
    ooms = 0
    for i, key in enumerate(order[:LIMIT], 1):
        rows = by_cfg.get(key, [])
        ok = [r["tokens_per_sec_per_gpu"] for r in rows if r["status"] == "success"]
        if ok and max(ok) >= (1 - WITHIN) * best:
            return i, ooms, True
        if not ok and any(r["status"] == "oom" for r in rows):
            ooms += 1
    return min(len(order), LIMIT), ooms, False


def run_cell(cell: tuple[float, int], records: list[dict], workdir: Path) -> dict:
    size, nodes = cell
    truth = [r for r in records if cell_of(r) == cell and not retired(r)]
    best = max(r["tokens_per_sec_per_gpu"] for r in truth if r["status"] == "success")
    by_cfg: dict[tuple, list[dict]] = {}
    for r in truth:
        by_cfg.setdefault(_key(r), []).append(r)
    db = Database(f"duckdb:///{workdir / f'replay_{size}_{nodes}.duckdb'}")
    db.upgrade()
    db.prepare()
    with db.session(write=True) as s:
        store.store_runs(s, [r for r in records if cell_of(r) != cell])
    with db.session(write=True) as s:
        retire.retire(s, None, RETIRE, "before nanotron's pipeline-engine fix")
    params = {"model_params": f"{size}B", "nodes": nodes, "gpu_type": GPU, "seq_len": SEQ,
              "global_batch_tokens": GBT}
    result = {"cell": f"{size:g}B x {nodes}", "best_tps": best}
    with held_in_prior(db), TestClient(create_app(db, Settings(database_url=None))) as api:
        ranked = api.get("/api/v1/recommend", params={**params, "k": LIMIT}).json()["candidates"]
        result["recommend_list"] = dict(zip(("runs", "ooms", "hit"),
                                            walk([_key(c["config"]) for c in ranked], by_cfg, best)))
        used, ooms, wasted, hit = 0, 0, 0, False
        while used < LIMIT and not hit:
            body = api.get("/api/v1/suggest", params={**params, "n": 1}).json()
            if not body.get("suggestions"):
                break
            cfg = body["suggestions"][0]["config"]
            used += 1
            rows = by_cfg.get(_key(cfg), [])
            if rows:
                posted = api.post("/api/v1/runs", json={"runs": [_strip(r, used) for r in rows]})
                assert posted.status_code in (200, 201), posted.text
                ok = [r["tokens_per_sec_per_gpu"] for r in rows if r["status"] == "success"]
                hit = bool(ok) and max(ok) >= (1 - WITHIN) * best
                ooms += int(not ok and any(r["status"] == "oom" for r in rows))
            else:
                wasted += 1
                run = {"run_key": f"replay:notrun:{size}:{nodes}:{used}", "source": "replay",
                       "model_params": int(size * 1e9), "nodes": nodes, "gpus_per_node": 8, "gpu_type": GPU,
                       "seq_len": SEQ, "framework": "nanotron", "precision": "bf16", "status": "failed",
                       "error_message": "replay: the sweep has no run of this configuration",
                       **{k: cfg[k] for k in ("dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size",
                                              "grad_accum_steps", "recompute")}}
                posted = api.post("/api/v1/runs", json=run)
                assert posted.status_code in (200, 201), posted.text
        result["suggest"] = {"runs": used, "ooms": ooms, "not_run": wasted, "hit": hit}
    db.dispose()
    rng = random.Random(f"{size}-{nodes}")
    shuffles = []
    for _ in range(20):
        order = list(by_cfg)
        rng.shuffle(order)
        shuffles.append(walk(order, by_cfg, best))
    result["random"] = {"runs": statistics.median(s[0] for s in shuffles),
                        "ooms": statistics.median(s[1] for s in shuffles),
                        "hit_rate": sum(s[2] for s in shuffles) / len(shuffles), "configs": len(by_cfg)}
    return result


def summarise(cells: list[dict]) -> dict:
    s = [c["suggest"]["runs"] if c["suggest"]["hit"] else LIMIT for c in cells]
    return {"median_runs": statistics.median(s), "max_runs": max(s),
            "cells_hit": sum(c["suggest"]["hit"] for c in cells),
            "suggest_ooms": sum(c["suggest"]["ooms"] for c in cells),
            "random_ooms": sum(c["random"]["ooms"] for c in cells),
            "random_median_runs": statistics.median(c["random"]["runs"] for c in cells),
            "recommend_median_runs": statistics.median(c["recommend_list"]["runs"] if c["recommend_list"]["hit"]
                                                       else LIMIT for c in cells)}


def print_table(cells: list[dict], summary: dict, commit: str) -> None:
    print(f"commit {commit}; data {data_dir() / 'nanotron' / 'bench_calibration.csv'}; limit {LIMIT} runs\n")
    print("| cell | configs | /suggest runs | hit | OOMs | not in sweep | random (median of 20) | random OOMs "
          "| recommend list | its OOMs |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for c in cells:
        sg, rd, rl = c["suggest"], c["random"], c["recommend_list"]
        print(f"| {c['cell']} | {rd['configs']} | {sg['runs']} | {'yes' if sg['hit'] else 'no'} | {sg['ooms']} "
              f"| {sg['not_run']} | {rd['runs']:g} | {rd['ooms']:g} | {rl['runs']}{'' if rl['hit'] else ' (no hit)'} "
              f"| {rl['ooms']} |")
    s = summary
    print(f"\nruns to within 5 % of the cell's best (a miss counts {LIMIT}): median {s['median_runs']:g} "
          f"(target <= 5), max {s['max_runs']} (target <= 15); cells hit {s['cells_hit']} of {len(cells)}")
    print(f"baselines: random order median {s['random_median_runs']:g}, recommender's list median "
          f"{s['recommend_median_runs']:g}")
    print(f"OOMs: /suggest {s['suggest_ooms']} vs random order {s['random_ooms']:g} (target: fewer)")


def main(argv: list[str] | None = None) -> int:
    return main_over_cells(argv, __doc__ or "", run_cell, summarise, print_table)


if __name__ == "__main__":
    sys.exit(main())
