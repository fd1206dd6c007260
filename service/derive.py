"""Derived fields and cross-field invariants of a run record (DESIGN §2 "Rules", §4).

Derived values are computed one way for every run, whatever framework reported it:

- world_size = nodes × gpus_per_node unless reported; nodes / gpus_per_node are filled from
  the others when the division is exact;
- parallelism degrees: one the record does not state stays None (NULL), never 1 by default. The
  invariant tp·pp·cp·dp = world_size fills them only where it determines them (one unknown degree
  with the others known, or the known ones already multiplying to world_size: the rest are 1) and
  is checked only when all four are known; ep's divisibility only when ep, dp, cp, tp are known.
  Every filled value is named in extra.derived_fields;
- global_batch_tokens = dp · micro_batch_size · grad_accum_steps · seq_len unless reported;
- model_size_class (core.model.model_size_class): model_params in billions to 2 significant
  figures; without model_params, the count from dims (core.model.params_from_dims);
- is_moe (core.model.is_moe): a mixture-of-experts run (EP > 1, experts declared in extra, or active
  parameters known); the heatmap's cells are (model_size_class, is_moe, nodes), so a MoE model never
  shares a cell with a dense model of the same total size;
- mfu_derived (PaLM, Chowdhery et al. 2022, arXiv 2204.02311, appendix B; core.model.flops_per_token):
  MFU = (6·N + 12·L·h·s) · tokens_per_sec_per_gpu / peak_flops, with N total parameters,
  L layers, h hidden size, s seq_len; without dims the attention term is dropped (6·N alone).
  When only tflops_per_gpu is reported, MFU = tflops_per_gpu / peak. `mfu_method` says which.
  For mixture-of-experts runs N is the parameter count *active* per token (extra.active_params or
  an "A3B" name token: core.model.active_params); without it MFU is only derived from a reported tflops_per_gpu.
- hfu_derived: with full recompute one more forward pass is executed:
  (8·N + 16·L·h·s) · tokens/s / peak; otherwise hfu_derived = mfu_derived (selective recompute's
  extra attention FLOPs are ignored).
- fingerprint: hash of config + hardware + framework/torch/CUDA/NCCL versions (regressions).
- allreduce_gb_s, ar_intra_node_gb_s: the collective bandwidths the run recorded in extra (GB/s),
  copied into columns of their own when they are numbers (a JSON number or numeric text, finite),
  else None; extra keeps them as reported (migration 0010 backfills stored runs the same way).
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass
from typing import Any

from core import hardware
from core.model import (
    active_params,
    flops_per_token,
    is_moe,
    known_model,
    model_size_class,
    params_from_dims,
)

#: Config and environment fields that make two runs "the same experiment" for regressions.
FINGERPRINT_FIELDS = (
    "model_name", "model_params", "num_layers", "hidden_size", "seq_len", "gpu_type", "gpus_per_node",
    "nodes", "dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size", "grad_accum_steps",
    "recompute", "precision", "framework", "framework_version", "torch_version", "cuda_version",
    "nccl_version",
)


#: extra keys of the collective bandwidths a run recorded, each also stored in the column of that name
RECORDED_BANDWIDTHS = ("allreduce_gb_s", "ar_intra_node_gb_s")


def _number(value: Any) -> float | None:
    """A finite number given as a JSON number or numeric text; None for anything else (booleans too)."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        return None
    try:
        number = float(value)
    except ValueError:
        return None
    if isinstance(value, str) and "_" in value:  # float() reads '1_000'; SQL casts do not
        return None
    return number if math.isfinite(number) else None


@dataclass(frozen=True)
class FieldError:
    """One problem with one field: what the API's error details list."""

    field: str
    value: Any
    message: str

    def as_dict(self) -> dict[str, Any]:
        return {"field": self.field, "value": self.value, "message": self.message}


