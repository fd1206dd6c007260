"""The run record's vocabulary (DESIGN §2, §6), standard library only.

These names are the JSON API's, the `runs` table's, CSV export's and SQL's. The service imports
them from here so that the training-side agent and the server can never disagree.
"""

from __future__ import annotations

#: `status` values. A failed run is a result, never dropped.
STATUSES = ("success", "oom", "nccl_error", "timeout", "failed")

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
    "unknown",
)

#: Fields a client reports, in wire order. Types: s=str, i=int, f=float, t=ISO-8601 timestamp,
#: j=JSON object.
REPORTED_FIELDS: dict[str, str] = {
    "run_key": "s",
    "name": "s",
    "started_at": "t",
    "source": "s",
    "model_name": "s",
    "model_params": "i",
    "num_layers": "i",
    "hidden_size": "i",
    "num_heads": "i",
    "num_kv_heads": "i",
    "ffn_hidden_size": "i",
    "vocab_size": "i",
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


_COUNT_SCALE = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "G": 10**9, "T": 10**12}


def parse_param_count(text: str | int) -> int:
    """A parameter count as people write it: 8030261248, '8,030,261,248', '8B', '1.34B', '350M',
    '1.3b', '1T', '8e9' -> int (K/M/B(=G)/T are 10^3/10^6/10^9/10^12). The one parser the CLI and the API
    share. Raises ValueError saying what it wants."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 1:
            raise ValueError(f"{text!r} is not a positive parameter count")
        return text
    import re
    from decimal import Decimal, InvalidOperation

    m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*([KMBGT]?)\s*",
                     str(text).replace(",", "").replace("_", ""), re.IGNORECASE)
    if not m:
        raise ValueError(f"{text!r} is not a parameter count: expected digits or a number with K, M, B or T "
                         "(e.g. 8030261248, 8B, 1.34B, 350M)")
    try:
        value = Decimal(m.group(1)) * _COUNT_SCALE[m.group(2).upper()]
    except InvalidOperation:  # pragma: no cover - the regex admits only decimals
        raise ValueError(f"{text!r} is not a parameter count") from None
    if value < 1 or value != value.to_integral_value():
        raise ValueError(f"{text!r} is not a whole, positive parameter count")
    return int(value)
