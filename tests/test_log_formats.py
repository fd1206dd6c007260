"""Log formats beyond nanotron/Megatron/torchtitan, on real excerpts (tests/data/logs/SOURCES.md
names where each came from). Every expected value was read off the fixture by eye; the comments
say which line. Warm-up rule: of n distinct steps the first min(3, n // 2) are dropped."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.record import REPORTED_FIELDS
from ingest.parsers.log_facts import log_facts
from ingest.parsers.logs import detect_format, parse_log

LOGS = Path(__file__).resolve().parent / "data" / "logs"

NEW_EXPECTED: dict[str, dict] = {
    "megatron_deepspeed_tgs.log": {
        "framework": "megatron-deepspeed", "status": "success",
        # steps 199, 200 -> skip 1 -> iteration 200's line
        "tokens_per_sec_per_gpu": 1126.713, "tflops_per_gpu": 68.63, "step_time_s": 14.5414,
        "seq_len": 4096,  # "actual seqlen:  4096"
        "peak_memory_gib": 19.52,  # MaxMemAllocated=19.52GB
    },
    "nemo2_bionemo.log": {
        "framework": "nemo", "status": "success",
        # global_step 120..125 -> skip 3 -> 0.03157, 0.0317, 0.03147 -> median 0.03157
        "step_time_s": 0.03157,
    },
    "maxtext_pr761.log": {
        "framework": "maxtext", "status": "success",
        "tokens_per_sec_per_gpu": 36653.244, "tflops_per_gpu": 257.929, "step_time_s": 1.341,
        "seq_len": 2048,  # max_target_length=2048 on the command line
        "precision": "bf16",  # dtype=bfloat16
    },
    "maxtext_doc2232.log": {
        "framework": "maxtext", "status": "success",
        "model_params": 15_933_000_000,  # "number parameters: 15.933 billion"
        "tokens_per_sec_per_gpu": 8672.758, "tflops_per_gpu": 134.924, "step_time_s": 5.667,
    },
    "hf_trainer_ddp.log": {
        "framework": "hf-transformers", "status": "success",
        "gpus_per_node": 2,  # torchrun --nproc_per_node 2
        "nodes": 1,  # no --nnodes: torchrun's default 1 (named in extra.derived_fields)
    },
    "deepspeed_flops_profiler.log": {
        "framework": "deepspeed", "status": "success",
        "world_size": 64, "dp": 8, "micro_batch_size": 4,
        "model_params": 17_100_000_000,  # "params of model = params per GPU * mp_size: 17.1 B"
        "tflops_per_gpu": 13.63, "step_time_s": 7.77,
    },
    "megatron_deepspeed_grad_norm_nan.log": {
        "framework": "megatron-deepspeed", "status": "failed", "error_class": "divergence",  # ends on NaN
        # iterations 5426..5428 -> skip 1 -> TFLOPs 78.77, 78.71; ms 4225.8, 4229.2
        "tflops_per_gpu": 78.74, "step_time_s": 4.2275,
        "seq_len": 2048,  # "actual seqlen:  2048"
    },
    "torchtitan_peak_flops_fallback.log": {
        "framework": "torchtitan", "status": "success",
        # steps 14..21 -> skip 3 -> 17..21: tps 7,282 7,322 7,309 7,272 7,304 -> median 7304
        "tokens_per_sec_per_gpu": 7304.0, "tflops_per_gpu": 0.52,
        "peak_memory_gib": 9.46,  # memory:  9.46GiB(64.99%) (reserved)
        "model_params": 6_163_712,  # "Model llama3 debugmodel size: 6,163,712 total parameters"
        "gpu_type": "Tesla T4",  # "CUDA capacity: Tesla T4 with 14.56GiB memory"
    },
    "mmengine_iter.log": {
        "framework": "mmengine", "status": "success",
        # iters 10..50 -> skip 2 -> time 0.004, 0.001, 0.001 -> median 0.001
        "step_time_s": 0.001,
    },
}


@pytest.mark.parametrize("name", sorted(NEW_EXPECTED))
def test_new_format_fixture(name):
    text = (LOGS / name).read_text(encoding="utf-8")
    assert detect_format(text) == NEW_EXPECTED[name]["framework"].replace("hf-transformers", "hf-trainer")
    record = parse_log(text)
    assert set(record) <= set(REPORTED_FIELDS)
    for key, want in NEW_EXPECTED[name].items():
        assert key in record, f"{name}: {key} missing"
        assert record[key] == (pytest.approx(want, rel=1e-5) if isinstance(want, float) else want), key
    # nothing in these logs states a tensor/pipeline/context degree: none is set
    assert not {"tp", "pp", "cp", "ep"} & set(record)


def test_sources_name_every_new_fixture():
    sources = (LOGS / "SOURCES.md").read_text(encoding="utf-8")
    for name in NEW_EXPECTED:
        assert f"| {name} |" in sources


def test_extra_of_the_new_formats():
    hf = parse_log((LOGS / "hf_trainer_ddp.log").read_text())
    assert hf["extra"]["samples_per_sec"] == 1.963 and hf["extra"]["derived_fields"] == ["nodes"]
    ds = parse_log((LOGS / "deepspeed_flops_profiler.log").read_text())
    assert ds["extra"]["samples_per_sec"] == 32.93 and ds["extra"]["model_parallel_size"] == 8


def test_a_diverged_megatron_run_says_so():
    """Megatron prints no "lm loss" when the loss is NaN (only averages > 0) -- bigscience-workshop/
    Megatron-DeepSpeed#396 shows "grad norm: nan" on every line and no loss."""
    record = parse_log((LOGS / "megatron_deepspeed_grad_norm_nan.log").read_text())
    assert record["extra"]["non_finite_steps"] == 3 and record["extra"]["first_non_finite_step"] == 5426
    assert "last_loss" not in record["extra"]
    # its last logged step is still NaN: a diverged run (DESIGN §6), its throughput kept
    assert (record["status"], record["error_class"]) == ("failed", "divergence")
    assert "step 5428" in record["error_message"] and record["tflops_per_gpu"] > 0


