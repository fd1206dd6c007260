"""What a framework's name says about how it trains, standard library only: the one home of these rules.

Framework names are free text as runs report them ("nanotron", "nanotron (smollm3 branch)", "megatron-lm",
"megatron-deepspeed", "NeMo 24.07 (Megatron-Core)", "Megatron-Bridge (NeMo container)", …).

- `is_nanotron(name)`: the Ultra-Scale Playbook's framework, the default of the throughput and memory models
  when no framework is named (their PRIOR and constants were measured on its sweep).
- `engine_family(name)`: the training engine whose parallel layers a framework runs, or None when the name
  says none this module knows. Megatron: Megatron-LM, Megatron-DeepSpeed, Megatron-Core and NeMo (built on
  Megatron-Core), Megatron-Bridge — one tensor-parallel implementation (megatron/core/tensor_parallel:
  ColumnParallelLinear, RowParallelLinear and their collectives; Shoeybi et al. 2019, arXiv 1909.08053) and
  its pipeline schedules (Narayanan et al. 2021, arXiv 2104.04473). nanotron: nanotron and its branches.
  The throughput model carries a fit within a family when the framework asked about has too few runs
  (service/analytics/throughput.Model.fit_for).
"""

from __future__ import annotations

__all__ = ["engine_family", "is_nanotron"]

#: (token in the lower-cased name, family), first match wins: "megatron-deepspeed" is Megatron's
_FAMILY_TOKENS = (("nanotron", "nanotron"), ("megatron", "megatron"), ("nemo", "megatron"))


def is_nanotron(framework: str | None) -> bool:
    """Whether `framework` is taken as nanotron: its name says so, or no framework is named (the Ultra-Scale
    sweep's framework, the one the throughput model's PRIOR and the memory model's constants come from)."""
    return not framework or "nanotron" in framework.lower()


def engine_family(framework: str | None) -> str | None:
    """"megatron" | "nanotron" | None (module docstring): the first of _FAMILY_TOKENS in the lower-cased
    name; None for a name without one, and for no name."""
    name = (framework or "").lower()
    return next((family for token, family in _FAMILY_TOKENS if token in name), None)
