#!/usr/bin/env python
"""The Sweeps page's screenshot (dashboard/screenshots/sweeps.png): a real grid sweep run by the agent.

A fresh DuckDB holds the Ultra-Scale calibration sweep except the 1.34B × 1-node cell (pre-fix pipeline
runs retired, as bench/sweep_replay.py); a grid sweep over that cell (TP 1, 2; ZeRO 0, 1; micro-batch
1, 2, 4) is created and run by `ingest.agent.Agent`, each job looking its configuration up in the cell's
real rows (bench/sweep_replay_job.py); then the dashboard's Sweeps page is opened in headless Chromium
and saved.

Usage: .venv/bin/python bench/sweep_shots.py [--out dashboard/screenshots] [--width 1280]
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

from bench import browser as bb  # noqa: E402
from bench.recommend_loo import GBT, GPU, RETIRE, SEQ, cell_of, load, retired  # noqa: E402
from bench.sweep_replay import JOB, _Server, results_table  # noqa: E402
from ingest.agent import Agent  # noqa: E402
from service import retire, store  # noqa: E402
from service.api import create_app  # noqa: E402
from service.db import Database  # noqa: E402
from service.settings import Settings  # noqa: E402

CELL = (1.34, 1)
NAME = "llama-1b-1node"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "dashboard" / "screenshots")
    parser.add_argument("--width", type=int, default=1280)
    args = parser.parse_args()
    records = load()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        os.environ["SCALEBOOK_SPOOL_DIR"] = str(work / "spool")
        truth = [r for r in records if cell_of(r) == CELL and not retired(r)]
        table = work / "results.json"
        table.write_text(json.dumps(results_table(truth)))
        db = Database(f"duckdb:///{work / 'shots.duckdb'}")
        db.upgrade()
        db.prepare()
        with db.session(write=True) as s:
            store.store_runs(s, [r for r in records if cell_of(r) != CELL])
        with db.session(write=True) as s:
            retire.retire(s, None, RETIRE, "before nanotron's pipeline-engine fix")
        port, dash_port = bb.free_port(), bb.free_port()
        url = f"http://127.0.0.1:{port}"
        with _Server(create_app(db, Settings(database_url=None)), port):
            httpx.post(f"{url}/api/v1/sweeps", timeout=120, json={
                "name": NAME, "strategy": "grid", "budget": 12,
                "target": {"model_params": "1.34B", "nodes": 1, "gpus_per_node": 8, "gpu_type": GPU, "seq_len": SEQ,
                           "global_batch_tokens": GBT, "framework": "nanotron"},
                "grid": {"tp": [1, 2], "zero_stage": [0, 1], "micro_batch_size": [1, 2, 4]}}).raise_for_status()
            Agent(NAME, [sys.executable, str(JOB), str(table)], log_dir=work / "logs", url=url, out=io.StringIO()).run()
            dash = bb.start_dashboard(url, dash_port, work / "dashboard.log")
            driver = bb.chromium(work / "profile", width=args.width, height=1500)
            try:
                driver.get(f"http://127.0.0.1:{dash_port}/sweeps?sweep={NAME}")
                bb.wait_drawn(driver, "Best so far", ".js-plotly-plot", timeout_s=300)
                time.sleep(1.5)
                args.out.mkdir(parents=True, exist_ok=True)
                driver.save_screenshot(str(args.out / "sweeps.png"))
            finally:
                driver.quit()
                bb.stop(dash)
        db.dispose()
    print(f"saved {args.out / 'sweeps.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
