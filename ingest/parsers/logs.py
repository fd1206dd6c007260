"""Training-log parser: one training log -> one run record, or a refusal.

Formats: nanotron, Megatron-LM and its forks (Megatron-DeepSpeed's ``tgs`` / ``TFLOPs``),
torchtitan (here), NeMo 2.0 / Megatron-Bridge, MaxText, MMEngine / XTuner, Hugging Face Trainer /
Accelerate, DeepSpeed flops profiler (:mod:`ingest.parsers.log_formats`), and torchrun / Slurm
failures (:mod:`ingest.classify`). Configuration facts any log prints (launcher lines, parallel
sizes, device names, parameter counts, versions) come from :mod:`ingest.parsers.log_facts`.

Standard library only. :func:`parse_log` reads a whole log (all ranks, stdout and stderr together
is fine) and returns ONE run-record dict whose keys are those of
:data:`core.record.REPORTED_FIELDS`; keys the log says nothing about are left out.

Line formats understood (checked against the frameworks' own format strings):

* nanotron -- ``src/nanotron/logging/base.py`` ``LoggerWriter.add_scalars_from_list`` prints the
  line that ``src/nanotron/trainer.py`` ``DistributedTrainer.train_step_logs`` assembles::

    iteration: 10 / 20 | consumed_tokens: 10.5M | elapsed_time_per_iteration_ms: 3.27K |
    tokens_per_sec: 321K | tokens_per_sec_per_gpu: 40.1K | global_batch_size: 256 | lm_loss: 8.12 |
    lr: 0.000285 | model_tflops_per_gpu: 387 | hardware_tflops_per_gpu: 387 | grad_norm: 1.2 ...

  (values in nanotron's ``human_format``: K/M/B/T = 10^3/10^6/10^9/10^12; newer versions say
  ``time_per_iteration_ms``), ``log_memory`` prints ``Memory usage: ..MiB. Peak allocated ..MiB.
  Peak reserved: ..MiB``, ``DistributedTrainer.pre_training`` prints ``mbs: 2 | grad_accum: 16 |
  ... sequence_length: 4096 | global_batch_size: 256 ...`` (global batch in samples), and the
  trainer logs ``pformat(config)`` (``ParallelismArgs(dp=.., pp=.., tp=..``, ``LlamaConfig(...)``).
* Megatron-LM -- ``megatron/training/training.py`` ``training_log``::

    [2024-11-05 14:02:11] iteration       10/     100 | consumed samples:  1280 |
    elapsed time per iteration (ms): 6123.4 | throughput per GPU (TFLOP/s/GPU): 292.3 |
    learning rate: 1.500000E-05 | global batch size:   128 | lm loss: 1.162543E+01 | ...

  ``megatron/training/utils.py`` ``report_memory`` prints ``[Rank 0] (after 10 iterations) memory
  (MB) | allocated: .. | max allocated: .. | reserved: .. | max reserved: ..`` (older versions:
  ``cached``; the "MB" are 2^20 bytes), and ``megatron/training/arguments.py`` ``_print_args``
  prints ``  seq_length ........ 4096`` for every argument.
* torchtitan -- ``torchtitan/components/metrics.py`` ``MetricsProcessor.log`` (formerly in
  ``train.py``), with or without its ANSI colours::

    step: 10  loss:  7.9012  grad_norm: 1.23  memory: 30.52GiB(38.62%)  tps: 5,762  tflops: 300.12  mfu: 30.35%

  ``memory`` is the peak *reserved* memory and ``tps`` is tokens per second per GPU. ``mfu`` is
  kept only when torchtitan knew the device's peak: for a device missing from its table
  ``torchtitan/tools/utils.py`` ``get_peak_flops`` warns ``Peak flops undefined for: Tesla T4,
  fallback to A100`` and divides by the A100's 312 TFLOPS (``Peak FLOPS used for computing MFU:
  3.120e+14``) -- that MFU is not the run's, so it is left out and ``extra.mfu_not_kept`` says why
  (TFLOPs and tokens/s do not depend on the peak and are kept). ``train.py`` also logs
  ``Model llama3 8B size: 8,030,261,248 total parameters``, ``Building 1-D device mesh
  with ['dp_shard'], [8]`` and ``Training starts at step 1, with local batch size 1, global batch
  size 8, sequence length 8192, ...``.
* torchrun / Slurm stderr: the failure is the first root cause found by
  :func:`ingest.classify.classify_text`.

Reduction rules
* Warm-up: of ``n`` distinct logged steps, the records of the first ``min(3, n // 2)`` are dropped
  (compilation, allocator warm-up and NCCL setup make them slow; Megatron's first record also
  averages over the warm-up iterations); throughput, TFLOPs, MFU and step time are the MEDIAN of
  the remaining records (of every rank that prints them).
* Memory: the maximum over every memory line of the log (all steps, all ranks that print one), in
  GiB (2^30 bytes); ``MiB``/``MB`` are read as 2^20 bytes and ``GiB``/``GB`` as 2^30 bytes, as these
  frameworks print them. torchtitan reports only reserved memory: it fills ``reserved_memory_gib``
  and, as the only peak it prints (an upper bound of allocated memory), ``peak_memory_gib``
  (``extra.peak_memory_is_reserved`` says so).
* Megatron prints no tokens/s: ``tokens_per_sec_per_gpu = global batch size x seq_len / step time
  / world_size`` when seq_len and world size are known (from its argument dump or from ``fields``).
* Status: the root cause's status when the log shows a failure (a run may fail after logging
  throughput: the numbers are kept), else ``success`` when training records were seen. A log with
  neither is refused (:class:`LogNotRecognised`): nothing is guessed.
* Loss: ``extra.last_loss`` is the loss printed for the last logged step, or absent when that step
  printed none. Steps whose loss or grad norm was NaN/inf (Megatron: ``grad norm: nan`` or ``number
  of nan iterations: N`` > 0 -- it omits a NaN ``lm loss`` from the line) are counted, as logged
  steps (one Megatron line covers its log interval), in ``extra.non_finite_steps`` /
  ``extra.first_non_finite_step``. A run whose LAST logged step is non-finite diverged: ``status =
  failed``, ``error_class = divergence`` (DESIGN §6), unless the log shows a more specific failure than
  a symptom (``child_process_failed``, ``unknown``); a run that recovered from a non-finite step (fp16
  loss scaling skips such steps) keeps the status its log shows.
* Never a guess: a parallel degree the log does not state is left out (the server derives it only
  where ``tp·pp·cp·dp = world_size`` determines it). Values computed here from printed numbers
  (tokens/s/GPU from batch x sequence / step time / world size; nodes from torchrun's default) are
  named in ``extra.derived_fields``.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Callable
from typing import Any

from core.record import ALIASES, COUNT_SUFFIXES, REPORTED_FIELDS
from ingest.classify import SYMPTOMS, classify_text, status_for
from ingest.parsers import log_formats
from ingest.parsers.log_facts import log_facts

__all__ = ["FORMATS", "FRAMEWORK", "LogNotRecognised", "WARMUP_RECORDS", "detect_format", "parse_log"]

#: Log formats :func:`detect_format` can return ("unknown": no training-step lines, e.g. a
#: torchrun/Slurm stderr file; it is parsed for failures only).
FORMATS = ("nanotron", "megatron", "megatron-deepspeed", "torchtitan", "nemo", "maxtext", "mmengine",
           "hf-trainer", "deepspeed", "unknown")
#: ``framework`` value written for each format.
FRAMEWORK = {"nanotron": "nanotron", "megatron": "megatron-lm", "megatron-deepspeed": "megatron-deepspeed",
             "torchtitan": "torchtitan", "nemo": "nemo", "maxtext": "maxtext", "mmengine": "mmengine",
             "hf-trainer": "hf-transformers", "deepspeed": "deepspeed"}
#: What a log must show to be imported (the refusal message names it).
LOOKED_FOR = ("training-step lines of a known format (" + ", ".join(FORMATS[:-1]) + ") or a failure line "
              "(CUDA/NCCL/torch.distributed errors, OOM, Slurm time limit or cancellation)")


class LogNotRecognised(ValueError):
    """The log shows neither training records of a known format nor a recognised failure."""
#: At most this many leading logged steps are treated as warm-up.
WARMUP_RECORDS = 3
#: Longest error_message kept.
MAX_MESSAGE = 2000

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"

# (No leading \b: a pattern that starts with a literal is searched much faster by `re`.)
_NANOTRON_ITER = re.compile(r"iteration: (\d+) / (\d+) \|(.*)$", re.M)
_MEGATRON_ITER = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|(.*)$", re.M)
_TITAN_STEP = re.compile(r"step:(?<!validate step:)(?<!validation step:)\s*(\d+)\s+loss:\s*(\S+)(.*)$", re.M)

_UNITS_GIB = {"kib": 2.0**-20, "kb": 2.0**-20, "mib": 2.0**-10, "mb": 2.0**-10, "gib": 1.0, "gb": 1.0}


def _human(value: str) -> float | None:
    """nanotron's ``human_format`` back to a number: '3.27K' -> 3270.0, '1.87e-05' -> 1.87e-05."""
    m = re.fullmatch(rf"\s*({_NUM})\s*([KMBGTPE]?)\s*", value)
    return float(m.group(1)) * COUNT_SUFFIXES[m.group(2)] if m else None


