"""`scalebook sync`, `scalebook classify` and `scalebook import log` against a live API (both backends)."""

from __future__ import annotations

import csv
import json
import subprocess
import sys

import httpx
import pytest
from conftest import REPO, free_port
from typer.testing import CliRunner

from ingest import Client
from ingest.classify import classify_line
from service.cli import app

runner = CliRunner()
LOGS = REPO / "tests" / "data" / "logs"


def invoke_json(*args: str, code: int = 0) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


def all_runs(url: str) -> list[dict]:
    return httpx.get(f"{url}/api/v1/runs", params={"limit": 1000}, timeout=30).json()["runs"]


# --------------------------------------------------------------------------- sync
def test_sync_replays_the_spool_then_has_nothing_left(live_api, tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEBOOK_SPOOL_DIR", str(tmp_path))
    offline = Client(url=f"http://127.0.0.1:{free_port()}", deadline_s=0.0)  # spool dir from the env
    result = offline.push_many([{"name": f"spooled-{i}", "status": "success", "tokens_per_sec_per_gpu": 100.0 + i}
                                for i in range(3)] + [{"name": "bad", "mfu": 7.0}])
    assert result.status == "spooled" and offline.pending() == 4

    first = invoke_json("sync", code=1)  # one run was rejected: exit 1, like every importer
    assert (first["replayed"], first["already_present"], first["rejected"], first["remaining"]) == (3, 0, 1, 0)
    assert first["spool"] == str(tmp_path / "spool.jsonl")
    assert sorted(r["name"] for r in all_runs(live_api)) == ["spooled-0", "spooled-1", "spooled-2"]
    [reject] = [json.loads(line) for line in (tmp_path / "rejects.jsonl").read_text().splitlines()]
    assert reject["run"]["name"] == "bad" and reject["http_status"] == 422

    text = runner.invoke(app, ["sync"])
    assert text.exit_code == 0 and "replayed 0, already present 0, rejected 0, remaining 0" in text.output


def test_sync_with_the_api_down_exits_1_and_keeps_the_runs(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEBOOK_API_URL", f"http://127.0.0.1:{free_port()}")
    Client(spool_dir=tmp_path, deadline_s=0.0).push({"name": "kept"})
    out = invoke_json("sync", "--spool-dir", str(tmp_path), "--deadline", "0.2", code=1)
    assert out["remaining"] == 1 and out["replayed"] == 0 and "Connection refused" in out["error"]


# --------------------------------------------------------------------------- classify
def test_classify_prints_one_class_per_stdin_line(data_dir):
    with open(data_dir / "failures" / "error_lines.csv", newline="") as fh:
        lines = [row["error_line"].replace("\n", " ") for row in csv.DictReader(fh)]
    lines += ["NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>", "step 10 loss 2.31"]
    proc = subprocess.run([sys.executable, "-m", "service.cli", "classify"], input="\n".join(lines) + "\n",
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    words = proc.stdout.splitlines()
    assert words == [classify_line(line) or "none" for line in lines]
    assert words[-2:] == ["none", "none"] and "oom_gpu" in words and "collective_timeout" in words


def test_classify_root_cause_of_a_whole_log():
    log = (LOGS / "torchrun_oom_rank3.log").read_text()
    result = runner.invoke(app, ["classify", "--root-cause"], input=log)
    assert result.exit_code == 0, result.output
    error_class, status, line_no, line = result.stdout.rstrip("\n").split("\t")
    assert (error_class, status) == ("oom_gpu", "oom") and "out of memory" in line.lower()
    assert log.splitlines()[int(line_no) - 1].strip() == line


# --------------------------------------------------------------------------- import log
def test_import_log_with_run_fields_twice(live_api, tmp_path):
    log = LOGS / "torchtitan_success.log"
    args = ["import", "log", str(log), "--name", "titan-8b", "--model-params", "8.03B", "--nodes", "1",
            "--gpus-per-node", "8", "--gpu-type", "h100_80gb", "--precision", "bf16",
            "--field", "zero_stage=3", "--field", "extra.cluster=\"eos\"", "--rejects", str(tmp_path / "r.csv")]
    first = invoke_json(*args)
    assert (first["read"], first["stored"], first["already_present"], first["rejected"]) == (1, 1, 0, 0)
    [run] = all_runs(live_api)
    assert (run["name"], run["source"], run["framework"], run["status"]) == ("titan-8b", "log", "torchtitan", "success")
    assert run["model_params"] == 8_030_000_000 and run["gpu_type"] == "H100-SXM-80GB"
    assert (run["nodes"], run["gpus_per_node"], run["world_size"], run["zero_stage"]) == (1, 8, 8, 3)
    assert run["tokens_per_sec_per_gpu"] > 0 and run["extra"]["cluster"] == "eos"
    assert run["extra"]["log_file"] == log.name and run["run_key"].startswith("log:")
    again = invoke_json(*args)
    assert (again["stored"], again["already_present"]) == (0, 1)


def test_import_several_logs_keeps_failures_as_results(live_api, tmp_path):
    logs = [LOGS / "torchrun_oom_rank3.log", LOGS / "slurm_time_limit.log", LOGS / "nanotron_success.log"]
    out = invoke_json("import", "log", *map(str, logs), "--gpu-type", "H100-SXM-80GB",
                      "--rejects", str(tmp_path / "r.csv"))
    assert (out["read"], out["stored"], out["rejected"]) == (3, 3, 0)
    status = {r["extra"]["log_file"]: (r["status"], r["error_class"]) for r in all_runs(live_api)}
    assert status == {"torchrun_oom_rank3.log": ("oom", "oom_gpu"),
                      "slurm_time_limit.log": ("timeout", "scheduler_time_limit"),
                      "nanotron_success.log": ("success", None)}


@pytest.mark.parametrize("option, message", [
    (["--field", "no_such_field=1"], "not a run field"),
    (["--field", "tp=two"], "--field tp='two'"),
    (["--model-params", "eight"], "is not a parameter count"),
])
def test_import_log_refuses_bad_options(option, message):
    result = runner.invoke(app, ["import", "log", str(LOGS / "nanotron_success.log"), *option])
    assert result.exit_code == 2 and message in result.output, result.output
