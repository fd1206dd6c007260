"""Live runs on both backends (DESIGN §9, issue 28): open a run as `running`, heartbeat it, finish it once;
a running run without a heartbeat for lost_after_s reads `lost` in GET /runs, its filter and SQL, derived
when read (the heartbeat is moved into the past with outside SQL: no sleeping, nothing of ours marks it);
analytics leave open runs out."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import sqlalchemy as sa
from test_api_runs import assert_error_shape, run

from core.lifecycle import DEFAULT_LOST_AFTER_S, read_status

OPEN = run(run_key="live-1", status="running", tokens_per_sec_per_gpu=None)


def backdate(database, run_key: str, seconds: float) -> None:
    """Move a run's last heartbeat `seconds` into the past, as a silent job would leave it."""
    moment = datetime.now(UTC).replace(tzinfo=None) - timedelta(seconds=seconds)
    with database.engine.begin() as conn:
        conn.execute(sa.text("UPDATE runs SET last_heartbeat_at = :t WHERE run_key = :k"), {"t": moment, "k": run_key})


def stored_status(database, run_key: str) -> str:
    with database.engine.connect() as conn:
        return conn.execute(sa.text("SELECT status FROM runs WHERE run_key = :k"), {"k": run_key}).scalar_one()


def statuses(client, **params) -> list[str]:
    return [r["status"] for r in client.get("/api/v1/runs", params=params).json()["runs"]]


def test_read_status_rule():
    now = datetime(2026, 11, 26, 12, 0, 0)
    assert read_status("running", now - timedelta(seconds=299), now, 300) == "running"
    assert read_status("running", now - timedelta(seconds=301), now, 300) == "lost"
    assert read_status("running", None, now, 300) == "lost"
    assert read_status("success", now - timedelta(days=9), now, 300) == "success"
    with pytest.raises(ValueError):
        read_status("running", now, now, 0)


def test_open_heartbeat_lost_and_back(client, database):
    opened = client.post("/api/v1/runs", json=OPEN)
    assert opened.status_code == 201, opened.text
    body = opened.json()
    assert body["status"] == "running" and body["last_heartbeat_at"] is not None
    assert body["tokens_per_sec_per_gpu"] is None and body["world_size"] == 16
    # the same opening again (a retry) is the stored run
    again = client.post("/api/v1/runs", json=OPEN)
    assert again.status_code == 200 and again.json()["id"] == body["id"]
    assert statuses(client, status="running") == ["running"] and statuses(client, status="lost") == []

    backdate(database, "live-1", DEFAULT_LOST_AFTER_S + 5)
    assert client.get(f"/api/v1/runs/{body['id']}").json()["status"] == "lost"
    assert statuses(client, status="lost") == ["lost"] and statuses(client, status="running") == []
    assert statuses(client) == ["lost"]
    assert stored_status(database, "live-1") == "running"  # derived when read, never marked
    sql = client.post("/api/v1/sql", json={"query": "SELECT status, count(*) AS n FROM runs GROUP BY status"})
    assert sql.status_code == 200, sql.text
    assert sql.json()["rows"] == [["lost", 1]]
    aliased = client.post("/api/v1/sql", json={"query": "SELECT r.status FROM runs r WHERE r.status = 'lost'"})
    assert aliased.json()["rows"] == [["lost"]], aliased.text
    star = client.post("/api/v1/sql", json={"query": "SELECT * FROM runs"}).json()
    assert star["rows"][0][star["columns"].index("status")] == "lost"
    assert client.post("/api/v1/sql", json={"query": "SELECT nodes FROM runs"}).json()["rows"] == [[2]]

    beat = client.post("/api/v1/runs/live-1/heartbeat", json={})
    assert beat.status_code == 200, beat.text
    assert beat.json()["status"] == "running" and beat.json()["lost_after_s"] == DEFAULT_LOST_AFTER_S
    assert statuses(client, status="running") == ["running"]
    sql = client.post("/api/v1/sql", json={"query": "SELECT status FROM runs"})
    assert sql.json()["rows"] == [["running"]]