def _number(value: str) -> float | None:
    """'5,762' -> 5762.0, '30.35%' -> 30.35, junk -> None."""
    m = re.fullmatch(rf"\s*({_NUM})\s*%?\s*", value.replace(",", ""))
    return float(m.group(1)) if m else None


def _to_gib(value: float, unit: str) -> float:
    """Convert ``value`` in ``unit`` (MiB, MB, GiB, ...) to GiB, rounded to 4 decimals."""
    return round(value * _UNITS_GIB[unit.lower()], 4)


def _non_finite(*values: str | None) -> bool:
    """Whether any printed value is NaN or infinite ('nan', 'inf', '-inf', 'nan.0')."""
    return any(v is not None and re.fullmatch(r"\s*[-+]?(?:nan|inf)(?:\.0)?\s*", v, re.I) is not None
               for v in values)


def _max(values: list[float]) -> float | None:
    return max(values) if values else None


def detect_format(text: str) -> str:
    """'nanotron', 'megatron', 'torchtitan' (whichever training-record line occurs most), or
    'unknown' when the log has none of them (e.g. a torchrun/Slurm stderr file)."""
    clean = _ANSI.sub("", text)
    megatron = [m.group(3) for m in _MEGATRON_ITER.finditer(clean) if "elapsed time per iteration" in m.group(3)]
    fork = sum(1 for body in megatron if "tokens per gpu per second" in body or "TFLOPs:" in body)
    counts = {
        "nanotron": len(_NANOTRON_ITER.findall(clean)),
        "megatron-deepspeed" if fork * 2 > len(megatron) else "megatron": len(megatron),
        "torchtitan": len(_TITAN_STEP.findall(clean)),
    }
    counts.update({name: count(clean) for name, count in log_formats.COUNTERS.items()})
    best = max(counts, key=lambda k: counts[k])
    return best if counts[best] else "unknown"


