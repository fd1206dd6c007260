"""Step-record extractors for the log formats beyond nanotron / Megatron-LM (and its forks) / torchtitan.

Standard library only. Each extractor takes the whole (ANSI-stripped) log text and returns
``(records, memory, config, extra)`` exactly like those in :mod:`ingest.parsers.logs`: ``records``
are per-step dicts with any of ``tokens_per_sec_per_gpu``, ``tflops_per_gpu``, ``mfu``,
``step_time_s``, ``samples_per_sec`` (whole job), ``global_batch_size`` (samples), ``loss`` and
``step``; ``memory`` has ``peak`` / ``reserved`` GiB; ``config`` holds run-record fields the log
states; ``extra`` anything else worth keeping.

Formats (the line each framework prints, from its own source or documentation):

* ``nemo`` -- NeMo 2.0 / Megatron-Bridge (Lightning progress printer)::

    Training epoch 0, iteration 120/149 | lr: 3e-05 | consumed_samples: 121 | global_batch_size: 1 |
    global_step: 120 | reduced_train_loss: 1.233 | train_step_timing in s: 0.03146

  and, when the FLOPs callback is on, ``tflops_per_sec_per_gpu: 412.3``.
* ``maxtext`` -- ``MaxText/metric_logger.py``: ``completed step: 9, seconds: 5.667,
  TFLOP/s/device: 134.924, Tokens/s/device: 8672.758, total_weights: 196608, loss: 10.374`` and
  ``number parameters: 15.933 billion``. "device" is what JAX calls a device (a TPU v4/v5p
  TensorCore pair, one v5e/v6e chip, one GPU): the values are kept per device, as printed.
* ``mmengine`` -- MMEngine / XTuner ``LoggerHook``: ``Iter(train) [10/270]  lr: 1.000e-02  eta:
  0:00:27  time: 0.004  data_time: 0.000  memory: 9806  loss: 5.3294`` (``memory`` in MB =
  ``max_memory_allocated() / 2**20``); XTuner's throughput hook adds ``tflops: 150.3`` and
  ``tokens_per_sec: 2000.1`` (per GPU).
* ``hf-trainer`` -- Hugging Face Trainer / Accelerate metric dicts: the final
  ``{'train_runtime': 101.9003, 'train_samples_per_second': 1.963, 'train_steps_per_second': ...}``
  (whole job, all processes) and per-step ``{'loss': ..., 'learning_rate': ..., 'epoch': ...}``.
* ``deepspeed`` -- DeepSpeed flops profiler summary (``deepspeed/profiling/flops_profiler/
  profiler.py`` ``print_model_profile``): ``world size``, ``data parallel size``, ``model parallel
  size``, ``batch size per GPU``, ``params of model = params per GPU * mp_size``, ``iter latency``,
  ``FLOPS per GPU = 3 * fwd flops per GPU / iter latency`` and ``samples/second`` (whole job).
"""

from __future__ import annotations

import ast
import re
from typing import Any

from core.record import COUNT_SUFFIXES, scale_count

__all__ = ["COUNTERS", "EXTRACTORS", "NUM", "human_number"]

NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"
_TIME = {"us": 1e-6, "ms": 1e-3, "s": 1.0}


def human_number(value: str) -> float | None:
    """'2.14 B' -> 2.14e9, '17.1 B' -> 1.71e10, '13.63' -> 13.63 (core.record.COUNT_SUFFIXES); junk -> None."""
    m = re.fullmatch(rf"\s*({NUM})\s*([KMBGTP]?)\s*", value.replace(",", ""))
    return float(m.group(1)) * COUNT_SUFFIXES[m.group(2)] if m else None


def _num(value: str | None) -> float | None:
    if value is None:
        return None
    m = re.fullmatch(rf"\s*({NUM})\s*%?\s*", value.replace(",", ""))
    return float(m.group(1)) if m else None


