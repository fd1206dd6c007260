"""Framework integrations (ingest/integrations) for real, on the CPU: a tiny Llama built from a
config trains a few steps under the Hugging Face Trainer, Lightning and Accelerate, and the run each
pushed is read back through the API (a live server on DuckDB and on PostgreSQL); jobs that die --
an exception in a step, SIGTERM mid-step -- leave a failed run with its failure class."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import time
import uuid

import httpx
import pytest

#: the frameworks the jobs run under (CI installs them, CPU builds). Looked up, not imported: importing
#: Lightning, Transformers and Accelerate costs ~12 s of CPU, which every xdist worker would pay at
#: collection; the jobs import them in their own processes.
_MISSING = [m for m in ("torch", "transformers", "lightning", "accelerate") if importlib.util.find_spec(m) is None]
if _MISSING:
    pytest.skip(f"not installed: {', '.join(_MISSING)}", allow_module_level=True)

import integration_jobs as jobs  # noqa: E402
from conftest import REPO  # noqa: E402

JOB_SCRIPT = REPO / "tests" / "integration_jobs.py"


def stored(url: str, run_key: str) -> list[dict]:
    return httpx.get(f"{url}/api/v1/runs", params={"run_key": run_key}, timeout=30).json()["runs"]


def assert_tiny_llama(run: dict) -> None:
    """Fields every integration must report for the job of tests/integration_jobs.py."""
    assert run["num_layers"] == jobs.LAYERS
    assert run["hidden_size"] == jobs.HIDDEN
    assert run["num_heads"] == jobs.HEADS
    assert run["num_kv_heads"] == jobs.KV_HEADS
    assert run["ffn_hidden_size"] == jobs.FFN
    assert run["vocab_size"] == jobs.VOCAB
    assert run["model_params"] == jobs.llama_params()
    assert run["micro_batch_size"] == jobs.MBS
    assert run["grad_accum_steps"] == jobs.GAS
    assert run["seq_len"] == jobs.SEQ
    assert run["world_size"] == 1 and run["dp"] == 1
    assert run["zero_stage"] == 0  # one process: nothing sharded
    assert run["status"] == "success" and run["error_class"] is None
    assert run["tokens_per_sec_per_gpu"] > 0 and run["step_time_s"] > 0
    assert run["peak_memory_gib"] is None  # CPU: no allocator peak, and none is made up
    assert run["extra"]["timed_steps"] == jobs.STEPS - 2 and run["extra"]["tokens_source"] == "counted"


def assert_live_series(url: str, run: dict, loss: bool) -> None:
    """The job's run was opened live (issue 28) and holds one step per optimizer step, each with its time
    and tokens/s/GPU (and the loss where the framework hands it over)."""
    assert run["last_heartbeat_at"] is not None
    steps = httpx.get(f"{url}/api/v1/runs/{run['id']}/steps", timeout=30).json()["steps"]
    assert [s["step"] for s in steps] == list(range(1, jobs.STEPS + 1))
    assert all(s["step_time_s"] > 0 and s["tokens_per_sec_per_gpu"] > 0 for s in steps)
    assert all((s["loss"] is not None) == loss for s in steps), steps


@pytest.fixture(autouse=True)
def _spool(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEBOOK_SPOOL_DIR", str(tmp_path / "spool"))


@pytest.mark.integration
def test_hf_trainer_run_is_stored(live_api):
    key = uuid.uuid4().hex
    callback = jobs.run_hf({"run_key": key, "name": "hf tiny llama"})
    assert callback.run.recorder.result.ok
    [run] = stored(live_api, key)
    assert_tiny_llama(run)
    assert (run["source"], run["framework"], run["name"]) == ("hf-trainer", "transformers", "hf tiny llama")
    assert run["precision"] == "fp32"  # no bf16/fp16 flag, fp32 weights
    assert run["recompute"] == "full"  # activation_checkpointing=True
    assert_live_series(live_api, run, loss=False)  # the Trainer's loss reaches callbacks only at logging steps


@pytest.mark.integration
def test_lightning_run_is_stored(live_api):
    key = uuid.uuid4().hex
    callback = jobs.run_lightning({"run_key": key})
    assert callback.run.recorder.result.ok
    [run] = stored(live_api, key)
    assert_tiny_llama(run)
    assert (run["source"], run["framework"]) == ("lightning", "lightning")
    assert run["precision"] == "bf16"  # precision="bf16-mixed"
    assert run["recompute"] == "none"
    assert run["nodes"] == 1 and run["gpus_per_node"] == 1
    assert_live_series(live_api, run, loss=True)


@pytest.mark.integration
def test_accelerate_run_is_stored(live_api):
    key = uuid.uuid4().hex
    tracker = jobs.run_accelerate({"run_key": key, "model_name": "tiny-llama"})
    assert tracker.run.recorder.result.ok
    [run] = stored(live_api, key)
    assert_tiny_llama(run)
    assert (run["source"], run["framework"], run["model_name"]) == ("accelerate", "accelerate", "tiny-llama")
    assert run["precision"] == "fp32"  # mixed_precision "no", fp32 weights
    assert_live_series(live_api, run, loss=True)  # accelerator.log({"loss": ...})
    assert run["recompute"] == "none"


def run_job(framework: str, key: str, fail: str, tmp_path) -> subprocess.CompletedProcess:
    """Run tests/integration_jobs.py in a subprocess; for "sigterm", SIGTERM it mid-step."""
    marker = tmp_path / f"{framework}.marker"
    cmd = [sys.executable, str(JOB_SCRIPT), framework, key, "--fail", fail, "--marker", str(marker)]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        if fail == "sigterm":
            deadline = time.monotonic() + 240
            while not marker.exists() and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.1)
            assert marker.exists(), "the job never reached its 4th step"
            proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, None)


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["duckdb"], indirect=True)
@pytest.mark.parametrize("framework", ["hf", "lightning", "accelerate"])
def test_exception_in_a_step_leaves_a_failed_run(framework, live_api, tmp_path):
    key = uuid.uuid4().hex
    result = run_job(framework, key, "oom", tmp_path)
    assert result.returncode == 1, result.stdout[-3000:]
    assert "OutOfMemoryError" in result.stdout  # the training error still reaches the user
    [run] = stored(live_api, key)
    assert (run["status"], run["error_class"]) == ("oom", "oom_gpu"), run
    assert "CUDA out of memory" in run["error_message"]
    assert run["num_layers"] == jobs.LAYERS and run["micro_batch_size"] == jobs.MBS


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["postgresql"], indirect=True)
@pytest.mark.parametrize("framework", ["hf", "lightning", "accelerate"])
def test_sigterm_mid_run_leaves_a_failed_run(framework, live_api, tmp_path):
    key = uuid.uuid4().hex
    result = run_job(framework, key, "sigterm", tmp_path)
    # HF / Accelerate: the guard records the run, then the process still dies of SIGTERM;
    # Lightning turns SIGTERM into SIGTERMException (a SystemExit without a code) after the step.
    expected = 0 if framework == "lightning" else -signal.SIGTERM
    assert result.returncode == expected, result.stdout[-3000:]
    [run] = stored(live_api, key)
    assert run["status"] == "failed" and run["error_class"] == "unknown", run
    assert "SIGTERM" in run["error_message"]
    assert run["hidden_size"] == jobs.HIDDEN and run["grad_accum_steps"] == jobs.GAS


# ---------------------------------------------------------------------- readers, without training
def test_zero_stage_of_fsdp_and_deepspeed_settings():
    from torch.distributed.fsdp import ShardingStrategy

    from ingest.integrations.common import deepspeed_zero_stage, fsdp_zero_stage

    # torch.distributed.fsdp.ShardingStrategy docs: what each strategy shards
    assert fsdp_zero_stage(ShardingStrategy.FULL_SHARD) == 3
    assert fsdp_zero_stage(ShardingStrategy.SHARD_GRAD_OP) == 2
    assert fsdp_zero_stage(ShardingStrategy.NO_SHARD) == 0
    assert fsdp_zero_stage(ShardingStrategy.HYBRID_SHARD) == 3
    assert fsdp_zero_stage("shard_grad_op") == 2
    assert fsdp_zero_stage(True, version=2) == 3 and fsdp_zero_stage(False, version=2) == 2
    assert deepspeed_zero_stage({"zero_optimization": {"stage": 3}}) == 3
    assert deepspeed_zero_stage({"zero_optimization": {"stage": "auto"}}) is None  # not a stage: NULL
    assert deepspeed_zero_stage({"train_micro_batch_size_per_gpu": 1}) is None


def test_lightning_strategy_fields():
    from lightning.pytorch.strategies import DDPStrategy, FSDPStrategy

    from ingest.integrations.lightning_callback import strategy_fields

    assert strategy_fields(FSDPStrategy(sharding_strategy="SHARD_GRAD_OP")) == {"zero_stage": 2}
    assert strategy_fields(FSDPStrategy(sharding_strategy="FULL_SHARD"))["zero_stage"] == 3
    assert strategy_fields(DDPStrategy()) == {"zero_stage": 0}


def test_model_fields_leave_out_what_the_config_does_not_state():
    from transformers import GPT2Config, GPT2LMHeadModel

    from ingest.integrations.common import model_fields

    model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=100, n_positions=32))
    fields = model_fields(model)
    assert (fields["num_layers"], fields["hidden_size"], fields["num_heads"], fields["vocab_size"]) == (2, 32, 4, 100)
    # GPT-2 states no KV-head count and no FFN width (n_inner=None means "4h" by convention): not guessed
    assert "num_kv_heads" not in fields and "ffn_hidden_size" not in fields
    assert fields["model_params"] == sum(p.numel() for p in model.parameters())


def test_batch_shape_counts_token_ids_only():
    import torch

    from ingest.integrations.common import batch_shape

    ids = torch.zeros(3, 7, dtype=torch.long)
    assert batch_shape(ids) == (3, 7)
    assert batch_shape({"input_ids": ids, "labels": ids}) == (3, 7)
    assert batch_shape((ids, ids)) == (3, 7)
    assert batch_shape({"inputs_embeds": torch.zeros(2, 5, 16)}) == (2, 5)
    assert batch_shape(torch.zeros(3, 7)) is None  # float features are not tokens
    assert batch_shape({"pixel_values": torch.zeros(2, 3, 8, 8)}) is None


def test_step_figures_take_the_usual_names_only():
    import torch

    from ingest.integrations.common import step_figures

    got = step_figures({"loss": 2.5, "lr": 1e-3, "steps": 3, "x": "a", "grad_norm": float("nan"), "train_loss": 9})
    assert got == {"loss": 2.5, "learning_rate": 1e-3}
    assert step_figures({"loss": torch.tensor(1.5)}) == {"loss": 1.5} and step_figures(None) == {}
