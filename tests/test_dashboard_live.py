"""The dashboard's live runs (issue 28): the Live page lists the open runs (running and lost) with their
last step, the run page plots a run's series with jitter and stragglers, the Failures page counts lost
runs; the pure pieces of dashboard/logic/live.py."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import httpx
from test_dashboard_pages import DUCKDB, app, frame_with, fresh_cache, texts  # noqa: F401 - fixture
from test_live_runs import OPEN, backdate, series

from dashboard.logic import live as lv


def open_two(url: str, database) -> int:
    """One running run with 20 steps (a straggler at step 12) and one lost run; returns the first's id."""
    with httpx.Client(base_url=url, timeout=60) as client:
        run_id = client.post("/api/v1/runs", json=OPEN).json()["id"]
        client.post("/api/v1/runs/live-1/steps", json={"steps": series(20, slow={12: 3.0})})
        client.post("/api/v1/runs", json={**OPEN, "run_key": "live-2", "nodes": 4})
    backdate(database, "live-2", 3600)
    return run_id


@DUCKDB
def test_live_page_lists_running_and_lost_runs_with_their_last_step(live_api, database):
    run_id = open_two(live_api, database)
    at = app("app_pages/live.py")
    assert not at.error, texts(at)
    table = frame_with(at, "status", "heard_s_ago", "last_step")
    assert sorted(zip(table.id, table.status)) == sorted([(run_id, "running"), (run_id + 1, "lost")])
    running = table[table.status == "running"].iloc[0]
    assert running.last_step == 19 and running.heard_s_ago < 600
    assert table[table.status == "lost"].iloc[0].heard_s_ago >= 3600
    assert at.get("plotly_chart"), "the selected run's series is plotted"
    assert "Straggler steps (step time > median + 3.5 robust z): 12." in texts(at)
    at.radio(key="live_which").set_value("lost").run()
    assert list(frame_with(at, "status", "heard_s_ago").status) == ["lost"]


@DUCKDB
def test_run_page_plots_the_series_and_failures_count_lost(live_api, database):
    run_id = open_two(live_api, database)
    at = app("app_pages/runs.py")
    at.number_input(key="runs_detail_id").set_value(run_id).run()
    assert not at.exception and not at.error
    chart = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert [t["y"][5] for t in chart["data"][:1]] == [series(20)[5]["tokens_per_sec_per_gpu"]]
    assert any("warm-up" in line for line in texts(at).splitlines())
    at = app("app_pages/failures.py")
    by_nodes = frame_with(at, "nodes", "runs", "lost", "failure_rate")
    assert list(zip(by_nodes.nodes, by_nodes.lost, by_nodes.failure_rate)) == [(4, 1, 1.0)]  # the running run: none


def test_live_table_and_summary_text():
    now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    body = {"runs": [{"run": {"id": 3, "status": "lost", "name": "x", "tp": 2, "pp": 1, "dp": 4,
                              "last_heartbeat_at": (now - timedelta(seconds=400)).isoformat()},
                      "last_step": {"step": 7, "loss": 2.5, "tokens_per_sec_per_gpu": 1000.0}},
                     {"run": {"id": 4, "status": "running", "last_heartbeat_at": now.isoformat()}, "last_step": None}],
            "lost_after_s": 300}
    table = lv.live_table(body, now=now)
    assert list(table.heard_s_ago) == [400, 0] and list(table.last_step.fillna(-1)) == [7, -1]
    summary = {"steps": 20, "warmup_steps": 2, "steady_steps": 18, "rule": "r", "jitter_step_time": 0.012,
               "stragglers": [], "headline": {"tokens_per_sec_per_gpu": 4000.0}}
    lines = lv.summary_text(summary)
    assert lines[0].startswith("20 steps: the first 2 are warm-up") and "1.2%" in lines[2]
    assert lines[-1] == "No straggler steps."
    fig = lv.series_figure(series(20), summary)
    assert len(fig.data) == 3 and fig.layout.shapes  # three panels (loss too), the warm-up shaded