def pipe_pairs(body: str) -> dict[str, str]:
    """``' key: value | key2: value2 |'`` -> ``{'key': 'value', 'key2': 'value2'}`` (the Megatron /
    nanotron / NeMo iteration-line layout; a key is what comes before a part's last colon)."""
    out: dict[str, str] = {}
    for part in body.split("|"):
        key, sep, value = part.rpartition(":")
        if sep and key.strip():
            out[key.strip()] = value.strip()
    return out


# --- NeMo 2.0 / Megatron-Bridge ---------------------------------------------------------------
_NEMO_ITER = re.compile(r"Training epoch \d+, iteration (\d+)/(\d+) \|(.*)$", re.MULTILINE)


def nemo(text: str) -> tuple[list[dict], dict, dict, dict]:
    """NeMo 2.0 Lightning progress lines (``train_step_timing in s``)."""
    records = []
    for m in _NEMO_ITER.finditer(text):
        kv = pipe_pairs(m.group(3))
        step = _num(kv.get("global_step"))
        records.append({
            "step": int(step) if step is not None else int(m.group(1)),
            "step_time_s": _num(kv.get("train_step_timing in s")),
            "tflops_per_gpu": _num(kv.get("tflops_per_sec_per_gpu")),
            "global_batch_size": _num(kv.get("global_batch_size")),
            "loss": _num(kv.get("reduced_train_loss")),
        })
    return records, {"peak": None, "reserved": None}, {}, {}


# --- MaxText -----------------------------------------------------------------------------------
_MAXTEXT_STEP = re.compile(r"completed step: (\d+), (.*)$", re.MULTILINE)


def maxtext(text: str) -> tuple[list[dict], dict, dict, dict]:
    """MaxText ``completed step:`` lines (values per JAX device)."""
    records = []
    for m in _MAXTEXT_STEP.finditer(text):
        kv = {}
        for part in m.group(2).split(","):
            key, sep, value = part.partition(":")
            if sep:
                kv[key.strip()] = value.strip()
        mfu = _num(kv.get("MFU"))
        records.append({
            "step": int(m.group(1)),
            "step_time_s": _num(kv.get("seconds")),
            "tflops_per_gpu": _num(kv.get("TFLOP/s/device")),
            "tokens_per_sec_per_gpu": _num(kv.get("Tokens/s/device")),
            "mfu": mfu / 100.0 if mfu is not None else None,
            "loss": _num(kv.get("loss")),
        })
    config: dict[str, Any] = {}
    params = re.search(rf"number parameters: ({NUM}) billion", text)
    if params:
        config["model_params"] = scale_count(params.group(1), "B")
    extra = {"per_device_is": "JAX device (TPU v4/v5p: a chip of 2 TensorCores counts as printed)"} if records else {}
    return records, {"peak": None, "reserved": None}, config, extra


# --- MMEngine / XTuner -------------------------------------------------------------------------
_MM_ITER = re.compile(r"(?:Iter|Epoch)\(train\)\s*(?:\[\s*\d+\])?\s*\[\s*(\d+)/\s*(\d+)\]\s+(.*)$", re.MULTILINE)


def mmengine(text: str) -> tuple[list[dict], dict, dict, dict]:
    """MMEngine / XTuner ``Iter(train) [i/n]  key: value ...`` lines."""
    records, memory = [], []
    for m in _MM_ITER.finditer(text):
        kv = dict(re.findall(rf"(\w+): ({NUM})(?=\s|$)", m.group(3)))
        mem = _num(kv.get("memory"))
        if mem:  # MB = max_memory_allocated() / 2**20; 0 on CPU
            memory.append(round(mem / 1024.0, 4))
        records.append({
            "step": int(m.group(1)),
            "step_time_s": _num(kv.get("time")),
            "tflops_per_gpu": _num(kv.get("tflops")),
            "tokens_per_sec_per_gpu": _num(kv.get("tokens_per_sec", kv.get("tgs"))),
            "loss": _num(kv.get("loss")),
        })
    return records, {"peak": max(memory) if memory else None, "reserved": None}, {}, {}


# --- Hugging Face Trainer / Accelerate ---------------------------------------------------------
_HF_DICT = re.compile(r"\{'(?:train_runtime|loss|train_loss)'[^{}\n]*\}")


