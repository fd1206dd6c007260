"""`scalebook agent` for real (issue 29): two agents in parallel driving torchrun (gloo, 2 ranks) on the
tiny torch example, a command that hangs (its process group killed, recorded as timeout), one that
crashes (classified from its captured log), the API restarted mid-sweep (the agent waits and goes on;
nothing lost or run twice), Ctrl-C (the job stopped, its lease left to expire). Real API, real
databases; the agent is ingest/agent.py as `scalebook agent` runs it."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import uvicorn

from ingest.agent import Agent, fill
from service.api import create_app

REPO = Path(__file__).resolve().parent.parent
TRAIN_TINY = REPO / "examples" / "train_tiny.py"
TINY = {"model_name": "tiny-gpt-2L64h", "num_layers": 2, "hidden_size": 64, "num_heads": 4, "vocab_size": 256,
        "nodes": 1, "gpus_per_node": 2, "seq_len": 64, "global_batch_tokens": 1024, "framework": "pytorch-ddp",
        "precision": "fp32"}
#: a job that logs nanotron's step lines (what the log importer reads) after `{0}` seconds
LOGGING_JOB = ("import sys, time; time.sleep({0}); "
               "[print(f'iteration: {{i}} / 5 | elapsed_time_per_iteration_ms: 100 | tokens_per_sec_per_gpu: 1.5K | "
               "lm_loss: 5.{{i}}', flush=True) for i in range(1, 6)]")


def _create(api: str, name: str, grid: dict, budget: int, target: dict | None = None) -> None:
    r = httpx.post(f"{api}/api/v1/sweeps", json={"name": name, "strategy": "grid", "budget": budget,
                                                 "target": target or TINY, "grid": grid}, timeout=30)
    assert r.status_code == 201, r.text


def _show(api: str, name: str) -> dict:
    return httpx.get(f"{api}/api/v1/sweeps/{name}", timeout=30).json()


def _run(api: str, run_id: int) -> dict:
    return httpx.get(f"{api}/api/v1/runs/{run_id}", timeout=30).json()


def _agent(api: str, name: str, command: list[str], tmp_path: Path, **kw) -> Agent:
    return Agent(name, command, log_dir=tmp_path / "logs", url=api, api_wait_s=kw.pop("api_wait_s", 60.0), **kw)


def test_placeholders_are_filled_and_other_braces_kept():
    lease = {"run_key": "s:1", "sweep": "s", "run": {"nodes": 2, "gpus_per_node": 8, "seq_len": 4096},
             "config": {"dp": 4, "tp": 4, "pp": 1, "cp": 1, "ep": 1, "zero_stage": 1, "micro_batch_size": 2,
                        "grad_accum_steps": 8, "recompute": "full"}}
    assert fill(["--tp={tp}", "{nodes}x{gpus_per_node}", "${HOME}", "{unknown}", "{run_key}"], lease) == \
        ["--tp=4", "2x8", "${HOME}", "{unknown}", "s:1"]
    with pytest.raises(KeyError):
        fill(["{seq_len}"], {**lease, "run": {}})


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["duckdb"])
def test_two_agents_drive_torchrun_on_one_sweep_with_disjoint_configurations(live_api, tmp_path, backend,
                                                                             monkeypatch):
    pytest.importorskip("torch")
    monkeypatch.setenv("SCALEBOOK_SPOOL_DIR", str(tmp_path / "spool"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    _create(live_api, "tiny", {"micro_batch_size": [2, 4], "recompute": ["none", "full"]}, budget=4)
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "{gpus_per_node}",
               str(TRAIN_TINY), "--tp", "{tp}", "--micro-batch-size", "{micro_batch_size}", "--grad-accum",
               "{grad_accum_steps}", "--recompute", "{recompute}", "--seq-len", "{seq_len}", "--steps", "3",
               "--warmup", "1"]
    agents = [_agent(live_api, "tiny", command, tmp_path / f"a{i}", hang_after_s=240) for i in range(2)]
    codes: list[int] = []
    threads = [threading.Thread(target=lambda a=a: codes.append(a.run())) for a in agents]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert codes == [0, 0]
    body = _show(live_api, "tiny")
    assert body["counts"] == {"success": 4}, body["runs"]
    assert len({r["label"] for r in body["runs"]}) == 4 and sum(a.runs for a in agents) == 4
    for r in body["runs"]:
        run = _run(live_api, r["id"])
        # finished by the job itself (ingest.Recorder under SCALEBOOK_RUN_KEY), in the configuration leased
        assert run["source"] == "recorder" and run["sweep"] == "tiny" and run["tokens_per_sec_per_gpu"] > 0
        assert (run["dp"], run["micro_batch_size"], run["grad_accum_steps"], run["recompute"]) == \
            (2, r["config"]["micro_batch_size"], r["config"]["grad_accum_steps"], r["config"]["recompute"])
    assert body["best"]["tokens_per_sec_per_gpu"] == max(r["tokens_per_sec_per_gpu"] for r in body["runs"])
    assert httpx.get(f"{live_api}/api/v1/runs", params={"limit": 1}).json()["total"] == 4  # nothing run twice


def _state(pid: int) -> str | None:
    """A process's state letter (Z: a zombie waiting to be reaped), None when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return None