# --- per-format extraction ---------------------------------------------------------------------
# Each returns (records, memory, config, extra): records are dicts with any of tokens_per_sec_per_gpu,
# tflops_per_gpu, mfu, step_time_s (+ step, and raw extras); memory has peak/reserved GiB.


def _nanotron(text: str) -> tuple[list[dict], dict, dict, dict]:
    records = []
    for m in _NANOTRON_ITER.finditer(text):
        raw = log_formats.pipe_pairs(m.group(3))
        kv = {k: _human(v) for k, v in raw.items()}
        ms = kv.get("elapsed_time_per_iteration_ms", kv.get("time_per_iteration_ms"))
        records.append(
            {
                "step": int(m.group(1)),
                "tokens_per_sec_per_gpu": kv.get("tokens_per_sec_per_gpu"),
                "tflops_per_gpu": kv.get("model_tflops_per_gpu"),
                "step_time_s": ms / 1000.0 if ms is not None else None,
                "hardware_tflops_per_gpu": kv.get("hardware_tflops_per_gpu"),
                "loss": kv.get("lm_loss"),
                "max_reserved_bytes": kv.get("cuda_max_memory_reserved"),
                "non_finite": _non_finite(raw.get("lm_loss"), raw.get("grad_norm")),
            }
        )
    unit = r"\s*([KMG]i?B)"
    peak = [_to_gib(float(v), u) for v, u in re.findall(rf"[Pp]eak[ _]allocated:?\s*({_NUM}){unit}", text)]
    res = [_to_gib(float(v), u) for v, u in re.findall(rf"[Pp]eak[ _]reserved:?\s*({_NUM}){unit}", text)]
    if not res:  # iteration lines may carry cuda_max_memory_reserved in bytes (human_format)
        res = [round(r["max_reserved_bytes"] / 2**30, 4) for r in records if r["max_reserved_bytes"]]
    memory = {"peak": _max(peak), "reserved": _max(res)}

    config: dict[str, Any] = {}
    start = re.search(r"\bmbs: \d+ \|.*$", text, re.M)
    if start:
        kv = {k: _number(v) for k, v in log_formats.pipe_pairs(start.group(0)).items()}
        mbs, gas, seq, gbs = (kv.get(k) for k in ("mbs", "grad_accum", "sequence_length", "global_batch_size"))
        config.update(micro_batch_size=mbs, grad_accum_steps=gas, seq_len=seq)
        if gbs and seq:
            config["global_batch_tokens"] = gbs * seq  # nanotron's global_batch_size is in samples

    def window(anchor: str, keys: dict[str, str]) -> None:
        at = text.find(anchor)
        if at < 0:
            return
        chunk = text[at : at + 6000]
        for name, field in keys.items():
            m = re.search(rf"\b{name}=(\d+)\b", chunk)
            if m and config.get(field) is None:
                config[field] = int(m.group(1))

    window("ParallelismArgs(", {"dp": "dp", "pp": "pp", "tp": "tp",
                                "context_parallel_size": "cp", "expert_parallel_size": "ep"})
    # nanotron's world is dp x tp x pp x cp (left out when expert parallelism is on: not checked)
    if all(config.get(k) for k in ("dp", "tp", "pp")) and (config.get("ep") or 1) == 1:
        config["world_size"] = config["dp"] * config["tp"] * config["pp"] * (config.get("cp") or 1)
    window("OptimizerArgs(", {"zero_stage": "zero_stage"})
    window("TokensArgs(", {"sequence_length": "seq_len", "micro_batch_size": "micro_batch_size",
                           "batch_accumulation_per_replica": "grad_accum_steps"})
    found = re.search(r"\b\w+Config\((?=[^)]*hidden_size=)", text)
    if found:
        window(found.group(0), {"hidden_size": "hidden_size", "num_hidden_layers": "num_layers",
                            "num_attention_heads": "num_heads", "num_key_value_heads": "num_kv_heads",
                            "intermediate_size": "ffn_hidden_size", "vocab_size": "vocab_size"})
    return records, memory, config, {}


