"""`scalebook runs --status running|lost` and `scalebook run ID` with its series as sparklines, read at 80
columns without a TTY (issue 28), against a live API on both backends."""

from __future__ import annotations

import httpx
from test_live_runs import OPEN, backdate, series
from typer.testing import CliRunner

from service.cli import app, render

runner = CliRunner()
NARROW = {"COLUMNS": "80"}


def test_sparkline_buckets_and_scales():
    assert render.sparkline([1, 2, 3, 4, 5, 6, 7, 8], 8) == "▁▂▃▄▅▆▇█"
    assert render.sparkline([1, 1, 8, 8], 2) == "▁█"  # two buckets, each at its mean
    assert render.sparkline([5, 5, 5], 10) == "▄▄▄"  # flat: the middle, never wider than the series
    assert render.sparkline([1, None, 3], 3) == "▁ █"
    assert render.sparkline([], 5) == "" and render.sparkline([None], 5) == ""
    assert len(render.sparkline(list(range(1000)), 57)) == 57


def test_runs_status_running_and_lost_and_run_with_sparklines(live_api, database):
    with httpx.Client(base_url=live_api, timeout=60) as client:
        run_id = client.post("/api/v1/runs", json=OPEN).json()["id"]
        client.post("/api/v1/runs/live-1/steps", json={"steps": series(300, slow={150: 3.0})})
        client.post("/api/v1/runs", json={**OPEN, "run_key": "live-2"})
    backdate(database, "live-2", 3600)

    running = runner.invoke(app, ["runs", "--status", "running"], env=NARROW)
    assert running.exit_code == 0, running.output
    assert "1 of 1 run(s)" in running.output and "running" in running.output and "lost" not in running.output
    lost = runner.invoke(app, ["runs", "--status", "lost"], env=NARROW)
    assert lost.exit_code == 0 and "lost" in lost.output and f"{run_id + 1}" in lost.output

    shown = runner.invoke(app, ["run", str(run_id)], env=NARROW)
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert max(len(line) for line in lines) <= 80, shown.output
    assert "status running, last heard from" in shown.output
    assert "300 steps (30 warm-up)" in shown.output and "stragglers: 150" in shown.output
    spark = {line.split()[0]: line for line in lines if any(c in line for c in render.SPARK_BARS)}
    assert set(spark) == {"tok/s/GPU", "step", "loss", "peak"}
    assert all(len(line) == 80 for line in spark.values()), spark  # the series fills the 80 columns
    assert spark["loss"].rstrip().endswith("7.01–10.00") and "▁" in spark["loss"] and "█" in spark["loss"]

    lost_run = runner.invoke(app, ["run", str(run_id + 1)], env=NARROW)
    assert "status lost" in lost_run.output and "no steps received yet" in lost_run.output
    as_json = runner.invoke(app, ["run", str(run_id), "--json"])
    assert as_json.exit_code == 0 and '"summary"' in as_json.output
    missing = runner.invoke(app, ["run", "999999"], env=NARROW)
    assert missing.exit_code == 1 and "no run with id 999999" in missing.output