def complete(rec: dict[str, Any]) -> tuple[dict[str, Any], list[FieldError]]:
    """Fill derived columns of one validated record and check cross-field invariants, in phases:
    catalog names (_canonical_names), the cluster and parallel layout (_layout), the global batch,
    the parameter count the FLOPs rule takes (_flops_params), MFU and HFU (_utilisation).

    `rec` is a RunIn dump (wire field names, python types). Returns (row, errors): `row` holds every
    `runs` column except id/run_key/content_hash/ingested_at; `errors` is empty when the record
    is acceptable. Never raises for bad data: every problem becomes a FieldError.
    """
    row = dict(rec)
    errors: list[FieldError] = []
    extra = dict(row.get("extra") or {})
    canonicalised = _canonical_names(row, extra)
    derived = _layout(row, errors)  # a degree the record does not state stays None (NULL)
    if row.get("global_batch_tokens") is None:
        mbs, gas, seq = row.get("micro_batch_size"), row.get("grad_accum_steps"), row.get("seq_len")
        if row["dp"] and mbs and gas and seq:
            row["global_batch_tokens"] = row["dp"] * mbs * gas * seq
            derived.append("global_batch_tokens")
    derived += known_dims(row, extra)
    _utilisation(row, *_flops_params(row, extra), errors)
    # which stored values the server computed from the others (never a value without evidence)
    if derived:
        extra["derived_fields"] = sorted(set(derived) | set(extra.get("derived_fields") or []))
    if canonicalised:
        extra["canonicalised_fields"] = canonicalised
    for key in RECORDED_BANDWIDTHS:
        row[key] = _number(extra.get(key))
    row["extra"] = extra or None
    row["fingerprint"] = fingerprint(row)
    return row, errors


def _canonical_names(row: dict[str, Any], extra: dict[str, Any]) -> list[str]:
    """gpu_type and precision rewritten (in place) to the catalog's names (core.hardware), the
    reported names kept in `extra`; returns the fields rewritten."""
    canonicalised: list[str] = []
    reported_gpu = row.get("gpu_type")
    canonical = hardware.canonical_gpu_type(reported_gpu)
    if canonical and canonical != reported_gpu:
        extra.setdefault("gpu_type_reported", reported_gpu)
        row["gpu_type"] = canonical
        canonicalised.append("gpu_type")
    reported_precision = row.get("precision")
    precision = hardware.canonical_precision(reported_precision)
    if precision != reported_precision and reported_precision is not None:
        extra.setdefault("precision_reported", reported_precision)
        canonicalised.append("precision")
    row["precision"] = precision
    return canonicalised


def _layout(row: dict[str, Any], errors: list[FieldError]) -> list[str]:
    """world_size, nodes, gpus_per_node and the degrees dp, tp, pp, cp completed (in place) where
    the others determine them, and checked (module docstring); ep's divisibility checked. Appends
    to `errors`; returns the fields derived."""
    derived: list[str] = []
    nodes, gpn, world = row.get("nodes"), row.get("gpus_per_node"), row.get("world_size")
    degrees: dict[str, int | None] = {d: row.get(d) for d in ("dp", "tp", "pp", "cp")}
    ep = row.get("ep")

    if nodes and gpn:
        # a job may use part of its last node (4 GPUs of one 8-GPU node), never more than all of them
        if world is not None and not (nodes - 1) * gpn < world <= nodes * gpn:
            errors.append(FieldError("world_size", world,
                                     f"world_size {world} does not fit nodes {nodes} × gpus_per_node {gpn} "
                                     f"= {nodes * gpn} GPUs"))
        if world is None:
            world = nodes * gpn
            derived.append("world_size")
    if world is None and all(degrees.values()):
        world = math.prod(v for v in degrees.values() if v)
        derived.append("world_size")
    if world:
        if nodes is None and gpn and world % gpn == 0:
            nodes = world // gpn
            derived.append("nodes")
        if gpn is None and nodes and world % nodes == 0:
            gpn = world // nodes
            derived.append("gpus_per_node")
        errors.extend(_check_degrees(degrees, world, derived))
    dp = degrees["dp"]
    if ep and ep > 1 and dp and degrees["cp"] and degrees["tp"]:
        carve = dp * degrees["cp"] * degrees["tp"]
        if carve % ep:
            errors.append(FieldError("ep", ep, f"ep {ep} must divide dp·cp·tp = {dp}·{degrees['cp']}·{degrees['tp']} "
                                               f"= {carve} (expert parallelism is carved out of DP×CP, or folded "
                                               "over TP too: Megatron-Core MoE parallel folding, arXiv 2504.14960)"))
    row.update(degrees)
    row.update(nodes=nodes, gpus_per_node=gpn, world_size=world, dp=dp)
    return derived


