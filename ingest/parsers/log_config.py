"""Configuration a training log states in its launcher command line or a config dump, whatever the
framework: one table of option synonyms (:data:`CONFIG_KEYS`), read from ``--flag value`` /
``--flag=value`` arguments, ``key: value`` / ``key=value`` lines (YAML, OmegaConf, argparse
``Namespace(...)`` and dataclass reprs), JSON/dict dumps and Megatron's ``key ...... value`` argument
dump. Standard library only.

Only what the text states: a key printed twice with different values is a conflict and left out
(``ingest.parsers.log_facts._Facts``); a maximum is not a size (``model_max_length``, ``cutoff_len``
are truncation limits, not the sequence length of a batch, and are not read); ``batch_size`` alone is
not read (per device in torchtune, per process in nanoGPT, global elsewhere).

``gated_linear_unit`` (the MLP has a gate: SwiGLU/GeGLU, three matrices) is set only where the log says
it: Megatron's ``--swiglu`` flag or ``swiglu`` argument, a config's ``swiglu: true`` /
``gated_linear_unit: true``, or a Hugging Face config naming its architecture
(``"architectures": ["LlamaForCausalLM"]`` or ``model_type``), looked up in
:data:`core.model.GATED_MLP_ARCHITECTURES`; an activation name alone (``hidden_act: silu``) says
nothing about a gate and is not read.
"""

from __future__ import annotations

import ast
import re
from typing import Any

from core.model import GATED_MLP_ARCHITECTURES
from ingest.parsers.log_reader import normalise_key, pairs

__all__ = ["CONFIG_KEYS", "config_facts"]

#: option name (normalised: lower case, "-" as "_") -> run-record field. Sources: Megatron-LM
#: arguments.py, Hugging Face TrainingArguments, DeepSpeed config, NeMo/Megatron-Bridge configs,
#: torchtitan job config, llm-foundry YAML, nanotron config, MaxText base.yml, Lightning Trainer.
CONFIG_KEYS: dict[str, str] = {
    **dict.fromkeys(("tensor_model_parallel_size", "tensor_parallel_size", "tensor_parallel_degree",
                     "parallelism.tensor_parallel_degree", "tp_size"), "tp"),
    **dict.fromkeys(("pipeline_model_parallel_size", "pipeline_parallel_size", "pipeline_parallel_degree",
                     "parallelism.pipeline_parallel_degree", "pp_size", "pipe_parallel_size"), "pp"),
    **dict.fromkeys(("context_parallel_size", "context_parallel_degree", "parallelism.context_parallel_degree",
                     "cp_size"), "cp"),
    **dict.fromkeys(("expert_model_parallel_size", "expert_parallel_size", "expert_parallel_degree",
                     "parallelism.expert_parallel_degree", "ep_size"), "ep"),
    **dict.fromkeys(("data_parallel_size", "dp_size"), "dp"),
    **dict.fromkeys(("micro_batch_size", "per_device_train_batch_size", "train_micro_batch_size_per_gpu",
                     "device_train_microbatch_size", "micro_batch_size_per_gpu", "per_device_batch_size",
                     "training.local_batch_size", "local_batch_size",
                     "instantaneous batch size per device"), "micro_batch_size"),  # HF Trainer's banner
    **dict.fromkeys(("gradient_accumulation_steps", "grad_accum_steps", "accumulate_grad_batches",
                     "batch_accumulation_per_replica", "gradient_accumulation_iters",
                     "gradient accumulation steps"), "grad_accum_steps"),
    **dict.fromkeys(("seq_length", "seq_len", "max_seq_len", "sequence_length", "encoder_seq_length",
                     "max_target_length", "training.seq_len"),
                    "seq_len"),
    **dict.fromkeys(("global_batch_size", "global_train_batch_size", "train_batch_size"), "global_batch_size"),
    **dict.fromkeys(("zero_stage", "zero_optimization.stage", "zero_optimization_stage"), "zero_stage"),
    # torchrun's elastic agent prints its launch configs ("min_nodes : 2", "nproc_per_node : 8"); a
    # range (min != max) is a conflict and left out. DeepSpeed's launcher: nnodes=, num_local_procs=,
    # dist_world_size=; Accelerate's state: "Num processes: 8"
    **dict.fromkeys(("num_nodes", "nnodes", "trainer.num_nodes", "min_nodes", "max_nodes"), "nodes"),
    **dict.fromkeys(("nproc_per_node", "gpus_per_node", "trainer.devices", "devices", "n_gpus_per_node",
                     "num_local_procs"), "gpus_per_node"),
    **dict.fromkeys(("world_size", "dist_world_size", "num processes"), "world_size"),
    **dict.fromkeys(("num_layers", "num_hidden_layers", "n_layers", "n_layer"), "num_layers"),
    **dict.fromkeys(("hidden_size", "d_model", "n_embd"), "hidden_size"),
    **dict.fromkeys(("num_attention_heads", "n_heads", "n_head"), "num_heads"),
    **dict.fromkeys(("num_key_value_heads", "num_query_groups", "n_kv_heads"), "num_kv_heads"),
    **dict.fromkeys(("ffn_hidden_size", "intermediate_size"), "ffn_hidden_size"),
}
_INT_FIELDS = frozenset(CONFIG_KEYS.values())
#: precision flags: (option, its value meaning "on") -> precision
_PRECISION = {"bf16": "bf16", "bfloat16": "bf16", "fp16": "fp16", "float16": "fp16", "half": "fp16",
              "fp8": "fp8", "fp32": "fp32", "float32": "fp32", "bf16-mixed": "bf16", "16-mixed": "fp16",
              "bf16-true": "bf16", "32-true": "fp32", "32": "fp32"}