def test_lost_after_s_is_the_setting(database):
    from fastapi.testclient import TestClient

    from service.api import create_app
    from service.settings import Settings

    with TestClient(create_app(database, Settings(database_url=None, lost_after_s=30))) as client:
        client.post("/api/v1/runs", json=OPEN)
        backdate(database, "live-1", 20)
        assert statuses(client) == ["running"]
        backdate(database, "live-1", 40)
        assert statuses(client) == ["lost"]
        assert client.post("/api/v1/sql", json={"query": "SELECT status FROM runs"}).json()["rows"] == [["lost"]]


def test_finish_once_with_status_and_figures_only(client, database):
    opened = client.post("/api/v1/runs", json=OPEN).json()
    backdate(database, "live-1", 3600)  # even a lost run may still finish
    finish = {"run_key": "live-1", "status": "success", "tokens_per_sec_per_gpu": 4000.0, "step_time_s": 2.1}
    done = client.post("/api/v1/runs", json=finish)
    assert done.status_code == 200, done.text
    body = done.json()
    assert body["id"] == opened["id"] and body["status"] == "success"
    assert body["model_name"] == "llama3-8b" and body["dp"] == 8 and body["mfu_derived"] > 0  # derived again
    assert body["extra"]["derived_fields"] == ["dp", "global_batch_tokens", "world_size"]
    assert body["ingested_at"] == opened["ingested_at"]
    # the finish again (a retry, the spool's replay): the stored run
    assert client.post("/api/v1/runs", json=finish).json() == body
    # a finished run is immutable
    changed = client.post("/api/v1/runs", json={**finish, "tokens_per_sec_per_gpu": 4100.0})
    assert changed.status_code == 409
    assert_error_shape(changed.json(), "conflict")
    beat = client.post("/api/v1/runs/live-1/heartbeat", json={})
    assert beat.status_code == 409 and "finished" in beat.json()["error"]["message"]
    assert client.post("/api/v1/runs", json={**OPEN}).status_code == 409  # no re-opening
    assert client.get("/api/v1/runs").json()["total"] == 1


def test_finish_as_failed_and_bad_finishes(client):
    client.post("/api/v1/runs", json=OPEN)
    bad = client.post("/api/v1/runs", json={"run_key": "live-1", "status": "success", "tp": 3})
    assert bad.status_code == 422 and "live-1" in bad.json()["error"]["message"]
    reopened = client.post("/api/v1/runs", json={**OPEN, "micro_batch_size": 2})
    assert reopened.status_code == 409  # an open run's config is what it was opened with
    failed = client.post("/api/v1/runs", json={"run_key": "live-1", "status": "oom", "error_class": "oom_gpu",
                                               "error_message": "torch.OutOfMemoryError: CUDA out of memory"})
    assert failed.status_code == 200 and failed.json()["status"] == "oom"
    assert failed.json()["error_class"] == "oom_gpu"


def test_heartbeat_errors_and_lost_is_never_reported(client):
    missing = client.post("/api/v1/runs/nope/heartbeat", json={})
    assert missing.status_code == 404
    assert_error_shape(missing.json(), "not_found")
    assert client.post("/api/v1/runs", json=run(run_key="x", status="lost")).status_code == 422
    assert client.post("/api/v1/runs", json=run(run_key="done")).status_code == 201
    assert client.post("/api/v1/runs/done/heartbeat", json={}).status_code == 409  # stored finished
    client.post("/api/v1/runs", json={**OPEN, "run_key": "a/b"})
    assert client.post("/api/v1/runs/a/b/heartbeat", json={}).status_code == 200  # keys with a slash
    assert client.post("/api/v1/runs/a/b/heartbeat", json={"junk": 1}).status_code == 422