def _flops_params(row: dict[str, Any], extra: dict[str, Any]) -> tuple[Any, str]:
    """Sets model_size_class (from model_params, else the count from dims); returns (N, where from)
    for the FLOPs rule: the parameters each token passes through — for MoE the active ones
    ("active_params"), None when they are unknown ("moe")."""
    n_params = row.get("model_params")
    n_source = "model_params"
    if not n_params:
        n_params = params_from_dims(row)
        n_source = "dims"
    row["model_size_class"] = model_size_class(n_params)
    row["is_moe"] = is_moe(row, extra)
    # MoE: the 6N rule counts the parameters each token passes through (active), not the total.
    active = active_params(row.get("model_name"), extra)
    if active:
        n_params, n_source = active, "active_params"
    elif is_moe(row, extra):
        n_params, n_source = None, "moe"
    return n_params, n_source


def _utilisation(row: dict[str, Any], n_params: Any, n_source: str, errors: list[FieldError]) -> None:
    """peak_tflops, mfu_derived, hfu_derived and mfu_method (in place; module docstring); an MFU
    above 1 is an error naming the throughput field it came from."""
    precision = row["precision"]
    # the peak depends on the precision (H100: 989 bf16, 1,979 fp8): without one there is no MFU
    peak = hardware.peak_tflops(row.get("gpu_type"), precision) if precision else None
    row["peak_tflops"] = peak
    row["mfu_derived"] = row["hfu_derived"] = row["mfu_method"] = None
    if precision is None and hardware.lookup(row.get("gpu_type")) is not None:
        row["mfu_method"] = "precision unknown: no MFU (the peak depends on the precision)"
    elif precision is not None and peak is None and hardware.lookup(row.get("gpu_type")) is not None:
        row["mfu_method"] = f"no {precision} peak for this GPU: no MFU"  # (String(64))
    tps = row.get("tokens_per_sec_per_gpu")
    if peak:
        if n_params and tps is not None:
            fpt, method = flops_per_token(n_params, row.get("num_layers"), row.get("hidden_size"), row.get("seq_len"))
            row["mfu_derived"] = fpt * tps / (peak * 1e12)
            row["mfu_method"] = method + {"dims": "(N from dims)", "active_params": "(N active)"}.get(n_source, "")
            if row.get("recompute") == "full":
                hfpt, _ = flops_per_token(n_params, row.get("num_layers"), row.get("hidden_size"),
                                          row.get("seq_len"), recompute_full=True)
                row["hfu_derived"] = hfpt * tps / (peak * 1e12)
            else:
                row["hfu_derived"] = row["mfu_derived"]
        elif row.get("tflops_per_gpu") is not None:
            row["mfu_derived"] = row["tflops_per_gpu"] / peak
            row["mfu_method"] = "tflops_per_gpu/peak"
    if row["mfu_derived"] is not None and row["mfu_derived"] > 1.0:
        from_tflops = row["mfu_method"] == "tflops_per_gpu/peak"
        field = "tflops_per_gpu" if from_tflops else "tokens_per_sec_per_gpu"
        value = row.get(field)
        errors.append(FieldError(field, value, (
            f"{field}={value} gives a derived MFU of {row['mfu_derived']:.3f} > 1 ({row['mfu_method']}, "
            f"N={n_params}, gpu_type={row.get('gpu_type')}, peak {peak} TFLOP/s at {precision or 'bf16'}): "
            "is the throughput per GPU, and are the hardware and model size right?")))
    if row["mfu_derived"] is None and n_source == "moe" and tps is not None:
        row["mfu_method"] = "moe: active params unknown (set extra.active_params)"


