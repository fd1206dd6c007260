"""Torch recorder: measures a training loop and pushes it as one run record (DESIGN §2).

    from ingest import Recorder
    with Recorder({"name": "8b-dp16-tp4", "model_name": "llama3-8b", "model_params": 8_030_261_248,
                   "seq_len": 8192, "tp": 4, "micro_batch_size": 1, "grad_accum_steps": 8,
                   "precision": "bf16"}) as rec:
        for batch in loader:
            train_step(batch)                       # forward, backward, optimizer step
            rec.step(tokens=mbs * gas * seq_len)    # after each optimizer step

torch is imported here only (``import ingest`` stays standard-library only).

What ``step(tokens)`` means
---------------------------
``tokens`` is the number of tokens in the batch that this rank's model replica consumed in the
optimizer step: ``micro_batch_size × grad_accum_steps × seq_len`` of the rank's data-parallel shard.
Ranks of one tensor/pipeline/context-parallel group pass the same number. The recorder turns it
into the per-GPU throughput nanotron and Megatron report (global tokens per second / world size)::

    tokens_per_sec_per_gpu = mean over ranks(timed tokens) / (tp · pp · cp) / max over ranks(timed seconds)

so with pure data parallelism it is simply this rank's tokens per second. Without tp, pp and cp in
``run_fields`` (and more than one process) tp·pp·cp is unknown: no tokens_per_sec_per_gpu is
stored, only ``extra.tokens_per_sec_per_replica`` (tokens per second of one model replica).

Measurement
-----------
* The first ``warmup_steps`` steps (compilation, allocator and NCCL warm-up) are not timed; the
  window runs from the end of the last warm-up step to the end of the last step. At each step
  boundary the device is synchronised (``torch.cuda.synchronize()`` on CUDA, nothing on CPU), as
  nanotron's and Megatron's timers do. ``step_time_s`` = window seconds / timed steps.
* Peak memory: ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` since ``__enter__``
  (peak stats are reset there), in GiB (2³⁰ bytes), max over ranks; ``None`` on CPU.
* With ``torch.distributed`` initialised, a successful exit joins two ``all_reduce`` calls on every
  rank (MAX of seconds and memory, SUM of tokens and steps); only rank 0 pushes. ``reduce=False``
  skips them (for hooks that run on the main process only, e.g. an Accelerate tracker): the record
  is then rank 0's own measurement.
* Filled in unless given in ``run_fields``: world_size and rank (torch.distributed, else the
  WORLD_SIZE/RANK variables; world_size 1 only for a process no launcher started, and left out
  when a launcher did not say it), gpus_per_node (LOCAL_WORLD_SIZE), nodes (world_size /
  LOCAL_WORLD_SIZE), gpu_type (``torch.cuda.get_device_name``; the
  server maps it to the catalog name), torch/CUDA/NCCL versions, framework ``"pytorch"``,
  source ``"recorder"``, started_at, run_key (SCALEBOOK_RUN_KEY when set — the run `scalebook agent`
  opened for its sweep lease — else uuid4 hex, made at construction: ``rec.run_key``).
  Parallelism degrees are never filled with 1: give tp/pp/cp/ep in ``run_fields``; the server
  derives dp (and any one missing degree) from tp·pp·cp·dp = world_size and says so.
  MFU is left to the server (``mfu_derived`` from model_params/dims and the hardware catalog).

Failures
--------
An exception leaving the ``with`` block becomes ``status`` / ``error_class`` / ``error_message``:
``torch.OutOfMemoryError`` or "CUDA out of memory" → ``oom`` / ``oom_gpu``; anything else is
classified from its text by ``ingest.classify.classify_text`` (NCCL and torch.distributed errors →
``nccl_error``, ``timeout``, ...; ``failed`` / ``unknown`` when unclassified or when that module is
missing). The exception is always re-raised: recording never swallows a training failure. On this
path no collective is issued (the other ranks may be blocked in a different one), so the values
are this rank's, and only rank 0 pushes: a failure seen by another rank alone is not recorded
here (import the job log with ``scalebook import log`` for that).
"""

