"""Bounds on every numeric input that drives work (POST /memory, GET /plan, GET /recommend, GET /suggest).

One copy of the limits (DESIGN §7): an endpoint declares its parameters with these constants
(`Field(le=MAX_PP)` / `Query(le=MAX_PP)`, so FastAPI answers 422 naming the field and the limit) and
calls `check_parallelism` for the rules that tie fields together. The limits are generous for real
clusters and models and small enough that no request can make the service loop or allocate for long:

- a cluster: at most MAX_NODES nodes of at most MAX_GPUS_PER_NODE GPUs, MAX_GPUS GPUs in all
  (the largest training clusters reported in 2024-25 have ~10^5 GPUs);
- a parallel layout: each degree at most its MAX_*, their product dp·tp·pp·cp at most MAX_GPUS, and
  what the model allows (Megatron-LM / nanotron constraints): pp ≤ num_layers (a stage holds at least
  one layer), tp ≤ num_heads (heads are split across TP ranks), cp ≤ seq_len (a CP rank holds at least
  one token);
- a model: at most MAX_LAYERS layers, MAX_HIDDEN hidden size, MAX_HEADS heads, MAX_VOCAB vocabulary,
  MAX_MODEL_PARAMS parameters; sequences of at most MAX_SEQ_LEN tokens; batches of at most
  MAX_MICRO_BATCH samples and MAX_GRAD_ACCUM micro-batches per step.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from service.errors import ValidationFailed

MAX_NODES = 100_000
MAX_GPUS_PER_NODE = 1024
MAX_GPUS = 1 << 20
MAX_DP = MAX_GPUS
MAX_TP = 1024
MAX_PP = 1024
MAX_CP = 1024
MAX_EP = 4096
MAX_LAYERS = 10_000
MAX_HIDDEN = 1 << 20
MAX_HEADS = 1 << 16
MAX_FFN = 1 << 22
MAX_VOCAB = 1 << 24
MAX_SEQ_LEN = 1 << 24
MAX_MICRO_BATCH = 1 << 20
MAX_GRAD_ACCUM = 1 << 20
MAX_MODEL_PARAMS = 10**15
MAX_TOKENS = 10**18
MAX_DAYS = 36_500
MAX_K = 50
MAX_PEAK_TFLOPS = 1e6


def _detail(field: str, value: Any, message: str) -> dict[str, Any]:
    return {"field": field, "value": value, "message": f"{field}: {message}"}


def check_model_params(value: int | float, field: str = "model_params") -> None:
    """Raise ValidationFailed (422) when a parsed model size is beyond MAX_MODEL_PARAMS parameters."""
    if not 1 <= value <= MAX_MODEL_PARAMS:
        message = f"{field}: {value:.3g} parameters is outside 1..{MAX_MODEL_PARAMS:.0e}"
        raise ValidationFailed(message, [{"field": field, "value": str(value), "message": message}])


def check_parallelism(values: Mapping[str, Any]) -> None:
    """Check the rules that tie a layout to its cluster and model (module docstring).

    `values`: run-record field names → values (None or absent = not given; degrees default to 1).
    Raises ValidationFailed (422) with one detail per broken rule, each naming the field, its value
    and the limit.
    """
    def get(name: str) -> int | None:
        v = values.get(name)
        return v if isinstance(v, int) and not isinstance(v, bool) else None

    details = []
    degrees = {k: get(k) or 1 for k in ("dp", "tp", "pp", "cp")}
    world = degrees["dp"] * degrees["tp"] * degrees["pp"] * degrees["cp"]
    if world > MAX_GPUS:
        details.append(_detail("dp", degrees["dp"], f"dp·tp·pp·cp = {world} GPUs exceeds the limit of {MAX_GPUS}"))
    layers, heads, seq = get("num_layers"), get("num_heads"), get("seq_len")
    if layers is not None and degrees["pp"] > layers:
        details.append(_detail("pp", degrees["pp"], f"must be <= num_layers ({layers}): a stage holds at least "
                                                    "one layer"))
    if heads is not None and degrees["tp"] > heads:
        details.append(_detail("tp", degrees["tp"], f"must be <= num_heads ({heads}): heads are split across "
                                                    "TP ranks"))
    if seq is not None and degrees["cp"] > seq:
        details.append(_detail("cp", degrees["cp"], f"must be <= seq_len ({seq}): a CP rank holds at least "
                                                    "one token"))
    nodes, per_node = get("nodes"), get("gpus_per_node")
    if nodes is not None and per_node is not None and nodes * per_node > MAX_GPUS:
        details.append(_detail("nodes", nodes, f"nodes·gpus_per_node = {nodes * per_node} GPUs exceeds the limit "
                                               f"of {MAX_GPUS}"))
    if details:
        raise ValidationFailed(details[0]["message"], details)