def test_last_loss_is_the_last_steps_not_an_earlier_one():
    """epfLLM/Megatron-LLM#33: the loss went NaN at iteration 3385, whose line has no "lm loss"
    (the issue's lines, the third up to where the excerpt ends)."""
    text = "\n".join([
        "iteration     3383/    8000 | consumed samples:       216512 | elapsed time per iteration (ms): 7613.1 | "
        "learning rate: 6.680E-06 | global batch size:    64 | lm loss: 7.334521E-01 | loss scale: 1.0 | grad norm: "
        "0.752 | number of skipped iterations:   0 | number of nan iterations:   0 |",
        "iteration     3384/    8000 | consumed samples:       216576 | elapsed time per iteration (ms): 7845.5 | "
        "learning rate: 6.678E-06 | global batch size:    64 | lm loss: 7.072597E-01 | loss scale: 1.0 | grad norm: "
        "0.741 | number of skipped iterations:   0 | number of nan iterations:   0 |",
        "iteration     3385/    8000 | consumed samples:       216640 | elapsed time per iteration (ms): 7624.3 | "
        "learning rate: 6.676E-06 | global batch size:    64 | loss scale: 1.0 |",
    ])
    extra = parse_log(text)["extra"]
    assert extra["last_step"] == 3385 and "last_loss" not in extra  # not 3384's 0.7072597
    assert parse_log(text.rsplit("\n", 1)[0])["extra"]["last_loss"] == pytest.approx(0.7072597)


def test_torchtitan_mfu_against_an_assumed_peak_is_left_out():
    """torchtitan/tools/utils.py get_peak_flops: an unknown device's MFU is computed against the
    A100's peak ("Peak flops undefined for: Tesla T4, fallback to A100"): 0.52 TFLOP/s / 312 =
    "mfu: 0.17%" on a T4. That is not the run's MFU: left out, and said so."""
    text = (LOGS / "torchtitan_peak_flops_fallback.log").read_text()
    record = parse_log(text)
    assert "mfu" not in record
    assert "Tesla T4, fallback to A100" in record["extra"]["mfu_not_kept"]
    assert "3.12e+14" in record["extra"]["mfu_not_kept"]
    # the same step lines without the warning: torchtitan knew the peak, its MFU is kept
    steps = "\n".join(line for line in text.splitlines() if " step: " in line)
    assert parse_log(steps)["mfu"] == pytest.approx(0.0017)


def test_tokens_per_gpu_from_batch_or_samples_when_seq_len_and_world_are_given():
    nemo = parse_log((LOGS / "nemo2_bionemo.log").read_text(), seq_len=1024, world_size=1)
    # global_batch_size 1 sample x 1024 tokens / 0.03157 s / 1 GPU
    assert nemo["tokens_per_sec_per_gpu"] == pytest.approx(1024 / 0.03157, rel=1e-5)
    assert "tokens_per_sec_per_gpu" in nemo["extra"]["derived_fields"]
    hf = parse_log((LOGS / "hf_trainer_ddp.log").read_text(), seq_len=1024)
    # 1.963 samples/s (whole job) x 1024 tokens / 2 GPUs
    assert hf["tokens_per_sec_per_gpu"] == pytest.approx(1.963 * 1024 / 2, rel=1e-5)


def test_format_can_be_forced():
    text = (LOGS / "maxtext_pr761.log").read_text()
    assert parse_log(text, log_format="maxtext")["framework"] == "maxtext"
    with pytest.raises(ValueError, match="unknown log format 'maxtxt'"):
        parse_log(text, log_format="maxtxt")


