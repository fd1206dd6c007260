"""A live run from the training side (DESIGN §9), standard library only: open, heartbeat, steps, finish.

    from ingest.live import LiveRun
    live = LiveRun({"run_key": key, "model_name": "llama3-8b", ..., "status": "running"}).start()
    live.step(12, step_time_s=2.1, tokens_per_sec_per_gpu=3950.0, loss=2.31)   # cheap: a buffer append
    live.finish({...the full record, status "success" or a failure...})

* ``start`` returns at once: a daemon thread opens the run (POST /api/v1/runs, ``status: running``), then
  every ``heartbeat_s`` (SCALEBOOK_HEARTBEAT_S, default core.lifecycle.DEFAULT_HEARTBEAT_S, 30 s) sends
  the buffered steps (POST /runs/{run_key}/steps, in batches of ``step_batch``; sooner when that many
  wait) or, with none, a heartbeat. The thread never raises, never blocks the training loop
  (``step`` only appends under a lock) and dies with the process (daemon), so a SIGKILLed job simply
  stops heartbeating and its run reads ``lost`` on the server after lost_after_s.
* ``finish`` (in the caller's thread) stops the thread, sends the steps still buffered, then the full
  record with its finished status under the same run_key — the terminal update.
* Offline. Every request retries as the push client does (:class:`ingest.client.Client`: backoff with
  jitter until its deadline, at most THREAD_DEADLINE_S for the thread's; they run beside training). An open, steps batch
  or finish that cannot be delivered is appended, in order, to ``<spool_dir>/live.jsonl``
  (``{"op": "open"|"steps"|"finish", "run_key", "body"}``, fsync'ed under the spool lock); from then
  on the run's later ops go to the spool too (their order is the server's order), and each heartbeat
  tick tries to replay the spool. Heartbeats themselves are never spooled (a late heartbeat means
  nothing). ``scalebook sync`` replays the spool (:func:`sync_live`) after the run spool: exactly once,
  since opening, steps and the finish are all idempotent on the server (run_key; (run, step) keys; a
  finish sent again answers the stored run).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from core.lifecycle import DEFAULT_HEARTBEAT_S
from core.record import RUNNING
from ingest.client import _SPOOL_LOCK, _SYNC_LOCK, Client, _dumps, _error_message, post_until

log = logging.getLogger("scalebook.live")

LIVE_SPOOL_FILE = "live.jsonl"
DEFAULT_STEP_BATCH = 100
#: the longest the thread retries one request (it is then spooled, or for a heartbeat dropped), seconds;
#: `finish` waits at most this (plus one request timeout) beyond its own deadline for a request in flight
THREAD_DEADLINE_S = 10.0


def heartbeat_period() -> float:
    """Seconds between heartbeats: SCALEBOOK_HEARTBEAT_S when set (> 0), else DEFAULT_HEARTBEAT_S (30)."""
    try:
        value = float(os.environ.get("SCALEBOOK_HEARTBEAT_S", ""))
    except ValueError:
        return DEFAULT_HEARTBEAT_S
    return value if value > 0 else DEFAULT_HEARTBEAT_S


def _path(op: str, run_key: str) -> str:
    if op in ("open", "finish"):
        return "/api/v1/runs"
    return f"/api/v1/runs/{urllib.parse.quote(run_key, safe='/')}/{op}"


def call(client: Client, op: str, run_key: str, body: Any, deadline: float) -> tuple[str, int | None, Any]:
    """One live-run request with the push client's retries. `op`: "open" / "finish" (POST /runs with the
    record), "steps" (POST …/steps with {"steps": [...]}) or "heartbeat" (POST …/heartbeat with {}).
    Returns ("ok", status, body) — also for an open answered 409 (the key is stored already: a sweep's lease
    opened it, or it finished) — ("reject", status, body) for a 4xx about the request (409, 422, a 404
    naming the run: it was never opened), or ("down", status | None, reason) when `deadline`
    (time.monotonic()) passed or the client is misconfigured (401/403, a 404 that is not the API's)."""

    def special(status: int, answer: Any) -> tuple[str, int | None, Any] | None:
        ours = isinstance(answer, dict) and isinstance(answer.get("error"), dict)
        if status == 404 and ours and answer["error"].get("code") == "not_found":
            return "reject", status, answer
        if status == 409 and op == "open" and ours:
            # a run is stored under this key already: opened by a sweep's lease (`scalebook agent` hands
            # the job SCALEBOOK_RUN_KEY), or finished by an earlier attempt. The job carries on with it.
            return "ok", status, answer
        return None

    return post_until(client, _path(op, run_key), _dumps(body).encode(), deadline, user_agent="scalebook-live/0.1",
                      special=special)


@dataclass
class LiveSyncResult:
    """Outcome of :func:`sync_live`: ops replayed (acknowledged), rejected (to rejects.jsonl), remaining."""

    replayed: int = 0
    rejected: int = 0
    remaining: int = 0
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"replayed": self.replayed, "rejected": self.rejected, "remaining": self.remaining,
                "error": self.error}


