"""Lightning integration: a ``Callback`` that records one benchmark run per ``trainer.fit()``.

    from ingest.integrations import ScalebookLightningCallback      # import lightning.pytorch as pl
    trainer = pl.Trainer(..., callbacks=[ScalebookLightningCallback()])

    from ingest.integrations import ScalebookPLCallback             # import pytorch_lightning as pl

(the two packages ship separate class hierarchies, so each gets its own class; the hooks are one).

Recorded (never a guess: what Lightning does not state is left out)
-------------------------------------------------------------------
* from the Trainer: ``world_size``, ``nodes`` (num_nodes), ``gpus_per_node`` (devices per node),
  ``grad_accum_steps`` (accumulate_grad_batches), ``precision`` ("bf16-mixed"/"bf16-true" → bf16,
  "16-mixed"/"16-true" → fp16, "32-true" → fp32, "64-true" → fp64, "transformer-engine" → fp8);
* from the strategy: ``zero_stage`` (DeepSpeed config's stage; FSDP sharding strategy: FULL_SHARD
  3, SHARD_GRAD_OP 2; DDP / single device 0), ``tp`` of a ModelParallelStrategy, ``recompute``
  "full" when FSDP activation checkpointing is set;
* from the model, read in ``setup`` before the strategy wraps or shards it: the dimensions and
  parameter count of the first submodule with a transformers style ``config`` (else the
  LightningModule's parameter count), and ``recompute`` from its activation-checkpointing flag;
* from the training batches (``on_train_batch_end``): tokens, micro-batch and sequence length of
  a batch of token ids (a 2-D integer tensor, a dict with ``input_ids``, or a tuple/list starting
  with one -- :func:`common.batch_shape`); step boundaries are increments of ``global_step``;
* measured by :class:`ingest.Recorder`: tokens/s/GPU over the steps after the warm-up, step time,
  peak memory, versions; a failure reaches ``on_exception`` and is recorded with its class.
  Lightning turns SIGTERM into ``SIGTERMException`` after the current batch; it is recorded as
  ``TrainingInterrupted: received SIGTERM``. The process guard's own SIGTERM handler is not
  installed here (Lightning's would be overridden).
"""

from __future__ import annotations

from typing import Any

from ingest.integrations.common import (
    RunCallback,
    TrainingInterrupted,
    TrainingRun,
    batch_shape,
    config_fields,
    deepspeed_zero_stage,
    fsdp_zero_stage,
    model_fields,
    recompute_of,
)

#: Lightning precision setting -> DESIGN precision.
PRECISION = {"bf16-mixed": "bf16", "bf16-true": "bf16", "bf16": "bf16", "16-mixed": "fp16", "16-true": "fp16",
             "16": "fp16", "32-true": "fp32", "32": "fp32", "64-true": "fp64", "64": "fp64",
             "transformer-engine": "fp8", "transformer-engine-float16": "fp8"}


def _class_names(obj: Any) -> set[str]:
    return {cls.__name__ for cls in type(obj).__mro__}


def strategy_fields(strategy: Any) -> dict[str, Any]:
    """zero_stage / tp / recompute stated by a Lightning strategy object (by class name, so both
    ``lightning.pytorch`` and ``pytorch_lightning`` strategies are read)."""
    names = _class_names(strategy)
    out: dict[str, Any] = {}
    if "DeepSpeedStrategy" in names:
        stage = deepspeed_zero_stage(getattr(strategy, "config", None))
        if stage is not None:
            out["zero_stage"] = stage
    elif "FSDPStrategy" in names:
        stage = fsdp_zero_stage(getattr(strategy, "sharding_strategy", None), 1)
        if stage is not None:
            out["zero_stage"] = stage
        if getattr(strategy, "_activation_checkpointing_kwargs", None):
            out["recompute"] = "full"
    elif "ModelParallelStrategy" in names:
        tp = getattr(strategy, "_tensor_parallel_size", None)
        if isinstance(tp, int) and tp > 0:
            out["tp"] = tp
    elif names & {"DDPStrategy", "SingleDeviceStrategy"}:
        out["zero_stage"] = 0
    return out


