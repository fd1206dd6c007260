"""The sweep agent (DESIGN §9, issue 29), standard library only: `scalebook agent NAME -- COMMAND …`.

    scalebook sweep create tiny --strategy grid --grid micro_batch_size=2,4 … --budget 4
    scalebook agent tiny --hang-after 120 -- torchrun --nproc-per-node {gpus_per_node} train.py \\
        --tp {tp} --micro-batch-size {micro_batch_size} --grad-accum {grad_accum_steps}

Loop: ask POST /api/v1/sweeps/{name}/next for a lease (the run is opened as `running` by the server);
run COMMAND with the placeholders {dp} {tp} {pp} {cp} {ep} {zero_stage} {micro_batch_size}
{grad_accum_steps} {recompute} {nodes} {gpus_per_node} {seq_len} (and {run_key} {sweep}) filled, in a
process group of its own, with SCALEBOOK_RUN_KEY, SCALEBOOK_SWEEP and SCALEBOOK_CONFIG (the opened run
record as JSON) in its environment (and SCALEBOOK_API_URL / SCALEBOOK_TOKEN: the agent's API) and its
stdout and stderr captured to a log file; heartbeat the run
every `heartbeat_s` while the command lives. Until the sweep answers 204 (done: the reason is printed)
or `max_runs` leases were run.

- Hang: when neither output nor a heartbeat of the job's own (the run's last_heartbeat_at moving past
  ours) came for `hang_after_s`, the whole process group is killed (SIGTERM, SIGKILL after
  KILL_GRACE_S) and the run finished as `timeout` with a hang note (extra.agent.hang).
- Result: when the command ends and its run is still open, the job pushed nothing itself (an
  integration or ingest.Recorder finishes the run under SCALEBOOK_RUN_KEY): the run is finished from
  the captured log through the log importer (ingest.parsers.logs.parse_log: its figures and outcome);
  a non-zero exit whose log yields no result is `failed` with the classifier's class
  (ingest.classify.classify_text; its status where the class implies one, e.g. oom).
- Ctrl-C / SIGTERM: the job's process group is terminated, its run is left open (the lease reads
  `lost` after lost_after_s and is handed out once more), the agent exits 130.
- The API away (restart, network): the agent retries `next` and the finish for up to `api_wait_s`
  (heartbeats are skipped meanwhile); a finish still undelivered then is spooled by ingest.Client
  for `scalebook sync`, so nothing is lost, and no configuration is run twice (the lease is the
  server's).
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO
from urllib.parse import quote

from ingest.client import Client, api_token, api_url

#: the placeholders a command may use, filled from the lease
PLACEHOLDERS = ("dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size", "grad_accum_steps", "recompute",
                "nodes", "gpus_per_node", "seq_len", "run_key", "sweep")
#: seconds between SIGTERM and SIGKILL when the agent stops a job's process group
KILL_GRACE_S = 5.0
#: the figures and outcome a finish takes from a captured log (the configuration is the lease's)
LOG_RESULT_FIELDS = ("status", "tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu", "hfu", "peak_memory_gib",
                     "reserved_memory_gib", "step_time_s", "error_class", "error_message", "framework_version",
                     "torch_version", "cuda_version", "nccl_version")
_TOKEN = re.compile(r"\{(" + "|".join(PLACEHOLDERS) + r")\}")


class ApiUnavailable(Exception):
    """The API did not answer within the agent's wait."""


def fill(command: list[str], lease: dict[str, Any]) -> list[str]:
    """`command` with each known {placeholder} replaced from the lease (config, run, run_key, sweep);
    other braces are left as they are (shell ${VAR}, JSON). Raises KeyError naming a placeholder the
    lease has no value for."""
    values = {**lease["run"], **lease["config"], "run_key": lease["run_key"], "sweep": lease["sweep"]}

    def one(m: re.Match[str]) -> str:
        value = values.get(m.group(1))
        if value is None:
            raise KeyError(f"{{{m.group(1)}}}: the sweep's target does not give it")
        return str(value)

    return [_TOKEN.sub(one, arg) for arg in command]