def live_spool(client: Client):
    """The path of `client`'s live-run spool (``<spool_dir>/live.jsonl``)."""
    return client.spool_dir / LIVE_SPOOL_FILE


def pending_ops(client: Client, run_key: str | None = None) -> int:
    """Ops waiting in the live spool (of one run when `run_key` is given)."""
    try:
        lines = live_spool(client).read_bytes().split(b"\n")
    except FileNotFoundError:
        return 0
    n = 0
    for raw in lines:
        if raw.strip():
            try:
                op = json.loads(raw)
            except ValueError:
                n += run_key is None
                continue
            n += run_key is None or (isinstance(op, dict) and op.get("run_key") == run_key)
    return n


def sync_live(client: Client, deadline_s: float | None = None) -> LiveSyncResult:
    """Replay the live spool in order, each op once (module doc), then drop the acknowledged and rejected
    ones (rejected: to rejects.jsonl with the server's answer). Stops at the first op the server cannot
    take now (the rest stays, in order). One sync at a time per spool directory. Never raises."""
    res = LiveSyncResult()
    path = live_spool(client)
    if not path.exists():
        return res
    try:
        with client._lock(_SYNC_LOCK):
            with client._lock(_SPOOL_LOCK):
                snapshot = path.read_bytes()
            lines = snapshot.split(b"\n")
            drop: set[int] = set()
            rejects: list[str] = []
            for n, raw in enumerate(lines):
                if not raw.strip():
                    drop.add(n)
                    continue
                try:
                    op = json.loads(raw)
                    kind, key, body = op["op"], op["run_key"], op["body"]
                except (ValueError, KeyError, TypeError) as exc:
                    rejects.append(client._reject_line(raw.decode("utf-8", "replace"), None,
                                                       {"error": {"code": "unreadable", "message": str(exc)}}, "sync"))
                    drop.add(n)
                    continue
                outcome, status, answer = call(client, kind, key, body,
                                               time.monotonic() + (deadline_s or client.deadline_s))
                if outcome == "down":
                    res.error = str(answer)
                    break
                if outcome == "reject":
                    log.warning("scalebook: spooled %s of run %s rejected (HTTP %s): %s", kind, key, status,
                                _error_message(answer))
                    rejects.append(client._reject_line(op, status, answer, "sync-live"))
                else:
                    res.replayed += 1
                drop.add(n)
            res.rejected = len(rejects)
            client._append(client.rejects_path, rejects)
            if drop:
                client._rewrite(snapshot, lines, drop, path=path)
    except Exception as exc:  # noqa: BLE001 - syncing must never raise into a training loop
        log.exception("scalebook: live sync failed")
        res.error = repr(exc)
    res.remaining = pending_ops(client)
    return res


