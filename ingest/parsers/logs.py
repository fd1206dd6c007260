"""Training-log parser: one training log -> one run record, or a refusal.

Formats: nanotron, Megatron-LM and its forks (Megatron-DeepSpeed's ``tgs`` / ``TFLOPs``),
torchtitan (here), NeMo 2.0 / Megatron-Bridge, MaxText, MMEngine / XTuner, Hugging Face Trainer /
Accelerate, DeepSpeed flops profiler (:mod:`ingest.parsers.log_formats`), and torchrun / Slurm
failures (:mod:`ingest.classify`). Configuration facts any log prints (launcher lines, parallel
sizes, device names, parameter counts, versions) come from :mod:`ingest.parsers.log_facts`.

Whatever the format, every line first loses its prefixes (ranks, srun labels, timestamps, logger
headers, issue quotes, container/cloud-logging headers, ANSI) and is read by the generic reader
(:mod:`ingest.parsers.log_reader`): ``key: value``, ``key=value``, ``| key value |`` and JSON/dict
lines, metric names mapped through one table of synonyms with their units; configuration comes from
launcher command lines and config dumps (:mod:`ingest.parsers.log_config`). The format extractors below
win where they read a metric; the generic reader fills in what they leave out, and reads logs of
frameworks without an extractor (OLMo, Composer/llm-foundry, NeMo 1.x DLLogger, picotron, torchtune,
nanoGPT, LitGPT, Hugging Face metric blocks, DeepSpeed engine timers).

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
  throughput: the numbers are kept), else ``success`` when the log states a measurement (tokens/s,
  TFLOP/s, MFU, step time or samples/s). A log with neither is refused (:class:`LogNotRecognised`,
  whose message says what was looked for): nothing is guessed. Samples/s and tokens/s that the log
  does not give per GPU stay in ``extra`` (the whole job's, or a scope it does not state).
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

from core.record import ALIASES, REPORTED_FIELDS
from ingest.classify import SYMPTOMS, classify_text, status_for
from ingest.parsers import log_formats, log_steps
from ingest.parsers.log_facts import log_facts
from ingest.parsers.log_reader import clean_lines, generic_records

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
LOOKED_FOR = ("training metrics (tokens/s, TFLOP/s, MFU, step time or samples/s under any of the names of "
              "ingest.parsers.log_reader.METRICS; formats " + ", ".join(FORMATS[:-1]) + ") or a failure line "
              "(CUDA/NCCL/torch.distributed errors, OOM, divergence, Slurm time limit, node failure)")


class LogNotRecognised(ValueError):
    """The log shows neither training records of a known format nor a recognised failure."""
#: At most this many leading logged steps are treated as warm-up.
WARMUP_RECORDS = 3
#: Longest error_message kept.
MAX_MESSAGE = 2000

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?"

def detect_format(text: str) -> str:
    """'nanotron', 'megatron', 'torchtitan' (whichever training-record line occurs most), or
    'unknown' when the log has none of them (e.g. a torchrun/Slurm stderr file)."""
    clean = _ANSI.sub("", text)
    megatron = [m.group(3) for m in log_steps.MEGATRON_ITER.finditer(clean)
                if "elapsed time per iteration" in m.group(3)]
    fork = sum(1 for body in megatron if "tokens per gpu per second" in body or "TFLOPs:" in body)
    counts = {
        "nanotron": len(log_steps.NANOTRON_ITER.findall(clean)),
        "megatron-deepspeed" if fork * 2 > len(megatron) else "megatron": len(megatron),
        "torchtitan": len(log_steps.TITAN_STEP.findall(clean)),
    }
    counts.update({name: count(clean) for name, count in log_formats.COUNTERS.items()})
    best = max(counts, key=lambda k: counts[k])
    return best if counts[best] else "unknown"


_EXTRACTORS: dict[str, Callable[[str], tuple[list[dict], dict, dict, dict]]] = {
    "nanotron": log_steps.nanotron,
    "megatron": log_steps.megatron,
    "megatron-deepspeed": log_steps.megatron,
    "torchtitan": log_steps.torchtitan,
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
    See the module docstring for the rules. Phases: :func:`_read` (prefixes off, format),
    :func:`_stated` (configuration facts), :func:`_steps` (step records: the format's extractor, then
    the generic reader for what it leaves out), :func:`_reduce` (warm-up, medians, memory),
    :func:`_derive` (tokens/s/GPU from batch and step time), :func:`_outcome` (failure, divergence,
    success or refusal), :func:`_finish` (the user's fields, extra).

    Raises :class:`LogNotRecognised` (a ValueError) when the log states neither a throughput nor a
    failure, ValueError for an unknown field or format name."""
    user = _normalise_fields(fields)
    raw, lines, fmt = _read(text, log_format)
    clean = "\n".join(lines)
    record, extra, derived = _stated(clean, fmt)
    steps, generic, memory = _steps(fmt, clean, lines, record, extra, derived)
    used = _reduce(steps, generic, memory, record, extra)
    measured = _derive(used, user, record, extra, derived)
    _outcome(raw, used, measured, record, extra)
    return _finish(record, extra, derived, user)


