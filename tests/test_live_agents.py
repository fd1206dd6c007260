"""The training side of live runs (issue 28, DESIGN §9), against a real API on both backends: a LiveRun
opens, heartbeats, sends steps and finishes; offline, all of it spools and `sync_live` (`scalebook sync`)
replays it exactly once; the torch recorder and the integrations do it by themselves; a real tiny
training job SIGKILLed mid-run reads `lost` once lost_after_s has passed (a small setting: no long sleep)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid

import httpx
import pytest
from conftest import REPO, LiveServer

from ingest import Client
from ingest.live import LiveRun, live_spool, pending_ops, sync_live

RECORD = {"model_name": "llama3-8b", "model_params": 8_030_261_248, "num_layers": 32, "hidden_size": 4096,
          "seq_len": 8192, "gpu_type": "H100", "gpus_per_node": 8, "nodes": 1, "tp": 1, "pp": 1, "cp": 1,
          "micro_batch_size": 1, "grad_accum_steps": 1, "precision": "bf16"}


def wait_for(check, what: str, timeout_s: float = 60.0):
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found:
            return found
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def get_run(url: str, key: str) -> dict | None:
    runs = httpx.get(f"{url}/api/v1/runs", params={"run_key": key}, timeout=30).json()["runs"]
    return runs[0] if runs else None


def get_steps(url: str, run_id: int) -> list[dict]:
    return httpx.get(f"{url}/api/v1/runs/{run_id}/steps", timeout=30).json()["steps"]


def test_live_run_opens_heartbeats_steps_and_finishes(live_api, tmp_path):
    key = uuid.uuid4().hex
    live = LiveRun({**RECORD, "run_key": key}, client=Client(spool_dir=tmp_path, deadline_s=10),
                   heartbeat_s=0.2, step_batch=4).start()
    opened = wait_for(lambda: get_run(live_api, key), "the open")
    assert opened["status"] == "running"
    for i in range(10):
        live.step(i, step_time_s=2.0 if i > 1 else 4.0, tokens_per_sec_per_gpu=4000.0 if i > 1 else 2000.0,
                  loss=3.0 - 0.1 * i)
    wait_for(lambda: len(get_steps(live_api, opened["id"])) == 10, "the steps")
    assert live.finish({**RECORD, "status": "success"}) == "stored"
    run = get_run(live_api, key)
    assert run["status"] == "success" and run["id"] == opened["id"]
    assert run["tokens_per_sec_per_gpu"] == 4000.0 and "tokens_per_sec_per_gpu" in run["extra"]["derived_fields"]
    assert pending_ops(live.client) == 0 and not live_spool(live.client).exists()


def test_offline_spools_everything_and_sync_replays_it_exactly_once(database, settings, tmp_path):
    from service.api import create_app

    key = uuid.uuid4().hex
    down = Client(url="http://127.0.0.1:9", spool_dir=tmp_path, deadline_s=0.3, backoff_base_s=0.01)
    live = LiveRun({**RECORD, "run_key": key}, client=down, heartbeat_s=0.1, step_batch=5).start()
    for i in range(12):
        live.step(i, step_time_s=1.0, tokens_per_sec_per_gpu=1000.0)
    assert live.finish({**RECORD, "status": "success", "tokens_per_sec_per_gpu": 1000.0}) == "spooled"
    ops = pending_ops(down)
    assert ops >= 2 and pending_ops(down, key) == ops  # the open, step batches, the finish
    with LiveServer(create_app(database, settings)) as server:
        up = Client(url=server.url, spool_dir=tmp_path, deadline_s=10)
        first = sync_live(up)
        assert (first.replayed, first.rejected, first.remaining, first.error) == (ops, 0, 0, None)
        run = get_run(server.url, key)
        assert run["status"] == "success" and run["tokens_per_sec_per_gpu"] == 1000.0
        assert [s["step"] for s in get_steps(server.url, run["id"])] == list(range(12))
        # an outage that ended mid-sync: the same ops again store nothing twice
        for line in ["open", "finish"]:
            body = {**RECORD, "run_key": key, "status": "running" if line == "open" else "success",
                    "tokens_per_sec_per_gpu": None if line == "open" else 1000.0}
            up._append(live_spool(up), [__import__("json").dumps({"op": line, "run_key": key,
                                                                   "body": {k: v for k, v in body.items() if v}})])
        again = sync_live(up)
        # the finish answers the stored run; the open, 409 (the key is taken: finished), is no error either
        assert (again.replayed, again.rejected, again.remaining) == (2, 0, 0)
        assert httpx.get(f"{server.url}/api/v1/runs", timeout=30).json()["total"] == 1
        assert len(get_steps(server.url, run["id"])) == 12


def test_a_run_opened_by_a_lease_is_carried_on(live_api, tmp_path):
    """`scalebook agent` opens the run (its sweep lease) and hands the job its key: the job's own opening,
    with other content, is answered 409 and the job carries on — steps, then the finish."""
    key = uuid.uuid4().hex
    httpx.post(f"{live_api}/api/v1/runs", json={**RECORD, "run_key": key, "status": "running", "name": "leased"},
               timeout=30).raise_for_status()
    client = Client(spool_dir=tmp_path, deadline_s=10)
    live = LiveRun({**RECORD, "run_key": key, "name": "the job's"}, client=client, heartbeat_s=0.2).start()
    for i in range(5):
        live.step(i, step_time_s=1.0)
    assert live.finish({**RECORD, "status": "success", "tokens_per_sec_per_gpu": 900.0}) == "stored"
    run = get_run(live_api, key)
    assert (run["status"], run["name"], run["tokens_per_sec_per_gpu"]) == ("success", "leased", 900.0)
    assert len(get_steps(live_api, run["id"])) == 5
    assert not client.rejects_path.exists() and pending_ops(client) == 0


def test_scalebook_sync_replays_the_live_spool(live_api, tmp_path):
    from typer.testing import CliRunner

    from service.cli import app

    key = uuid.uuid4().hex
    down = Client(url="http://127.0.0.1:9", spool_dir=tmp_path, deadline_s=0.2, backoff_base_s=0.01)
    live = LiveRun({**RECORD, "run_key": key}, client=down, heartbeat_s=0.1).start()
    live.step(0, loss=1.0)
    live.finish({**RECORD, "status": "oom", "error_class": "oom_gpu"})
    result = CliRunner().invoke(app, ["sync", "--spool-dir", str(tmp_path), "--deadline", "10"])
    assert result.exit_code == 0, result.output
    assert "live-run ops replayed" in result.output
    run = get_run(live_api, key)
    assert (run["status"], run["error_class"]) == ("oom", "oom_gpu")


@pytest.mark.integration
def test_the_torch_recorder_keeps_its_run_live(live_api, tmp_path, monkeypatch):
    """examples/train_tiny.py (a real CPU training loop under ingest.Recorder): the run is live while it
    trains and ends as success with its series."""
    pytest.importorskip("torch")
    key = uuid.uuid4().hex
    env = {**os.environ, "PYTHONPATH": str(REPO), "SCALEBOOK_SPOOL_DIR": str(tmp_path), "SCALEBOOK_HEARTBEAT_S": "0.2"}
    out = subprocess.run([sys.executable, str(REPO / "examples" / "train_tiny.py"), "--steps", "8", "--run-key", key],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    run = get_run(live_api, key)
    assert run["status"] == "success" and run["last_heartbeat_at"] is not None  # it was opened live
    steps = get_steps(live_api, run["id"])
    assert [s["step"] for s in steps] == list(range(1, 9))
    assert all(s["loss"] > 0 and s["step_time_s"] > 0 and s["tokens_per_sec_per_gpu"] > 0 for s in steps)
    assert run["tokens_per_sec_per_gpu"] > 0  # the recorder's own (reported), not derived
    assert "tokens_per_sec_per_gpu" not in (run["extra"].get("derived_fields") or [])


@pytest.mark.integration
@pytest.mark.parametrize("framework", ["accelerate"])
def test_a_sigkilled_training_job_reads_lost_after_lost_after_s(framework, database, tmp_path):
    """A tiny Llama under Accelerate with the scalebook tracker: running with steps while it trains;
    SIGKILLed (nothing of it can report), it reads `lost` once lost_after_s (1.5 s here) has passed."""
    pytest.importorskip("accelerate")
    from service.api import create_app
    from service.settings import Settings

    lost_after_s = 1.5
    with LiveServer(create_app(database, Settings(database_url=None, lost_after_s=lost_after_s))) as server:
        key = uuid.uuid4().hex
        marker = tmp_path / "marker"
        env = {**os.environ, "PYTHONPATH": str(REPO), "SCALEBOOK_API_URL": server.url,
               "SCALEBOOK_SPOOL_DIR": str(tmp_path), "SCALEBOOK_HEARTBEAT_S": "0.2"}
        env.pop("SCALEBOOK_TOKEN", None)
        cmd = [sys.executable, str(REPO / "tests" / "integration_jobs.py"), framework, key, "--fail", "hang",
               "--marker", str(marker)]
        proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            wait_for(marker.exists, "the job's 4th forward", timeout_s=240)
            run = wait_for(lambda: get_run(server.url, key), "the open")
            assert run["status"] == "running"  # opened at the start: the config known then
            wait_for(lambda: get_steps(server.url, run["id"]), "the first steps")
            live = httpx.get(f"{server.url}/api/v1/live", timeout=30).json()["runs"]
            assert [(r["run"]["run_key"], r["run"]["status"]) for r in live] == [(key, "running")]
            assert live[0]["last_step"]["step"] >= 1
            proc.send_signal(signal.SIGKILL)
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        killed_at = time.monotonic()
        assert get_run(server.url, key)["status"] in ("running", "lost")
        lost = wait_for(lambda: (r := get_run(server.url, key)) and r["status"] == "lost" and r, "lost",
                        timeout_s=lost_after_s + 30)
        assert time.monotonic() - killed_at < lost_after_s + 30
        assert [r["status"] for r in httpx.get(f"{server.url}/api/v1/runs", params={"status": "lost"},
                                               timeout=30).json()["runs"]] == ["lost"]
        assert lost["tokens_per_sec_per_gpu"] is None  # never finished: no result
