"""Step-level series of a live run (DESIGN §9), standard library only: the fields of one step, the
warm-up rule, and what a series says about its run (headline throughput, jitter, stragglers).

Warm-up rule. The first steps of a training job are slower than the rest for reasons that say nothing
about the layout: CUDA context and NCCL communicator creation, the caching allocator growing to its
working set, autotuning and compilation (torch.compile, cuDNN benchmark), the data loader filling its
prefetch queue. Benchmarks therefore measure after a warm-up: PyTorch's profiler skips its `wait` and
`warmup` steps before recording (torch.profiler.schedule(wait=1, warmup=1, active=3), the schedule
the Ultra-Scale Playbook's memory profiling uses) and torch.utils.benchmark.Timer.timeit runs the
statement max(2, number/100) times as a warm-up before it times it. Here the
warm-up is the first `warmup_steps(n)` = max(WARMUP_MIN_STEPS, ⌈WARMUP_FRACTION · n⌉) steps of an
n-step series in step order: 2 of 10, 10 of 100, 100 of 1,000. The rest is the steady state; a series
with fewer than MIN_STEADY_STEPS steady steps gives no headline (too few to say).

Headline. The median of the steady steps (robust to the odd slow step, unlike the mean):
tokens_per_sec_per_gpu, step_time_s and tflops_per_gpu; peak_memory_gib is the maximum over all steps
(a peak). The server fills only what the run did not report, and names each in extra.derived_fields.

Jitter is the coefficient of variation (standard deviation / mean) of the steady steps' step_time_s.
Stragglers are steady steps whose step time is an outlier on the slow side by the modified z-score of
Iglewicz and Hoaglin (1993), 0.6745 · (t − median) / MAD > 3.5, MAD the median absolute deviation:
robust to the outliers it looks for, unlike a z-score on the mean and standard deviation.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

#: the fields of one step (wire = table column names). Types as in core.record.REPORTED_FIELDS:
#: i = int, f = float, t = ISO-8601 timestamp. Units are in the names; loss and grad_norm as the job logs them.
STEP_FIELDS: dict[str, str] = {
    "step": "i",                      # optimizer step number (≥ 0), the series' key
    "step_time_s": "f",               # seconds for this optimizer step
    "tokens_per_sec_per_gpu": "f",
    "tflops_per_gpu": "f",
    "mfu": "f",                       # fraction in [0, 1]
    "loss": "f",
    "grad_norm": "f",
    "learning_rate": "f",
    "peak_memory_gib": "f",           # per GPU, GiB (2^30 bytes), peak since the job started or this step
    "recorded_at": "t",               # when the job measured it (its clock)
}

#: the measured figures of a step (all but the key and the timestamp)
STEP_METRICS = tuple(k for k in STEP_FIELDS if k not in ("step", "recorded_at"))

WARMUP_MIN_STEPS = 2
WARMUP_FRACTION = 0.10
MIN_STEADY_STEPS = 3
#: modified z-score above which a steady step is a straggler (Iglewicz & Hoaglin 1993)
STRAGGLER_Z = 3.5
#: the median headline fields; peak_memory_gib is a maximum
MEDIAN_HEADLINE = ("tokens_per_sec_per_gpu", "step_time_s", "tflops_per_gpu")

WARMUP_RULE = (f"warm-up = first max({WARMUP_MIN_STEPS}, ceil({WARMUP_FRACTION:g}·n)) steps; headline = median of "
               f"the steady steps (peak memory: maximum of all); at least {MIN_STEADY_STEPS} steady steps")


def warmup_steps(n: int) -> int:
    """How many of an n-step series' first steps are warm-up (module docstring); never more than n."""
    return min(n, max(WARMUP_MIN_STEPS, math.ceil(WARMUP_FRACTION * n)))


def _values(steps: Sequence[Mapping[str, Any]], field: str) -> list[float]:
    return [float(s[field]) for s in steps if s.get(field) is not None]


def steady(steps: Sequence[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    """The steady-state steps of a series: sorted by step, warm-up dropped."""
    ordered = sorted(steps, key=lambda s: s["step"])
    return ordered[warmup_steps(len(ordered)):]


def headline(steps: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """{field: value} a series gives for the run's headline (module docstring): the medians of
    MEDIAN_HEADLINE over the steady steps when at least MIN_STEADY_STEPS of them have the field, and
    peak_memory_gib as the maximum over all steps. Fields without enough data are absent."""
    out: dict[str, float] = {}
    rest = steady(steps)
    for field in MEDIAN_HEADLINE:
        values = _values(rest, field)
        if len(values) >= MIN_STEADY_STEPS:
            out[field] = statistics.median(values)
    peaks = _values(steps, "peak_memory_gib")
    if peaks and len(rest) >= MIN_STEADY_STEPS:
        out["peak_memory_gib"] = max(peaks)
    return out


def stragglers(steps: Sequence[Mapping[str, Any]], field: str = "step_time_s") -> list[int]:
    """Step numbers of the steady steps that are slow outliers in `field` (modified z-score >
    STRAGGLER_Z; module docstring). [] when the MAD is 0 or there are too few steady steps."""
    rest = [s for s in steady(steps) if s.get(field) is not None]
    if len(rest) < MIN_STEADY_STEPS:
        return []
    values = [float(s[field]) for s in rest]
    med = statistics.median(values)
    mad = statistics.median(abs(v - med) for v in values)
    if mad == 0:
        return []
    return [int(s["step"]) for s, v in zip(rest, values) if 0.6745 * (v - med) / mad > STRAGGLER_Z]


def jitter(steps: Sequence[Mapping[str, Any]], field: str = "step_time_s") -> float | None:
    """Coefficient of variation (stdev / mean, a fraction) of `field` over the steady steps; None with
    fewer than MIN_STEADY_STEPS values or a zero mean."""
    values = _values(steady(steps), field)
    if len(values) < MIN_STEADY_STEPS:
        return None
    mean = statistics.fmean(values)
    return statistics.stdev(values) / mean if mean else None


def summarize(steps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What a series says about its run: {"steps": n, "warmup_steps", "steady_steps", "headline"
    (headline()), "jitter_step_time" (fraction or None), "stragglers" (step numbers), "rule"
    (WARMUP_RULE), "last" (the last step's fields or None)}."""
    ordered = sorted(steps, key=lambda s: s["step"])
    n = len(ordered)
    warm = warmup_steps(n)
    return {"steps": n, "warmup_steps": warm, "steady_steps": n - warm, "headline": headline(ordered),
            "jitter_step_time": jitter(ordered), "stragglers": stragglers(ordered), "rule": WARMUP_RULE,
            "last": dict(ordered[-1]) if ordered else None}