@pytest.mark.integration
def test_a_hanging_command_is_killed_with_its_process_group_and_recorded_as_timeout(live_api, tmp_path):
    _create(live_api, "hang", {"micro_batch_size": [2]}, budget=1)
    pidfile = tmp_path / "child.pid"
    job = ("import subprocess, sys, time; p = subprocess.Popen(['sleep', '600']); "
           "open(sys.argv[1], 'w').write(str(p.pid)); print('started', flush=True); time.sleep(600)")
    agent = _agent(live_api, "hang", [sys.executable, "-c", job, str(pidfile)], tmp_path, hang_after_s=2)
    started = time.monotonic()
    assert agent.run() == 0
    assert time.monotonic() - started < 60
    [r] = _show(live_api, "hang")["runs"]
    run = _run(live_api, r["id"])
    assert run["status"] == "timeout" and run["error_message"].startswith("hang: no output and no heartbeat for 2 s")
    assert run["extra"]["agent"]["hang"] is True and run["extra"]["agent"]["hang_after_s"] == 2
    assert _state(int(pidfile.read_text())) in (None, "Z")  # the grandchild went with the group
    assert "started" in Path(run["extra"]["agent"]["log"]).read_text()


@pytest.mark.integration
def test_a_crashing_command_is_classified_from_its_log(live_api, tmp_path):
    _create(live_api, "crash", {"micro_batch_size": [2, 4]}, budget=2)
    job = ("import sys; print('step 1 loss 5.5'); "
           "print('torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 79.11 GiB total)',"
           " file=sys.stderr); sys.exit(1)")
    agent = _agent(live_api, "crash", [sys.executable, "-c", job], tmp_path, hang_after_s=60)
    assert agent.run() == 0
    body = _show(live_api, "crash")
    assert body["counts"] == {"oom": 2}
    run = _run(live_api, body["runs"][0]["id"])
    assert run["error_class"] == "oom_gpu" and "CUDA out of memory" in run["error_message"]
    assert run["extra"]["agent"]["exit_code"] == 1 and run["extra"]["agent"]["result_from"] == "log"


@pytest.mark.integration
def test_the_agent_waits_out_an_api_restart_and_nothing_is_lost_or_run_twice(database, settings, tmp_path):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    first = _Server(create_app(database, settings), port).start()
    _create(url, "restart", {"micro_batch_size": [1, 2, 4]}, budget=3)
    agent = _agent(url, "restart", [sys.executable, "-c", LOGGING_JOB.format(3)], tmp_path, api_wait_s=120)
    code: list[int] = []
    thread = threading.Thread(target=lambda: code.append(agent.run()))
    thread.start()
    deadline = time.monotonic() + 60
    while not _show(url, "restart")["counts"].get("running"):
        assert time.monotonic() < deadline
        time.sleep(0.2)
    first.stop()  # the API goes away while the first job runs; its result arrives while it is away
    time.sleep(5)
    second = _Server(create_app(database, settings), port).start()
    try:
        thread.join(180)
        assert code == [0]
        body = _show(url, "restart")
        assert body["counts"] == {"success": 3} and len({r["label"] for r in body["runs"]}) == 3
        assert [r["attempt"] for r in body["runs"]] == [1, 1, 1]
        assert all(r["tokens_per_sec_per_gpu"] == 1500.0 for r in body["runs"])  # read from the captured logs
        assert httpx.get(f"{url}/api/v1/runs", params={"limit": 1}).json()["total"] == 3
    finally:
        second.stop()


@pytest.mark.integration
def test_ctrl_c_stops_the_job_and_leaves_its_lease_to_expire(live_api, tmp_path):
    _create(live_api, "stop", {"micro_batch_size": [2, 4]}, budget=2)
    pidfile = tmp_path / "job.pid"
    job = f"import os, time; open({str(pidfile)!r}, 'w').write(str(os.getpid())); print('up', flush=True); " \
          "time.sleep(600)"
    proc = subprocess.Popen([sys.executable, "-m", "ingest.agent", "stop", "--log-dir", str(tmp_path / "logs"), "--",
                             sys.executable, "-c", job], cwd=REPO, env={**os.environ, "SCALEBOOK_API_URL": live_api},
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not pidfile.exists() or not pidfile.read_text():
        assert time.monotonic() < deadline and proc.poll() is None
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 130, out
    assert "left open" in out
    assert _state(int(pidfile.read_text())) in (None, "Z")
    body = _show(live_api, "stop")
    assert body["counts"] == {"running": 1} and body["handed_out"] == 1  # not finished: it will read lost


def _free_port() -> int:
    from conftest import free_port

    return free_port()


class _Server:
    """uvicorn on a fixed port in a thread, stopped and started again as an API restart."""

    def __init__(self, app, port: int):
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)

    def start(self) -> _Server:
        self.thread.start()
        deadline = time.monotonic() + 20
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start"
            time.sleep(0.02)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def test_scalebook_agent_command_line(live_api, tmp_path):
    from typer.testing import CliRunner

    from service.cli import app

    _create(live_api, "cli", {"micro_batch_size": [1, 2, 4]}, budget=3)
    out = CliRunner().invoke(app, ["agent", "cli", "--max-runs", "1", "--log-dir", str(tmp_path), "--",
                                   sys.executable, "-c", LOGGING_JOB.format(0)])
    assert out.exit_code == 0, out.output
    assert "1 run(s) done (--max-runs)" in out.output
    assert _show(live_api, "cli")["counts"] == {"success": 1}
    assert CliRunner().invoke(app, ["agent", "cli"]).exit_code == 2  # no command
