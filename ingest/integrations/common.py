"""What the framework integrations share: one :class:`TrainingRun` per training job, built on
:class:`ingest.recorder.Recorder`, the process guard that records a job that dies, and readers of
model and launcher facts.

Each integration turns its framework's hooks into four calls::

    run = TrainingRun(fields, source="hf-trainer", framework="transformers", ...)
    run.watch(model)          # optional: model dims from model.config, tokens counted per forward
    run.start()               # training begins (Recorder.start; guard armed)
    run.step()                # after each optimizer step
    run.finish(exc=None)      # training ended; exc = what killed it

Timing, warm-up, device synchronisation, peak memory, the cross-rank reduction, the failure class
(``ingest.classify`` through ``ingest.recorder.classify_exception``) and the push from rank 0 are
the Recorder's: they exist once.

Never a guess
-------------
A field is filled only from what the framework or the run itself states: the hooks' arguments,
the model's config, torch.distributed / the launcher's environment, and what was observed (the
batch and sequence sizes of the training forwards). Anything else is left out (NULL). Fields given
by the user in ``run_fields`` always win.

Tokens
------
:meth:`TrainingRun.watch` registers a forward pre-hook on the model that counts, for each forward
made in training mode, ``batch × sequence`` of its ``input_ids`` (or ``inputs_embeds``): the tokens
this rank's replica consumed, padding included (it is computed on like any token). A step's tokens
are those counted since the previous step. When nothing was counted (the inputs were not found),
tokens per step are taken from the configuration, ``micro_batch_size × grad_accum_steps ×
seq_len``, when all three are known; otherwise no throughput is recorded.
``extra.tokens_source`` says which (``"counted"`` / ``"config"``). The micro-batch size and the
sequence length are filled from the observation when every training forward had the same one (and
the configuration gave none); ``extra.seq_len_observed = [min, max]`` otherwise. Likewise
``grad_accum_steps`` is the number of training forwards per optimizer step when that was constant
and the framework did not state it.

Process guard
-------------
While a run is open (between :meth:`start` and :meth:`finish`), an uncaught exception
(``sys.excepthook``), a normal interpreter exit (``atexit``) and, where the integration allows it,
SIGTERM close it as a failed run before the process goes away: the exception's class
(classified), ``TrainingInterrupted: process exited before training ended``, or
``TrainingInterrupted: received SIGTERM``. The SIGTERM handler (main thread only; installed only
when the current handler is the default one or a Python callable) records the run with a push
deadline of ``SIGTERM_PUSH_DEADLINE_S`` seconds (the run is spooled if the API does not answer in
time), then hands the signal on: to the previous Python handler, or back to the default action so
the process still dies of SIGTERM. SIGKILL cannot be caught: import the job's log for that
(``scalebook import log``).

Standard library only at import time; torch is imported by the Recorder when a run starts.
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger("scalebook.integrations")

#: Seconds the push of a run closed by SIGTERM may retry before spooling (schedulers and torchrun
#: send SIGKILL some seconds after SIGTERM: Slurm's KillWait and torchrun both default to 30 s).
SIGTERM_PUSH_DEADLINE_S = 10.0

#: ZeRO stage of each FSDP sharding strategy. FULL_SHARD shards parameters, gradients and optimizer
#: states (ZeRO-3); SHARD_GRAD_OP shards gradients and optimizer states (ZeRO-2); NO_SHARD is DDP;
#: HYBRID_SHARD / _HYBRID_SHARD_ZERO2 apply FULL_SHARD / SHARD_GRAD_OP within a node and replicate
#: across nodes. Source: torch.distributed.fsdp.ShardingStrategy documentation.
FSDP_ZERO_STAGE = {"FULL_SHARD": 3, "SHARD_GRAD_OP": 2, "NO_SHARD": 0, "HYBRID_SHARD": 3,
                   "_HYBRID_SHARD_ZERO2": 2}

#: torch dtype name -> precision.
_DTYPE_PRECISION = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}

#: Model-config attribute spellings (transformers configs, GPT-2 style, T5 style) per field.
_CONFIG_ATTRS = {
    "num_layers": ("num_hidden_layers", "n_layer", "num_layers"),
    "hidden_size": ("hidden_size", "n_embd", "d_model"),
    "num_heads": ("num_attention_heads", "n_head", "num_heads"),
    "num_kv_heads": ("num_key_value_heads", "num_kv_heads"),
    "ffn_hidden_size": ("intermediate_size", "n_inner", "ffn_dim", "d_ff"),
    "vocab_size": ("vocab_size",),
}


class TrainingInterrupted(Exception):
    """The reason recorded for a run that was still open when its process was told to stop or
    exited (see "Process guard" in the module doc)."""


# ---------------------------------------------------------------------- readers
def _int(value: Any) -> int | None:
    """`value` as an int when it is a plain positive integer (not a bool, not "auto")."""
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        return None
    return value


def config_fields(config: Any) -> dict[str, Any]:
    """Model dimensions stated by a model config (a transformers ``PretrainedConfig`` or any object
    with the same attribute names; multimodal configs are read through their ``text_config``) and
    ``model_name`` (``name_or_path`` when set). Empty for None."""
    out: dict[str, Any] = {}
    if config is None:
        return out
    text_config = getattr(config, "text_config", None)
    for cfg in (config, text_config) if text_config is not None else (config,):
        for name, attrs in _CONFIG_ATTRS.items():
            for attr in attrs:
                value = _int(getattr(cfg, attr, None))
                if value is not None and name not in out:
                    out[name] = value
                    break
    model_name = getattr(config, "name_or_path", None) or getattr(config, "_name_or_path", None)
    if isinstance(model_name, str) and model_name:
        out["model_name"] = model_name
    return out


def model_fields(model: Any) -> dict[str, Any]:
    """DESIGN §2 model fields of a torch module: :func:`config_fields` of ``model.config`` and
    ``model_params`` (unique parameters; DeepSpeed ZeRO-3 partitions counted at their full size,
    ``ds_numel``). Fields the model does not state are absent."""
    out = config_fields(getattr(model, "config", None))
    parameters = getattr(model, "parameters", None)
    if callable(parameters):
        total = 0
        for p in parameters():
            total += int(getattr(p, "ds_numel", 0) or p.numel())
        if total:
            out["model_params"] = total
    return out


def recompute_of(model: Any) -> str | None:
    """"full" / "none" from transformers' activation-checkpointing flag of `model` or any of its
    submodules (``is_activation_checkpointing``; ``is_gradient_checkpointing`` before v5); None
    when no module states it (a plain torch module may checkpoint internally: unknown)."""
    flags = set()
    for module in model.modules():
        for attr in ("is_activation_checkpointing", "is_gradient_checkpointing"):
            if getattr(type(module), attr, None) is not None:
                flags.add(bool(getattr(module, attr)))
                break
    if not flags:
        return None
    return "full" if True in flags else "none"


def dtype_precision(model: Any) -> str | None:
    """Precision of a model's floating-point parameters when they share one dtype ("fp32",
    "bf16", "fp16"), else None."""
    names = {str(p.dtype).replace("torch.", "") for p in model.parameters() if p.is_floating_point()}
    return _DTYPE_PRECISION.get(names.pop()) if len(names) == 1 else None


def deepspeed_zero_stage(config: Any) -> int | None:
    """``zero_optimization.stage`` of a DeepSpeed config dict (None when absent or not 0-3)."""
    stage = (config or {}).get("zero_optimization", {}).get("stage") if isinstance(config, dict) else None
    return stage if isinstance(stage, int) and not isinstance(stage, bool) and 0 <= stage <= 3 else None


def fsdp_zero_stage(strategy: Any, version: int = 1) -> int | None:
    """ZeRO stage of an FSDP setting: a ``ShardingStrategy`` (or its name) for FSDP1 (see
    :data:`FSDP_ZERO_STAGE`); for FSDP2 (``fully_shard``), ``reshard_after_forward`` True → 3
    (parameters re-sharded after forward, like FULL_SHARD), False → 2 (like SHARD_GRAD_OP)."""
    if version == 2 and isinstance(strategy, bool):
        return 3 if strategy else 2
    name = getattr(strategy, "name", strategy)
    return FSDP_ZERO_STAGE.get(name.upper()) if isinstance(name, str) else None


def accelerate_fields() -> dict[str, Any]:
    """Launcher facts of an initialised Accelerate state (the Trainer runs on it too): world
    size, ZeRO stage (DeepSpeed config, or FSDP sharding; 0 for plain DDP / one process), tp/cp
    from a ``ParallelismConfig``, precision from ``mixed_precision`` (fp16/bf16/fp8; "no" says
    nothing), grad accumulation and micro-batch from a DeepSpeed config with plain integers.
    Empty when accelerate is missing or its state was never initialised."""
    try:
        from accelerate.state import AcceleratorState, PartialState
    except ImportError:
        return {}
    if not AcceleratorState._shared_state or not PartialState._shared_state:
        return {}
    state = AcceleratorState()
    out: dict[str, Any] = {}
    world = _int(getattr(state, "num_processes", None))
    if world:
        out["world_size"] = world
    dist_type = str(getattr(state, "distributed_type", "")).rsplit(".", 1)[-1].upper()
    ds = getattr(state, "deepspeed_plugin", None)
    fsdp = getattr(state, "fsdp_plugin", None)
    if dist_type == "DEEPSPEED" and ds is not None:
        cfg = getattr(ds, "deepspeed_config", None)
        stage = deepspeed_zero_stage(cfg)
        if stage is None and _int(getattr(ds, "zero_stage", None)) is not None:
            stage = ds.zero_stage
        if stage is not None:
            out["zero_stage"] = stage
        if isinstance(cfg, dict):
            if _int(cfg.get("gradient_accumulation_steps")):
                out["grad_accum_steps"] = cfg["gradient_accumulation_steps"]
            if _int(cfg.get("train_micro_batch_size_per_gpu")):
                out["micro_batch_size"] = cfg["train_micro_batch_size_per_gpu"]
    elif dist_type == "FSDP" and fsdp is not None:
        version = int(getattr(fsdp, "fsdp_version", 1) or 1)
        strategy = getattr(fsdp, "reshard_after_forward", None)
        if version == 1 and getattr(fsdp, "sharding_strategy", None) is not None:
            strategy = fsdp.sharding_strategy
        stage = fsdp_zero_stage(strategy, version)
        if stage is not None:
            out["zero_stage"] = stage
    elif dist_type in ("NO", "MULTI_GPU", "MULTI_CPU", "MULTI_XPU", "MULTI_NPU", "MULTI_MLU", "MULTI_SDAA",
                       "MULTI_MUSA", "MULTI_HPU"):
        out["zero_stage"] = 0  # one process, or DDP: every rank holds everything
    pc = getattr(state, "parallelism_config", None)
    if pc is not None:
        for field, attr in (("tp", "tp_size"), ("cp", "cp_size")):
            if _int(getattr(pc, attr, None)):
                out[field] = getattr(pc, attr)
    mp = str(getattr(state, "mixed_precision", "") or "").lower()
    if mp in ("fp16", "bf16", "fp8"):
        out["precision"] = mp
    return out


def batch_shape(obj: Any) -> tuple[int, int] | None:
    """(batch, sequence) of a language-model input: a 2-D integer tensor of token ids, a mapping
    with ``input_ids`` (or 3-D ``inputs_embeds``), or a tuple/list whose first item is one of
    those. None when no such input is found (nothing is assumed)."""
    if isinstance(obj, dict):
        ids = obj.get("input_ids")
        if ids is not None:
            return batch_shape(ids)
        emb = obj.get("inputs_embeds")
        shape = getattr(emb, "shape", None)
        return (int(shape[0]), int(shape[1])) if shape is not None and len(shape) == 3 else None
    if isinstance(obj, (tuple, list)):
        return batch_shape(obj[0]) if obj else None
    shape, dtype = getattr(obj, "shape", None), getattr(obj, "dtype", None)
    if shape is not None and len(shape) == 2 and dtype is not None and not getattr(dtype, "is_floating_point", True):
        return int(shape[0]), int(shape[1])
    return None


# ---------------------------------------------------------------------- the run
class TrainingRun:
    """One training job measured from framework hooks and pushed as one run (module doc).

    Args:
        fields: run fields read from the framework (model, launcher, config).
        run_fields: the user's fields; they override `fields` (``extra`` is merged).
        client: :class:`ingest.Client` (default: from the environment).
        warmup_steps: leading optimizer steps not timed.
        push: False to only build ``self.record``.
        reduce: False when the hooks run on the main process only (no cross-rank collective).
        guard_signals: arm the SIGTERM part of the guard (False where the framework turns SIGTERM
            into an exception it reports itself, as Lightning does).
    """

    def __init__(self, fields: dict[str, Any], run_fields: dict[str, Any] | None = None, *, client: Any = None,
                 warmup_steps: int = 2, push: bool = True, reduce: bool = True, guard_signals: bool = True):
        user = dict(run_fields or {})
        merged = {k: v for k, v in fields.items() if v is not None}
        merged_extra = {**(fields.get("extra") or {}), **(user.pop("extra", None) or {})}
        merged.update({k: v for k, v in user.items() if v is not None})
        merged["extra"] = merged_extra
        self.fields = merged
        self._user = set(user)
        self.client = client
        self.warmup_steps = warmup_steps
        self.push = push
        self.reduce = reduce
        self.guard_signals = guard_signals
        self.recorder: Any = None
        self.record: dict[str, Any] | None = None
        self._tokens = 0
        self._forwards = 0
        self._batches: set[int] = set()
        self._seqs: set[int] = set()
        self._forwards_per_step: set[int] = set()
        self._counted_any = False
        self._hooks: list[Any] = []
        self._lock = threading.RLock()  # a SIGTERM handler may re-enter finish()

    # ---------------------------------------------------------------- observation
    def watch(self, model: Any) -> None:
        """Read ``model``'s fields (:func:`model_fields`, not overriding given ones) and count the
        tokens of its training forwards (module doc)."""
        for key, value in model_fields(model).items():
            self.fields.setdefault(key, value)
        register = getattr(model, "register_forward_pre_hook", None)
        if register is None:
            return

        def hook(module: Any, args: tuple, kwargs: dict) -> None:
            if getattr(module, "training", True):
                shape = batch_shape(kwargs) or (batch_shape(args[0]) if args else None)
                self.count(shape)

        self._hooks.append(register(hook, with_kwargs=True))

    def count(self, shape: tuple[int, int] | None) -> None:
        """One training micro-batch of ``(batch, sequence)`` went through the model (None: it went
        through, but its size is not known)."""
        self._forwards += 1
        if shape is None:
            return
        batch, seq = shape
        self._counted_any = True
        self._tokens += batch * seq
        self._batches.add(batch)
        self._seqs.add(seq)

    def set_fields(self, values: dict[str, Any]) -> None:
        """Add framework-read fields (also after :meth:`start`); user-given fields are kept."""
        targets = [self.fields] + ([self.recorder.run_fields] if self.recorder is not None else [])
        for key, value in values.items():
            if value is not None and key not in self._user:
                for target in targets:
                    target[key] = value

    # ---------------------------------------------------------------- lifecycle
    @property
    def is_open(self) -> bool:
        """True between :meth:`start` and :meth:`finish`."""
        return self.recorder is not None and self.record is None and not self.recorder.finished

    def start(self) -> None:
        """Training begins: start the Recorder and arm the process guard."""
        from ingest.recorder import Recorder

        self.recorder = Recorder(self.fields, client=self.client, warmup_steps=self.warmup_steps, push=self.push,
                                 reduce=self.reduce)
        self.recorder.start()
        _guard.add(self, signals=self.guard_signals)

    def step(self, steps: int = 1, **figures: Any) -> None:
        """``steps`` optimizer steps ended: hand the tokens counted since the last call to the Recorder;
        ``figures`` (loss, grad_norm, learning_rate as the framework reports them) join the live series."""
        if not self.is_open:
            return
        tokens, forwards = self._tokens, self._forwards
        self._tokens = self._forwards = 0
        if forwards:
            self._forwards_per_step.add(forwards // steps if forwards % steps == 0 else -1)
        if not self._counted_any:
            mbs, gas, seq = (self.fields.get(k) for k in ("micro_batch_size", "grad_accum_steps", "seq_len"))
            tokens = mbs * gas * seq * steps if mbs and gas and seq else 0
        self.recorder.step(tokens=tokens, steps=steps, **step_figures(figures))

    def finish(self, exc: BaseException | None = None, deadline_s: float | None = None) -> dict[str, Any] | None:
        """Training ended (``exc``: what ended it). Fills the observed fields, builds and pushes the
        record once (:meth:`ingest.recorder.Recorder.finish`); later calls return the same record."""
        with self._lock:
            if not self.is_open:
                return self.record
            _guard.discard(self)
            for handle in self._hooks:
                handle.remove()
            self._hooks.clear()
            self._fill_observed()
            self.record = self.recorder.finish(exc, deadline_s=deadline_s)
            return self.record

    def _fill_observed(self) -> None:
        """Observed micro-batch, sequence length and tokens source into the Recorder's fields."""
        fields, extra = self.recorder.run_fields, self.recorder.run_fields.setdefault("extra", {})
        if len(self._batches) == 1 and fields.get("micro_batch_size") is None:
            fields["micro_batch_size"] = next(iter(self._batches))
        if len(self._forwards_per_step) == 1 and fields.get("grad_accum_steps") is None:
            per_step = next(iter(self._forwards_per_step))
            if per_step > 0:
                fields["grad_accum_steps"] = per_step
        if len(self._seqs) == 1 and fields.get("seq_len") is None:
            fields["seq_len"] = next(iter(self._seqs))
        elif len(self._seqs) > 1:
            extra["seq_len_observed"] = [min(self._seqs), max(self._seqs)]
        if self.recorder.steps:
            if self._counted_any:
                extra["tokens_source"] = "counted"
            elif all(fields.get(k) for k in ("micro_batch_size", "grad_accum_steps", "seq_len")):
                extra["tokens_source"] = "config"


