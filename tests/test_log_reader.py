"""The generalising log reader (ingest/parsers/log_reader.py, log_config.py) on the development split
of issue 27: line prefixes, key/value layouts, the metric synonym table with its units, configuration
from launcher lines and config dumps, and whole logs of formats no extractor of its own reads.

Each text is either copied from a public thread (URL beside it) or written from the framework's own
format string (source file named beside it); none is from the held-out set in bench/data/heldout/.
"""

from __future__ import annotations

import pytest

from ingest.parsers.log_reader import clean_lines, metric_value, pairs, step_of, strip_prefix
from ingest.parsers.logs import LogNotRecognised, parse_log


@pytest.mark.parametrize("line,message", [
    ("3: [rank24]:[titan] 2025-01-02 10:00:00,123 - root - INFO - step: 5  loss: 7.1", "step: 5  loss: 7.1"),
    ("> > iter 12: loss 3.2, time 100.00ms", "iter 12: loss 3.2, time 100.00ms"),
    ("2024-06-01T12:00:00.123456789Z stdout F [rank0]: step 10 | tokens/s/gpu 3,456", "step 10 | tokens/s/gpu 3,456"),
    ("I0601 12:00:00.123456 140 train.py:123] step=3 mfu=41.2%", "step=3 mfu=41.2%"),
    ("\x1b[32m[rank 0] Step: 10     | Loss: 9.1\x1b[0m", "Step: 10     | Loss: 9.1"),
    ("(TrainWorker pid=4242, ip=10.0.0.7) step: 4, loss: 2.0", "step: 4, loss: 2.0"),
    ("0: [NeMo I 2025-10-02 13:23:36 utils:662] Setting up optimizer", "Setting up optimizer"),
    ("INFO:torchtune.utils._logging:Running with resolved config:", "Running with resolved config:"),
    ("INFO 2024-10-01T12:00:00.123456Z [resource.labels.taskName: workerpool0-0] step 10 | loss 2.3",
     "step 10 | loss 2.3"),
    ("2024-10-01 12:00:00.123 CEST  [rank3]: step=4 tps=1000", "step=4 tps=1000"),
    ("[2023-08-16 16:42:39,674] [INFO] [config.py:957:print]   loss_scale ........ 0", "loss_scale ........ 0"),
])
def test_prefixes_are_stripped(line, message):
    assert strip_prefix(line) == message


def test_clean_lines_keeps_the_line_count():
    text = "a\n\n0: [rank0]: b\n"
    assert clean_lines(text) == ["a", "", "b"]


@pytest.mark.parametrize("line,want", [
    ("step: 22  loss:  6.2250  memory:  1.41GiB(1.79%)  tps: 193,831  mfu: 1.86%",
     {"tokens_per_sec_per_gpu": 193831.0, "peak_memory_gib": 1.41, "mfu": 0.0186}),
    ("loss nan, time 1017.59ms, mfu 14.58%", {"step_time_s": 1.01759, "mfu": 0.1458}),
    ("throughput/device/TPS=258,163", {"tokens_per_sec_per_gpu": 258163.0}),
    ("throughput/device/flopsPS=441.0T", {"tflops_per_gpu": 441.0}),
    ("Train throughput/device/mfu: 0.41", {"mfu": 0.41}),                    # Composer: a fraction
    ("throughput/device/MFU=44.57", {"mfu": 0.4457}),                        # OLMo-core: a percentage
    ("System/Peak GPU Memory (MB)=42,518", {"peak_memory_gib": 41.5215}),     # OLMo: 2^20 bytes
    ("MaxMemAllocated=9.02GB", {"peak_memory_gib": 9.02}),                   # DeepSpeed: /1024**3
    ("train_step_timing in s=0.615", {"step_time_s": 0.615}),
    ("Tokens/s/GPU:  1.54K", {"tokens_per_sec_per_gpu": 1540.0}),
])
def test_metric_synonyms_and_units(line, want):
    got = {}
    for key, raw in pairs(line).items():
        hit = metric_value(key, raw)
        if hit:
            got[hit[0]] = pytest.approx(hit[2], rel=1e-4)
    assert got == want


@pytest.mark.parametrize("line", ["mfu: 0.41", "memory: 9806", "time: 0.004", "Train memory/peak_allocated_mem: 30.1",
                                  "mfu -100.00%"])
def test_a_unit_that_cannot_be_told_is_not_read(line):
    """A bare MFU <= 1 (fraction or percent?), memory or time without a unit, nanoGPT's placeholder."""
    assert [metric_value(k, v) for k, v in pairs(line).items() if metric_value(k, v)] == []