@dataclass
class Job:
    """One leased run in progress: the process, its log and what the agent saw of it."""

    lease: dict[str, Any]
    proc: subprocess.Popen
    log_path: Path
    last_activity: float = field(default_factory=time.monotonic)
    our_beat: str | None = None  # the run's last_heartbeat_at as our last heartbeat left it
    hung: bool = False
    copier: threading.Thread | None = None


class Agent:
    """Runs a sweep's configurations until the sweep is done (module docstring)."""

    def __init__(self, sweep: str, command: list[str], *, hang_after_s: float | None = None,
                 max_runs: int | None = None, log_dir: str | os.PathLike = "scalebook-agent-logs",
                 api_wait_s: float = 600.0, url: str | None = None, token: str | None = None,
                 out: TextIO | None = None):
        if not command:
            raise ValueError("no command to run: scalebook agent NAME -- COMMAND ARGS…")
        self.sweep, self.command = sweep, list(command)
        self.hang_after_s, self.max_runs = hang_after_s, max_runs
        self.log_dir = Path(log_dir) / sweep
        self.api_wait_s = api_wait_s
        self.url = (url or api_url()).rstrip("/")
        self.token = token if token is not None else api_token()
        self.out = out or sys.stdout
        self.name = f"{socket.gethostname()}:{os.getpid()}"
        self.stopping = threading.Event()
        self.runs = 0

    # ------------------------------------------------------------------ HTTP
    def _request(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> tuple[int, Any, Any]:
        """(status, JSON body or None, headers) of one request; raises OSError when nothing answers."""
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.url}/api/v1{path}", data=data, method=method,
                                     headers={"Content-Type": "application/json",
                                              **({"Authorization": f"Bearer {self.token}"} if self.token else {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
                return resp.status, json.loads(raw) if raw else None, resp.headers
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                parsed = json.loads(raw) if raw else None
            except ValueError:
                parsed = None
            return exc.code, parsed, exc.headers

    def _patient(self, method: str, path: str, body: Any = None) -> tuple[int, Any, Any]:
        """_request, retried while the API is away (no answer, 5xx) for up to api_wait_s."""
        deadline, delay, said = time.monotonic() + self.api_wait_s, 0.5, False
        while True:
            try:
                status, parsed, headers = self._request(method, path, body)
                if status < 500:
                    if said:
                        self.say("the API answers again")
                    return status, parsed, headers
                why = f"HTTP {status}"
            except OSError as exc:
                why = str(getattr(exc, "reason", exc))
            if self.stopping.is_set() or time.monotonic() > deadline:
                raise ApiUnavailable(f"{self.url}: {why}")
            if not said:
                self.say(f"the API is away ({why}); waiting up to {self.api_wait_s:.0f} s")
                said = True
            time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
            delay = min(delay * 2, 10.0)

    def say(self, message: str) -> None:
        print(f"[scalebook agent {self.sweep}] {message}", file=self.out, flush=True)

    # ------------------------------------------------------------------ loop
    def run(self) -> int:
        """Run leases until the sweep is done, max_runs, or a stop; returns the exit code (0 done,
        1 the API stayed away or refused, 130 stopped by a signal)."""
        while not self.stopping.is_set() and (self.max_runs is None or self.runs < self.max_runs):
            try:
                status, lease, headers = self._patient("POST", f"/sweeps/{self.sweep}/next", {"agent": self.name})
            except ApiUnavailable as exc:
                self.say(f"gave up waiting for the API: {exc}")
                return 1
            if status == 204:
                self.say(f"sweep done ({headers.get('Sweep-Done')}): {headers.get('Sweep-Done-Reason')}")
                return 0
            if status != 200:
                self.say(f"next refused (HTTP {status}): {(lease or {}).get('error', {}).get('message', lease)}")
                return 1
            self.runs += 1
            try:
                self._run_one(lease)
            except ApiUnavailable as exc:
                self.say(f"gave up waiting for the API: {exc}")
                return 1
        if self.stopping.is_set():
            return 130
        self.say(f"{self.runs} run(s) done (--max-runs)")
        return 0

    def stop(self, *_: Any) -> None:
        """Signal handler (SIGINT, SIGTERM): stop the current job and the loop; leave its lease to expire."""
        self.stopping.set()

    def _start(self, lease: dict[str, Any]) -> Job:
        argv = fill(self.command, lease)
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log_path = self.log_dir / (re.sub(r"[^A-Za-z0-9._-]", "_", lease["run_key"]) + ".log")
        # the job pushes to the API the agent leased from (ingest.Client, the recorder, the integrations)
        env = {**os.environ, "SCALEBOOK_RUN_KEY": lease["run_key"], "SCALEBOOK_SWEEP": lease["sweep"],
               "SCALEBOOK_CONFIG": json.dumps(lease["run"]), "SCALEBOOK_API_URL": self.url, "PYTHONUNBUFFERED": "1",
               **({"SCALEBOOK_TOKEN": self.token} if self.token else {})}
        self.say(f"{lease['run_key']} {lease['label']} (attempt {lease['attempt']}): {' '.join(argv)}; log {log_path}")
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
        job = Job(lease, proc, log_path)
        job.copier = threading.Thread(target=self._copy, args=(job,), daemon=True)
        job.copier.start()
        return job

    def _copy(self, job: Job) -> None:
        """Copy the job's output to its log file; every chunk counts as activity."""
        assert job.proc.stdout is not None
        fd = job.proc.stdout.fileno()
        with open(job.log_path, "ab") as log:
            while chunk := os.read(fd, 65536):
                log.write(chunk)
                log.flush()
                job.last_activity = time.monotonic()

    def _beat(self, job: Job) -> None:
        """Heartbeat the job's run (skipped while the API is away) and notice the job's own heartbeats."""
        key = job.lease["run_key"]
        try:
            status, run, _ = self._request("GET", f"/runs?run_key={quote(key, safe='')}&limit=1")
            if status == 200 and run and run["runs"]:
                seen = run["runs"][0].get("last_heartbeat_at")
                if job.our_beat is not None and seen and seen > job.our_beat:
                    job.last_activity = time.monotonic()  # the job heartbeat itself
                if run["runs"][0]["status"] not in ("running", "lost"):
                    return  # the job finished its run: nothing left to heartbeat
            status, beat, _ = self._request("POST", f"/runs/{quote(key, safe='')}/heartbeat", {})
            if status == 200 and beat:
                job.our_beat = beat["last_heartbeat_at"]
        except OSError:
            pass  # the API is away: the job goes on; the run may read lost meanwhile and running again after

    def _kill(self, job: Job) -> None:
        """SIGTERM the job's process group, SIGKILL after KILL_GRACE_S."""
        for sig, wait in ((signal.SIGTERM, KILL_GRACE_S), (signal.SIGKILL, KILL_GRACE_S)):
            try:
                os.killpg(job.proc.pid, sig)
            except ProcessLookupError:
                return
            try:
                job.proc.wait(wait)
                return
            except subprocess.TimeoutExpired:
                continue

    def _run_one(self, lease: dict[str, Any]) -> None:
        try:
            job = self._start(lease)
        except (KeyError, OSError) as exc:
            self._finish(lease, {"status": "failed", "error_class": "invalid_config",
                                 "error_message": f"scalebook agent could not start the command: {exc}"}, None, None)
            return
        period = float(lease.get("heartbeat_s") or 30.0)
        next_beat = 0.0
        while job.proc.poll() is None:
            now = time.monotonic()
            if self.stopping.is_set():
                self._kill(job)
                self.say(f"{lease['run_key']}: stopped; its run is left open (the lease expires after "
                         f"{lease.get('lost_after_s', 300):.0f} s without heartbeats)")
                return
            if self.hang_after_s is not None and now - job.last_activity > self.hang_after_s:
                job.hung = True
                self._kill(job)
                break
            if now >= next_beat:
                self._beat(job)
                next_beat = now + period
            time.sleep(0.2)
        job.proc.wait()
        if job.copier is not None:
            job.copier.join(KILL_GRACE_S)  # the log is complete once the pipe is drained
        self._conclude(job)

    def _conclude(self, job: Job) -> None:
        lease, rc = job.lease, job.proc.returncode
        status, page, _ = self._patient("GET", f"/runs?run_key={quote(lease['run_key'], safe='')}")
        run = page["runs"][0] if status == 200 and page and page["runs"] else None
        if run is not None and run["status"] not in ("running", "lost"):
            self.say(f"{lease['run_key']}: {_summary(run)} (pushed by the job; exit {rc})")
            return
        text = job.log_path.read_text(errors="replace") if job.log_path.exists() else ""
        if job.hung:
            record = {"status": "timeout",
                      "error_message": f"hang: no output and no heartbeat for {self.hang_after_s:g} s; scalebook "
                                       "agent killed the process group"}
        else:
            record = result_from_log(text, rc)
        self._finish(lease, record, rc, job)

    def _finish(self, lease: dict[str, Any], record: dict[str, Any], rc: int | None, job: Job | None) -> None:
        agent: dict[str, Any] = {"host": self.name, "exit_code": rc, "log": str(job.log_path) if job else None,
                 "result_from": "hang" if job and job.hung else "log" if job else "agent"}
        if job and job.hung:
            agent.update(hang=True, hang_after_s=self.hang_after_s)
        body = {"run_key": lease["run_key"], **record, "extra": {"agent": agent}}
        result = Client(url=self.url, token=self.token, deadline_s=self.api_wait_s).push(body)
        self.say(f"{lease['run_key']}: {_summary(body)} (from {agent['result_from']}; exit {rc}; push {result.status})")


def result_from_log(text: str, returncode: int | None) -> dict[str, Any]:
    """The finish of a run whose job pushed nothing: the figures and outcome of its captured log
    (ingest.parsers.logs.parse_log), or — nothing readable in it — `failed` with the classifier's class
    for a non-zero exit (its status where the class implies one) and `failed`/unknown for a zero exit
    without a result. A non-zero exit is never read as a success."""
    from ingest.classify import classify_text, status_for
    from ingest.parsers.logs import parse_log

    try:
        parsed = parse_log(text)
    except ValueError:
        parsed = {}
    record = {k: parsed[k] for k in LOG_RESULT_FIELDS if parsed.get(k) is not None}
    if returncode not in (0, None):
        if record.get("status") in (None, "success"):  # crashed: what the log measured is not a result
            found = classify_text(text)
            cls = found.error_class or "unknown"
            record.update(status=status_for(cls) or "failed", error_class=cls,
                          error_message=(found.line or f"exit code {returncode}")[:2000])
    elif record.get("status") in (None, "success") and not record.get("tokens_per_sec_per_gpu"):
        record.update(status="failed", error_class="unknown",
                      error_message="the command exited 0 but neither pushed a result nor logged a throughput")
    return record


def _summary(run: dict[str, Any]) -> str:
    tps = run.get("tokens_per_sec_per_gpu")
    return (f"{run.get('status')}" + (f" {tps:,.0f} tok/s/GPU" if tps else "")
            + (f" ({run['error_class']})" if run.get("error_class") else ""))


def main(argv: list[str] | None = None) -> int:
    """`python -m ingest.agent NAME [--hang-after S] [--max-runs N] -- COMMAND …` (what `scalebook agent`
    runs; this entry needs only the standard library)."""
    import argparse

    p = argparse.ArgumentParser(prog="scalebook agent", description=__doc__.split("\n")[0])
    p.add_argument("sweep")
    p.add_argument("--hang-after", type=float, default=None, help="kill a job silent for this many seconds")
    p.add_argument("--max-runs", type=int, default=None)
    p.add_argument("--log-dir", default="scalebook-agent-logs")
    p.add_argument("--api-wait", type=float, default=600.0, help="seconds to wait out an API away")
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        p.error("no command: scalebook agent NAME [options] -- COMMAND ARGS…")
    cut = argv.index("--")
    args, command = p.parse_args(argv[:cut]), argv[cut + 1:]
    return run_agent(args.sweep, command, hang_after_s=args.hang_after, max_runs=args.max_runs,
                     log_dir=args.log_dir, api_wait_s=args.api_wait)


def run_agent(sweep: str, command: list[str], **options: Any) -> int:
    """An Agent with SIGINT/SIGTERM stopping it cleanly; returns its exit code."""
    agent = Agent(sweep, command, **options)
    previous = {sig: signal.signal(sig, agent.stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        return agent.run()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
