"""Training-log parser (ingest/parsers/logs.py) on the fixtures in tests/data/logs/.

Every expected number below was computed by hand from the fixture; the comments show how.
Warm-up rule: of n distinct logged steps the first min(3, n // 2) are dropped, the median of the
rest is reported.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from core.record import REPORTED_FIELDS
from ingest.parsers.logs import LogNotRecognised, detect_format, parse_log

LOGS = Path(__file__).resolve().parent / "data" / "logs"
REPO = Path(__file__).resolve().parent.parent


def read(name: str) -> str:
    return (LOGS / name).read_text(encoding="utf-8")


APPROX = dict(rel=1e-5, abs=1e-4)

EXPECTED: dict[str, dict] = {
    "nanotron_success.log": {
        "framework": "nanotron",
        "status": "success",
        # records 1..10, skip 3; steps 4..10 tokens/s/GPU 40.1K 40.2K 40.1K 40.3K 40.1K 40.2K 40K
        "tokens_per_sec_per_gpu": 40100.0,
        # model_tflops_per_gpu 387 388 387 389 387 388 386 -> median 387
        "tflops_per_gpu": 387.0,
        # elapsed_time_per_iteration_ms 3.27K 3.26K 3.27K 3.25K 3.27K 3.26K 3.28K -> 3270 ms
        "step_time_s": 3.27,
        # max "Peak allocated" 25672.91 MiB (step 2), max "Peak reserved" 27008.00 MiB
        "peak_memory_gib": 25672.91 / 1024,
        "reserved_memory_gib": 27008.0 / 1024,
        # [Start training] mbs: 2 | grad_accum: 16 | global_batch_size: 256 | sequence_length: 4096
        "micro_batch_size": 2,
        "grad_accum_steps": 16,
        "seq_len": 4096,
        "global_batch_tokens": 256 * 4096,
        # pformat(config): ParallelismArgs(dp=8, pp=1, tp=1, ...), OptimizerArgs(... zero_stage=0), LlamaConfig
        "dp": 8,
        "tp": 1,
        "pp": 1,
        "world_size": 8 * 1 * 1,
        "zero_stage": 0,
        "hidden_size": 2048,
        "num_layers": 16,
        "num_heads": 32,
        "num_kv_heads": 32,
        "ffn_hidden_size": 8192,
        "vocab_size": 131072,
    },
    "megatron_success.log": {
        "framework": "megatron-lm",
        "status": "success",
        # iterations 10..100, skip 3; 40..100 TFLOP/s/GPU 438.1 438.6 437.6 438.7 438.0 438.3 437.9 -> 438.1
        "tflops_per_gpu": 438.1,
        # ms 4085.7 4081.2 4090.3 4079.8 4086.4 4083.5 4087.9 -> median 4085.7
        "step_time_s": 4.0857,
        # global batch 128 samples x seq_length 4096 / 4.0857 s / world_size 16
        "tokens_per_sec_per_gpu": 128 * 4096 / 4.0857 / 16,
        # max over [Rank 0] and [Rank 1] report_memory lines (MB = MiB)
        "peak_memory_gib": 52391.87060546875 / 1024,
        "reserved_memory_gib": 59012.0 / 1024,
        # argument dump
        "tp": 2,
        "pp": 1,
        "cp": 1,
        "ep": 1,
        "dp": 8,
        "world_size": 16,
        "micro_batch_size": 1,
        "grad_accum_steps": 128 // (1 * 8),
        "seq_len": 4096,
        "global_batch_tokens": 128 * 4096,
        "num_layers": 32,
        "hidden_size": 4096,
        "num_heads": 32,
        "num_kv_heads": 8,
        "ffn_hidden_size": 14336,
        "precision": "bf16",
        "recompute": "none",
        "zero_stage": 1,  # use_distributed_optimizer True
    },
    "torchtitan_success.log": {
        "framework": "torchtitan",
        "status": "success",
        # training steps 1 10 20 30 40 50 (the "validate step" line is not one), skip 3 -> 30 40 50
        "tokens_per_sec_per_gpu": 5771.0,  # tps 5,771 5,755 5,780
        "tflops_per_gpu": 334.21,  # 334.21 333.28 334.73
        "mfu": 0.3379,  # 33.79% 33.70% 33.84%
        # memory (max reserved) over all steps: max(49.87, 62.13, 62.15, 62.15, 62.17, 62.15)
        "peak_memory_gib": 62.17,
        "reserved_memory_gib": 62.17,
        "model_params": 8030261248,
        "seq_len": 8192,
        "global_batch_tokens": 8 * 8192,
        "dp": 8,  # mesh ['dp_shard'], [8]
        "world_size": 8,
    },
    "torchrun_oom_rank3.log": {
        "framework": "nanotron",
        "status": "oom",
        "error_class": "oom_gpu",
        # records 1..3, skip 1 -> steps 2 and 3
        "tokens_per_sec_per_gpu": (38600 + 38800) / 2,
        "tflops_per_gpu": (372 + 374) / 2,
        "step_time_s": (3.4 + 3.38) / 2,
        "peak_memory_gib": 74102.77 / 1024,
        "reserved_memory_gib": 78602.0 / 1024,
        "micro_batch_size": 4,
        "grad_accum_steps": 8,
        "seq_len": 4096,
        "global_batch_tokens": 256 * 4096,
    },
    "slurm_time_limit.log": {
        "framework": "megatron-lm",
        "status": "timeout",
        "error_class": "scheduler_time_limit",
        "error_message": "slurmstepd: error: *** JOB 4812377 ON nid005123 CANCELLED AT 2025-02-14T02:04:12 "
        "DUE TO TIME LIMIT ***",
        # records 10..40, skip 2 -> 30, 40
        "step_time_s": (3899.6 + 3902.8) / 2 / 1000,
        "tflops_per_gpu": (403.1 + 402.7) / 2,
        "tokens_per_sec_per_gpu": 64 * 8192 / ((3899.6 + 3902.8) / 2 / 1000) / 16,
        "peak_memory_gib": 61102.5380859375 / 1024,
        "reserved_memory_gib": 66034.0 / 1024,
        "tp": 4,
        "pp": 2,
        "dp": 2,
        "world_size": 16,
        "grad_accum_steps": 64 // (1 * 2),
        "recompute": "selective",
    },
    "nccl_net_ib_then_watchdog_timeout.log": {
        "framework": "torchtitan",
        "status": "nccl_error",
        "error_class": "nccl_network_error",
        # records 1 10 20, skip 1 -> 10, 20
        "tokens_per_sec_per_gpu": (824 + 818) / 2,
        "tflops_per_gpu": (387.02 + 384.20) / 2,
        "mfu": (39.13 + 38.85) / 2 / 100,
        "peak_memory_gib": 73.91,
        "reserved_memory_gib": 73.91,
        "model_params": 70553706496,
        "seq_len": 8192,
        "global_batch_tokens": 16 * 8192,
        "tp": 8,
        "dp": 2,
        "world_size": 16,
    },
}

FORMATS = {
    "nanotron_success.log": "nanotron",
    "megatron_success.log": "megatron",
    "torchtitan_success.log": "torchtitan",
    "torchrun_oom_rank3.log": "nanotron",
    "slurm_time_limit.log": "megatron",
    "nccl_net_ib_then_watchdog_timeout.log": "torchtitan",
}


def test_fixtures_all_listed():
    from tests.test_log_formats import NEW_EXPECTED

    assert sorted(p.name for p in LOGS.glob("*.log")) == sorted(EXPECTED | NEW_EXPECTED)


@pytest.mark.parametrize("name,fmt", sorted(FORMATS.items()))
def test_detect_format(name, fmt):
    assert detect_format(read(name)) == fmt


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_parse_fixture(name):
    record = parse_log(read(name))
    assert set(record) <= set(REPORTED_FIELDS)
    assert record["source"] == "log"
    for key, want in EXPECTED[name].items():
        assert key in record, f"{name}: {key} missing"
        if isinstance(want, float):
            assert record[key] == pytest.approx(want, **APPROX), key
        else:
            assert record[key] == want, key
    if record["status"] == "success":
        assert "error_class" not in record and "error_message" not in record


def test_oom_root_cause_message_and_line():
    text = read("torchrun_oom_rank3.log")
    record = parse_log(text)
    assert record["error_message"].startswith(
        "[default3]:torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 3"
    )
    line_no = record["extra"]["error_line_no"]
    assert text.splitlines()[line_no - 1].strip() == record["error_message"]
    assert "ChildFailedError" in text  # the symptom is in the log, and lost to the OOM


def test_network_error_beats_the_later_watchdog_timeouts():
    record = parse_log(read("nccl_net_ib_then_watchdog_timeout.log"))
    assert "NET/IB : Got completion from peer 10.224.3.17<50443>" in record["error_message"]


def test_extra():
    extra = parse_log(read("nanotron_success.log"))["extra"]
    assert extra["log_format"] == "nanotron"
    assert extra["steps_logged"] == 10
    assert extra["warmup_steps_skipped"] == 3
    assert (extra["first_step"], extra["last_step"]) == (1, 10)
    assert extra["hardware_tflops_per_gpu"] == pytest.approx(387.0)
    assert extra["last_loss"] == pytest.approx(8.71)
    assert parse_log(read("torchtitan_success.log"))["extra"]["peak_memory_is_reserved"] is True


def test_torchtitan_with_and_without_ansi_colours():
    text = read("torchtitan_success.log")
    assert "\x1b[" in text
    plain = re.sub(r"\x1b\[[0-9;]*m", "", text)
    assert parse_log(plain) == parse_log(text)


def test_fields_override_and_aliases():
    record = parse_log(read("nanotron_success.log"), name="bench-1.34G", mbs=4, gas=8, nodes=1,
                       gpus_per_node=8, gpu_type="H100-SXM-80GB", extra={"job_id": "14113488"})
    assert record["name"] == "bench-1.34G"
    assert record["micro_batch_size"] == 4  # overrides the log's 2
    assert record["grad_accum_steps"] == 8
    assert (record["nodes"], record["gpus_per_node"], record["gpu_type"]) == (1, 8, "H100-SXM-80GB")
    assert record["extra"]["job_id"] == "14113488"
    assert record["extra"]["log_format"] == "nanotron"
    assert parse_log(read("nanotron_success.log"), status="failed")["status"] == "failed"


def test_unknown_field_is_refused():
    with pytest.raises(ValueError, match="unknown run field 'tokens'"):
        parse_log(read("nanotron_success.log"), tokens=5)


def test_megatron_throughput_from_user_fields():
    """Without the argument dump, seq_len and the world size come from the caller."""
    iterations = [line for line in read("megatron_success.log").splitlines() if " iteration " in line]
    text = "\n".join(iterations)
    without = parse_log(text)
    assert "tokens_per_sec_per_gpu" not in without and without["tflops_per_gpu"] == pytest.approx(438.1)
    record = parse_log(text, seq_len=4096, nodes=2, gpus_per_node=8)
    assert record["tokens_per_sec_per_gpu"] == pytest.approx(128 * 4096 / 4.0857 / 16, **APPROX)


def test_stderr_only_log():
    text = "\n".join([
        "node-1:100:200 [0] NCCL INFO Init COMPLETE",
        "n1:9621:9691 [6] misc/shmutils.cc:112 NCCL WARN Error while creating shared memory segment "
        "/dev/shm/nccl-KWfVyt (size 5967872)",
        "torch.distributed.DistBackendError: NCCL error in: ../torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp"
        ":1275, unhandled system error (run with NCCL_DEBUG=INFO for details), NCCL version 2.18.1",
        "torch.distributed.elastic.multiprocessing.errors.ChildFailedError: ",
    ])
    assert detect_format(text) == "unknown"
    record = parse_log(text)
    assert "framework" not in record
    assert (record["status"], record["error_class"]) == ("nccl_error", "nccl_system_error")
    assert "shared memory segment" in record["error_message"]


@pytest.mark.parametrize("text", ["", "hello\nworld\n", "node-1:1:2 [0] NCCL INFO Bootstrap : Using eth0\n"])
def test_nothing_recognised_is_refused(text):
    assert detect_format(text) == "unknown"
    with pytest.raises(LogNotRecognised, match="found no training metrics"):
        parse_log(text)


def test_success_needs_throughput_and_no_failure():
    text = read("megatron_success.log")
    assert parse_log(text)["status"] == "success"
    crashed = text + "[rank5]: RuntimeError: CUDA error: an illegal memory access was encountered\n"
    record = parse_log(crashed)
    assert (record["status"], record["error_class"]) == ("failed", "cuda_illegal_memory_access")
    assert record["tflops_per_gpu"] == pytest.approx(438.1)  # numbers measured before the crash are kept


def test_ingest_imports_with_the_standard_library_only():
    code = (
        "import sys; sys.path.insert(0, sys.argv[1]);"
        "import ingest.classify, ingest.parsers.logs, ingest.integrations, ingest.integrations.common;"
        "bad = sorted({m.split('.')[0] for m in sys.modules} - set(sys.stdlib_module_names)"
        " - {'ingest', 'core', '__main__'});"
        "print(','.join(bad))"
    )
    out = subprocess.run([sys.executable, "-I", "-S", "-c", code, str(REPO)], capture_output=True, text=True,
                         check=True)
    assert out.stdout.strip() == ""


def test_every_rank_printing_its_step_lines():
    """Without torchrun --local-ranks-filter each rank prints its own step line: warm-up is counted in
    steps, not lines, and the median runs over every rank's records."""
    lines = []
    for step, tps in ((1, 900), (10, 5000), (20, 5010), (30, 5020), (40, 5030)):
        for rank in range(4):
            lines.append(f"[rank{rank}]:[titan] 2025-03-11 09:13:10,561 - root - INFO - step: {step:2}  loss:  7.6129  "
                         f"memory: 62.15GiB(78.50%)  tps: {tps + rank:,}  tflops: 334.21  mfu: 33.79%")
    record = parse_log("\n".join(lines))
    # 5 steps -> skip 2 (steps 1 and 10); steps 20, 30, 40 x ranks 0..3 = 5010..5013, 5020..5023,
    # 5030..5033: the 6th and 7th of these 12 values are 5021 and 5022
    assert record["extra"]["warmup_steps_skipped"] == 2
    assert record["tokens_per_sec_per_gpu"] == pytest.approx((5021 + 5022) / 2)


def test_torchtitan_mesh_with_unknown_dimensions_sets_no_parallel_sizes():
    text = read("torchtitan_success.log").replace(
        "Building 1-D device mesh with ['dp_shard'], [8]",
        "Building 2-D device mesh with ['dp_shard_mod_ep', 'ep'], [2, 4]")
    record = parse_log(text)
    assert record["extra"]["device_mesh"] == {"dp_shard_mod_ep": 2, "ep": 4}
    assert not {"dp", "world_size"} & set(record)