from __future__ import annotations

import copy
import datetime as _dt
import logging
import os
import time
import uuid
from collections.abc import Callable
from typing import Any, Literal

import torch

from ingest.client import Client, PushResult
from ingest.live import LiveRun

log = logging.getLogger("scalebook.recorder")
GIB = float(2**30)
_MAX_MESSAGE = 4000


def _env_int(name: str) -> int | None:
    try:
        return int(os.environ[name])
    except (KeyError, ValueError):
        return None


def classify_exception(exc: BaseException) -> tuple[str, str, str]:
    """(status, error_class, error_message) for an exception that ended a training loop."""
    message = f"{type(exc).__name__}: {exc}"[:_MAX_MESSAGE]
    text = str(exc)
    if isinstance(exc, torch.OutOfMemoryError) or "CUDA out of memory" in text:
        return "oom", "oom_gpu", message
    try:
        from ingest.classify import classify_text
    except ImportError:
        return "failed", "unknown", message
    try:
        found = classify_text(f"{type(exc).__name__}: {text}")
    except Exception:  # noqa: BLE001 - classification must never hide the training error
        log.exception("scalebook: classify_text failed")
        return "failed", "unknown", message
    if found.error_class is None:
        return "failed", "unknown", message
    return found.status or "failed", found.error_class, message