def _read(text: str, log_format: str | None) -> tuple[str, list[str], str]:
    """(ANSI-free text for the classifier, cleaned lines for the readers, format)."""
    if log_format is not None and log_format not in FORMATS:
        raise ValueError(f"unknown log format {log_format!r}; one of {', '.join(FORMATS)}")
    raw = _ANSI.sub("", text)
    lines = clean_lines(raw)
    return raw, lines, log_format or detect_format("\n".join(lines))


def _stated(clean: str, fmt: str) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """The record's start: what the log states of its configuration (log_facts, log_config)."""
    record: dict[str, Any] = {"source": "log"}
    extra: dict[str, Any] = {"log_format": fmt}
    facts, facts_extra, derived = log_facts(clean)
    samples = facts.pop("global_batch_samples", None)
    record.update(facts)
    extra.update(facts_extra)
    if samples is not None:
        extra["global_batch_samples"] = samples
        if "seq_len" in facts and "global_batch_tokens" not in facts:
            record["global_batch_tokens"] = samples * facts["seq_len"]
    if fmt in _EXTRACTORS:
        record["framework"] = FRAMEWORK[fmt]
    return record, extra, derived


def _steps(fmt: str, clean: str, lines: list[str], record: dict[str, Any], extra: dict[str, Any],
           derived: list[str]) -> tuple[list[dict], list[dict], dict[str, float | None]]:
    """(the format extractor's records, the generic reader's records, memory peaks in GiB). The
    extractor's configuration wins over a launcher line (a disagreement is kept in extra); its memory
    over the generic reader's."""
    records: list[dict] = []
    memory: dict[str, float | None] = {"peak": None, "reserved": None}
    if fmt in _EXTRACTORS:
        records, memory, config, fmt_extra = _EXTRACTORS[fmt](clean)
        for key, value in config.items():
            if value is None:
                continue
            value = int(value) if isinstance(value, float) and value.is_integer() else value
            if key in record and key != "source" and record[key] != value:
                extra.setdefault("conflicting_facts", {})[key] = [record[key], value]
            record[key] = value
            if key in derived:
                derived.remove(key)
        extra.update(fmt_extra)
    generic, generic_memory = generic_records(lines)
    if "mfu_not_kept" in extra:  # the extractor left MFU out on purpose (an assumed peak)
        for r in generic:
            r.pop("mfu", None)
    memory = {k: memory[k] if memory[k] is not None else generic_memory[k] for k in memory}
    return records, generic, memory


