"""Configuration facts a training log prints, whatever the framework. Standard library only.

:func:`log_facts` returns ``(fields, extra, derived)``: run-record fields the log STATES (launcher
lines, parallel sizes, device names, parameter counts, sequence length, precision, versions),
``extra`` for context (the lines they came from, conflicts), and ``derived``: names of fields set
from a documented default rather than a printed number (e.g. torchrun's ``--nnodes`` defaults to 1).
Nothing is guessed: a fact printed twice with different values is left out and the conflict kept
in ``extra``.

Sources of the line formats
- torchrun (``torch/distributed/run.py``): ``--nproc_per_node``/``--nproc-per-node N``, ``--nnodes
  N`` (default ``1:1``; a range ``MIN:MAX`` says nothing); mpirun/mpiexec ``-np``/``--np``/``-n N``
  and MPICH/PALS ``-ppn N`` (processes per node); ``NGPU=N`` (torchtitan's ``run_train.sh`` passes
  it as ``--nproc_per_node``); ``WORLD_SIZE=N``; Slurm ``SLURM_NNODES``/``SLURM_JOB_NUM_NODES``,
  ``SLURM_NTASKS``, ``SLURM_GPUS_ON_NODE``.
- Megatron-LM ``arguments.py``: ``using world size: 16, data-parallel size: 2, context-parallel
  size: 1, ... tensor-model-parallel size: 4, ... pipeline-model-parallel size: 2``;
  ``theoretical_memory_usage.py``: ``Total number of parameters in billions: 8.03``.
- torchtitan CLI flags ``--parallelism.{data_parallel_shard,data_parallel_replicate,tensor_parallel,
  pipeline_parallel,context_parallel,expert_parallel}_degree N`` (``-1`` = "the rest": not a number)
  and ``--training.seq_len N``.
- nanotron ``Total number of parameters: 1.71G (3264.00MiB)`` (``human_format``); generic
  ``Number of parameters: 124,439,808``; PyTorch Lightning's summary ``24.2 B    Total params``.
- Device names as CUDA/ROCm report them (``torch.cuda.get_device_name``, nvidia-smi, rocm-smi):
  ``NVIDIA H100 80GB HBM3``, ``NVIDIA A100-SXM4-80GB``, ``Tesla V100-PCIE-32GB``, ``Tesla T4``,
  ``NVIDIA L4``, ``AMD Instinct MI300X``. The server maps the name to its catalog name
  (``core/hardware.py``) and keeps the reported one.
- NCCL ``NCCL INFO NCCL version 2.21.5+cuda12.4``; ``torch version ..... 2.1.0`` / ``PyTorch
  version: 2.1.0`` (Megatron-DeepSpeed, ``collect_env``); ``CUDA version: 12.1``.
"""

from __future__ import annotations

import re
from typing import Any

from core.record import scale_count
from ingest.parsers.log_config import config_facts

__all__ = ["log_facts"]

_FLAG = r"[ \t=]+"


def _ints(pattern: str, text: str, flags: int = 0) -> set[int]:
    return {int(v) for v in re.findall(pattern, text, flags) if v.isdigit() and int(v) > 0}


class _Facts:
    """Collects single-valued facts; a second, different value turns a fact into a conflict."""

    def __init__(self) -> None:
        self.fields: dict[str, Any] = {}
        self.conflicts: dict[str, list] = {}
        self.derived: list[str] = []

    def put(self, field: str, values: set | list, *, derived: bool = False) -> None:
        values = sorted(set(values))
        if not values or field in self.conflicts:
            return
        if len(values) > 1 or (field in self.fields and self.fields[field] != values[0]):
            self.conflicts[field] = sorted(set(values) | ({self.fields.pop(field)} if field in self.fields else set()))
            if field in self.derived:
                self.derived.remove(field)
            return
        self.fields[field] = values[0]
        if derived and field not in self.derived:
            self.derived.append(field)