# megatron/training/arguments.py _print_args: "  seq_length ........ 4096" (optional srun -l label)
_MEGATRON_ARG = re.compile(r"^[ \t]*(?:\d+:[ \t]*)?([a-z_][a-z0-9_]*) \.{3,} (\S[^\n]*?)[ \t]*$", re.M)
_MEGATRON_ARGS = {
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
    "context_parallel_size": "cp",
    "expert_model_parallel_size": "ep",
    "data_parallel_size": "dp",
    "world_size": "world_size",
    "micro_batch_size": "micro_batch_size",
    "seq_length": "seq_len",
    "num_layers": "num_layers",
    "hidden_size": "hidden_size",
    "num_attention_heads": "num_heads",
    "ffn_hidden_size": "ffn_hidden_size",
    "padded_vocab_size": "vocab_size",
}


def _megatron(text: str) -> tuple[list[dict], dict, dict, dict]:
    args = dict(_MEGATRON_ARG.findall(text))
    config: dict[str, Any] = {}
    for name, field in _MEGATRON_ARGS.items():
        if re.fullmatch(r"\d+", args.get(name, "")):
            config[field] = int(args[name])
    if args.get("num_query_groups", "").isdigit() and args.get("group_query_attention") == "True":
        config["num_kv_heads"] = int(args["num_query_groups"])
    elif args.get("group_query_attention") == "False" and "num_heads" in config:
        config["num_kv_heads"] = config["num_heads"]
    if args.get("recompute_granularity") in ("None", "selective", "full"):
        config["recompute"] = {"None": "none"}.get(args["recompute_granularity"], args["recompute_granularity"])
    if args.get("fp8") not in (None, "None"):
        config["precision"] = "fp8"
    elif args.get("bf16") == "True":
        config["precision"] = "bf16"
    elif args.get("fp16") == "True":
        config["precision"] = "fp16"
    if args.get("use_distributed_optimizer") in ("True", "False"):
        config["zero_stage"] = 1 if args["use_distributed_optimizer"] == "True" else 0
    gbs_arg = args.get("global_batch_size", "")
    if gbs_arg.isdigit() and "seq_len" in config:
        config["global_batch_tokens"] = int(gbs_arg) * config["seq_len"]
    if gbs_arg.isdigit() and {"micro_batch_size", "dp"} <= config.keys():
        gas, rem = divmod(int(gbs_arg), config["micro_batch_size"] * config["dp"])
        if gas and not rem:
            config["grad_accum_steps"] = gas

    records = []
    for m in _MEGATRON_ITER.finditer(text):
        kv = log_formats.pipe_pairs(m.group(3))
        if "elapsed time per iteration (ms)" not in kv:
            continue
        ms = _number(kv["elapsed time per iteration (ms)"])
        tflops = kv.get("throughput per GPU (TFLOP/s/GPU)", kv.get("TFLOPs", ""))  # forks print "TFLOPs"
        records.append(
            {
                "step": int(m.group(1)),
                "tflops_per_gpu": _number(tflops),
                "tokens_per_sec_per_gpu": _number(kv.get("tokens per gpu per second (tgs)", "")),
                "step_time_s": ms / 1000.0 if ms is not None else None,
                "global_batch_size": _number(kv.get("global batch size", "")),
                "loss": _number(kv.get("lm loss", "")),
                # Megatron leaves a NaN loss out of the line (it prints only averages > 0), so a
                # non-finite grad norm or a nonzero "number of nan iterations" is what shows it
                "non_finite": _non_finite(kv.get("lm loss"), kv.get("grad norm"))
                or (_number(kv.get("number of nan iterations", "")) or 0) > 0,
            }
        )
        seqlen = _number(kv.get("actual seqlen", ""))  # Megatron-DeepSpeed
        if seqlen and "seq_len" not in config:
            config["seq_len"] = int(seqlen)
    mem = re.findall(
        rf"memory \(MB\) \| allocated: ({_NUM}) \| max allocated: ({_NUM}) \| "
        rf"(?:reserved|cached): ({_NUM}) \| max (?:reserved|cached): ({_NUM})",
        text,
    )
    # DeepSpeed's timer: MaxMemAllocated=19.52GB is torch.cuda.max_memory_allocated() / 2**30
    ds_peak = [float(v) for v in re.findall(rf"MaxMemAllocated=({_NUM})GB", text)]
    memory = {
        "peak": _max([_to_gib(float(m[1]), "MiB") for m in mem] + ds_peak),
        "reserved": _max([_to_gib(float(m[3]), "MiB") for m in mem]),
    }
    return records, memory, config, {}