def hf_trainer(text: str) -> tuple[list[dict], dict, dict, dict]:
    """The Trainer's logged metric dicts; the final ``train_*`` dict is the whole-job summary."""
    records: list[dict] = []
    extra: dict[str, Any] = {}
    for i, m in enumerate(_HF_DICT.finditer(text)):
        try:
            d = ast.literal_eval(m.group(0))
        except (ValueError, SyntaxError):
            continue
        if not isinstance(d, dict):
            continue
        values = {k: _num(str(v)) for k, v in d.items()}
        if values.get("train_runtime") is not None:
            sps = values.get("train_steps_per_second")
            records.append({
                "step": i,
                "samples_per_sec": values.get("train_samples_per_second"),
                "step_time_s": 1.0 / sps if sps else None,
                "loss": values.get("train_loss"),
            })
            extra["train_runtime_s"] = values["train_runtime"]
            if values.get("train_tokens_per_second") is not None:
                extra["train_tokens_per_second"] = values["train_tokens_per_second"]
    return records, {"peak": None, "reserved": None}, {}, extra


# --- DeepSpeed flops profiler ------------------------------------------------------------------
def _profiler_value(text: str, label: str) -> str | None:
    m = re.search(rf"^[ \t>]*(?:\d+:\s*)?{re.escape(label)}:\s+(\S[^\n]*?)\s*$", text, re.MULTILINE)
    return m.group(1) if m else None


def deepspeed(text: str) -> tuple[list[dict], dict, dict, dict]:
    """DeepSpeed flops-profiler summaries: one record per ``Profile Summary at step N``."""
    records = []
    config: dict[str, Any] = {}
    mp = None
    for block in re.split(r"(?=Profile Summary at step \d+)", text)[1:]:
        step = int(re.match(r"Profile Summary at step (\d+)", block).group(1))  # type: ignore[union-attr]
        latency = _profiler_value(block, "iter latency")
        seconds = None
        if latency:
            lm = re.fullmatch(rf"({NUM})\s*(us|ms|s)", latency)
            seconds = float(lm.group(1)) * _TIME[lm.group(2)] if lm else None
        flops = _profiler_value(block, "FLOPS per GPU = 3 * fwd flops per GPU / iter latency")
        fm = re.fullmatch(rf"({NUM})\s*([KMGTP]?)FLOPS", flops or "")
        records.append({
            "step": step,
            "step_time_s": seconds,
            "tflops_per_gpu": float(fm.group(1)) * COUNT_SUFFIXES[fm.group(2)] / 1e12 if fm else None,
            "samples_per_sec": _num(_profiler_value(block, "samples/second")),
        })
        for label, field in (("world size", "world_size"), ("data parallel size", "dp"),
                             ("batch size per GPU", "micro_batch_size")):
            v = _num(_profiler_value(block, label))
            if v is not None and v > 0:
                config[field] = int(v)
        params = _profiler_value(block, "params of model = params per GPU * mp_size")
        if params and human_number(params):
            config["model_params"] = round(human_number(params) or 0)
        mp = _num(_profiler_value(block, "model parallel size"))
    extra = {"model_parallel_size": int(mp)} if records and mp else {}
    return records, {"peak": None, "reserved": None}, config, extra


#: format -> (extractor, counter of the format's record lines used by detection)
EXTRACTORS = {
    "nemo": nemo,
    "maxtext": maxtext,
    "mmengine": mmengine,
    "hf-trainer": hf_trainer,
    "deepspeed": deepspeed,
}

COUNTERS = {
    "nemo": lambda t: len(_NEMO_ITER.findall(t)),
    "maxtext": lambda t: len(_MAXTEXT_STEP.findall(t)),
    "mmengine": lambda t: len(_MM_ITER.findall(t)),
    "hf-trainer": lambda t: sum(1 for m in _HF_DICT.finditer(t) if "train_runtime" in m.group(0)),
    "deepspeed": lambda t: len(re.findall(r"Profile Summary at step \d+", t)),
}