def module_fields(pl_module: Any) -> dict[str, Any]:
    """Model fields of a LightningModule: those of its first submodule with a transformers-style
    ``config`` (dimensions + parameter count), else its own parameter count."""
    lm = next((m for m in pl_module.modules() if "num_layers" in config_fields(getattr(m, "config", None))), None)
    return model_fields(lm if lm is not None else pl_module)


def trainer_fields(trainer: Any, pl_module: Any) -> dict[str, Any]:
    """Run fields stated by a Lightning Trainer and its LightningModule (module doc)."""
    out: dict[str, Any] = {"world_size": trainer.world_size, "nodes": trainer.num_nodes,
                           "gpus_per_node": trainer.num_devices,
                           "grad_accum_steps": trainer.accumulate_grad_batches}
    precision = str(getattr(trainer, "precision", "") or "")
    if precision in PRECISION:
        out["precision"] = PRECISION[precision]
    out.update(strategy_fields(trainer.strategy))
    out.update(module_fields(pl_module))
    if "recompute" not in out:
        out["recompute"] = recompute_of(pl_module)
    return out


class _Hooks(RunCallback):
    """The callback's hooks; mixed into each Lightning package's ``Callback`` below."""

    def __init__(self, run_fields: dict[str, Any] | None = None, client: Any = None, warmup_steps: int = 2,
                 push: bool = True):
        super().__init__(run_fields, client, warmup_steps, push)
        self._last_global_step = 0

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        # before the strategy wraps or shards the model (FSDP would leave local shard sizes)
        if stage == "fit":
            self._model_fields = module_fields(pl_module)

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        import importlib

        package = type(trainer).__module__.split(".trainer")[0]  # lightning.pytorch | pytorch_lightning
        version = getattr(importlib.import_module(package.split(".")[0]), "__version__", None)
        fields = {"source": "lightning", "framework": "lightning", "framework_version": version,
                  "extra": {"integration": "lightning", "strategy": type(trainer.strategy).__name__,
                            "lightning_precision": str(trainer.precision)},
                  **trainer_fields(trainer, pl_module), **self._model_fields}
        self.run = TrainingRun(fields, self.run_fields, client=self.client, warmup_steps=self.warmup_steps,
                               push=self.push, guard_signals=False)
        self._last_global_step = trainer.global_step
        self.run.start()

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.run is None:
            return
        self.run.count(batch_shape(batch))
        if trainer.global_step > self._last_global_step:
            loss = outputs.get("loss") if isinstance(outputs, dict) else outputs
            self.run.step(trainer.global_step - self._last_global_step, loss=loss)  # the step's last micro-batch
            self._last_global_step = trainer.global_step

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        if self.run is not None:
            self.run.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        if self.run is None:
            return
        if type(exception).__name__ == "SIGTERMException":
            exception = TrainingInterrupted("received SIGTERM during training (Lightning SIGTERMException)")
        self.run.finish(exception)


_CLASSES: dict[str, Any] = {}
_BASES = {"ScalebookLightningCallback": "lightning.pytorch", "ScalebookPLCallback": "pytorch_lightning"}


def __getattr__(name: str) -> Any:
    """``ScalebookLightningCallback`` / ``ScalebookPLCallback``, built on first access from the
    ``Callback`` of ``lightning.pytorch`` / ``pytorch_lightning``."""
    if name not in _BASES:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    if name not in _CLASSES:
        import importlib

        base = importlib.import_module(_BASES[name]).Callback
        doc = (f"``{_BASES[name]}.Callback`` recording one scalebook run per ``fit`` (module doc). Args: "
               "run_fields (fields to add or override), client, warmup_steps, push (False: only build ``.record``).")
        _CLASSES[name] = type(name, (_Hooks, base), {"__doc__": doc, "__module__": __name__})
    return _CLASSES[name]