@pytest.mark.parametrize("line,step", [("iter 1631: loss 4.0", 1631), ("step=40, skipped=2", 40), ("0/17, Samples", 17),
                                       ('DLLL {"step": 12, "data": {}}', 12), ("global_step=9e+3, x=1", 9000),
                                       ("[batch=100/4800]:", 100), ("loss: 1.0", None)])
def test_step_numbers(line, step):
    assert step_of(line) == step


# OLMo (allenai/OLMo olmo/train.py Trainer.log_metrics_to_console: "[step=N/M]" then "    name=value")
OLMO = """[step=10/739328]
    train/CrossEntropyLoss=10.46
    train/Perplexity=34,879
    throughput/total_tokens=41,943,040
    throughput/device/tokens_per_second=9,613
    throughput/device/batches_per_second=0.0023
    System/Peak GPU Memory (MB)=42,518
[step=20/739328]
    train/CrossEntropyLoss=9.81
    throughput/device/tokens_per_second=9,655
    System/Peak GPU Memory (MB)=42,518
"""
# Composer (composer/loggers/console_logger.py: "[batch=i/n]:" then "\t Train name: value")
COMPOSER = """[batch=1/4800]:
\t Train time/batch: 0
\t Train throughput/device/tokens_per_sec: 2000.0
[batch=2/4800]:
\t Train throughput/device/tokens_per_sec: 3120.5
\t Train throughput/device/mfu: 0.41
[batch=3/4800]:
\t Train throughput/device/tokens_per_sec: 3131.5
\t Train throughput/device/mfu: 0.42
"""
# NeMo 1.x DLLogger (nemo/utils/loggers/dllogger.py through dllogger's JSONStreamBackend: "DLLL {json}")
DLLOGGER = "\n".join(
    f'DLLL {{"timestamp": "1700000{i}.0", "datetime": "2023-11-14 22:13:2{i}", "elapsedtime": "{i}.5", "type": "LOG", '
    f'"step": {i * 10}, "data": {{"reduced_train_loss": 5.{i}, "train_step_timing in s": 1.5{i}, '
    f'"consumed_samples": {i * 1280}}}}}' for i in range(1, 6))
# picotron (picotron/train.py print_rank_0 of each step, on srun with -l)
PICOTRON = "\n".join(
    f"0: [rank 0] Step: {i:<5} | Loss: 9.{i}234 | Global batch size:   1.05M | Tokens/s: 12.34K | "
    f"Tokens/s/GPU:  1.5{i}K | Tokens:  10.49M | MFU: 30.2{i}% | Memory usage: 40.50GB" for i in range(1, 6))
# Hugging Face Trainer's final metrics block (trainer_pt_utils.log_metrics) under LlamaFactory's YAML
HF_BLOCK = """per_device_train_batch_size: 2
gradient_accumulation_steps: 8
cutoff_len: 2048
bf16: true
***** train metrics *****
  epoch                    =        3.0
  total_flos               = 1234567890GF
  train_loss               =     1.2345
  train_runtime            = 0:10:00.12
  train_samples_per_second =     12.345
  train_steps_per_second   =      0.123
"""


# a key=value block without a step number, its metrics among other pairs (OLMo-core's SpeedMonitor
# names, olmo_core/train/callbacks/speed_monitor.py): one record, not one per metric line
OLMO_CORE_BLOCK = """    optim/total grad norm=0.41
    throughput/device/MFU=40.10
    throughput/device/MFU (actual avg)=30.00
    throughput/device/TPS=100,000
    throughput/device/TPS (actual avg)=90,000
    train/CE loss=3.2
"""


@pytest.mark.parametrize("name,text,want", [
    ("olmo_core_block", OLMO_CORE_BLOCK, {"tokens_per_sec_per_gpu": 100000.0, "mfu": 0.401}),
    ("olmo", OLMO, {"tokens_per_sec_per_gpu": 9655.0, "peak_memory_gib": 41.5215}),
    ("composer", COMPOSER, {"tokens_per_sec_per_gpu": 3126.0, "mfu": 0.415}),  # batch 1 is warm-up
    ("dllogger", DLLOGGER, {"step_time_s": 1.54}),
    ("picotron", PICOTRON, {"tokens_per_sec_per_gpu": 1540.0, "mfu": 0.3023, "peak_memory_gib": 40.5}),
    ("hf_block", HF_BLOCK, {"micro_batch_size": 2, "grad_accum_steps": 8, "precision": "bf16"}),
])
def test_formats_without_an_extractor_are_read(name, text, want):
    record = parse_log(text)
    assert record["status"] == "success"
    for key, value in want.items():
        assert record[key] == (pytest.approx(value, rel=1e-3) if isinstance(value, float) else value), (name, key)


