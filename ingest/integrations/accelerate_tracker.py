"""Accelerate integration: a ``GeneralTracker`` that records one benchmark run per training job.

    from ingest.integrations import ScalebookTracker
    accelerator = Accelerator(log_with=[ScalebookTracker(model=model)], gradient_accumulation_steps=4)
    accelerator.init_trackers("my-project", config={"seq_len": 2048})   # starts the run
    for step, batch in enumerate(loader, 1):
        ...                                                              # forward, backward, step
        accelerator.log({"loss": loss.item()}, step=step)                # after each optimizer step
    accelerator.end_training()                                           # ends it: the run is pushed

Step boundaries are the ``accelerator.log`` calls: each call ends the optimizer steps since the
previous one (``step`` - previous ``step``; one step when no ``step`` is given; a call that repeats
a step adds nothing; the first call counts as one step, which the warm-up absorbs). Accelerate
runs trackers on the main process only, so the record is that process's measurement (no
cross-rank reduction: the Recorder's ``reduce=False``); in data-parallel training every rank steps
together, so its step time is the job's.

Recorded (never a guess): the launcher facts of the Accelerate state (world size, ZeRO stage from
the DeepSpeed config or FSDP sharding, 0 for DDP / one process, tp/cp of a ParallelismConfig,
``mixed_precision``; with ``"no"`` the dtype of the watched model's parameters), the configured
gradient accumulation (``GradientState``) unless a watched model's forwards per step say it, the
model's dimensions and parameter count and the tokens, micro-batch and sequence length of its
training forwards when a model is watched (``model=`` or :meth:`ScalebookTracker.watch`), config
values passed to ``init_trackers`` under DESIGN §2 names (``seq_len``, ``micro_batch_size``,
``mbs``, ...), tokens/s/GPU over the steps after the warm-up, peak memory, and the failure class
when the job dies (the process guard of :mod:`ingest.integrations.common`).
"""

from __future__ import annotations

from typing import Any

import accelerate
from accelerate.tracking import GeneralTracker

from core.record import ALIASES, REPORTED_FIELDS
from ingest.integrations.common import (
    TrainingRun,
    accelerate_fields,
    dtype_precision,
    recompute_of,
    step_figures,
)

_NOT_CONFIG = {"run_key", "status", "tokens_per_sec_per_gpu", "step_time_s", "peak_memory_gib", "reserved_memory_gib",
               "error_class", "error_message", "extra", "source", "started_at", "mfu", "hfu", "tflops_per_gpu"}


class ScalebookTracker(GeneralTracker):
    """Accelerate tracker that records one scalebook run per training job (module doc).

    Args:
        run_fields: DESIGN §2 fields to add or override (name, model_name, gpu_type, seq_len, ...).
        model: the model to watch (dimensions, parameter count, tokens per forward); optional. Give
            it before ``accelerator.prepare``: an FSDP1-wrapped model's parameters are local shards.
        client: :class:`ingest.Client` (default: SCALEBOOK_API_URL / SCALEBOOK_TOKEN / spool).
        warmup_steps: leading optimizer steps not timed.
        push: False to only build the record (``tracker.record``).
    """

    name = "scalebook"
    requires_logging_directory = False
    main_process_only = True

    def __init__(self, run_fields: dict[str, Any] | None = None, model: Any = None, client: Any = None,
                 warmup_steps: int = 2, push: bool = True):
        super().__init__()
        fields = {"source": "accelerate", "framework": "accelerate", "framework_version": accelerate.__version__,
                  "extra": {"integration": "accelerate"}}
        self.run = TrainingRun(fields, run_fields, client=client, warmup_steps=warmup_steps, push=push,
                               reduce=False)
        self._model: Any = None
        self._last_step: int | None = None
        if model is not None:
            self.watch(model)

    @property
    def tracker(self) -> TrainingRun:
        """The :class:`ingest.integrations.common.TrainingRun` behind this tracker."""
        return self.run

    @property
    def record(self) -> dict[str, Any] | None:
        """The run record once the job ended (None before)."""
        return self.run.record

    @property
    def run_key(self) -> str | None:
        return self.run.recorder.run_key if self.run.recorder else None

    def watch(self, model: Any) -> None:
        """Read `model`'s dimensions and count the tokens of its training forwards."""
        self._model = model
        self.run.watch(model)

    def start(self) -> None:
        """Called by ``accelerator.init_trackers``: read the launcher and start timing."""
        if self.run.recorder is not None:
            return
        launcher = accelerate_fields()
        if "precision" not in launcher and self._model is not None:
            launcher["precision"] = dtype_precision(self._model)
        if self._model is None:  # a watched model's forwards per step are measured instead
            try:
                from accelerate.state import GradientState

                if GradientState._shared_state:
                    launcher["grad_accum_steps"] = GradientState().num_steps
            except ImportError:
                pass
        if self._model is not None:
            launcher["recompute"] = recompute_of(self._model)
        self.run.set_fields(launcher)
        self.run.start()

    def store_init_configuration(self, values: dict) -> None:
        """Take the config values named like DESIGN §2 fields (or their ALIASES); the rest is ignored."""
        found: dict[str, Any] = {}
        for key, value in (values or {}).items():
            name = ALIASES.get(key, key)
            if name in REPORTED_FIELDS and name not in _NOT_CONFIG and value is not None:
                found[name] = value
        self.run._user.update(found)  # the user's own statements: launcher readings never override them
        for target in (self.run.fields, *((self.run.recorder.run_fields,) if self.run.recorder else ())):
            target.update(found)

    def log(self, values: dict, step: int | None = None, **kwargs: Any) -> None:
        """A step boundary (module doc); the loss, grad_norm and learning rate among `values` join the live
        run's step series (ingest.integrations.common.step_figures), nothing else of them is stored."""
        if self.run.recorder is None:
            self.start()
        if step is None or self._last_step is None:
            steps = 1
        else:
            steps = step - self._last_step
        if step is not None:
            self._last_step = step if self._last_step is None else max(step, self._last_step)
        if steps > 0:
            self.run.step(steps, **step_figures(values))

    def finish(self) -> None:
        """Called by ``accelerator.end_training``: the job succeeded; build and push the run."""
        if self.run.recorder is not None:
            self.run.finish()
