#!/usr/bin/env python
"""Replay of the Ultra-Scale Playbook sweep by `scalebook agent` (issue 29): a suggest sweep per cell.

For each of the 12 cells of <data>/nanotron/bench_calibration.csv (bench/recommend_loo.py: the cells,
the retirement of pre-fix pipeline runs): a fresh DuckDB file holds the other cells' runs and a real API
serves it (uvicorn, loopback); a sweep is created for the cell's target (strategy suggest, budget
LIMIT, the default expected-improvement stop, service/sweeps.DEFAULT_MIN_EXPECTED_IMPROVEMENT) and
`ingest.agent.Agent` runs it end to end: each lease's "job" (bench/sweep_replay_job.py) looks the
configuration up in the cell's real rows (bench/suggest_replay.py's lookup: its `_key`, the best
success of the configuration, else its OOM or failure) and finishes the run with it; a configuration
the sweep never ran is finished as failed. The agent goes on until the sweep says it is done.

Per cell: runs until one is within 5 % of the cell's best tokens/s/GPU (suggest_replay.WITHIN; a miss
counts LIMIT), the runs the sweep took before it stopped and why (budget, converged: EI below the
threshold, no_candidates), the best the sweep found against the cell's best, OOMs met.

Usage: .venv/bin/python bench/sweep_replay.py [--json] [--cells N]
"""

from __future__ import annotations

import io
import json
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx  # noqa: E402
import uvicorn  # noqa: E402

from bench.probe import free_port  # noqa: E402
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
from bench.suggest_replay import LIMIT, WITHIN, _key  # noqa: E402
from ingest.agent import Agent  # noqa: E402
from service import retire, store  # noqa: E402
from service.api import create_app  # noqa: E402
from service.db import Database  # noqa: E402
from service.settings import Settings  # noqa: E402

JOB = REPO / "bench" / "sweep_replay_job.py"
_FIGURES = ("status", "tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu", "peak_memory_gib", "step_time_s",
            "error_class", "error_message")


def results_table(truth: list[dict]) -> dict:
    """{"key_fields", "results": {json(key): finish record}} of a cell's rows: per configuration
    (suggest_replay._key) its best success, else its first OOM, else its first row."""
    by_cfg: dict[tuple, list[dict]] = {}
    for r in truth:
        by_cfg.setdefault(_key(r), []).append(r)
    out = {}
    for key, rows in by_cfg.items():
        ok = [r for r in rows if r["status"] == "success" and r.get("tokens_per_sec_per_gpu")]
        pick = (max(ok, key=lambda r: r["tokens_per_sec_per_gpu"]) if ok
                else next((r for r in rows if r["status"] == "oom"), rows[0]))
        out[json.dumps(list(key))] = {k: pick[k] for k in _FIGURES if pick.get(k) is not None}
    return {"key_fields": list(KEY), "results": out}


class _Server:
    def __init__(self, app, port: int):
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> _Server:
        self.thread.start()
        while not self.server.started:
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def run_cell(cell: tuple[float, int], records: list[dict], workdir: Path) -> dict:
    size, nodes = cell
    truth = [r for r in records if cell_of(r) == cell and not retired(r)]
    best = max(r["tokens_per_sec_per_gpu"] for r in truth if r["status"] == "success")
    table = workdir / f"results_{size}_{nodes}.json"
    table.write_text(json.dumps(results_table(truth)))
    db = Database(f"duckdb:///{workdir / f'sweep_{size}_{nodes}.duckdb'}")
    db.upgrade()
    db.prepare()
    with db.session(write=True) as s:
        store.store_runs(s, [r for r in records if cell_of(r) != cell])
    with db.session(write=True) as s:
        retire.retire(s, None, RETIRE, "before nanotron's pipeline-engine fix")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    name = f"replay-{size:g}B-{nodes}n"
    started = time.monotonic()
    with held_in_prior(db), _Server(create_app(db, Settings(database_url=None)), port):
        r = httpx.post(f"{url}/api/v1/sweeps", timeout=120, json={
            "name": name, "strategy": "suggest", "budget": LIMIT,
            "target": {"model_params": f"{size}B", "nodes": nodes, "gpus_per_node": 8, "gpu_type": GPU,
                       "seq_len": SEQ, "global_batch_tokens": GBT, "framework": "nanotron"}})
        r.raise_for_status()
        said = io.StringIO()
        agent = Agent(name, [sys.executable, str(JOB), str(table)], log_dir=workdir / "logs", url=url,
                      api_wait_s=120, out=said)
        code = agent.run()
        sweep = httpx.get(f"{url}/api/v1/sweeps/{name}", timeout=120).json()
    db.dispose()
    runs = sweep["runs"]
    hit = next((i for i, r in enumerate(runs, 1)
                if r["status"] == "success" and r["tokens_per_sec_per_gpu"] >= (1 - WITHIN) * best), None)
    done = [line for line in said.getvalue().splitlines() if "sweep done" in line]
    return {"cell": f"{size:g}B x {nodes}", "best_tps": best, "agent_exit": code, "runs_to_within_5pct": hit,
            "runs": len(runs), "stopped": done[0].split("sweep done ")[-1] if done else "(no stop line)",
            "found_tps": (sweep["best"] or {}).get("tokens_per_sec_per_gpu"),
            "ooms": sweep["counts"].get("oom", 0), "not_in_sweep": sum(
                1 for r in runs if r["status"] == "failed"), "seconds": round(time.monotonic() - started, 1)}


def summarise(cells: list[dict]) -> dict:
    hits = [c["runs_to_within_5pct"] or LIMIT for c in cells]
    return {"median_runs_to_best": statistics.median(hits), "max_runs_to_best": max(hits),
            "cells_hit": sum(c["runs_to_within_5pct"] is not None for c in cells),
            "median_runs_taken": statistics.median(c["runs"] for c in cells),
            "converged": sum(c["stopped"].startswith("(converged)") for c in cells)}


def print_table(cells: list[dict], summary: dict, commit: str) -> None:
    print(f"commit {commit}; data {data_dir() / 'nanotron' / 'bench_calibration.csv'}; budget {LIMIT} runs per sweep\n")
    print("| cell | runs to within 5 % | runs taken | stopped | best found / cell best | OOMs | not in sweep |")
    print("|---|---|---|---|---|---|---|")
    for c in cells:
        found = f"{c['found_tps']:,.0f} / {c['best_tps']:,.0f}" if c["found_tps"] else f"— / {c['best_tps']:,.0f}"
        print(f"| {c['cell']} | {c['runs_to_within_5pct'] or 'miss'} | {c['runs']} | {c['stopped'].split(':')[0]} "
              f"| {found} | {c['ooms']} | {c['not_in_sweep']} |")
    s = summary
    print(f"\nruns to within 5 % of the cell's best (a miss counts {LIMIT}): median {s['median_runs_to_best']:g}, "
          f"max {s['max_runs_to_best']}; cells hit {s['cells_hit']} of {len(cells)}; runs taken before the sweep "
          f"stopped: median {s['median_runs_taken']:g}; stopped by the expected-improvement threshold: "
          f"{s['converged']} of {len(cells)}")


def main(argv: list[str] | None = None) -> int:
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as spool:  # a job's undeliverable push stays with the bench
        os.environ["SCALEBOOK_SPOOL_DIR"] = spool
        return main_over_cells(argv, __doc__ or "", run_cell, summarise, print_table)


if __name__ == "__main__":
    sys.exit(main())