def test_job_wide_rates_stay_in_extra():
    """HF's train_samples_per_second is the whole job's: it is not a per-GPU figure."""
    record = parse_log(HF_BLOCK)
    assert record["extra"]["samples_per_sec"] == pytest.approx(12.345)
    assert "tokens_per_sec_per_gpu" not in record and "seq_len" not in record  # cutoff_len is a maximum


def test_memory_alone_is_refused_with_a_reason():
    with pytest.raises(LogNotRecognised, match="found no training metrics"):
        parse_log("Max CUDA memory allocated was 47 GB\nMax CUDA memory reserved was 55 GB\n")


def test_a_diverged_generic_log():
    text = "\n".join(f"step: {i}, loss: {'nan' if i > 3 else 2.0}, tokens_per_sec_per_gpu: 1000" for i in range(1, 7))
    record = parse_log(text)
    assert (record["status"], record["error_class"]) == ("failed", "divergence")
    assert record["extra"]["first_non_finite_step"] == 4


@pytest.mark.parametrize("text,want", [
    # Megatron-LM command line (examples/gpt3/train_gpt3_175b_distributed.sh) under torchrun
    ("torchrun --nproc_per_node 8 --nnodes 2 pretrain_gpt.py --tensor-model-parallel-size 4 "
     "--pipeline-model-parallel-size 2 --micro-batch-size 1 --global-batch-size 512 --seq-length 4096 --bf16 "
     "--swiglu --use-distributed-optimizer",
     {"gpus_per_node": 8, "nodes": 2, "tp": 4, "pp": 2, "micro_batch_size": 1, "seq_len": 4096,
      "global_batch_tokens": 512 * 4096, "precision": "bf16", "gated_linear_unit": True}),
    # DeepSpeed's config dump (deepspeed/runtime/config.py DeepSpeedConfig.print), as in
    # https://github.com/deepspeedai/DeepSpeed/issues/4158
    ("[2023-08-16 16:42:39,674] [INFO] [config.py:957:print]   train_micro_batch_size_per_gpu  4\n"
     "[2023-08-16 16:42:39,674] [INFO] [config.py:957:print]   zero_optimization_stage ...... 3\n"
     "[2023-08-16 16:42:39,674] [INFO] [config.py:957:print]   gradient_accumulation_steps .... 2\n",
     {"zero_stage": 3, "grad_accum_steps": 2}),
    # NeMo / Megatron-Bridge YAML
    ("trainer:\n  devices: 8\n  num_nodes: 4\nmodel:\n  tensor_model_parallel_size: 2\n"
     "  pipeline_model_parallel_size: 1\n"
     "  context_parallel_size: 2\n  micro_batch_size: 1\n  global_batch_size: 256\n  encoder_seq_length: 8192\n"
     "  activation: fast-swiglu\n",
     {"gpus_per_node": 8, "nodes": 4, "tp": 2, "pp": 1, "cp": 2, "micro_batch_size": 1, "seq_len": 8192,
      "global_batch_tokens": 256 * 8192}),
])
def test_configuration_from_launchers_and_dumps(text, want):
    record = parse_log(text + "\nstep: 1, tokens_per_sec_per_gpu: 100\n")
    for key, value in want.items():
        assert record.get(key) == value, key


@pytest.mark.parametrize("text,glu", [
    ('{"architectures": ["LlamaForCausalLM"], "hidden_act": "silu", "hidden_size": 4096}', True),
    ('{"architectures": ["GPT2LMHeadModel"], "activation_function": "gelu_new"}', False),
    ("  swiglu .......................................... True", True),
    ("  swiglu .......................................... False", False),
    ('{"hidden_act": "silu", "hidden_size": 4096}', None),  # an activation alone says nothing of a gate
    ("activation: fast-swiglu", None),                       # nor a NeMo activation name without swiglu: true
])
def test_gated_linear_unit_only_where_stated(text, glu):
    record = parse_log(text + "\nstep: 1, tokens_per_sec_per_gpu: 100\n")
    assert record.get("gated_linear_unit") is glu


def test_a_value_printed_twice_differently_is_left_out():
    record = parse_log("--micro-batch-size 2\nmicro_batch_size: 4\nstep: 1, tokens_per_sec_per_gpu: 100\n")
    assert "micro_batch_size" not in record
    assert record["extra"]["conflicting_facts"]["micro_batch_size"] == [2, 4]