def _torchtitan(text: str) -> tuple[list[dict], dict, dict, dict]:
    records, reserved = [], []
    for m in _TITAN_STEP.finditer(text):
        rest = m.group(3)

        def grab(pattern: str, rest: str = rest) -> float | None:
            hit = re.search(pattern, rest)
            return _number(hit.group(1)) if hit else None

        mem = re.search(rf"memory:\s*({_NUM})\s*(GiB|GB|MiB)", rest)
        if mem:
            reserved.append(_to_gib(float(mem.group(1)), mem.group(2)))
        mfu = grab(rf"mfu:\s*({_NUM})%")
        step_time = grab(rf"elapsed_time_per_step:\s*({_NUM})s")
        records.append(
            {
                "step": int(m.group(1)),
                "tokens_per_sec_per_gpu": grab(r"tps:\s*([\d,]+(?:\.\d+)?)"),
                "tflops_per_gpu": grab(r"tflops:\s*([\d,]+(?:\.\d+)?)"),
                "mfu": mfu / 100.0 if mfu is not None else None,
                "step_time_s": step_time,
                "loss": _number(m.group(2)),
                "non_finite": _non_finite(m.group(2), (re.findall(r"grad_norm:\s*(\S+)", rest) or [None])[0]),
            }
        )
    config: dict[str, Any] = {}
    extra: dict[str, Any] = {}
    found = re.search(r"size:\s*([\d,]+) total parameters", text)
    if found:
        config["model_params"] = int(found.group(1).replace(",", ""))
    found = re.search(r"sequence length (\d+)", text)
    if found:
        config["seq_len"] = int(found.group(1))
        g = re.search(r"global batch size (\d+)", text)
        if g:
            config["global_batch_tokens"] = int(g.group(1)) * config["seq_len"]
    found = re.search(r"Building \d+-D device mesh with \[([^\]]*)\], \[([\d,\s]*)\]", text)
    if found:
        names = re.findall(r"'(\w+)'", found.group(1))
        sizes = [int(s) for s in re.findall(r"\d+", found.group(2))]
        dims = dict(zip(names, sizes))
        extra["device_mesh"] = dims
        # Only a mesh of the usual disjoint dimensions says what dp/tp/pp/cp and the world are.
        if dims and set(dims) <= {"dp", "dp_shard", "dp_replicate", "tp", "pp", "cp"}:
            config["dp"] = dims.get("dp", 1) * dims.get("dp_shard", 1) * dims.get("dp_replicate", 1)
            for name in ("tp", "pp", "cp"):
                if name in dims:
                    config[name] = dims[name]
            world = 1
            for size in dims.values():
                world *= size
            config["world_size"] = world
    fallback = re.search(r"Peak flops undefined for:? *([^\n]*)", text)
    if fallback and any(r["mfu"] is not None for r in records):
        for r in records:
            r["mfu"] = None
        peak = re.search(rf"Peak FLOPS used for computing MFU: ({_NUM})", text)
        extra["mfu_not_kept"] = (f"torchtitan divided by a peak it assumed ('Peak flops undefined for: "
                                 f"{fallback.group(1).strip()}'"
                                 + (f"; peak used {float(peak.group(1)):.4g} FLOP/s" if peak else "") + ")")
    memory = {"peak": _max(reserved), "reserved": _max(reserved)}
    if reserved:
        extra["peak_memory_is_reserved"] = True
    return records, memory, config, extra


