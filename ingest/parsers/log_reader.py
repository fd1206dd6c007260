"""A framework-agnostic reader of training-log lines: prefixes off, key/value pairs out, metric names
mapped through one table of synonyms with their units. Standard library only.

:func:`clean_lines` strips what launchers, loggers and copy-paste put in front of a message (kept one
output line per input line, so line numbers stay those of the file): ANSI colours, issue quotes
(``> ``), Slurm ``srun -l`` labels (``12: ``), torchrun/accelerate rank labels (``[rank3]:``,
``[default0]:``, ``[1,0]<stderr>:``), Ray actor labels (``(Worker pid=12, ip=10.0.0.1)``),
timestamps (ISO 8601, ``10/17/2025 16:31:56``, ``03:26:55``, in brackets or not), log-level and
logger headers (``[INFO]``, ``[INFO|DP=0|PP=0|TP=0]:``, ``[logging.py:69:log_dist]``, ``- root - INFO
-``, ``INFO:torchtune.utils._logging:``, ``[NeMo I 2025-10-02 13:23:36 utils:662]``, glog ``I0501
12:00:00.123 123 file.cc:45]``), container and cloud-logging headers (``stdout F``, ``stdout:``,
``severity: INFO``/``textPayload:`` exports) and markdown bullets.

:func:`pairs` reads one cleaned line as ``{normalised key: raw value}`` whatever its layout:
``key: value | key: value`` (Megatron, nanotron, NeMo), ``key: value  key: value`` (torchtitan,
MMEngine), ``key=value, key=value`` (DeepSpeed, OLMo-core), ``| key value |`` tables, and JSON or
Python-dict lines (Hugging Face Trainer, NeMo's DLLogger ``DLLL {...}``, flattened one level).

:data:`METRICS` is the one table of metric synonyms: each normalised key maps to a run-record field
and the unit the framework means (sources in the comments). :func:`metric_value` converts a raw
value to the field's unit (tokens/s per GPU, TFLOP/s per GPU, MFU as a fraction, step time in s,
memory in GiB = 2^30 bytes); it returns None whenever the unit cannot be told -- never a guess.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any

__all__ = ["METRICS", "SCOPED", "clean_lines", "generic_records", "metric_value", "normalise_key", "pairs",
           "parse_quantity", "step_of", "strip_prefix"]

NUM = r"[-+]?(?:\d[\d,]*(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TS = (r"(?:\d{4}-\d\d-\d\d[T ]\d\d:\d\d:\d\d(?:[.,]\d+)?(?:Z|[+-]\d\d:?\d\d| ?[A-Z]{3,4}\b)?"
       r"|\d\d/\d\d/\d{4},? \d\d:\d\d:\d\d(?:[.,]\d+)?|\d\d:\d\d:\d\d(?:[.,]\d+)?)")
_LEVEL = r"(?:INFO|WARNING|WARN|ERROR|DEBUG|CRITICAL|TRACE|NOTICE)"
# One prefix at the start of a line; strip_prefix removes them repeatedly.
_PREFIX = re.compile(
    "|".join(f"(?:{p})" for p in (
        r">+ ?",                                          # issue / e-mail quotes
        rf"- [\w.]+ - {_LEVEL} - ",                       # Python logging "- root - INFO - "
        r"[-*•] (?=\S)",                                  # markdown bullets ("- Train memory/...")
        r"\d{1,5}: ",                                     # srun -l task labels
        r"\[(?:rank|default|RANK|Rank) ?\d+\]:?",          # torchrun --tee / accelerate / DeepSpeed / picotron
        r"\[\d+,\d+\]<std\w+>:",                          # mpirun --tag-output
        r"\((?:[\w.]+ )?pid=\d+(?:, ip=[\d.]+)?\) ",      # Ray actors
        r"[\w.-]+/\d+ (?=\[)",                            # NeMo-Run task labels ("i.pretrain/0 [default2]:")
        rf"\[?{_TS}\]?[:,]?",                             # timestamps
        rf"\[{_LEVEL}[^\]]{{0,60}}\]:?",                  # [INFO], [INFO|DP=0|PP=0|TP=0]:
        r"\[[\w./-]+\.(?:py|cc|cpp|h):\d+(?::[\w<>]+)?\]:?",  # [logging.py:69:log_dist]
        r"\[(?:titan|TRAIN|train|nanotron|deepspeed|NeMo [IWEDC][^\]]*|[A-Z][A-Za-z]{1,20})\]:?",
        rf"{_LEVEL}:[\w.]+:",                             # logging.basicConfig "INFO:torchtune.x:"
        rf"{_LEVEL}\b:?",                                 # a bare level
        r"[IWEF]\d{4} \d\d:\d\d:\d\d\.\d+ +\d+ [\w./-]+:\d+\]",  # glog
        r"std(?:out|err)(?: [FP])?:? ",                   # container runtime / launcher stream tags
        r"(?:severity|textPayload|jsonPayload\.message): ",  # Cloud Logging exports
        r"\[resource\.labels\.[^\]]{0,80}\]:?",              # Vertex AI "[resource.labels.taskName: workerpool0-0]"
    )))


def strip_prefix(line: str) -> str:
    """The message of one log line: every launcher/logger/copy-paste prefix removed (module docstring)."""
    line = _ANSI.sub("", line).strip()
    for _ in range(12):
        m = _PREFIX.match(line)
        if not m or not m.group(0):
            break
        line = line[m.end():].lstrip()
    return line


def clean_lines(text: str) -> list[str]:
    """``text`` split into lines (same count as ``str.splitlines``), each through :func:`strip_prefix`."""
    return [strip_prefix(line) for line in text.splitlines()]


def normalise_key(key: str) -> str:
    """'  Train throughput/device/tokens_per_sec ' -> 'throughput/device/tokens_per_sec' (lower case,
    single spaces, Composer's "Train " scope and a trailing colon dropped)."""
    key = re.sub(r"\s+", " ", key.strip().strip(":").strip()).lower()
    return re.sub(r"^(?:train|training) (?=\S+/)", "", key)


_DICT = re.compile(r"\{.*\}")


def _flatten(d: dict[str, Any], out: dict[str, str]) -> None:
    for key, value in d.items():
        if isinstance(value, dict):
            _flatten(value, out)
        elif isinstance(value, (int, float, str)) and not isinstance(value, bool):
            out[normalise_key(str(key))] = str(value)


def _dict_pairs(line: str) -> dict[str, str] | None:
    m = _DICT.search(line)
    if not m:
        return None
    for loader in (json.loads, ast.literal_eval):
        try:
            value = loader(m.group(0))
        except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
            continue
        if isinstance(value, dict):
            out: dict[str, str] = {}
            _flatten(value, out)
            return out
    return None


# key: value / key=value inside a segment; the value is one token (a number with units, "nan", a word)
_WORD = r"[A-Za-z_][\w/().%-]*"
_VALUE = (r"[^\s|=:,](?:[^\s|,]|,(?=\d{3}\b))*"
          r"(?: (?:[KMGT]i?B|ms|us|s|%|T?FLOPS)(?![\w/]))?(?:\s?\([^)]*\))?")  # "180.00 ms", "21.47 GB"
_KV = re.compile(rf"(?<![\w/.-])({_WORD}(?: (?:{_WORD}|\([^)]*\)))*)\s*(?::|=)\s*({_VALUE})")
_TABLE = re.compile(rf"^({_WORD}(?: {_WORD})*)\s+({NUM}\s*[A-Za-z%/]*|nan|inf|-inf)$", re.IGNORECASE)
# "iter 3010: loss nan, ..." (nanoGPT), "iter 4 step 0: loss 2.63, ..." (LitGPT): the step marker first
_LEAD_STEP = re.compile(r"^(?:(?:iter|iteration|step|epoch)\s+\d+\s*)+[:|]\s*", re.IGNORECASE)


def pairs(line: str) -> dict[str, str]:
    """``{normalised key: raw value}`` of one cleaned line (module docstring); {} when none."""
    found = _dict_pairs(line) if "{" in line else None
    if found is not None:
        return found
    out: dict[str, str] = {}
    line = _LEAD_STEP.sub("", line)
    for segment in re.split(r"\s*\|\s*|,\s+(?=[A-Za-z_])|\s{2,}(?=[A-Za-z_])", line):
        segment = segment.strip()
        if not segment:
            continue
        hits = list(_KV.finditer(segment))
        if hits:
            for m in hits:
                out[normalise_key(m.group(1))] = m.group(2).strip()
        else:
            t = _TABLE.match(segment)  # "| throughput 123.4 |" tables
            if t:
                out[normalise_key(t.group(1))] = t.group(2)
    return out


_STEP = re.compile(r"(?:^|[\s\[(|,\"'])(?:iteration|iter|step|global_step|batch)[\"']?\s*[:=]?\s*\[?\s*"
                   r"(\d+(?:\.\d+)?(?:e\+?\d+)?)(?=[\s/:,|\])]|$)|^\d+/(\d+),", re.IGNORECASE)


def step_of(line: str) -> int | None:
    """The step/iteration number a metric line names ('iter 1631:', 'step: 10', 'step=40',
    'global_step=9e+3', '[batch=10/100]'), or None."""
    m = _STEP.search(line)
    if not m:
        return None
    try:
        return int(float(m.group(1) or m.group(2)))
    except ValueError:
        return None


_SUFFIX = {"": 1.0, "k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12, "p": 1e15}
_QTY = re.compile(rf"^\s*({NUM})\s*([A-Za-z%/]*(?:\([^)]*\))?)")


def parse_quantity(raw: str) -> tuple[float, str] | None:
    """'5,762' -> (5762.0, ''), '30.35%' -> (30.35, '%'), '26.47GiB(33.47%)' -> (26.47, 'gib'),
    '561.94ms' -> (561.94, 'ms'), 'nan' -> None."""
    m = _QTY.match(raw.replace("\u202f", ""))
    if not m:
        return None
    unit = re.sub(r"\(.*", "", m.group(2)).lower()
    try:
        return float(m.group(1).replace(",", "")), unit
    except ValueError:
        return None


_GIB = {"b": 2.0**-30, "bytes": 2.0**-30, "kb": 2.0**-20, "kib": 2.0**-20, "mb": 2.0**-10, "mib": 2.0**-10,
        "gb": 1.0, "gib": 1.0, "tb": 1024.0, "tib": 1024.0}
_SECONDS = {"s": 1.0, "sec": 1.0, "secs": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6}

# --- the one table of metric synonyms ------------------------------------------------------------
# key (normalised) -> (field, kind, default unit when the value and key carry none)
#   kind: per_gpu (tokens/s per GPU), tflops, mfu, seconds, memory (peak allocated),
#   reserved (peak reserved), samples (samples/s, the whole job), tokens (tokens/s, whole job or unstated),
#   iter_seconds (one micro-batch iteration)
_M: list[tuple[str, str, str | None, tuple[str, ...]]] = [
    # tokens/s per GPU: nanotron tokens_per_sec_per_gpu, torchtune tokens_per_second_per_gpu, torchtitan
    # tps (and wps before it was renamed: "words" per second per GPU), Megatron-DeepSpeed "tokens per gpu
    # per second (tgs)" / TGS, MaxText Tokens/s/device, Composer throughput/device/tokens_per_sec,
    # OLMo throughput/device/tokens_per_second, OLMo-core throughput/device/TPS, picotron Tokens/s/GPU
    ("tokens_per_sec_per_gpu", "per_gpu", None, (
        "tokens_per_sec_per_gpu", "tokens_per_second_per_gpu", "tokens/s/gpu", "tokens/sec/gpu", "tok/s/gpu",
        "tokens/s/device", "tokens_per_sec_per_device", "tps", "wps", "tgs", "tokens per gpu per second (tgs)",
        "throughput/device/tokens_per_sec", "throughput/device/tokens_per_second", "throughput/device/tps",
        "tokens_per_gpu_per_sec", "tokens per second per gpu", "throughput per gpu (tokens/s)")),
    # TFLOP/s per GPU: Megatron-LM "throughput per GPU (TFLOP/s/GPU)", forks' TFLOPs, nanotron
    # model_tflops_per_gpu, torchtitan tflops, MaxText TFLOP/s/device, NeMo tflops_per_sec_per_gpu,
    # OLMo-core throughput/device/flopsPS (FLOP/s with a T suffix), GPT-NeoX "approx flops per GPU"
    ("tflops_per_gpu", "tflops", "tflops", (
        "tflops", "tflops_per_gpu", "model_tflops_per_gpu", "throughput per gpu (tflop/s/gpu)", "tflop/s/device",
        "tflop/s/gpu", "tflops_per_sec_per_gpu", "tflops per gpu", "tflops/gpu", "throughput (tflop/s/gpu)")),
    ("tflops_per_gpu", "tflops", "flops", ("throughput/device/flopsps", "approx flops per gpu", "flops per gpu")),
    # MFU: "%" (torchtitan, nanoGPT, MaxText) or a bare percentage above 1 (OLMo-core, prime-rl); a bare
    # value <= 1 is a fraction only where the framework defines it so (Composer throughput/device/mfu)
    ("mfu", "mfu", None, ("mfu", "model flops utilization", "mfu (%)", "throughput/device/mfu (%)")),
    ("mfu", "mfu", "fraction", ("throughput/device/mfu",)),
    # step time: Megatron "elapsed time per iteration (ms)", nanotron elapsed_time_per_iteration_ms,
    # NeMo "train_step_timing in s", MaxText "seconds", nanoGPT "time 561.94ms", torchtitan
    # elapsed_time_per_step
    ("step_time_s", "seconds", "ms", ("elapsed time per iteration (ms)", "elapsed_time_per_iteration_ms",
                                      "time_per_iteration_ms", "step_time_ms", "iteration time (ms)")),
    ("step_time_s", "seconds", "s", ("train_step_timing in s", "train_step_timing", "seconds", "step_time_s",
                                     "elapsed_time_per_step", "step time (s)", "time/step")),
    ("step_time_s", "seconds", None, ("time", "step_time", "step time", "iteration time")),
    # LitGPT "iter time: 827.80ms": one iteration (micro-batch), a step only when it is the last of a
    # gradient-accumulation cycle -- kept in extra as iter_time_s, not as the step time
    ("iter_time_s", "iter_seconds", None, ("iter time", "iter_time")),
    # peak memory (allocated): DeepSpeed MaxMemAllocated (GB = 2^30), torchtune peak_memory_alloc (GiB),
    # OLMo "System/Peak GPU Memory (MB)" (2^20), Composer memory/peak_allocated_mem (no unit printed: not read),
    # axolotl memory/max_mem_allocated(gib), Liger total_peak_memory_allocated_MB (2^20), picotron
    # "Memory usage", torchtitan "memory" (its peak reserved: kept as the peak it prints, flagged)
    ("peak_memory_gib", "memory", None, (
        "maxmemallocated", "max memory allocated", "max_memory_allocated",
        "memory/max_mem_allocated", "total_peak_memory_allocated", "peak_memory_allocated", "peak allocated",
        "max allocated", "peak memory", "peak_memory", "memory usage", "max_mem_allocated", "memory",
        "system/peak gpu memory", "memory/peak_allocated_mem", "max_memory_allocated_gib")),
    # torchtune training.get_memory_stats: max_memory_allocated() / 1024**3, printed without a unit
    ("peak_memory_gib", "memory", "gib", ("peak_memory_alloc", "peak_memory_active")),
    # LitGPT "Memory used: 12.34 GB" is torch.cuda.max_memory_allocated() / 1e9 (decimal gigabytes)
    ("peak_memory_gib", "memory", "decimal", ("memory used",)),
    ("reserved_memory_gib", "reserved", "gib", ("peak_memory_reserved",)),
    ("reserved_memory_gib", "reserved", None, (
        "gpu_memory/gpu reserved mem", "memory/device_mem_reserved", "total_peak_memory_reserved",
        "max reserved", "max_memory_reserved", "peak reserved")),
    # job-wide rates (not per GPU): kept in extra
    ("samples_per_sec", "samples", None, ("samples/sec", "samplespersec", "currsamplespersec",
                                          "train_samples_per_second", "samples_per_second", "samples/second",
                                          "samples per second")),
    # LlamaFactory's LogCallback "throughput" (tokens/s of num_input_tokens_seen, gathered over processes)
    ("tokens_per_sec", "tokens", None, ("tokens_per_sec", "tokens/s", "tokens_per_second", "train_tokens_per_second",
                                        "step_tokens_per_second", "throughput (tokens/s)", "tokens/sec", "tok/s",
                                        "throughput")),
]
METRICS: dict[str, tuple[str, str, str | None]] = {key: (field, kind, unit) for field, kind, unit, keys in _M
                                                    for key in keys}
#: Keys whose unit is in the key itself: "(gib)", "_mb", "(ms)" (stripped before the table lookup).
_KEY_UNIT = re.compile(r"\s*(?:\(([a-z]+)\)|_(gib|gb|mib|mb|bytes|ms|s))$")
#: Job-wide rate kinds, kept apart from the per-GPU fields.
SCOPED = ("samples", "tokens", "iter_seconds")


def metric_value(key: str, raw: str) -> tuple[str, str, float] | None:
    """(field, kind, value in the field's unit) for one pair, or None when the key is no metric or the
    value's unit cannot be told (module docstring)."""
    unit_in_key = None
    entry = METRICS.get(key)
    if entry is None:
        m = _KEY_UNIT.search(key)
        if m:
            entry = METRICS.get(key[: m.start()])
            unit_in_key = m.group(1) or m.group(2)
    if entry is None:
        return None
    field, kind, default = entry
    q = parse_quantity(raw)
    if q is None:
        return None
    value, unit = q
    unit = unit or unit_in_key or ""
    converted = _convert(kind, value, unit, default)
    return None if converted is None else (field, kind, converted)


def _convert(kind: str, value: float, unit: str, default: str | None) -> float | None:
    """``value`` with ``unit`` (or the table's ``default``) in the unit of ``kind``; None if unknown."""
    if value < 0:
        return None  # nanoGPT prints "mfu -100.00%" before it has measured
    suffix = unit[:1] if unit[:1] in _SUFFIX and len(unit) == 1 else ""
    if kind in ("per_gpu", "samples", "tokens"):
        return value * _SUFFIX[suffix] if unit in ("", *_SUFFIX) else None
    if kind == "tflops":
        if default == "flops":  # "441.0T" FLOP/s, "72.3TFLOPS"
            m = re.fullmatch(r"([kmgtp])(?:flops)?", unit)
            return value * _SUFFIX[m.group(1)] / 1e12 if m else None
        return value if unit in ("", "tflops") else None
    if kind == "mfu":
        if unit == "%" or (not unit and value > 1.0):
            return value / 100.0 if value <= 100.0 else None
        return value if (not unit and default == "fraction" and value <= 1.0) else None
    if kind in ("seconds", "iter_seconds"):
        scale = _SECONDS.get(unit or (default or ""))
        return value * scale if scale is not None else None
    if kind in ("memory", "reserved"):
        if default == "decimal":  # gigabytes and megabytes of 10^9 and 10^6 bytes
            scale = {"gb": 1e9 / 2**30, "mb": 1e6 / 2**30}.get(unit)
        else:
            scale = _GIB.get(unit or (default or ""))
        return round(value * scale, 4) if scale is not None else None
    return None


# --- step records from any layout ----------------------------------------------------------------
#: Loss and grad-norm keys whose NaN/inf marks a non-finite step (divergence, see logs.parse_log).
_LOSS_KEYS = frozenset({"loss", "lm loss", "lm_loss", "reduced_train_loss", "train_loss", "train/ce loss",
                        "train/crossentropyloss", "loss/train/total", "grad_norm", "grad norm",
                        "optim/total grad norm", "total_norm"})
_NON_FINITE = re.compile(r"[-+]?(?:nan|inf)(?:\.0)?", re.IGNORECASE)


def _line_metrics(kv: dict[str, str]) -> tuple[dict[str, float], list[tuple[str, float]], bool]:
    """(per-step fields, memory readings as (field, GiB), whether a loss/grad norm is non-finite)."""
    fields: dict[str, float] = {}
    memory: list[tuple[str, float]] = []
    for key, raw in kv.items():
        hit = metric_value(key, raw)
        if hit is None:
            continue
        field, kind, value = hit
        if kind in ("memory", "reserved"):
            memory.append((field, value))
        elif field not in fields:  # the first synonym on a line wins ("TPS" before "TPS (actual avg)")
            fields[field] = value
    bad = any(_NON_FINITE.fullmatch(kv[k].strip()) for k in _LOSS_KEYS & kv.keys())
    return fields, memory, bad


def generic_records(lines: list[str]) -> tuple[list[dict[str, Any]], dict[str, float | None]]:
    """Step records and memory peaks read from cleaned ``lines`` through :data:`METRICS`, whatever the
    framework. A line with metrics and a step number is a record of that step; consecutive lines
    without one (OLMo-core's ``key=value`` block, Composer's bullet list) are one record until a key
    repeats; a step number printed on a line without metrics (DeepSpeed's ``step=40`` before its
    timer line) is the step of the next metric line. Returns (records, {"peak", "reserved"} GiB)."""
    records: list[dict[str, Any]] = []
    peaks: dict[str, list[float]] = {"peak_memory_gib": [], "reserved_memory_gib": []}
    pending: int | None = None
    open_block = False
    for line in lines:
        kv = pairs(line) if line else {}
        fields, memory, bad = _line_metrics(kv) if kv else ({}, [], False)
        step = step_of(line) if line else None
        for field, value in memory:
            peaks[field].append(value)
        if not fields and not bad:
            if step is not None:
                pending = step
            open_block = open_block and bool(kv) and step is None  # other pairs of the block keep it open
            continue
        if step is None and open_block and records and not (fields.keys() & records[-1].keys()):
            records[-1].update(fields)
            records[-1]["non_finite"] = records[-1]["non_finite"] or bad
            continue
        if step is None and pending is not None:
            step, pending = pending, None
        records.append({"step": step if step is not None else -len(records) - 1, **fields, "non_finite": bad})
        open_block = step_of(line) is None
    memory_out = {"peak": max(peaks["peak_memory_gib"], default=None),
                  "reserved": max(peaks["reserved_memory_gib"], default=None)}
    return [r for r in records if len(r) > 2 or r["non_finite"]], memory_out