# LitGPT (litgpt/pretrain.py fit(): "Epoch {e} | iter {i} step {s} | loss train: ..., val: ... | iter time:
# {ms:.2f} ms (step) remaining time: ..." and at the end "Memory used: {max_memory_allocated() / 1e9:.02f} GB")
LITGPT = "\n".join(
    [f"Epoch 1 | iter {i} step {i // 2} | loss train: 3.{i:03d}, val: n/a | iter time: {100 + i % 2 * 80:.2f} ms"
     f"{' (step)' if i % 2 else ''} remaining time: 0:10:00" for i in range(1, 9)]
    + ["Training time: 123.45s", "Memory used: 21.47 GB"])
# Hugging Face Trainer's banner (transformers/trainer.py _inner_training_loop) under Accelerate's state
HF_BANNER = """Distributed environment: MULTI_GPU  Backend: nccl
Num processes: 8
***** Running training *****
  Num examples = 52,002
  Num Epochs = 3
  Instantaneous batch size per device = 4
  Total train batch size (w. parallel, distributed & accumulation) = 128
  Gradient Accumulation steps = 4
  Total optimization steps = 1,218
{'loss': 1.2, 'grad_norm': 0.9, 'epoch': 0.1, 'num_input_tokens_seen': 409600, 'throughput': 10240.5}
"""
# torchrun's elastic agent launch configs, as printed in https://github.com/pytorch/pytorch/issues/79388
TORCHRUN_CONFIGS = """INFO:torch.distributed.launcher.api:Starting elastic_operator with launch configs:
  entrypoint       : launch_mnist.py
  min_nodes        : 2
  max_nodes        : 2
  nproc_per_node   : 4
  rdzv_backend     : c10d
step: 1, tokens_per_sec_per_gpu: 100
"""
# torchtune (torchtune/training/metric_logging.py DiskLogger/StdoutLogger with log_peak_memory_stats)
TORCHTUNE_MEMORY = "\n".join(f"Step {i} | loss:1.{i} lr:2e-05 tokens_per_second_per_gpu:{400 + i} "
                             f"peak_memory_active:20.{i} peak_memory_alloc:20.{i} peak_memory_reserved:24.{i}"
                             for i in range(1, 6))


def test_litgpt_iteration_times_are_kept_as_iterations_not_steps():
    record = parse_log(LITGPT)
    assert record["status"] == "success" and "step_time_s" not in record
    assert record["extra"]["iter_time_s"] == pytest.approx(0.1)  # iterations 4-8: 100, 180, 100, 180, 100 ms
    assert record["peak_memory_gib"] == pytest.approx(21.47e9 / 2**30, rel=1e-4)  # decimal GB


def test_hf_trainer_banner_states_batch_and_processes():
    record = parse_log(HF_BANNER)
    assert (record["world_size"], record["micro_batch_size"], record["grad_accum_steps"]) == (8, 4, 4)
    assert record["extra"]["global_batch_samples"] == 128 and record["extra"]["tokens_per_sec"] == 10240.5
    assert record["status"] == "success" and "tokens_per_sec_per_gpu" not in record  # scope not stated


def test_torchrun_launch_configs_state_nodes_and_gpus_per_node():
    record = parse_log(TORCHRUN_CONFIGS)
    assert (record["nodes"], record["gpus_per_node"]) == (2, 4)
    assert "nodes" not in parse_log(TORCHRUN_CONFIGS.replace("max_nodes        : 2", "max_nodes        : 4"))


def test_torchtune_memory_is_gib_without_a_unit():
    record = parse_log(TORCHTUNE_MEMORY)
    assert record["peak_memory_gib"] == pytest.approx(20.5) and record["reserved_memory_gib"] == pytest.approx(24.5)


def test_deepspeed_launcher_world_info():
    """deepspeed/launcher/launch.py logs "WORLD INFO DICT: {host: [local ranks]}" and "nnodes=..,
    num_local_procs=.., node_rank=.." and "dist_world_size=.." (as in its launcher's own log lines)."""
    text = ("[2024-01-01 00:00:00,000] [INFO] [launch.py:145:main] WORLD INFO DICT: {'gpu-1': [0, 1, 2, 3], "
            "'gpu-2': [0, 1, 2, 3]}\n"
            "[2024-01-01 00:00:00,000] [INFO] [launch.py:151:main] nnodes=2, num_local_procs=4, node_rank=0\n"
            "[2024-01-01 00:00:00,000] [INFO] [launch.py:163:main] dist_world_size=8\n"
            "step: 1, tokens_per_sec_per_gpu: 100\n")
    record = parse_log(text)
    assert (record["nodes"], record["gpus_per_node"], record["world_size"]) == (2, 4, 8)
