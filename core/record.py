"""The run record's vocabulary (DESIGN §2, §6) and the one parameter-count parser, standard library only.

These names are the JSON API's, the `runs` table's, CSV export's and SQL's. ingest/, service/ and
dashboard/ import them from here so that the training-side agent and the server can never disagree.
Also here: reading one field of a run mapping (`get_field`, `positive_int_field`, `flag_field`: a field may sit in
the record or in its `extra`), shared by the memory model and the model-shape rules.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

#: `status` values of a finished run. A failed run is a result, never dropped.
STATUSES = ("success", "oom", "nccl_error", "timeout", "failed")

#: the status of a run opened at the start of its job and not finished yet (DESIGN §9): stored as such,
#: the one stored status that may still change (once, to one of STATUSES)
RUNNING = "running"
#: how a running run reads once its last heartbeat is older than lost_after_s: derived when read
#: (core/lifecycle.py), never stored
LOST = "lost"
#: the statuses of a run that has not finished
UNFINISHED_STATUSES = (RUNNING, LOST)
#: what a client may send as `status`: a finished run's, or `running` to open one (never `lost`)
REPORTED_STATUSES = (*STATUSES, RUNNING)
#: every status a run can read as (GET /runs, its filter, SQL, dashboard, CLI)
ALL_STATUSES = (*STATUSES, *UNFINISHED_STATUSES)

#: `recompute` values (activation checkpointing).
RECOMPUTE = ("none", "selective", "full")

#: `error_class` values: the failure taxonomy of DESIGN §6.
ERROR_CLASSES = (
    "collective_timeout",
    "nccl_network_error",
    "nccl_remote_error",
    "nccl_system_error",
    "nccl_unhandled_cuda_error",
    "nccl_invalid_usage_or_internal",
    "oom_gpu",
    "oom_gpu_nccl_buffer",
    "cuda_illegal_memory_access",
    "gpu_hardware_fault",
    "child_process_failed",
    "rendezvous_failure",
    "scheduler_time_limit",
    "scheduler_cancelled",
    "divergence",
    "invalid_config",
    "node_failure",
    "oom_host",
    "unknown",
)

#: The run `status` each `error_class` implies (DESIGN §6): memory exhaustion on the GPU or the host is
#: `oom`, a collective or scheduler timeout `timeout`, an NCCL result `nccl_error`, anything else
#: (a diverged run -- NaN/inf loss or the loss scale at its minimum --, a refused layout, a lost node,
#: a hardware fault, a symptom) `failed`.
ERROR_CLASS_STATUS: dict[str, str] = {
    **{cls: "nccl_error" for cls in ERROR_CLASSES if cls.startswith("nccl_")},
    "oom_gpu": "oom",
    "oom_gpu_nccl_buffer": "oom",
    "oom_host": "oom",
    "collective_timeout": "timeout",
    "scheduler_time_limit": "timeout",
    **{cls: "failed" for cls in ("cuda_illegal_memory_access", "gpu_hardware_fault", "child_process_failed",
                                 "rendezvous_failure", "scheduler_cancelled", "divergence", "invalid_config",
                                 "node_failure", "unknown")},
}
assert set(ERROR_CLASS_STATUS) == set(ERROR_CLASSES), "every error class needs its status"


#: OOM classes that say nothing about GPU memory: the host's (kernel or cgroup) OOM killer ended the run
#: because of host RAM, so the layout may well fit on the GPUs. A recorded OOM of these classes vetoes no
#: layout in recommend/suggest (service/analytics/recommend.oom_implied); an OOM without a class still does.
HOST_MEMORY_OOM_CLASSES: frozenset[str] = frozenset({"oom_host"})


def status_for_error_class(error_class: str | None) -> str | None:
    """The run status implied by ``error_class`` (:data:`ERROR_CLASS_STATUS`); ``None`` for no failure.

    Raises KeyError for a name outside :data:`ERROR_CLASSES`."""
    return None if error_class is None else ERROR_CLASS_STATUS[error_class]

#: Fields a client reports, in wire order. Types: s=str, i=int, f=float, b=bool (parse_bool),
#: t=ISO-8601 timestamp, j=JSON object, l=list of strings (parse_tags).
REPORTED_FIELDS: dict[str, str] = {
    "run_key": "s",
    "name": "s",
    "started_at": "t",
    "source": "s",
    "sweep": "s",  # the sweep (POST /api/v1/sweeps) the run belongs to, by name; null for none
    "tags": "l",  # free labels, e.g. ["baseline", "after-nccl-upgrade"]; filter GET /api/v1/runs?tag=
    "model_name": "s",
    "model_params": "i",
    "num_layers": "i",
    "hidden_size": "i",
    "num_heads": "i",
    "num_kv_heads": "i",
    "ffn_hidden_size": "i",
    "vocab_size": "i",
    "gated_linear_unit": "b",  # the MLP: gated (SwiGLU/GeGLU, 3 matrices) or plain (GPT's GELU, 2)
    "seq_len": "i",
    "gpu_type": "s",
    "gpus_per_node": "i",
    "nodes": "i",
    "world_size": "i",
    "dp": "i",
    "tp": "i",
    "pp": "i",
    "cp": "i",
    "ep": "i",
    "zero_stage": "i",
    "micro_batch_size": "i",
    "grad_accum_steps": "i",
    "global_batch_tokens": "i",
    "recompute": "s",
    "precision": "s",
    "framework": "s",
    "framework_version": "s",
    "torch_version": "s",
    "cuda_version": "s",
    "nccl_version": "s",
    "status": "s",
    "tokens_per_sec_per_gpu": "f",
    "tflops_per_gpu": "f",
    "mfu": "f",
    "hfu": "f",
    "peak_memory_gib": "f",
    "reserved_memory_gib": "f",
    "step_time_s": "f",
    "error_class": "s",
    "error_message": "s",
    "extra": "j",
}

#: Columns the server computes the same way for every run (DESIGN §2 "Rules").
DERIVED_FIELDS = (
    "model_size_class",  # billions of parameters, 2 significant figures
    "is_moe",  # mixture-of-experts (core.model.is_moe): the heatmap keeps MoE rows apart from dense ones
    "mfu_derived",
    "hfu_derived",
    "mfu_method",
    "peak_tflops",
    "fingerprint",
)

#: Accepted spellings of the config fields used by other tools, mapped to ours.
ALIASES = {
    "mbs": "micro_batch_size",
    "micro_batch": "micro_batch_size",
    "gas": "grad_accum_steps",
    "batch_accum": "grad_accum_steps",
    "grad_accum": "grad_accum_steps",
    "num_nodes": "nodes",
    "num_gpus": "world_size",
    "tok_per_sec_per_gpu": "tokens_per_sec_per_gpu",
}


#: Decimal magnitude suffixes of counts (parameters, tokens, FLOPs), as people and logs write them:
#: K, M, B (= G, "giga"), T, P, E are 10^3 ... 10^18. Upper case; readers fold the case.
COUNT_SUFFIXES: dict[str, int] = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12,
                                  "P": 10**15, "E": 10**18}

#: A parameter count written as a bare number below this (no suffix) is read as billions: "8" and
#: "470" are 8·10⁹ and 470·10⁹ parameters (nobody benchmarks distributed training of a model with
#: fewer than 10,000 parameters; "8" meaning eight parameters was a trap — GET /runs read it so while
#: /recommend read 8·10⁹).
BARE_BILLIONS_BELOW = 10_000

_COUNT = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|\.[0-9]+)\s*([KMBGTP]?)\s*", re.IGNORECASE)


def scale_count(number: str | float | int | Decimal, suffix: str = "") -> int:
    """`number` × the magnitude of `suffix` (COUNT_SUFFIXES, any case), computed exactly and rounded
    to a whole count: ("1.34", "G") -> 1340000000, ("8.03", "B") -> 8030000000. For parsers that have
    already split a printed count from its suffix (log lines, run-name prefixes); text a person typed
    goes through parse_param_count / parse_count. Raises KeyError for an unknown suffix and
    decimal.InvalidOperation for a number Decimal cannot read."""
    return int((Decimal(str(number)) * COUNT_SUFFIXES[suffix.upper()]).to_integral_value())


def _split_count(text: str | int | float, what: str) -> tuple[Decimal, str]:
    """(number, suffix) of a count as written; raises ValueError naming `what` and the value."""
    if isinstance(text, bool):
        raise ValueError(f"{text!r} is not a {what}")
    if isinstance(text, int | float):
        if not math.isfinite(text):
            raise ValueError(f"{text!r} is not a {what}: not finite")
        return Decimal(str(text)), ""
    m = _COUNT.fullmatch(str(text).replace(",", "").replace("_", ""))
    if not m:
        raise ValueError(f"{text!r} is not a {what}: expected digits or a number with K, M, B or T "
                         "(e.g. 8030261248, 8B, 1.34B, 350M)")
    try:
        return Decimal(m.group(1)), m.group(2).upper()
    except InvalidOperation:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"{text!r} is not a {what}") from None


def parse_count(text: str | int | float, *, what: str = "count") -> int:
    """A count as people write it: 15000000000, '1.5e12', '500B', '11T', '2,048' -> int (suffixes:
    COUNT_SUFFIXES, powers of 1,000, any case; commas and underscores between digits ignored); a
    fraction left after scaling is rounded. For token counts; parameter counts: parse_param_count.

    Raises ValueError naming `what` and the value when it cannot be read or is not positive."""
    number, suffix = _split_count(text, what)
    scaled = number * COUNT_SUFFIXES[suffix]
    if scaled < 1:
        raise ValueError(f"{text!r} is not a positive {what}")
    return int(scaled.to_integral_value())


def parse_param_count(text: str | int | float) -> int:
    """The one parameter-count parser (the API's query parameters, the CLI, the importers):
    8030261248, '8,030,261,248', '8B', '1.34B', '350M', '1.3b', '1T', '8e9' -> int. A bare number
    below BARE_BILLIONS_BELOW (10,000) is billions: '8' and 8 -> 8·10⁹, '470' -> 470·10⁹, '1.5' ->
    1.5·10⁹.

    Raises ValueError naming the value: unreadable, not positive, or not a whole count ('12345.5')."""
    number, suffix = _split_count(text, "parameter count")
    if not suffix and number < BARE_BILLIONS_BELOW:
        suffix = "B"
    scaled = number * COUNT_SUFFIXES[suffix]
    if scaled < 1:
        raise ValueError(f"{text!r} is not a positive parameter count")
    if scaled != scaled.to_integral_value():
        raise ValueError(f"{text!r} is not a whole parameter count")
    return int(scaled)


# ------------------------------------------------------------------------------------------------
# Reading one field of a run mapping


def get_field(run: Mapping[str, Any], key: str) -> Any:
    """run[key], else run["extra"][key] (extra may be a dict or its JSON text); NaN reads as None."""
    found = run.get(key)
    if found is None:  # only then is extra read (and its JSON text parsed)
        extra = run.get("extra")
        if isinstance(extra, str):
            try:
                extra = json.loads(extra)
            except ValueError:
                extra = None
        if isinstance(extra, dict):
            found = extra.get(key)
    if isinstance(found, float) and math.isnan(found):
        return None
    return found


def positive_int_field(run: Mapping[str, Any], key: str) -> int | None:
    """`get_field(run, key)` as a positive int (numeric text and whole floats accepted); None when absent.
    Raises ValueError naming the field when it is not a number or not positive."""
    if (found := get_field(run, key)) in (None, ""):
        return None
    try:
        number = int(float(found))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{key}: not a number: {found!r}") from exc
    if number <= 0:
        raise ValueError(f"{key}: must be positive, got {found!r}")
    return number


#: how true and false are written in CSV cells, logs, configs and command lines
TRUE_WORDS = ("true", "t", "yes", "y", "1", "on")
FALSE_WORDS = ("false", "f", "no", "n", "0", "off")


def parse_bool(field: str, value: Any) -> bool:
    """A boolean field's value as written (True/False, 1/0, 'true'/'false', 'yes'/'no', 'on'/'off',
    any case). Raises ValueError naming the field and the value for anything else (2, 'maybe')."""
    if isinstance(value, bool):
        return value
    if isinstance(value, int) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.strip().lower() in TRUE_WORDS + FALSE_WORDS:
        return value.strip().lower() in TRUE_WORDS
    raise ValueError(f"{field}: {value!r} is not true or false")


def flag_field(run: Mapping[str, Any], key: str) -> bool | None:
    """`get_field(run, key)` as a bool ('1'/'true'/'yes'/'t' are true, other text false); None when absent."""
    if (found := get_field(run, key)) in (None, ""):
        return None
    return found.strip().lower() in ("1", "true", "yes", "t") if isinstance(found, str) else bool(found)


#: at most this many tags per run, each at most TAG_MAX_LEN characters
MAX_TAGS = 32
TAG_MAX_LEN = 100


def parse_tags(value: Any) -> list[str] | None:
    """A run's `tags` as written: a list of strings, its JSON text ('["a", "b"]') or comma-separated
    text ('a, b'); None or '' -> None. Tags are stripped, empty ones dropped, duplicates kept once in
    order. Raises ValueError naming the value for a non-string tag, more than MAX_TAGS tags or a tag
    longer than TAG_MAX_LEN characters."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, str):
        text = value.strip()
        if text.startswith("["):
            try:
                value = json.loads(text)
            except ValueError:
                raise ValueError(f"tags: {value!r} is not a JSON list of strings") from None
        else:
            value = text.split(",")
    if not isinstance(value, list | tuple) or not all(isinstance(t, str) for t in value):
        raise ValueError(f"tags: {value!r} is not a list of strings")
    tags = list(dict.fromkeys(t.strip() for t in value if t.strip()))
    if len(tags) > MAX_TAGS:
        raise ValueError(f"tags: {len(tags)} tags; at most {MAX_TAGS}")
    if any(len(t) > TAG_MAX_LEN for t in tags):
        raise ValueError(f"tags: a tag is longer than {TAG_MAX_LEN} characters")
    return tags or None