_GPU = re.compile(
    # a one-digit model number only for the families that have one (Tesla T4, NVIDIA L4, NVIDIA A2):
    # "NVIDIA GPU0" is a device index, not a GPU type
    r"\b((?:NVIDIA|Tesla|Quadro|AMD Instinct|Instinct)\s+(?:GeForce\s+)?(?:[A-Z]{1,3}\d{2,4}|[TLA]\d(?!\d))[A-Za-z]*"
    r"(?:[- ](?:SXM\d?|PCIE|PCIe|NVL|HBM\d?e?|\d+GB|\d+G))*)")


def log_facts(text: str) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Facts stated by the log (see the module docstring). Returns (fields, extra, derived)."""
    f = _Facts()
    extra: dict[str, Any] = {}
    _launchers(f, extra, text)
    _parallel_sizes(f, text)
    _model_size(f, extra, text)
    _hardware_and_software(f, extra, text)
    config_facts(text.splitlines(), f.put)
    if f.conflicts:
        extra["conflicting_facts"] = f.conflicts
    return f.fields, extra, f.derived


def _launchers(f: _Facts, extra: dict[str, Any], text: str) -> None:
    """torchrun / NGPU / mpirun / Slurm: GPUs per node, nodes, world size."""
    nproc = _ints(rf"--nproc[_-]per[_-]node{_FLAG}(\d+)\b", text)
    nnodes = _ints(rf"--nnodes{_FLAG}(\d+)(?![\d:])", text)
    torchrun = re.search(r"\btorchrun\b|torch\.distributed\.(?:run|launch)\b", text) is not None
    if nproc:
        f.put("gpus_per_node", nproc)
    if nnodes:
        f.put("nodes", nnodes)
    elif nproc and torchrun and not re.search(rf"--nnodes{_FLAG}\S", text):
        f.put("nodes", {1}, derived=True)  # torchrun's documented default: --nnodes=1:1
    ngpu = _ints(r"(?<![\w$])NGPU=(\d+)\b", text)
    if ngpu and not nproc:
        f.put("gpus_per_node", ngpu)
        if not nnodes:
            f.put("nodes", {1}, derived=True)  # torchtitan's run_train.sh: single-node torchrun
    world = _ints(r"(?<![\w$])WORLD_SIZE[=:]\s*(\d+)\b", text)
    mpi = _ints(r"\b(?:mpirun|mpiexec|aprun)\b[^\n]*?\s(?:--?np|-n)[ \t=]+(\d+)\b", text)
    ppn = _ints(r"\b(?:mpirun|mpiexec)\b[^\n]*?\s(?:-ppn|--ppn|-npernode|--npernode|--map-by ppr:)"
                r"[ \t=:]*(\d+)\b", text)
    f.put("world_size", world | mpi)
    if ppn:
        f.put("gpus_per_node", ppn)
    f.put("nodes", _ints(r"\bSLURM_(?:NNODES|JOB_NUM_NODES)[=:]\s*(\d+)\b", text))
    f.put("gpus_per_node", _ints(r"\bSLURM_GPUS_ON_NODE[=:]\s*(\d+)\b", text))
    ntasks = _ints(r"\bSLURM_NTASKS[=:]\s*(\d+)\b", text)
    if ntasks:
        extra["slurm_ntasks"] = min(ntasks) if len(ntasks) == 1 else sorted(ntasks)
        if not torchrun:  # srun launching one task per GPU; with torchrun a task is a node
            f.put("world_size", ntasks)

    if re.search(r"--standalone\b", text) and torchrun:
        f.put("nodes", {1})  # torchrun --standalone: a single-node rendezvous


def _parallel_sizes(f: _Facts, text: str) -> None:
    """Megatron-LM's printed sizes and command line, torchtitan's flags and trainer line."""
    f.put("world_size", _ints(r"using world size: (\d+)", text))
    for name, field in (("data-parallel", "dp"), ("context-parallel", "cp"), ("tensor-model-parallel", "tp"),
                        ("pipeline-model-parallel", "pp"), ("expert-model-parallel", "ep")):
        f.put(field, _ints(rf"(?<![\w-]){name} size: (\d+)", text))
    for flag, field in (("tensor-model-parallel-size", "tp"), ("pipeline-model-parallel-size", "pp"),
                        ("context-parallel-size", "cp"), ("expert-model-parallel-size", "ep")):
        f.put(field, _ints(rf"--{flag}{_FLAG}(\d+)\b", text))  # Megatron-LM command line
    f.put("micro_batch_size", _ints(rf"--micro-batch-size{_FLAG}(\d+)\b", text))
    for flag, field in (("tensor_parallel_degree", "tp"), ("pipeline_parallel_degree", "pp"),
                        ("context_parallel_degree", "cp"), ("expert_parallel_degree", "ep")):
        f.put(field, _ints(rf"--(?:parallelism|experimental)\.{flag}{_FLAG}(\d+)\b", text))
    shard = _ints(rf"--parallelism\.data_parallel_shard_degree{_FLAG}(\d+)\b", text)
    replicate = _ints(rf"--parallelism\.data_parallel_replicate_degree{_FLAG}(\d+)\b", text)
    if shard and replicate and len(shard) == len(replicate) == 1:
        f.put("dp", {next(iter(shard)) * next(iter(replicate))})
    f.put("seq_len", _ints(rf"--training\.seq_len{_FLAG}(\d+)\b", text)
          | _ints(r"--(?:seq[_-]length|max[_-]seq[_-]length|seq[_-]len)[ \t=]+(\d+)\b", text)
          | _ints(r"\bmax_target_length=(\d+)\b", text))

    # torchtitan's trainer line: "local batch size 1, global batch size 8, gradient accumulation steps 1,
    # sequence length 8192" (older: "Training starts at step 1, with local batch size 5, ...")
    f.put("micro_batch_size", _ints(r"\blocal batch size (\d+)", text))
    f.put("grad_accum_steps", _ints(r"\bgradient accumulation steps (\d+)", text))


def _model_size(f: _Facts, extra: dict[str, Any], text: str) -> None:
    """Parameter counts (nanotron, Megatron, generic, Lightning's summary)."""
    params: set[int] = set()
    for value, unit in re.findall(r"Total number of parameters: ([\d.]+)\s*([KMGBT]?)\b", text):
        params.add(scale_count(value, unit))
    billions = re.findall(r"Total number of parameters in billions:\s*([\d.]+)", text)
    if billions:
        params |= {scale_count(v, "B") for v in billions}
        extra["model_params_rounded_to"] = "0.01B (Megatron prints billions to 2 decimals)"
    params |= {int(v.replace(",", "")) for v in re.findall(r"\bNumber of parameters:\s*([\d,]{4,})\b", text)}
    for value, unit in re.findall(r"^\s*([\d.]+)\s*([KMBT])\s+Total params\b", text, re.MULTILINE):
        params.add(scale_count(value, unit))
    f.put("model_params", params)



def _hardware_and_software(f: _Facts, extra: dict[str, Any], text: str) -> None:
    """The GPU's name (one only), NCCL/torch/CUDA versions, bf16."""
    gpus = {re.sub(r"\s+", " ", g).strip() for g in _GPU.findall(text)}
    if len(gpus) == 1:
        f.put("gpu_type", gpus)
    elif gpus:
        extra["gpu_types_seen"] = sorted(gpus)
    f.put("nccl_version", set(re.findall(r"NCCL version (\d+\.\d+\.\d+)", text)))
    f.put("torch_version", set(re.findall(r"\b(?:torch|PyTorch) version[ .:]*\s(\d+\.\d+\.\d+[\w.+]*)", text)))
    f.put("cuda_version", set(re.findall(r"\bCUDA (?:version|Version)[ .:]*\s(\d+\.\d+)\b", text)))
    if re.search(r"\bdtype=bfloat16\b|--bf16\b(?![ =]+False)|\bbf16: True\b|\bprecision[=:]\s*['\"]?bf16", text):
        f.put("precision", {"bf16"})