#: names frameworks log a step's figures under → the step series' field (core.steps.STEP_FIELDS)
_FIGURE_NAMES = {"loss": "loss", "train_loss": "loss", "train/loss": "loss", "grad_norm": "grad_norm",
                 "learning_rate": "learning_rate", "lr": "learning_rate"}


def step_figures(values: Any) -> dict[str, float]:
    """The step-series figures among logged `values` ({name: number or 0-d tensor}): loss, grad_norm,
    learning_rate under their usual names (_FIGURE_NAMES); anything else, or not a finite number, is left out."""
    import math

    out: dict[str, float] = {}
    for name, value in (values or {}).items() if isinstance(values, dict) else ():
        field = _FIGURE_NAMES.get(name)
        if field is None or field in out:
            continue
        try:
            number = float(value.item() if hasattr(value, "item") else value)
        except (TypeError, ValueError, RuntimeError):
            continue
        if math.isfinite(number):
            out[field] = number
    return out


# ---------------------------------------------------------------------- process guard
class RunCallback:
    """The state both training-framework callbacks keep (Hugging Face ``Trainer``, Lightning):
    what to add to the record, where to send it, and the :class:`TrainingRun` of the last job.

    Args:
        run_fields: DESIGN §2 fields to add or override (name, model_name, gpu_type, tp, ...).
        client: :class:`ingest.Client` (default: SCALEBOOK_API_URL / SCALEBOOK_TOKEN / spool).
        warmup_steps: leading optimizer steps not timed (compilation, allocator warm-up).
        push: False to only build the record (``callback.record``).
    """

    def __init__(self, run_fields: dict[str, Any] | None = None, client: Any = None, warmup_steps: int = 2,
                 push: bool = True):
        super().__init__()
        self.run_fields = dict(run_fields or {})
        self.client = client
        self.warmup_steps = warmup_steps
        self.push = push
        self.run: TrainingRun | None = None
        self._model_fields: dict[str, Any] = {}

    @property
    def record(self) -> dict[str, Any] | None:
        """The record of the last training job (None before it ended)."""
        return self.run.record if self.run else None

    @property
    def run_key(self) -> str | None:
        """The run_key of the last training job's record (None before it started)."""
        return self.run.recorder.run_key if self.run and self.run.recorder else None