class Recorder:
    """Context manager that times a training loop and pushes one run record on exit (module doc).

    Without a ``with`` block (framework hooks, ``ingest.integrations``): :meth:`start` where the
    loop begins, :meth:`step` after each optimizer step, :meth:`finish` (with the exception that
    ended the loop, if any) where it ends.

    Args:
        run_fields: DESIGN §2 fields of the run (name, model_*, seq_len, tp/pp/cp, batch, ...);
            given values are never overwritten. ``extra`` is merged with the recorder's own.
        client: the :class:`ingest.Client` to push with (default: ``Client()`` from the environment).
        warmup_steps: leading steps excluded from timing (≥ 0).
        push: False to only build ``rec.record`` (no network).
        reduce: False to skip the cross-rank reduction on success (only this rank's values).
        live: open the run on the server at :meth:`start` and keep it live (rank 0, with ``push``):
            heartbeats and the step series from a daemon thread, the record as its finish
            (:mod:`ingest.live`; module doc "Live run"). False: one push at the end only.
        heartbeat_s: seconds between heartbeats / step batches of the live run (default SCALEBOOK_HEARTBEAT_S
            or core.lifecycle.DEFAULT_HEARTBEAT_S, 30).
        clock: the step timer, seconds (default time.perf_counter; tests pass a fake one).

    After exit: ``rec.record`` is the run record (on every rank; rank 0's is the one pushed) and
    ``rec.result`` the :class:`ingest.PushResult` (rank 0 with ``push=True``, else None).
    """

    def __init__(self, run_fields: dict[str, Any], client: Client | None = None, warmup_steps: int = 2,
                 push: bool = True, reduce: bool = True, live: bool = True, heartbeat_s: float | None = None,
                 clock: Callable[[], float] = time.perf_counter):
        if warmup_steps < 0:
            raise ValueError("warmup_steps must be >= 0")
        self.run_fields = dict(run_fields)
        self.client = client
        self.warmup_steps = int(warmup_steps)
        self.push = push
        self.reduce = reduce
        self._clock = clock
        # under `scalebook agent` the run is already open under SCALEBOOK_RUN_KEY (its sweep lease)
        self.run_key: str = str(self.run_fields.get("run_key") or os.environ.get("SCALEBOOK_RUN_KEY")
                                or uuid.uuid4().hex)
        self.steps = 0
        self.timed_steps = 0
        self.timed_tokens = 0
        self.record: dict[str, Any] | None = None
        self.result: PushResult | None = None
        self._cuda = torch.cuda.is_available()
        self._t_start: float | None = None
        self._t_last: float | None = None
        self._started_at: _dt.datetime | None = None
        self._finished = False
        self.live = live
        self.heartbeat_s = heartbeat_s
        #: the live run on the server (rank 0, push and live), None otherwise
        self.live_run: LiveRun | None = None
        self._t_prev: float | None = None

    # ------------------------------------------------------------------ loop
    def start(self) -> Recorder:
        """Begin the run: reset CUDA peak-memory stats, start the clock when there is no warm-up."""
        self._started_at = _dt.datetime.now(_dt.UTC)
        if self._cuda:
            torch.cuda.reset_peak_memory_stats()
        self._sync()
        self._t_prev = self._clock()
        if self.warmup_steps == 0:
            self._t_start = self._t_prev
        if self.push and self.live and self._rank() == 0:
            try:
                opening = self._base_record()
                opening["status"] = "running"
                self.live_run = LiveRun(opening, client=self.client or Client(), heartbeat_s=self.heartbeat_s).start()
            except Exception:  # noqa: BLE001 - recording must never stop training
                log.exception("scalebook: could not open the live run; it is recorded at the end only")
                self.live_run = None
        return self

    __enter__ = start

    def step(self, tokens: int, steps: int = 1, **figures: Any) -> None:
        """Mark the end of `steps` optimizer steps (default one) that together consumed `tokens`
        tokens (module doc). A call that reaches the end of the warm-up is all warm-up. `figures`
        (loss, grad_norm, learning_rate: core.steps.STEP_FIELDS) go into the live run's step series
        with this rank's step time, tokens/s/GPU and peak memory."""
        if steps < 1:
            raise ValueError("steps must be >= 1")
        self._sync()
        now = self._clock()
        self.steps += steps
        if self.live_run is not None:
            self._live_step(now, tokens, steps, figures)
        if self.steps <= self.warmup_steps:
            if self.steps == self.warmup_steps:
                self._t_start = now
            return
        if self._t_start is None:  # this call crossed the end of the warm-up: all of it is warm-up
            self._t_start = now
            return
        self.timed_steps += steps
        self.timed_tokens += int(tokens)
        self._t_last = now

    def finish(self, exc: BaseException | None = None, deadline_s: float | None = None) -> dict[str, Any] | None:
        """End the run once: build ``self.record`` (success when `exc` is None, else the failure
        class of `exc`) and push it from rank 0. Later calls return the same record and do nothing.

        ``deadline_s`` caps the push's retry deadline (e.g. inside a SIGTERM handler, before the
        scheduler's SIGKILL). A record that cannot be built is logged and None returned; a strict
        client's push error is raised only when `exc` is None (never replaces a training error).
        """
        if self._finished:
            return self.record
        self._finished = True
        try:
            self.record = self._build(exc)
        except Exception:  # noqa: BLE001 - never mask the training outcome
            log.exception("scalebook: could not build the run record")
            return None
        if self.live_run is not None:  # the record is the live run's finish (same run_key)
            outcome = self.live_run.finish(self.record, deadline_s=deadline_s)
            self.result = PushResult(status=outcome, run_keys=[self.run_key])
            if outcome in ("rejected", "error") and exc is None and self.client is not None and self.client.strict:
                from ingest.client import PushError

                raise PushError(f"the live run {self.run_key} could not be finished: {outcome}", self.result)
        elif self.push and self._rank() == 0:
            client = self.client or Client()
            if deadline_s is not None and deadline_s < client.deadline_s:
                client = copy.copy(client)
                client.deadline_s = deadline_s
            try:
                self.result = client.push(self.record)
            except Exception:  # noqa: BLE001 - a strict client's error must not replace the training error
                if exc is None:
                    raise
                log.exception("scalebook: push failed")
        return self.record

    @property
    def finished(self) -> bool:
        """True once :meth:`finish` ran (the record is built and, on rank 0, pushed)."""
        return self._finished

    def __exit__(self, exc_type, exc, tb) -> Literal[False]:
        self.finish(exc if exc_type is not None and not _clean_exit(exc) else None)
        return False  # re-raise whatever left the block

    def _live_step(self, now: float, tokens: int, steps: int, figures: dict[str, Any]) -> None:
        """Hand this step's figures to the live run (a buffer append: nothing waits on the network)."""
        try:
            seconds = now - self._t_prev if self._t_prev is not None else None
            self._t_prev = now
            mp = self._model_parallel(self.run_fields, self.run_fields.get("world_size") or self._world_size())
            peak, _ = self._memory()
            assert self.live_run is not None
            self.live_run.step(self.steps, step_time_s=seconds / steps if seconds else None,
                               tokens_per_sec_per_gpu=tokens / mp / seconds if seconds and mp and tokens else None,
                               peak_memory_gib=peak, **figures)
        except Exception:  # noqa: BLE001 - a figure must never stop training
            log.exception("scalebook: could not record the step")

    # ------------------------------------------------------------------ helpers
    def _sync(self) -> None:
        if self._cuda:
            torch.cuda.synchronize()

    @staticmethod
    def _dist():
        dist = torch.distributed
        return dist if dist.is_available() and dist.is_initialized() else None

    def _rank(self) -> int:
        dist = self._dist()
        return dist.get_rank() if dist else (_env_int("RANK") or 0)

    def _world_size(self) -> int | None:
        """torch.distributed's world size when initialised, else the launcher's WORLD_SIZE; 1 for a
        process no launcher started (no RANK / LOCAL_RANK / WORLD_SIZE: a single process is a fact,
        not a guess); None when a launcher ran it but did not say the world size."""
        dist = self._dist()
        if dist:
            return dist.get_world_size()
        world = _env_int("WORLD_SIZE")
        if world:
            return world
        launched = any(os.environ.get(k) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        return None if launched else 1

    def _memory(self) -> tuple[float | None, float | None]:
        if not self._cuda:
            return None, None
        return torch.cuda.max_memory_allocated() / GIB, torch.cuda.max_memory_reserved() / GIB

    def _reduce(self, seconds: float, peak: float | None,
                reserved: float | None) -> tuple[float, float, int, float | None, float | None]:
        """(max seconds, mean tokens, min timed steps, max peak GiB, max reserved GiB) over ranks."""
        dist = self._dist() if self.reduce else None
        if dist is None:
            return seconds, float(self.timed_tokens), self.timed_steps, peak, reserved
        on_gpu = dist.get_backend() == "nccl"
        device = torch.device("cuda", torch.cuda.current_device()) if on_gpu else torch.device("cpu")
        maxes = torch.tensor([seconds, peak or 0.0, reserved or 0.0, -float(self.timed_steps)],
                             dtype=torch.float64, device=device)
        sums = torch.tensor([float(self.timed_tokens)], dtype=torch.float64, device=device)
        dist.all_reduce(maxes, op=dist.ReduceOp.MAX)
        dist.all_reduce(sums, op=dist.ReduceOp.SUM)
        m, s = maxes.tolist(), sums.tolist()
        world = dist.get_world_size()
        return (m[0], s[0] / world, int(-m[3]),
                m[1] if peak is not None else None, m[2] if reserved is not None else None)

    @staticmethod
    def _model_parallel(fields: dict[str, Any], world: int | None) -> int | None:
        """tp·pp·cp when all three are given, 1 for a single process, else None (unknown)."""
        degrees = [int(v) for d in ("tp", "pp", "cp") if (v := fields.get(d))]
        return degrees[0] * degrees[1] * degrees[2] if len(degrees) == 3 else 1 if world == 1 else None

    def _base_record(self) -> dict[str, Any]:
        """The record's fields known before any measurement: run_fields, run_key and what torch and
        the launcher state (world size, node layout, versions, GPU). The opening of the live run."""
        fields = self.run_fields
        rec: dict[str, Any] = {"run_key": self.run_key, "source": "recorder", "framework": "pytorch"}
        rec.update({k: v for k, v in fields.items() if v is not None and k != "extra"})
        world = fields.get("world_size") or self._world_size()
        local = _env_int("LOCAL_WORLD_SIZE")
        # dp and any degree not given are left to the server, which fills them only where
        # tp·pp·cp·dp = world_size determines them and names them in extra.derived_fields.
        defaults: dict[str, Any] = {
            "started_at": self._started_at.isoformat() if self._started_at else None,
            "world_size": world,
            "gpus_per_node": local if local and fields.get("nodes") is None else None,
            "nodes": (world // local if world and local and world % local == 0
                      and fields.get("gpus_per_node") is None else None),
            "torch_version": torch.__version__,
            "cuda_version": torch.version.cuda,
            "nccl_version": _nccl_version() if self._cuda else None,
            "gpu_type": torch.cuda.get_device_name() if self._cuda else None,
        }
        if world == 1:  # one process: every degree is 1 (a fact, the only solution of tp·pp·cp·dp = 1)
            defaults.update(dp=1, tp=1, pp=1, cp=1)
        for key, value in defaults.items():
            if rec.get(key) is None and value is not None:
                rec[key] = value
        if fields.get("extra"):
            rec["extra"] = dict(fields["extra"])
        return rec

    def _build(self, exc: BaseException | None) -> dict[str, Any]:
        fields = self.run_fields
        rec = self._base_record()
        rec.pop("extra", None)
        world = rec.get("world_size")
        # Per-GPU throughput divides by tp·pp·cp: known when given, or 1 for a single process.
        mp = self._model_parallel(fields, world)
        seconds = (self._t_last - self._t_start) if self._t_last is not None and self._t_start is not None else 0.0
        peak, reserved = self._memory()
        extra: dict[str, Any] = {"warmup_steps": self.warmup_steps, "steps": self.steps,
                                 "timed_steps": self.timed_steps}
        if exc is None:
            seconds, mean_tokens, steps, peak, reserved = self._reduce(seconds, peak, reserved)
            rec.setdefault("status", "success")
            if steps > 0 and seconds > 0:
                if mp:
                    rec.setdefault("tokens_per_sec_per_gpu", mean_tokens / mp / seconds)
                else:
                    extra["tokens_per_sec_per_replica"] = mean_tokens / seconds
                    log.warning("scalebook: tp/pp/cp not all given in run_fields: tokens/s/GPU unknown "
                                "(kept as extra.tokens_per_sec_per_replica)")
                rec.setdefault("step_time_s", seconds / steps)
            else:
                log.warning("scalebook: %d step(s) recorded, %d warm-up: no throughput measured",
                            self.steps, self.warmup_steps)
        else:
            status, error_class, message = classify_exception(exc)
            rec["status"], rec["error_class"], rec["error_message"] = status, error_class, message
            if self.timed_steps and seconds > 0 and mp:
                extra["tokens_per_sec_per_gpu_before_failure"] = self.timed_tokens / mp / seconds
        if peak is not None:
            rec.setdefault("peak_memory_gib", peak)
        if reserved is not None:
            rec.setdefault("reserved_memory_gib", reserved)
        rec["extra"] = {**extra, **(fields.get("extra") or {})}
        return rec


def _clean_exit(exc: BaseException | None) -> bool:
    """SystemExit(0) / SystemExit(None) leaving the block is a normal end, not a failure."""
    return isinstance(exc, SystemExit) and exc.code in (0, None)


def _nccl_version() -> str | None:
    try:
        v = torch.cuda.nccl.version()
    except Exception:  # noqa: BLE001 - CPU builds have no NCCL
        return None
    return ".".join(str(p) for p in v) if isinstance(v, tuple) else str(v)
