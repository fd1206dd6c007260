"""ingest.Recorder on CPU: its numbers against a hand-timed loop, failures turned into statuses
(and re-raised), and a real 2-rank DDP/gloo training run under torchrun pushing to a live API."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import uuid

import httpx
import pytest

torch = pytest.importorskip("torch")  # CI installs torch (CPU wheel); skipped only without it

from conftest import REPO  # noqa: E402

from ingest import Client, Recorder  # noqa: E402

TRAIN_TINY = REPO / "examples" / "train_tiny.py"


def load_train_tiny():
    spec = importlib.util.spec_from_file_location("train_tiny", TRAIN_TINY)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def stored(url: str, run_key: str) -> list[dict]:
    return httpx.get(f"{url}/api/v1/runs", params={"run_key": run_key}, timeout=30).json()["runs"]


class FakeClock:
    """The recorder's clock, advanced by the test: step times are exact, whatever the machine's load."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_recorder_times_the_steps_after_warmup_only():
    tiny = load_train_tiny()
    torch.manual_seed(0)
    model = tiny.TinyGPT(layers=2, hidden=64, heads=4, seq_len=64, recompute="none")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    mbs, seq, warmup, timed = 4, 64, 2, 8
    tokens = mbs * seq
    step_s = [3.0, 3.0] + [0.05, 0.06, 0.05, 0.07, 0.05, 0.05, 0.06, 0.05]  # a slow warm-up (compilation)
    clock = FakeClock()
    fields = {"name": "hand-timed", "seq_len": seq, "micro_batch_size": mbs, "model_params": 10**6}
    with Recorder(fields, warmup_steps=warmup, push=False, clock=clock) as rec:
        for step in range(warmup + timed):
            ids = torch.randint(0, 256, (mbs, seq + 1))
            logits = model(ids[:, :-1])
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, 256), ids[:, 1:].reshape(-1))
            opt.zero_grad()
            loss.backward()
            opt.step()
            clock.now += step_s[step]
            rec.step(tokens=tokens)
    window = sum(step_s[warmup:])  # the timed steps only: the warm-up's 6 s are left out
    r = rec.record
    assert r["status"] == "success" and r["extra"]["timed_steps"] == timed and r["extra"]["steps"] == warmup + timed
    assert r["tokens_per_sec_per_gpu"] == pytest.approx(timed * tokens / window, rel=1e-9)
    assert r["step_time_s"] == pytest.approx(window / timed, rel=1e-9)
    assert r["world_size"] == 1 and r["dp"] == 1 and r["torch_version"] == torch.__version__
    assert r.get("peak_memory_gib") is None and r.get("reserved_memory_gib") is None  # CPU: no device memory
    assert "gpu_type" not in r and r["run_key"] == rec.run_key and rec.result is None


def test_too_few_steps_records_no_throughput():
    with Recorder({"name": "short"}, warmup_steps=3, push=False) as rec:
        for _ in range(3):
            rec.step(tokens=100)
    assert rec.record["status"] == "success" and "tokens_per_sec_per_gpu" not in rec.record


def test_oom_is_pushed_as_an_oom_run_and_propagates(live_api, tmp_path):
    rec = Recorder({"name": "oom-run", "model_name": "llama3-8b", "micro_batch_size": 64, "seq_len": 8192},
                   client=Client(url=live_api, spool_dir=tmp_path), warmup_steps=1)
    with pytest.raises(torch.OutOfMemoryError):
        with rec:
            rec.step(tokens=10)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (GPU 0; 79.10 GiB total)")
    assert rec.result.status == "stored"
    [run] = stored(live_api, rec.run_key)
    assert run["status"] == "oom" and run["error_class"] == "oom_gpu"
    assert "Tried to allocate 20.00 GiB" in run["error_message"] and run["tokens_per_sec_per_gpu"] is None


def test_distributed_and_other_errors_are_classified_and_reraised():
    nccl = ("NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:1970, remote process exited or "
            "there was a network error, NCCL version 2.21.5\nncclRemoteError: A call failed possibly due to a "
            "network error or a remote process exiting prematurely.")
    with pytest.raises(torch.distributed.DistBackendError):
        with Recorder({"name": "nccl"}, push=False) as rec:
            raise torch.distributed.DistBackendError(nccl)
    assert rec.record["status"] == "nccl_error" and rec.record["error_class"] == "nccl_remote_error"
    with pytest.raises(ValueError):
        with Recorder({"name": "bug"}, push=False) as rec2:
            raise ValueError("shape mismatch")
    assert (rec2.record["status"], rec2.record["error_class"]) == ("failed", "unknown")
    assert rec2.record["error_message"] == "ValueError: shape mismatch"


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["duckdb"])
def test_torchrun_two_ranks_ddp_gloo_pushes_one_run(live_api, tmp_path, backend):
    run_key = uuid.uuid4().hex
    env = {**os.environ, "SCALEBOOK_API_URL": live_api, "SCALEBOOK_SPOOL_DIR": str(tmp_path), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(TRAIN_TINY),
         "--tp", "1", "--steps", "6", "--warmup", "2", "--micro-batch-size", "4", "--grad-accum", "2",
         "--recompute", "selective", "--name", "torchrun-test", "--run-key", run_key],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    [run] = stored(live_api, run_key)
    assert (run["world_size"], run["dp"], run["tp"], run["nodes"], run["gpus_per_node"]) == (2, 2, 1, 1, 2)
    assert run["status"] == "success" and run["tokens_per_sec_per_gpu"] > 0 and run["step_time_s"] > 0
    assert run["torch_version"] == torch.__version__ and run["source"] == "recorder"
    assert (run["micro_batch_size"], run["grad_accum_steps"], run["recompute"]) == (4, 2, "selective")
    assert run["global_batch_tokens"] == 2 * 4 * 2 * 64 and run["extra"]["timed_steps"] == 4
    assert run["model_params"] == sum(p.numel() for p in load_train_tiny().TinyGPT(2, 64, 4, 64, "none").parameters())
    total = httpx.get(f"{live_api}/api/v1/runs", params={"limit": 1}, timeout=30).json()["total"]
    assert total == 1  # only rank 0 pushed
    assert not (tmp_path / "spool.jsonl").exists()