_PRECISION_KEYS = ("dtype", "precision", "mixed_precision", "compute_dtype", "trainer.precision",
                   "training.mixed_precision_param")

_FLAG = re.compile(r"(?<![\w-])--([A-Za-z][\w.-]*)(?:[ =]+(?!--)([^\s\\'\"]+|'[^']*'|\"[^\"]*\"))?")
_MEGATRON_DUMP = re.compile(r"^([a-z_][a-z0-9_]*) \.{3,} (\S.*?)\s*$")
_ARCH = re.compile(r"""["']?(?:architectures|model_type|_class_name)["']?\s*[:=]\s*\[?\s*["']?([A-Za-z0-9_]+)""")
_TORCH_PRECISION = re.compile(r"\bprecision[ :=]+torch\.(bfloat16|float16|float32)\b")
_ZERO_JSON = re.compile(r"""["']zero_optimization["']\s*:\s*\{[^{}]*?["']stage["']\s*:\s*([0-3])\b""")
_HF_TOTAL_BATCH = re.compile(r"Total train batch size \(w\. parallel, distributed & accumulation\) = ([\d,]+)")
_WORLD_INFO = re.compile(r"WORLD INFO DICT: (\{.*\})")
_TRUE = {"true", "1", "yes", "on"}
_FALSE = {"false", "0", "no", "off", "none"}


def _key(name: str) -> str:
    return normalise_key(name).replace("-", "_")


def _pairs(lines: list[str]) -> list[tuple[str, str]]:
    """Every (normalised key, raw value) the config text states, in order."""
    found: list[tuple[str, str]] = []
    for line in lines:
        for flag, value in _FLAG.findall(line):
            found.append((_key(flag), value.strip("'\"") if value else "true"))
        m = _MEGATRON_DUMP.match(line)
        if m:
            found.append((m.group(1), m.group(2)))
            continue
        found.extend((_key(k), v) for k, v in pairs(line).items())
    return found


def _world_info(line: str) -> dict[str, list] | None:
    """DeepSpeed launcher's host -> local ranks map, or None."""
    m = _WORLD_INFO.search(line)
    if not m:
        return None
    try:
        hosts = ast.literal_eval(m.group(1))
    except (ValueError, SyntaxError):
        return None
    ok = isinstance(hosts, dict) and hosts and all(isinstance(v, list) and v for v in hosts.values())
    return hosts if ok else None


def config_facts(lines: list[str], put: Any) -> None:
    """Feed what the cleaned ``lines`` state into ``put(field, values)`` (log_facts.Facts.put)."""
    ints: dict[str, set[int]] = {}
    precision: set[str] = set()
    gated: set[bool] = set()
    for key, raw in _pairs(lines):
        value = raw.strip().strip(",;").strip("'\"")
        field = CONFIG_KEYS.get(key)
        if field in _INT_FIELDS and re.fullmatch(r"\d+", value) and (int(value) > 0 or field == "zero_stage"):
            ints.setdefault(field, set()).add(int(value))
        elif key in _PRECISION and value.lower() in _TRUE:  # "--bf16 True", "bf16: true", "--fp16"
            precision.add(_PRECISION[key])
        elif key in _PRECISION_KEYS and value.lower().removeprefix("torch.") in _PRECISION:
            precision.add(_PRECISION[value.lower().removeprefix("torch.")])
        elif key in ("swiglu", "gated_linear_unit") and value.lower() in _TRUE | _FALSE:
            gated.add(value.lower() in _TRUE)
    for line in lines:
        torch_dtype = _TORCH_PRECISION.search(line)  # torchtune "initialized with precision torch.bfloat16"
        if torch_dtype:
            precision.add(_PRECISION[torch_dtype.group(1)])
        for name in _ARCH.findall(line):
            if name in GATED_MLP_ARCHITECTURES:
                gated.add(GATED_MLP_ARCHITECTURES[name])
    zero = _ZERO_JSON.findall("\n".join(lines))  # DeepSpeed's JSON config: "zero_optimization": {"stage": 2
    if zero:
        ints.setdefault("zero_stage", set()).update(int(z) for z in zero)
    for line in lines:  # DeepSpeed's launcher: "WORLD INFO DICT: {'node-1': [0, 1, 2, 3], 'node-2': [...]}"
        hosts = _world_info(line)
        if hosts:
            ints.setdefault("nodes", set()).add(len(hosts))
            ints.setdefault("gpus_per_node", set()).update(len(ranks) for ranks in hosts.values())
    for line in lines:  # HF Trainer's banner (its key has a comma inside parentheses)
        total = _HF_TOTAL_BATCH.search(line)
        if total:
            ints.setdefault("global_batch_size", set()).add(int(total.group(1).replace(",", "")))
    global_batch = ints.pop("global_batch_size", set())
    for field, values in ints.items():
        put(field, values)
    if precision:
        put("precision", precision)
    if gated:
        put("gated_linear_unit", gated)
    if global_batch:
        put("global_batch_samples", global_batch)
