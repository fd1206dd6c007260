"""`scalebook import mlflow` against a REAL MLflow tracking server (started here, runs logged through
its REST API) and `scalebook import wandb` on a hand-written W&B runs-table export, both through
the shipped mapping files (examples/*_map.toml) into a live scalebook API on both backends."""

from __future__ import annotations

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import REPO, free_port
from typer.testing import CliRunner

from ingest import external
from service.cli import app

runner = CliRunner()
MLFLOW_MAP = REPO / "examples" / "mlflow_map.toml"
WANDB_MAP = REPO / "examples" / "wandb_map.toml"
WANDB_CSV = REPO / "tests" / "data" / "wandb_runs.csv"
T0_MS = 1_715_680_000_000  # 2024-05-14T09:46:40Z


def cli_json(*args: str, code: int = 0) -> dict:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == code, result.output
    return json.loads(result.stdout)


def runs_by_key(url: str) -> dict[str, dict]:
    page = httpx.get(f"{url}/api/v1/runs", params={"limit": 1000}, timeout=30).json()
    return {r["run_key"]: r for r in page["runs"]}


# --------------------------------------------------------------------------- MLflow server
class Mlflow:
    """`mlflow server` on a SQLite store in its own process group; REST helpers. Startup takes
    ~10 s (SQLite schema migrations), more on a busy machine: health is polled for 90 s."""

    def __init__(self, workdir: Path):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = open(workdir / "mlflow.log", "wb")
        mlflow = Path(sys.executable).with_name("mlflow")
        self.proc = subprocess.Popen(
            [str(mlflow), "server", "--backend-store-uri", f"sqlite:///{workdir / 'mlflow.db'}",
             "--default-artifact-root", str(workdir / "artifacts"), "--host", "127.0.0.1",
             "--port", str(self.port), "--workers", "1"],
            cwd=workdir, stdout=self.log, stderr=subprocess.STDOUT, start_new_session=True,
            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false",  # no job workers: starts faster
                 "MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "true"})
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"mlflow server exited with {self.proc.returncode}: see {workdir}/mlflow.log")
            try:
                if httpx.get(f"{self.url}/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.25)
        self.stop()
        raise TimeoutError("mlflow server not healthy after 90 s")

    def api(self, path: str, body: dict) -> dict:
        r = httpx.post(f"{self.url}/api/2.0/mlflow/{path}", json=body, timeout=30)
        assert r.status_code == 200, r.text
        return r.json()

    def log_run(self, experiment_id: str, name: str, params: dict, metrics: dict, tags: dict,
                status: str | None, start_ms: int) -> str:
        """Create a run, log params/tags and metrics (each metric twice: the latest must win),
        then end it with `status` (None: leave it RUNNING). Returns the run id."""
        run_id = self.api("runs/create", {"experiment_id": experiment_id, "run_name": name,
                                          "start_time": start_ms})["run"]["info"]["run_id"]
        self.api("runs/log-batch", {
            "run_id": run_id,
            "params": [{"key": k, "value": str(v)} for k, v in params.items()],
            "tags": [{"key": k, "value": str(v)} for k, v in tags.items()],
            "metrics": [m for k, v in metrics.items() for m in (
                {"key": k, "value": v / 2, "timestamp": start_ms + 1000, "step": 1},
                {"key": k, "value": v, "timestamp": start_ms + 60_000, "step": 100})]})
        if status:
            self.api("runs/update", {"run_id": run_id, "status": status, "end_time": start_ms + 120_000})
        return run_id

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(timeout=10)
        self.log.close()


def base_params(**over) -> dict:
    p = {"model.num_params": 8030261248, "model.num_layers": 32, "model.hidden_size": 4096, "data.seq_len": 8192,
         "nodes": 1, "gpus_per_node": 8, "parallelism.dp": 8, "parallelism.tp": 1, "parallelism.pp": 1,
         "zero_stage": 1, "train.micro_batch_size": 1, "train.grad_accum": 4,
         "train.activation_checkpointing": "false", "precision": "bf16", "optimizer": "adamw"}
    return {**p, **over}


@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """A real MLflow server with experiment "llm-sweep": 3 finished runs, 1 OOM failure,
    1 still running, 1 with an unparseable param (6 runs)."""
    server = Mlflow(tmp_path_factory.mktemp("mlflow"))
    try:
        exp = server.api("experiments/create", {"name": "llm-sweep"})["experiment_id"]
        tags = {"model": "llama3-8b", "framework": "torchtitan"}
        metrics = {"throughput/tokens_per_sec_per_gpu": 5762.0, "throughput/tflops_per_gpu": 385.0,
                   "mfu_pct": 38.9, "memory/peak_mb": 64_312.0, "time/step_ms": 5687.0}
        ids = {
            "dp8": server.log_run(exp, "8b-n1-dp8", base_params(), metrics, tags, "FINISHED", T0_MS),
            "dp16": server.log_run(exp, "8b-n2-dp16", base_params(nodes=2, **{"parallelism.dp": 16}),
                                   {**metrics, "throughput/tokens_per_sec_per_gpu": 5210.0}, tags, "FINISHED",
                                   T0_MS + 3_600_000),
            "tp2": server.log_run(exp, "8b-n2-dp8-tp2", base_params(nodes=2, **{"parallelism.tp": 2,
                                  "train.activation_checkpointing": "true"}),
                                  {**metrics, "throughput/tokens_per_sec_per_gpu": 4890.0}, tags, "FINISHED",
                                  T0_MS + 7_200_000),
            "oom": server.log_run(exp, "8b-n1-mbs4", base_params(**{"train.micro_batch_size": 4}),
                                  {"memory/peak_mb": 80_100.0},
                                  {**tags, "error": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                                   "3.91 GiB. GPU 0 has a total capacity of 79.11 GiB"}, "FAILED", T0_MS + 9_000_000),
            "running": server.log_run(exp, "8b-n4-dp32", base_params(nodes=4), metrics, tags, None, T0_MS),
            "bad": server.log_run(exp, "8b-typo", base_params(**{"parallelism.tp": "two"}), metrics, tags,
                                  "FINISHED", T0_MS),
        }
        yield server, ids
    finally:
        server.stop()


@pytest.mark.integration
def test_mlflow_rest_client_pages_through_every_run(mlflow_server):
    server, ids = mlflow_server
    client = external.MlflowClient(server.url)
    runs = list(client.search_runs(client.experiment_id("llm-sweep"), page_size=2))  # 3 pages
    assert sorted(r["info"]["run_id"] for r in runs) == sorted(ids.values())
    with pytest.raises(external.MlflowError, match="RESOURCE_DOES_NOT_EXIST"):
        client.experiment_id("no-such-experiment")


@pytest.mark.integration
def test_import_mlflow_experiment_twice(mlflow_server, live_api, tmp_path):
    server, ids = mlflow_server
    rejects = tmp_path / "rejects.csv"
    args = ["import", "mlflow", "--tracking-uri", server.url, "--experiment", "llm-sweep",
            "--map", str(MLFLOW_MAP), "--rejects", str(rejects)]
    first = cli_json(*args, code=1)  # rows were rejected: exit 1
    assert (first["read"], first["stored"], first["already_present"], first["rejected"]) == (6, 4, 0, 2)
    with open(rejects, newline="") as fh:
        reasons = {row["line"]: row["reason"] for row in csv.DictReader(fh)}
    assert "RUNNING" in reasons[ids["running"]] and "parallelism.tp" not in reasons[ids["bad"]]
    assert "tp: 'two' is not a number" in reasons[ids["bad"]]

    stored = runs_by_key(live_api)
    assert set(stored) == {f"mlflow:{ids[k]}" for k in ("dp8", "dp16", "tp2", "oom")}
    dp8 = stored[f"mlflow:{ids['dp8']}"]
    assert dp8["tokens_per_sec_per_gpu"] == 5762.0  # the latest value, not the step-1 one
    assert dp8["mfu"] == pytest.approx(0.389) and dp8["peak_memory_gib"] == pytest.approx(64_312 / 1024)
    assert dp8["step_time_s"] == pytest.approx(5.687) and dp8["tflops_per_gpu"] == 385.0
    assert (dp8["model_params"], dp8["seq_len"], dp8["dp"], dp8["world_size"]) == (8030261248, 8192, 8, 8)
    assert (dp8["name"], dp8["source"], dp8["gpu_type"], dp8["status"]) == ("8b-n1-dp8", "mlflow",
                                                                           "H100-SXM-80GB", "success")
    assert dp8["started_at"].startswith("2024-05-14T09:46:40") and dp8["extra"]["optimizer"] == "adamw"
    assert dp8["extra"]["mlflow_run_id"] == ids["dp8"] and dp8["mfu_derived"] > 0
    tp2 = stored[f"mlflow:{ids['tp2']}"]
    assert (tp2["tp"], tp2["recompute"], tp2["world_size"]) == (2, "full", 16)
    oom = stored[f"mlflow:{ids['oom']}"]
    assert (oom["status"], oom["error_class"]) == ("oom", "oom_gpu") and oom["tokens_per_sec_per_gpu"] is None

    again = cli_json(*args, code=1)
    assert (again["stored"], again["already_present"], again["rejected"]) == (0, 4, 2)
    assert len(runs_by_key(live_api)) == 4


@pytest.mark.integration
def test_import_mlflow_errors_are_clear(mlflow_server, live_api, tmp_path):
    server, _ = mlflow_server
    bad_map = tmp_path / "map.toml"
    bad_map.write_text('[fields]\ntokens_per_second = { metric = "tps" }\n')
    result = runner.invoke(app, ["import", "mlflow", "--tracking-uri", server.url, "--experiment", "llm-sweep",
                                 "--map", str(bad_map)])
    assert result.exit_code == 1 and "unknown run field 'tokens_per_second'" in result.output
    result = runner.invoke(app, ["import", "mlflow", "--tracking-uri", server.url, "--experiment", "nope",
                                 "--map", str(MLFLOW_MAP)])
    assert result.exit_code == 1 and "RESOURCE_DOES_NOT_EXIST" in result.output


# --------------------------------------------------------------------------- W&B
def test_import_wandb_export_twice(live_api, tmp_path):
    rejects = tmp_path / "wandb.rejects.csv"
    args = ["import", "wandb", str(WANDB_CSV), "--map", str(WANDB_MAP), "--rejects", str(rejects)]
    first = cli_json(*args, code=1)  # rows were rejected: exit 1
    # 6 rows: 3 finished, 1 crashed (OOM) stored; 1 running and 1 with dp·tp ≠ world size rejected
    assert (first["read"], first["stored"], first["already_present"], first["rejected"]) == (6, 4, 0, 2)
    with open(rejects, newline="") as fh:
        reasons = [row["reason"] for row in csv.DictReader(fh)]
    assert any("running" in r for r in reasons) and any("world_size" in r or "dp" in r for r in reasons)

    stored = runs_by_key(live_api)
    assert set(stored) == {"wandb:llama3-8b-n1-dp8-mbs1", "wandb:llama3-8b-n2-dp16-mbs2",
                           "wandb:llama3-8b-n2-dp8-tp2", "wandb:llama3-8b-n1-dp8-mbs4"}
    base = stored["wandb:llama3-8b-n1-dp8-mbs1"]
    assert (base["tokens_per_sec_per_gpu"], base["mfu"], base["status"], base["source"]) == (5762.3, 0.3891,
                                                                                            "success", "wandb")
    assert base["peak_memory_gib"] == pytest.approx(62.81e9 / 2**30)
    assert base["started_at"].startswith("2024-05-14T10:22:31") and base["recompute"] == "none"
    assert base["extra"]["wandb_runtime_s"] == 1863 and base["extra"]["wandb_tags"] == "baseline, h100"
    assert stored["wandb:llama3-8b-n2-dp16-mbs2"]["recompute"] == "full"
    crashed = stored["wandb:llama3-8b-n1-dp8-mbs4"]
    assert (crashed["status"], crashed["error_class"]) == ("oom", "oom_gpu")

    again = cli_json(*args, code=1)
    assert (again["stored"], again["already_present"], again["rejected"]) == (0, 4, 2)


def test_mapping_validation():
    with pytest.raises(external.MappingError, match="exactly one of"):
        external.parse_mapping({"fields": {"tp": {"param": "a", "metric": "b"}}})
    with pytest.raises(external.MappingError, match="scale must be a number"):
        external.parse_mapping({"fields": {"mfu": {"metric": "m", "scale": "0.01"}}})
    nested = external.parse_mapping({"fields": {"extra": {"opt": {"param": "optimizer"}}}})
    assert [(r.field, r.source, r.key) for r in nested.rules] == [("extra.opt", "param", "optimizer")]
    assert external.convert("tp", "2.0") == 2 and external.convert("mfu", "41", 0.01) == pytest.approx(0.41)
    with pytest.raises(ValueError, match="not an integer"):
        external.convert("tp", "2.5")


def test_yaml_mapping_is_read_when_pyyaml_is_installed(tmp_path):
    pytest.importorskip("yaml")
    path = tmp_path / "map.yaml"
    path.write_text("fields:\n  tp: {param: parallelism.tp}\n  mfu: {metric: mfu_pct, scale: 0.01}\n"
                    "defaults:\n  gpu_type: H100-SXM-80GB\n")
    mapping = external.load_mapping(path)
    assert [(r.field, r.source, r.scale) for r in mapping.rules] == [("tp", "param", None), ("mfu", "metric", 0.01)]
    assert mapping.defaults == {"gpu_type": "H100-SXM-80GB"}