_EXTRACTORS: dict[str, Callable[[str], tuple[list[dict], dict, dict, dict]]] = {
    "nanotron": _nanotron,
    "megatron": _megatron,
    "megatron-deepspeed": _megatron,
    "torchtitan": _torchtitan,
    **log_formats.EXTRACTORS,
}


# --- assembling the record ---------------------------------------------------------------------


def _normalise_fields(fields: dict[str, Any]) -> dict[str, Any]:
    """Map accepted aliases (``mbs`` -> ``micro_batch_size``) and refuse unknown field names."""
    out = {}
    for key, value in fields.items():
        name = ALIASES.get(key, key)
        if name not in REPORTED_FIELDS:
            raise ValueError(f"unknown run field {key!r}")
        out[name] = value
    return out


def _median(records: list[dict], key: str) -> float | None:
    """Median of ``key`` over ``records`` (6 significant digits), None when no record has it."""
    values = [r[key] for r in records if r.get(key) is not None]
    return float(f"{statistics.median(values):.6g}") if values else None


def parse_log(text: str, log_format: str | None = None, **fields: Any) -> dict[str, Any]:
    """One run record from one training log; ``fields`` (user-supplied run fields, aliases
    accepted) override what the log says; ``log_format`` (one of :data:`FORMATS`) skips detection.
    See the module docstring for the rules.

    Raises :class:`LogNotRecognised` (a ValueError) when the log has no training records and no
    recognised failure, ValueError for an unknown field or format name."""
    user = _normalise_fields(fields)
    clean = _ANSI.sub("", text)
    if log_format is not None and log_format not in FORMATS:
        raise ValueError(f"unknown log format {log_format!r}; one of {', '.join(FORMATS)}")
    fmt = log_format or detect_format(clean)
    record: dict[str, Any] = {"source": "log"}
    extra: dict[str, Any] = {"log_format": fmt}
    facts, facts_extra, derived = log_facts(clean)
    record.update(facts)
    extra.update(facts_extra)
    records: list[dict] = []
    diverged: str | None = None
    if fmt in _EXTRACTORS:
        record["framework"] = FRAMEWORK[fmt]
        records, memory, config, fmt_extra = _EXTRACTORS[fmt](clean)
        for key, value in config.items():
            if value is None:
                continue
            value = int(value) if isinstance(value, float) and value.is_integer() else value
            if key in facts and facts[key] != value:
                extra.setdefault("conflicting_facts", {})[key] = [facts[key], value]
            record[key] = value  # the framework's own statement wins over a launcher line
            if key in derived:
                derived.remove(key)
        extra.update(fmt_extra)
        if memory["peak"] is not None:
            record["peak_memory_gib"] = memory["peak"]
        if memory["reserved"] is not None:
            record["reserved_memory_gib"] = memory["reserved"]

    # Warm-up is counted in distinct steps: without --local-ranks-filter every rank prints its line.
    steps = list(dict.fromkeys(r["step"] for r in records))
    skip = min(WARMUP_RECORDS, len(steps) // 2)
    warmup = set(steps[:skip])
    steady = [r for r in records if r["step"] not in warmup]
    # Frameworks that print batch size and step time (or samples/s) but no tokens/s per GPU:
    # tokens/s/GPU = global batch (samples) x seq_len / step time / world size, or
    # samples/s x seq_len / world size -- only when seq_len and the world size are known.
    seq = user.get("seq_len", record.get("seq_len"))
    world = user.get("world_size", record.get("world_size"))
    nodes, gpn = user.get("nodes", record.get("nodes")), user.get("gpus_per_node", record.get("gpus_per_node"))
    if world is None and nodes and gpn:
        world = nodes * gpn
    computed = False
    for r in records:
        if r.get("tokens_per_sec_per_gpu") is not None or not (seq and world):
            continue
        if r.get("step_time_s") and r.get("global_batch_size"):
            r["tokens_per_sec_per_gpu"] = r["global_batch_size"] * seq / r["step_time_s"] / world
            computed = True
        elif r.get("samples_per_sec"):
            r["tokens_per_sec_per_gpu"] = r["samples_per_sec"] * seq / world
            computed = True
    for key in ("tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu", "step_time_s"):
        value = _median(steady, key)
        if value is not None:
            record[key] = value
    if computed and "tokens_per_sec_per_gpu" in record:
        derived.append("tokens_per_sec_per_gpu")
    samples = _median(steady, "samples_per_sec")
    if samples is not None:
        extra["samples_per_sec"] = samples  # whole job, every process
    hardware_tflops = _median(steady, "hardware_tflops_per_gpu")  # nanotron's HFU numerator
    if hardware_tflops is not None:
        extra["hardware_tflops_per_gpu"] = hardware_tflops
    if records:
        extra.update(
            steps_logged=len(steps),
            warmup_steps_skipped=skip,
            first_step=steps[0],
            last_step=records[-1]["step"],  # the last line's (a restarted job logs its steps again)
        )
        # the loss of the last logged step only: an earlier value would hide a loss that went NaN
        # (Megatron then prints no "lm loss" at all) — the trailing lines of that step (one per rank),
        # not an earlier attempt's line of the same step number
        tail: list[dict[str, Any]] = []
        for r in reversed(records):
            if r["step"] != records[-1]["step"]:
                break
            tail.append(r)
        loss = [r["loss"] for r in reversed(tail) if r.get("loss") is not None]
        if loss:
            extra["last_loss"] = loss[-1]
        bad = list(dict.fromkeys(r["step"] for r in records if r.get("non_finite")))
        if bad:
            extra.update(non_finite_steps=len(bad), first_non_finite_step=bad[0])
        if any(r.get("non_finite") for r in tail):
            diverged = (f"loss or grad norm not finite at the last logged step {records[-1]['step']} "
                        f"({len(bad)} non-finite logged step(s), the first at step {bad[0]})")
    measured = any(r.get(k) is not None for r in records
                   for k in ("tokens_per_sec_per_gpu", "tflops_per_gpu", "step_time_s", "samples_per_sec"))

    failure = classify_text(clean)
    if diverged is not None and failure.error_class in (None, *SYMPTOMS):
        # the run ended on a NaN/inf loss or grad norm: a diverged run (DESIGN §6), whatever symptom
        # (a child process failing, a bare traceback) followed it
        record.update(status=status_for("divergence"), error_class="divergence", error_message=diverged)
    elif failure.error_class is not None:
        record["status"] = failure.status
        record["error_class"] = failure.error_class
        record["error_message"] = (failure.line or "")[:MAX_MESSAGE]
        extra["error_line_no"] = failure.line_no
    elif measured:
        record["status"] = "success"
    else:
        raise LogNotRecognised(f"nothing to import: found no {LOOKED_FOR}")

    user_extra = user.pop("extra", None)
    for key in user:
        if key in derived:
            derived.remove(key)
    record.update(user)
    if derived:
        extra["derived_fields"] = sorted(set(derived))
    record["extra"] = {**extra, **(user_extra or {})}
    return record