class _Guard:
    """Closes open runs when the process dies (module doc, "Process guard"); one per process."""

    def __init__(self) -> None:
        self.runs: list[TrainingRun] = []
        self._hooked = False
        self._sigterm = False
        self._previous_excepthook: Callable[..., Any] | None = None
        self._previous_sigterm: Any = None

    def add(self, run: TrainingRun, signals: bool) -> None:
        self.runs.append(run)
        if not self._hooked:
            self._hooked = True
            self._previous_excepthook = sys.excepthook
            sys.excepthook = self._excepthook
            atexit.register(self._atexit)
        if signals and not self._sigterm:
            self._install_sigterm()

    def discard(self, run: TrainingRun) -> None:
        if run in self.runs:
            self.runs.remove(run)

    def _close_all(self, exc: BaseException, deadline_s: float | None = None) -> None:
        for run in list(self.runs):
            try:
                run.finish(exc, deadline_s=deadline_s)
            except Exception:
                log.exception("scalebook: could not record the interrupted run")

    def _excepthook(self, exc_type: type[BaseException], exc: BaseException, tb: Any) -> None:
        if self.runs and not (isinstance(exc, SystemExit) and exc.code in (0, None)):
            self._close_all(exc)
        hook = self._previous_excepthook or sys.__excepthook__
        hook(exc_type, exc, tb)

    def _atexit(self) -> None:
        if self.runs:
            self._close_all(TrainingInterrupted("the process exited before training ended"))

    def _install_sigterm(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        try:
            previous = signal.getsignal(signal.SIGTERM)
        except (ValueError, OSError):
            return
        if previous is signal.SIG_IGN or previous is None:  # ignored, or set outside Python: leave it
            return
        try:
            signal.signal(signal.SIGTERM, self._on_sigterm)
        except (ValueError, OSError):
            return
        self._previous_sigterm = previous
        self._sigterm = True

    def _on_sigterm(self, signum: int, frame: Any) -> None:
        if self.runs:
            self._close_all(TrainingInterrupted(f"received SIGTERM (signal {signum}) during training"),
                            deadline_s=SIGTERM_PUSH_DEADLINE_S)
        previous = self._previous_sigterm
        if callable(previous):
            previous(signum, frame)
            return
        signal.signal(signal.SIGTERM, signal.SIG_DFL)  # the default action: die of SIGTERM
        self._sigterm = False
        os.kill(os.getpid(), signal.SIGTERM)


_guard = _Guard()