def test_analytics_leave_open_runs_out(client, database):
    client.post("/api/v1/runs", json=OPEN)
    client.post("/api/v1/runs", json={**OPEN, "run_key": "live-2"})
    backdate(database, "live-2", 3600)  # one running, one lost
    assert client.get("/api/v1/heatmap").json()["cells"] == []
    recommend = client.get("/api/v1/recommend", params={"model_params": "8B", "nodes": 2, "gpu_type": "H100",
                                                       "seq_len": 8192})
    assert recommend.status_code == 200, recommend.text
    assert recommend.json().get("measured_on_target") in ([], None)
    client.post("/api/v1/runs", json={"run_key": "live-1", "status": "success", "tokens_per_sec_per_gpu": 4000.0})
    cells = client.get("/api/v1/heatmap").json()["cells"]
    assert [(c["n_success"], c["n_oom"], c["n_failed"]) for c in cells] == [(1, 0, 0)]  # the lost run is no failure


# ------------------------------------------------------------------------------------------ steps
def series(n: int, start: int = 0, tps: float = 4000.0, slow: dict[int, float] | None = None) -> list[dict]:
    """n steps from `start`: the first two a slow warm-up, then a steady `tps` (±1 %), `slow` {step: factor}."""
    out = []
    for i in range(start, start + n):
        factor = 0.5 if i < 2 else 1.0 + 0.01 * ((i % 3) - 1)
        factor /= (slow or {}).get(i, 1.0)
        out.append({"step": i, "tokens_per_sec_per_gpu": tps * factor, "step_time_s": 2.0 / factor,
                    "loss": 10.0 - 0.01 * i, "peak_memory_gib": 50.0 + (i == 5)})
    return out


def test_steps_stored_once_and_headline_derived_from_steady_state(client):
    from core.steps import WARMUP_RULE, headline

    opened = client.post("/api/v1/runs", json=OPEN).json()
    first = client.post("/api/v1/runs/live-1/steps", json={"steps": series(20)})
    assert first.status_code == 200, first.text
    assert first.json() == {"run_id": opened["id"], "received": 20, "created": 20, "thinned": 0}
    again = client.post("/api/v1/runs/live-1/steps", json={"steps": series(20)})  # a replay
    assert again.json()["created"] == 0
    beat = client.post("/api/v1/runs/live-1/heartbeat", json={"step": 20, "loss": 9.7, "step_time_s": 2.0,
                                                              "tokens_per_sec_per_gpu": 4000.0})
    assert beat.status_code == 200, beat.text
    got = client.get(f"/api/v1/runs/{opened['id']}/steps").json()
    assert [s["step"] for s in got["steps"]] == list(range(21))
    summary = got["summary"]
    assert summary["warmup_steps"] == 3 and summary["steady_steps"] == 18 and summary["rule"] == WARMUP_RULE
    assert summary["stragglers"] == [] and 0 < summary["jitter_step_time"] < 0.02
    live = client.get("/api/v1/live").json()
    assert [(r["run"]["run_key"], r["last_step"]["step"]) for r in live["runs"]] == [("live-1", 20)]

    done = client.post("/api/v1/runs", json={"run_key": "live-1", "status": "success"})
    assert done.status_code == 200, done.text
    body = done.json()
    stored = [s for s in got["steps"]]
    expected = headline(stored)
    assert body["tokens_per_sec_per_gpu"] == pytest.approx(expected["tokens_per_sec_per_gpu"])
    assert body["tokens_per_sec_per_gpu"] == pytest.approx(4000.0)  # the warm-up's 2,000 tokens/s left out
    assert body["peak_memory_gib"] == 51.0 and body["step_time_s"] == pytest.approx(2.0)
    assert {"tokens_per_sec_per_gpu", "step_time_s", "peak_memory_gib"} <= set(body["extra"]["derived_fields"])
    assert body["extra"]["headline_from_steps"]["steps"] == 21 and body["mfu_derived"] > 0
    assert client.post("/api/v1/runs", json={"run_key": "live-1", "status": "success"}).json() == body  # replay
    replay = client.post("/api/v1/runs/live-1/steps", json={"steps": series(20)})
    assert replay.status_code == 200 and replay.json()["created"] == 0  # the spool's replay of old steps
    late = client.post("/api/v1/runs/live-1/steps", json={"steps": series(1, start=50)})
    assert late.status_code == 409
    assert client.get("/api/v1/live").json()["runs"] == []