def _check_degrees(degrees: dict[str, int | None], world: int, derived: list[str]) -> list[FieldError]:
    """Check and complete dp, tp, pp, cp (in place) against tp·pp·cp·dp = world_size (DESIGN §2).

    Degrees are integers ≥ 1, so the invariant determines the unknown ones only when
    - exactly one is unknown: it is world_size / (product of the others), if that divides exactly;
    - the known ones already multiply to world_size: every unknown one is 1.
    Otherwise the unknown ones stay None. Every filled degree is appended to `derived`. Returns the
    invariant violations (the known degrees do not multiply to, or do not divide, world_size).
    """
    known = {d: v for d, v in degrees.items() if v}
    unknown = [d for d in degrees if not degrees[d]]
    product = math.prod(known.values())
    stated = "·".join(f"{d}={v}" for d, v in known.items())
    if not unknown:
        if product != world:
            tp, pp, cp, dp = (degrees[d] for d in ("tp", "pp", "cp", "dp"))
            return [FieldError("dp", dp, f"tp·pp·cp·dp = {tp}·{pp}·{cp}·{dp} = {product} != world_size {world}")]
        return []
    if world % product:
        field = "dp" if "dp" in known else "world_size"
        return [FieldError(field, degrees.get(field) if field == "dp" else world,
                           f"world_size {world} is not divisible by {stated} = {product}")]
    if len(unknown) == 1:
        degrees[unknown[0]] = world // product
        derived.append(unknown[0])
    elif product == world:
        for d in unknown:
            degrees[d] = 1
            derived.append(d)
    return []


def fingerprint(row: dict[str, Any]) -> str:
    """16-hex-digit hash of FINGERPRINT_FIELDS (config + hardware + software versions)."""
    key = json.dumps([row.get(f) for f in FINGERPRINT_FIELDS], default=str)
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def content_hash(reported: dict[str, Any]) -> str:
    """SHA-256 of the reported fields (run_key excluded), canonical JSON: idempotency check."""
    body = {k: v for k, v in reported.items() if k != "run_key" and v is not None}
    return hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()


#: the dims a published model's configuration gives (core/model.KnownModel's field for each)
_KNOWN_DIMS = {"num_layers": "layers", "hidden_size": "h", "num_heads": "heads", "num_kv_heads": "kv",
               "ffn_hidden_size": "ffn", "vocab_size": "vocab", "gated_linear_unit": "gated"}


def known_dims(row: dict[str, Any], extra: dict[str, Any]) -> list[str]:
    """Fill the dims of a run that names a published model (core/model.known_model: "LLAMA3_70B",
    "MPT-7b") and states neither num_layers nor hidden_size, from that model's released configuration;
    extra.dims_source names it. Returns the fields filled (derived: never a value the run contradicts —
    a stated dim, or a model_params more than 5 % off, leaves the run as it is)."""
    if row.get("num_layers") or row.get("hidden_size"):
        return []
    model = known_model(row.get("model_name"), row.get("model_params"))
    if model is None:
        return []
    filled = [f for f in _KNOWN_DIMS if row.get(f) is None]
    for f in filled:
        row[f] = getattr(model, _KNOWN_DIMS[f])
    if "tie_word_embeddings" not in extra:
        extra["tie_word_embeddings"] = model.tied
        filled.append("extra.tie_word_embeddings")
    extra["dims_source"] = model.source
    return filled