class LiveRun:
    """One run, live on the server while its job runs (module doc).

    Args:
        record: the run's fields known at the start (config, hardware, run_key); opened with status running.
        client: the :class:`ingest.Client` whose URL, token, spool and retry settings are used.
        heartbeat_s: seconds between the thread's heartbeats / step batches (default :func:`heartbeat_period`).
        step_batch: steps per request; a full batch is sent before the next tick.
        on_error: called with each exception the thread catches (tests); it is logged either way.
    """

    def __init__(self, record: dict[str, Any], client: Client | None = None, heartbeat_s: float | None = None,
                 step_batch: int = DEFAULT_STEP_BATCH, on_error: Callable[[BaseException], None] | None = None):
        self.client = client or Client()
        self.record = {**json.loads(_dumps(record)), "status": RUNNING}
        self.run_key: str = str(self.record.get("run_key") or "")
        if not self.run_key:
            raise ValueError("a live run needs its run_key")
        self.heartbeat_s = float(heartbeat_s) if heartbeat_s else heartbeat_period()
        self.step_batch = int(step_batch)
        self.on_error = on_error
        self.spooled = False  #: some op of this run waits in the live spool (later ops follow it there)
        self.opened = False
        self.sent_steps = 0
        self._buffer: list[dict[str, Any]] = []
        self._lock = threading.Lock()      # the buffer
        self._io = threading.Lock()        # one request of this run at a time, in order
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---------------------------------------------------------------- training-thread side
    def start(self) -> LiveRun:
        """Start the daemon thread (it opens the run first). Returns self at once."""
        self._thread = threading.Thread(target=self._loop, name=f"scalebook-live-{self.run_key[:12]}", daemon=True)
        self._thread.start()
        return self

    def step(self, step: int, **figures: Any) -> None:
        """Buffer one optimizer step's figures (core.steps.STEP_FIELDS; None values are left out)."""
        entry = {"step": int(step), **{k: v for k, v in figures.items() if v is not None}}
        with self._lock:
            self._buffer.append(entry)
            full = len(self._buffer) >= self.step_batch
        if full:
            self._wake.set()

    def finish(self, record: dict[str, Any], deadline_s: float | None = None) -> str:
        """Stop the thread, send what is buffered, then `record` (the full record, a finished status) under
        this run's key, within `deadline_s` (default the client's). Returns "stored", "spooled",
        "rejected" or "error"; never raises."""
        try:
            deadline = time.monotonic() + (deadline_s if deadline_s is not None else self.client.deadline_s)
            self._stop.set()
            self._wake.set()
            if self._thread is not None:
                self._thread.join(timeout=max(0.0, deadline - time.monotonic()))
            final = {**json.loads(_dumps(record)), "run_key": self.run_key}
            # a request the thread has in flight ends within its own deadline: wait for it, so that every op
            # of this run reaches the server (or the spool) in order
            got = self._io.acquire(timeout=max(0.0, deadline - time.monotonic()) + self._thread_deadline_s()
                                   + self.client.timeout_s)
            if not got:  # cannot happen unless the thread is wedged: spool, in order behind whatever it sends
                self.spooled = True
            try:
                if not self.opened and not self.spooled:
                    self._send("open", self.record, deadline)
                self._flush_steps(deadline)
                return self._send("finish", final, deadline)
            finally:
                if got:
                    self._io.release()
        except Exception as exc:  # noqa: BLE001 - recording must never raise into training
            log.exception("scalebook: could not finish live run %s", self.run_key)
            self._report(exc)
            return "error"

    # ---------------------------------------------------------------- the thread
    def _loop(self) -> None:
        try:
            with self._io:
                self._send("open", self.record, time.monotonic() + self._thread_deadline_s())
            while not self._stop.is_set():
                self._wake.wait(self.heartbeat_s)
                self._wake.clear()
                if self._stop.is_set():
                    return
                with self._io:
                    self._tick(time.monotonic() + self._thread_deadline_s())
        except Exception as exc:  # noqa: BLE001 - the thread must never die loudly or touch training
            log.exception("scalebook: live thread of run %s failed", self.run_key)
            self._report(exc)

    def _thread_deadline_s(self) -> float:
        return min(self.client.deadline_s, THREAD_DEADLINE_S)

    def _tick(self, deadline: float) -> None:
        if self.spooled:  # replay what waits, in order; back online when none of this run's remains
            sync_live(self.client, deadline_s=max(0.05, deadline - time.monotonic()))
            self.spooled = pending_ops(self.client, self.run_key) > 0
        with self._lock:
            waiting = bool(self._buffer)
        if waiting or self.spooled:
            self._flush_steps(deadline)
        else:
            outcome, status, answer = call(self.client, "heartbeat", self.run_key, {}, deadline)
            if outcome != "ok":
                log.info("scalebook: heartbeat of run %s not delivered (%s %s)", self.run_key, status,
                         _error_message(answer))

    # ---------------------------------------------------------------- delivery
    def _flush_steps(self, deadline: float) -> None:
        while True:
            with self._lock:
                batch, self._buffer = self._buffer[:self.step_batch], self._buffer[self.step_batch:]
            if not batch:
                return
            self._send("steps", {"steps": batch}, deadline)
            self.sent_steps += len(batch)

    def _send(self, op: str, body: Any, deadline: float) -> str:
        """Deliver one op, or spool it (in order behind this run's spooled ops). Returns the outcome."""
        if not self.spooled:
            outcome, status, answer = call(self.client, op, self.run_key, body, deadline)
            if outcome == "ok":
                self.opened = self.opened or op == "open"
                return "stored"
            if outcome == "reject":
                log.warning("scalebook: %s of run %s rejected (HTTP %s): %s", op, self.run_key, status,
                            _error_message(answer))
                self.client._append(self.client.rejects_path, [self.client._reject_line(
                    {"op": op, "run_key": self.run_key, "body": body}, status, answer, "live")])
                return "rejected"
            log.warning("scalebook: API unavailable for run %s (%s); %s spooled to %s", self.run_key, answer, op,
                        live_spool(self.client))
        self.client._append(live_spool(self.client), [_dumps({"op": op, "run_key": self.run_key, "body": body})])
        self.spooled = True
        return "spooled"

    def _report(self, exc: BaseException) -> None:
        if self.on_error is not None:
            try:
                self.on_error(exc)
            except Exception:  # noqa: BLE001
                pass