def test_reported_headline_wins_and_stragglers(client):
    client.post("/api/v1/runs", json=OPEN)
    client.post("/api/v1/runs/live-1/steps", json={"steps": series(30, slow={12: 3.0, 25: 2.5})})
    run_id = client.get("/api/v1/runs").json()["runs"][0]["id"]
    assert client.get(f"/api/v1/runs/{run_id}/steps").json()["summary"]["stragglers"] == [12, 25]
    done = client.post("/api/v1/runs", json={"run_key": "live-1", "status": "success",
                                             "tokens_per_sec_per_gpu": 3900.0}).json()
    assert done["tokens_per_sec_per_gpu"] == 3900.0  # as reported
    assert "tokens_per_sec_per_gpu" not in done["extra"]["derived_fields"]


def test_steps_bounded_per_run(database):
    from fastapi.testclient import TestClient

    from service.api import create_app
    from service.settings import Settings

    with TestClient(create_app(database, Settings(database_url=None, max_steps_per_run=50))) as client:
        client.post("/api/v1/runs", json=OPEN)
        stored = client.post("/api/v1/runs/live-1/steps", json={"steps": series(80)}).json()
        assert stored["created"] == 80 and stored["thinned"] > 0
        run_id = stored["run_id"]
        steps = [s["step"] for s in client.get(f"/api/v1/runs/{run_id}/steps").json()["steps"]]
        assert len(steps) <= 50 and steps[0] == 0 and steps[-1] == 79  # the whole span, evenly thinner


def test_steps_errors(client):
    assert client.post("/api/v1/runs/nope/steps", json={"steps": series(2)}).status_code == 404
    client.post("/api/v1/runs", json=OPEN)
    assert client.post("/api/v1/runs/live-1/steps", json={"steps": [{"loss": 1.0}]}).status_code == 422
    assert client.post("/api/v1/runs/live-1/heartbeat", json={"loss": 1.0}).status_code == 422  # figures need a step
    assert client.post("/api/v1/runs/live-1/steps", json={"steps": [{"step": 1, "mfu": 2.0}]}).status_code == 422


def test_deleting_a_run_deletes_its_steps(client, database):
    run_id = client.post("/api/v1/runs", json=OPEN).json()["id"]
    client.post("/api/v1/runs/live-1/steps", json={"steps": series(5)})
    assert client.delete(f"/api/v1/runs/{run_id}").status_code == 200
    assert client.get(f"/api/v1/runs/{run_id}/steps").status_code == 404
    with database.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM run_steps")).scalar() == 0


def test_an_exported_step_headline_imports_as_derived(client):
    """A run whose headline came from its steps, exported and imported elsewhere (no steps there), keeps
    the figures, still named derived (ingest.parsers.runs.as_reported)."""
    from ingest.parsers.runs import as_reported

    client.post("/api/v1/runs", json=OPEN)
    client.post("/api/v1/runs/live-1/steps", json={"steps": series(20)})
    done = client.post("/api/v1/runs", json={"run_key": "live-1", "status": "success"}).json()
    record = as_reported({k: v for k, v in done.items() if k in OPEN or k in ("extra", "step_time_s",
                                                                                "tokens_per_sec_per_gpu",
                                                                                "peak_memory_gib")})
    assert record["tokens_per_sec_per_gpu"] == done["tokens_per_sec_per_gpu"]
    assert set(record["extra"]["derived_fields"]) == {"tokens_per_sec_per_gpu", "step_time_s", "peak_memory_gib"}
    again = client.post("/api/v1/runs", json={**record, "run_key": "elsewhere"}).json()
    assert again["tokens_per_sec_per_gpu"] == done["tokens_per_sec_per_gpu"]
    assert "tokens_per_sec_per_gpu" in again["extra"]["derived_fields"]