def _steady(records: list[dict]) -> tuple[list[dict], list, int]:
    """(records after warm-up, distinct steps, steps skipped): the first min(3, n // 2) of n distinct
    logged steps are warm-up (without --local-ranks-filter every rank prints its line)."""
    steps = list(dict.fromkeys(r["step"] for r in records))
    skip = min(WARMUP_RECORDS, len(steps) // 2)
    warmup = set(steps[:skip])
    return [r for r in records if r["step"] not in warmup], steps, skip


def _reduce(steps: list[dict], generic: list[dict], memory: dict[str, float | None], record: dict[str, Any],
            extra: dict[str, Any]) -> list[dict]:
    """Medians of the steady records into ``record`` (per metric: the extractor's records when they
    have it, else the generic reader's), memory peaks, loss and non-finite steps. Returns the step
    records that describe the run (the extractor's, else the generic reader's)."""
    used = steps or generic
    steady_fmt, _, _ = _steady(steps)
    steady_gen, _, _ = _steady(generic)
    for key in ("tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu", "step_time_s"):
        value = _median(steady_fmt, key)
        if value is None:
            value = _median(steady_gen, key)
        if value is not None:
            record[key] = value
    for key, name in (("samples_per_sec", "samples_per_sec"), ("tokens_per_sec", "tokens_per_sec"),
                      ("hardware_tflops_per_gpu", "hardware_tflops_per_gpu"), ("iter_time_s", "iter_time_s")):
        value = _median(steady_fmt, key)
        value = value if value is not None else _median(steady_gen, key)
        if value is not None:
            extra[name] = value  # samples/s and tokens/s: the whole job (or a scope the log does not state)
    if memory["peak"] is not None:
        record["peak_memory_gib"] = memory["peak"]
    if memory["reserved"] is not None:
        record["reserved_memory_gib"] = memory["reserved"]
    _losses(used, extra)
    return used


def _losses(records: list[dict], extra: dict[str, Any]) -> None:
    """Steps logged, the last step's loss and the non-finite steps into ``extra`` (module docstring)."""
    if not records:
        return
    _, steps, skip = _steady(records)
    named = [s for s in steps if s >= 0]
    extra.update(steps_logged=len(steps), warmup_steps_skipped=skip)
    if named:
        extra.update(first_step=named[0], last_step=records[-1]["step"] if records[-1]["step"] >= 0 else named[-1])
    # the loss of the last logged step only: an earlier value would hide a loss that went NaN
    # (Megatron then prints no "lm loss" at all) -- the trailing lines of that step (one per rank),
    # not an earlier attempt's line of the same step number
    tail = _tail(records)
    loss = [r["loss"] for r in tail if r.get("loss") is not None]
    if loss:
        extra["last_loss"] = loss[-1]
    bad = list(dict.fromkeys(r["step"] for r in records if r.get("non_finite")))
    if bad:
        extra.update(non_finite_steps=len(bad))
        if bad[0] >= 0:
            extra["first_non_finite_step"] = bad[0]


def _tail(records: list[dict]) -> list[dict]:
    """The trailing records of the last logged step, in log order."""
    tail: list[dict] = []
    for r in reversed(records):
        if r["step"] != records[-1]["step"]:
            break
        tail.append(r)
    return tail[::-1]


def _derive(used: list[dict], user: dict[str, Any], record: dict[str, Any], extra: dict[str, Any],
            derived: list[str]) -> bool:
    """tokens/s/GPU = global batch (samples) x seq_len / step time / world size, or samples/s x
    seq_len / world size, for logs that print no tokens/s per GPU -- only when seq_len and the world
    size are known. Returns whether the log states a measurement (throughput, TFLOP/s, MFU or step
    time)."""
    seq = user.get("seq_len", record.get("seq_len"))
    world = user.get("world_size", record.get("world_size"))
    nodes, gpn = user.get("nodes", record.get("nodes")), user.get("gpus_per_node", record.get("gpus_per_node"))
    if world is None and nodes and gpn:
        world = nodes * gpn
    if "tokens_per_sec_per_gpu" not in record and seq and world:
        per_step = [r["global_batch_size"] * seq / r["step_time_s"] / world for r in _steady(used)[0]
                    if r.get("step_time_s") and r.get("global_batch_size")]
        if not per_step and extra.get("samples_per_sec"):
            per_step = [extra["samples_per_sec"] * seq / world]
        if per_step:
            record["tokens_per_sec_per_gpu"] = float(f"{statistics.median(per_step):.6g}")
            derived.append("tokens_per_sec_per_gpu")
    return any(k in record for k in ("tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu", "step_time_s")) or any(
        k in extra for k in ("samples_per_sec", "tokens_per_sec", "iter_time_s"))


def _outcome(raw: str, used: list[dict], measured: bool, record: dict[str, Any], extra: dict[str, Any]) -> None:
    """Status: the root cause's when the log shows a failure; ``failed`` + ``divergence`` when the last
    logged step is non-finite (unless a more specific failure than a symptom is shown); ``success``
    when it states a measurement; otherwise the log is refused."""
    failure = classify_text(raw)
    tail = _tail(used) if used else []
    if any(r.get("non_finite") for r in tail) and failure.error_class in (None, *SYMPTOMS):
        last = tail[-1]["step"]
        where = f"the last logged step {last}" if last >= 0 else "the last logged record"
        record.update(status=status_for("divergence"), error_class="divergence",
                      error_message=f"loss or grad norm not finite at {where} "
                                    f"({extra.get('non_finite_steps', 1)} non-finite logged step(s))")
    elif failure.error_class is not None:
        record["status"] = failure.status
        record["error_class"] = failure.error_class
        record["error_message"] = (failure.line or "")[:MAX_MESSAGE]
        extra["error_line_no"] = failure.line_no
    elif measured:
        record["status"] = "success"
    else:
        raise LogNotRecognised(f"nothing to import: found no {LOOKED_FOR}")


def _finish(record: dict[str, Any], extra: dict[str, Any], derived: list[str], user: dict[str, Any]) -> dict[str, Any]:
    """The user's fields over the log's; derived fields named; extra attached."""
    user_extra = user.pop("extra", None)
    for key in user:
        if key in derived:
            derived.remove(key)
    record.update(user)
    if derived:
        extra["derived_fields"] = sorted(set(derived))
    record["extra"] = {**extra, **(user_extra or {})}
    return record