@pytest.mark.parametrize("text,want", [
    # launcher lines
    ("mpirun --np 16 python train.py", {"world_size": 16}),
    ("mpiexec --verbose --envall -n 8 -ppn 4 --hostfile /var/spool/pbs/aux/1777928 python x.py",  # ALCF README
     {"world_size": 8, "gpus_per_node": 4}),
    ("NGPU=4 ./run_train.sh", {"gpus_per_node": 4, "nodes": 1}),
    ("torchrun --nnodes=2 --nproc_per_node=8 train.py", {"gpus_per_node": 8, "nodes": 2}),
    ("torchrun --nnodes=1:4 --nproc-per-node 8 train.py", {"gpus_per_node": 8}),  # a range says nothing
    ("WORLD_SIZE=32\nSLURM_NNODES=4\n", {"world_size": 32, "nodes": 4}),
    # Megatron-LM arguments.py
    (("using world size: 16, data-parallel size: 2, context-parallel size: 1, hierarchical context-parallel "
     "sizes: None, tensor-model-parallel size: 4, encoder-tensor-model-parallel size: 0, pipeline-model-parallel "
     "size: 2, encoder-pipeline-model-parallel size: 0"),
     {"world_size": 16, "dp": 2, "cp": 1, "tp": 4, "pp": 2}),
    # torchtitan command line: CP stated there
    (("torchrun --nproc_per_node=8 -m torchtitan.train --parallelism.context_parallel_degree 2 "
     "--parallelism.data_parallel_shard_degree -1 --training.seq_len 65536"),
     {"cp": 2, "seq_len": 65536, "gpus_per_node": 8}),
    # device names: huggingface/transformers#9415 ("1: Tesla V100-PCIE-32GB"), nvidia-smi
    ("0: Tesla V100-PCIE-32GB\n1: Tesla V100-PCIE-32GB\n", {"gpu_type": "Tesla V100-PCIE-32GB"}),
    # torchtitan's "CUDA capacity" line (pytorch/torchtitan#3393); a one-digit model number
    ("[titan] - root - INFO - CUDA capacity: Tesla T4 with 14.56GiB memory", {"gpu_type": "Tesla T4"}),
    ("|   0  NVIDIA H100 80GB HBM3          On  | 00000000:18:00.0 Off |", {"gpu_type": "NVIDIA H100 80GB HBM3"}),
    # parameter counts
    ("Total number of parameters: 1.71G (3264.00MiB)", {"model_params": 1_710_000_000}),
    ("24.2 B    Total params\n", {"model_params": 24_200_000_000}),
    ("NCCL INFO NCCL version 2.21.5+cuda12.4", {"nccl_version": "2.21.5"}),
])
def test_log_facts(text, want):
    fields, _extra, _derived = log_facts(text)
    assert {k: fields.get(k) for k in want} == want
    assert not {"tp", "pp", "cp", "dp", "ep"} - set(want) & set(fields)


def test_conflicting_facts_are_left_out():
    fields, extra, _ = log_facts("WORLD_SIZE=16\nmpirun -np 32 python x.py\n"
                                 "NVIDIA H100 80GB HBM3\nNVIDIA A100-SXM4-80GB")
    assert "world_size" not in fields and extra["conflicting_facts"]["world_size"] == [16, 32]
    assert "gpu_type" not in fields and len(extra["gpu_types_seen"]) == 2


def test_a_restarted_megatron_log_reports_its_last_line_not_the_first_attempt():
    """A requeued job appends to the same log and logs steps 60, 70, 80 again; its last step went NaN
    (Megatron then prints no lm loss): the first attempt's healthy step-100 loss must not be reported."""
    from ingest.parsers import logs

    def line(it: int, nan: bool = False) -> str:
        return (f" iteration {it:>8}/    1000 | consumed samples: {it * 8:>8} | elapsed time per iteration (ms):"
                f" 500.0 | learning rate: 1.0E-04 | global batch size:     8 |"
                + ("" if nan else " lm loss: 6.000000E+00 |")
                + f" loss scale: 1.0 | grad norm: {'nan' if nan else '1.000'} | number of skipped iterations:   0 |"
                f" number of nan iterations:   {1 if nan else 0} |")

    text = "\n".join([line(i) for i in range(10, 101, 10)] + [line(60), line(70), line(80, nan=True)])
    extra = logs.parse_log(text)["extra"]
    assert extra["last_step"] == 80 and "last_loss" not in extra
    assert extra["non_finite_steps"] == 1 and extra["first_non_finite_step"] == 80
    recovered = logs.parse_log("\n".join([line(i) for i in range(10, 61, 10)] + [line(70, nan=True), line(80)]))
    assert recovered["status"] == "success" and recovered["extra"]["non_finite_steps"] == 1  # a skipped step


def test_a_device_index_is_not_a_gpu_type():
    from ingest.parsers.log_facts import log_facts

    assert log_facts("Found NVIDIA GPU0 on host\nGPU 0: NVIDIA L4\n")[0].get("gpu_type") == "NVIDIA L4"
    assert log_facts("device: Tesla T4\n")[0].get("gpu_type") == "Tesla T4"
