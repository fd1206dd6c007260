"""Hugging Face ``transformers.Trainer`` integration: one benchmark run per ``trainer.train()``.

    from ingest.integrations import ScalebookCallback
    trainer = Trainer(model=model, args=args, train_dataset=ds, callbacks=[ScalebookCallback()])

``report_to="scalebook"`` is not possible: transformers maps ``report_to`` names through a fixed
table of its own integrations (``transformers.integrations.INTEGRATION_TO_CALLBACK``) and offers no
registration for third-party ones, so the callback is passed in ``callbacks=``.

What is recorded (never a guess: what the Trainer does not state is left out)
----------------------------------------------------------------------------
* from ``TrainingArguments``: ``micro_batch_size`` (per_device_train_batch_size),
  ``grad_accum_steps``, ``precision`` (``bf16``/``fp16`` flags; without them the dtype of the
  model's parameters), ``recompute`` ("full" with gradient checkpointing -- transformers
  checkpoints whole decoder layers -- else "none"), ``name`` (run_name);
* from the launcher (the Trainer's Accelerate state, :func:`common.accelerate_fields`):
  ``world_size``, ``zero_stage`` (DeepSpeed config's stage; FSDP sharding strategy: FULL_SHARD 3,
  SHARD_GRAD_OP 2; 0 for DDP or one process), tp/cp of a ``ParallelismConfig``; ``dp`` =
  world size / (tp·pp·cp), nodes and GPUs per node from the torchrun environment (Recorder);
* from the model: num_layers, hidden_size, heads, kv heads, ffn, vocab, parameter count
  (:func:`common.model_fields`), read when the Trainer is built (before any sharding wrapper);
* measured: ``seq_len`` and tokens from the training forwards, tokens/s/GPU and step time over the
  steps after ``warmup_steps``, peak memory (CUDA), versions -- by :class:`ingest.Recorder`;
* a job that dies (exception, SIGTERM, exit before the end of training) is recorded as failed with
  its failure class (module doc of :mod:`ingest.integrations.common`).

Callbacks run on every rank; on success the ranks join the Recorder's reduction and rank 0 pushes.
"""

from __future__ import annotations

from typing import Any

import transformers
from transformers import TrainerCallback

from ingest.integrations.common import (
    RunCallback,
    TrainingRun,
    accelerate_fields,
    deepspeed_zero_stage,
    dtype_precision,
    model_fields,
    recompute_of,
)


def trainer_fields(args: Any, model: Any) -> dict[str, Any]:
    """Run fields stated by ``TrainingArguments`` `args`, the Accelerate state and `model`."""
    out: dict[str, Any] = {"source": "hf-trainer", "framework": "transformers",
                           "framework_version": transformers.__version__,
                           "extra": {"integration": "hf_trainer"}}
    out.update(accelerate_fields())
    out["micro_batch_size"] = args.per_device_train_batch_size
    out["grad_accum_steps"] = args.gradient_accumulation_steps
    if getattr(args, "bf16", False):
        out["precision"] = "bf16"
    elif getattr(args, "fp16", False):
        out["precision"] = "fp16"
    elif "precision" not in out and model is not None:
        out["precision"] = dtype_precision(model)
    checkpointing = bool(getattr(args, "activation_checkpointing", False)  # gradient_checkpointing before v5
                         or getattr(args, "gradient_checkpointing", False)
                         or (model is not None and recompute_of(model) == "full"))
    out["recompute"] = "full" if checkpointing else "none"
    ds = getattr(args, "hf_deepspeed_config", None)
    if getattr(args, "deepspeed", None) and ds is not None:
        stage = deepspeed_zero_stage(getattr(ds, "config", None))
        if stage is not None:
            out["zero_stage"] = stage
    world = getattr(args, "world_size", None)
    if isinstance(world, int) and world > 0:
        out.setdefault("world_size", world)
    if getattr(args, "run_name", None):
        out["name"] = args.run_name
    return out


class ScalebookCallback(RunCallback, TrainerCallback):
    """``TrainerCallback`` that records one scalebook run per training job (module doc).

    Args:
        run_fields: DESIGN §2 fields to add or override (name, model_name, gpu_type, tp, ...).
        client: :class:`ingest.Client` (default: SCALEBOOK_API_URL / SCALEBOOK_TOKEN / spool).
        warmup_steps: leading optimizer steps not timed (compilation, allocator warm-up).
        push: False to only build the record (``callback.record``).

    After training, ``callback.record`` is the run record and ``callback.run_key`` its key.
    """

    def on_init_end(self, args, state, control, model=None, **kwargs):
        if model is not None:  # the model as given to the Trainer: unsharded, unwrapped
            self._model_fields = model_fields(model)

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        if self.run is not None and self.run.is_open:  # an earlier train() that never ended
            self.run.finish(RuntimeError("trainer.train() was started again before the previous one ended"))
        fields = {**self._model_fields, **trainer_fields(args, model)}
        self.run = TrainingRun(fields, self.run_fields, client=self.client, warmup_steps=self.warmup_steps,
                               push=self.push)
        if model is not None:
            self.run.watch(model)
        self.run.start()

    def on_step_end(self, args, state, control, **kwargs):
        if self.run is not None:
            self.run.step()

    def on_train_end(self, args, state, control, **kwargs):
        if self.run is not None:
            self.run.finish()
