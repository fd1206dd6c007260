"""Step-record extractors of nanotron, Megatron-LM (and its forks) and torchtitan, whose line formats
:mod:`ingest.parsers.logs` documents. Standard library only.

Each extractor takes the whole cleaned log text and returns ``(records, memory, config, extra)`` as
those of :mod:`ingest.parsers.log_formats` do.
"""

from __future__ import annotations

import re
from typing import Any

from core.record import COUNT_SUFFIXES
from ingest.parsers import log_formats

__all__ = ["MEGATRON_ITER", "NANOTRON_ITER", "TITAN_STEP", "megatron", "nanotron", "torchtitan"]

_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"

# (No leading \b: a pattern that starts with a literal is searched much faster by `re`.)
NANOTRON_ITER = re.compile(r"iteration: (\d+) / (\d+) \|(.*)$", re.M)
MEGATRON_ITER = re.compile(r"iteration\s+(\d+)/\s*(\d+) \|(.*)$", re.M)
TITAN_STEP = re.compile(r"step:(?<!validate step:)(?<!validation step:)\s*(\d+)\s+loss:\s*(\S+)(.*)$", re.M)

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


# --- per-format extraction ---------------------------------------------------------------------
# Each returns (records, memory, config, extra): records are dicts with any of tokens_per_sec_per_gpu,
# tflops_per_gpu, mfu, step_time_s (+ step, and raw extras); memory has peak/reserved GiB.


def nanotron(text: str) -> tuple[list[dict], dict, dict, dict]:
    records = []
    for m in NANOTRON_ITER.finditer(text):
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
    if found and found.group(0) == "LlamaConfig(":
        # nanotron's Llama (src/nanotron/models/llama.py MLP: gate_up_proj, down_proj) is a gated MLP
        config["gated_linear_unit"] = True
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


def megatron(text: str) -> tuple[list[dict], dict, dict, dict]:
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
    for m in MEGATRON_ITER.finditer(text):
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


def torchtitan(text: str) -> tuple[list[dict], dict, dict, dict]:
    records, reserved = [], []
    for m in TITAN_STEP.finditer(text):
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
