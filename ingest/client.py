"""Push client for the scalebook API, standard library only (DESIGN §1, §7 "never loses a run").

    from ingest import Client
    client = Client()                      # SCALEBOOK_API_URL, SCALEBOOK_TOKEN, SCALEBOOK_SPOOL_DIR
    result = client.push({"model_name": "llama3-8b", "nodes": 8, ..., "tokens_per_sec_per_gpu": 4100.0})
    result.status                          # "stored" | "spooled" | "rejected" | "partial" | "error"

Delivery
--------
* Every run gets a ``run_key`` (uuid4 hex) before the first attempt unless it has one, so a retry,
  a replay from the spool or a response lost on the wire never stores a run twice: the server
  answers "already stored" for the same key and content.
* Connection errors, timeouts, HTTP 5xx, 408 and 429 are retried with exponential backoff and full
  jitter (``uniform(0, min(backoff_max_s, backoff_base_s * 2**attempt))``, at least ``Retry-After``)
  until ``deadline_s`` has passed since the call began; then the run(s) are appended to
  ``<spool_dir>/spool.jsonl`` (status ``"spooled"``) for :meth:`Client.sync` (``scalebook sync``)
  to replay. A call never blocks much longer than ``deadline_s`` (one request timeout is clipped
  to the time left, with a 50 ms floor).
* A bad record (400, 409, 413 for a single run, 422) is not retried: it is logged, reported in the
  result and appended to ``<spool_dir>/rejects.jsonl`` with the server's error body. A batch whose
  error names the offending indices has only those runs rejected; the rest are resent. Other 4xx
  answers (401, 403, 404, ...) mean a misconfigured client, not a bad run: nothing is retried and
  the runs are spooled, so fixing the URL or token and running ``scalebook sync`` delivers them.
* Batches hold at most 1,000 runs (the API's limit); a 413 for a batch splits it in halves.

Spool files are JSON Lines, one run record per line in ``spool.jsonl`` and one
``{"run", "http_status", "error", "rejected_at", "origin"}`` object per line in ``rejects.jsonl``.
Appends hold an exclusive ``fcntl.flock`` on ``<spool_dir>/.spool.lock`` and are flushed and
fsync'ed before the call returns, so concurrent processes never interleave lines and a crash
after ``push`` returned loses nothing.

Errors: nothing is raised into the training loop (every failure is logged on the
``scalebook.client`` logger and described in the result) unless ``strict=True``, in which case
unexpected errors propagate and a run that was rejected, or could be neither sent nor spooled,
raises :class:`PushError` (after it was written to the rejects file).
"""

from __future__ import annotations

import datetime as _dt
import fcntl
import hashlib
import http.client
import json
import logging
import os
import random
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("scalebook.client")

DEFAULT_API_URL = "http://127.0.0.1:8000"
MAX_BATCH = 1000
SPOOL_FILE = "spool.jsonl"
REJECTS_FILE = "rejects.jsonl"
_SPOOL_LOCK = ".spool.lock"
_SYNC_LOCK = ".sync.lock"
_HOLD = (401, 403, 404, 405)  # client misconfiguration: keep the runs for a later sync


def api_url() -> str:
    """The API base URL: SCALEBOOK_API_URL or http://127.0.0.1:8000, without a trailing slash (the
    push client's, the CLI's and the dashboard's: service/client.py reads it from here)."""
    return (os.environ.get("SCALEBOOK_API_URL") or DEFAULT_API_URL).rstrip("/")


def api_token() -> str | None:
    """SCALEBOOK_TOKEN, or None when unset or empty."""
    return os.environ.get("SCALEBOOK_TOKEN") or None


def default_spool_dir() -> Path:
    """SCALEBOOK_SPOOL_DIR, else $XDG_DATA_HOME/scalebook/spool, else ~/.local/share/scalebook/spool."""
    env = os.environ.get("SCALEBOOK_SPOOL_DIR")
    if env:
        return Path(env).expanduser()
    base = os.environ.get("XDG_DATA_HOME") or os.path.join(os.path.expanduser("~"), ".local", "share")
    return Path(base) / "scalebook" / "spool"


class PushError(Exception):
    """Raised by a ``strict=True`` client when a run was rejected or could not be kept."""

    def __init__(self, message: str, result: PushResult):
        super().__init__(message)
        self.result = result


@dataclass
class PushResult:
    """What happened to the runs of one :meth:`Client.push` / :meth:`Client.push_many` call.

    ``status``: ``"stored"`` (all acknowledged: created or already present), ``"spooled"`` (some
    or all kept in spool.jsonl, none rejected), ``"rejected"`` (some refused by the server and
    written to rejects.jsonl, the rest stored), ``"partial"`` (some spooled and some rejected),
    ``"error"`` (some could be neither sent nor spooled; see ``errors``).
    ``errors``: one ``{"run_key", "http_status", "error"}`` per rejected run or failure.
    """

    status: str
    run_keys: list[str] = field(default_factory=list)
    created: int = 0
    existing: int = 0
    spooled: int = 0
    rejected: int = 0
    lost: int = 0
    attempts: int = 0
    errors: list[dict[str, Any]] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when every run is on the server."""
        return self.status == "stored"

    @property
    def run_key(self) -> str | None:
        """The first run's key (the only one for :meth:`Client.push`)."""
        return self.run_keys[0] if self.run_keys else None


@dataclass
class SyncResult:
    """Outcome of :meth:`Client.sync`: counts of spooled runs.

    ``replayed``: newly stored; ``already_present``: the server had them (an earlier attempt got
    through); ``rejected``: moved to rejects.jsonl (bad record, 409 conflict, unreadable line);
    ``remaining``: still in the spool (server unreachable); ``error``: why sync stopped early.
    """

    replayed: int = 0
    already_present: int = 0
    rejected: int = 0
    remaining: int = 0
    error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"replayed": self.replayed, "already_present": self.already_present, "rejected": self.rejected,
                "remaining": self.remaining, "error": self.error}


@dataclass
class _Delivery:
    """Internal accounting of one delivery: runs are the caller's dict objects."""

    created: int = 0
    existing: int = 0
    acked: list[dict] = field(default_factory=list)
    rejected: list[tuple[dict, int, Any]] = field(default_factory=list)
    undelivered: list[dict] = field(default_factory=list)
    error: str | None = None
    attempts: int = 0


def _json_default(obj: Any) -> Any:
    """datetime/date → ISO 8601; numpy/torch scalars → Python numbers; anything else → str."""
    if isinstance(obj, (_dt.datetime, _dt.date)):
        return obj.isoformat()
    item = getattr(obj, "item", None)
    if callable(item):
        try:
            return item()
        except Exception:  # noqa: BLE001 - fall through to str()
            pass
    return str(obj)


def _dumps(obj: Any) -> str:
    return json.dumps(obj, default=_json_default, separators=(",", ":"))


def _now() -> str:
    return _dt.datetime.now(_dt.UTC).isoformat()


def _fsync_dir(path: Path) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Client:
    """Pushes run records to ``{url}/api/v1/runs``; spools what cannot be delivered (module doc).

    Args:
        url: API base URL; default SCALEBOOK_API_URL or http://127.0.0.1:8000.
        token: bearer token; default SCALEBOOK_TOKEN (none when unset).
        spool_dir: directory of spool.jsonl / rejects.jsonl; default :func:`default_spool_dir`.
        deadline_s: seconds one push call (or one sync batch) keeps retrying before spooling.
        strict: raise instead of only logging (see module doc).
        timeout_s: socket timeout of one HTTP request, seconds (clipped to the time left).
        backoff_base_s, backoff_max_s: backoff of the n-th retry is uniform(0, min(max, base·2ⁿ)).
    """

    def __init__(self, url: str | None = None, token: str | None = None, spool_dir: str | os.PathLike | None = None,
                 deadline_s: float = 30.0, strict: bool = False, timeout_s: float = 5.0,
                 backoff_base_s: float = 0.25, backoff_max_s: float = 8.0):
        self.url = (url or api_url()).rstrip("/")
        self.token = token if token is not None else api_token()
        self.spool_dir = Path(spool_dir).expanduser() if spool_dir is not None else default_spool_dir()
        self.deadline_s = float(deadline_s)
        self.strict = strict
        self.timeout_s = float(timeout_s)
        self.backoff_base_s = float(backoff_base_s)
        self.backoff_max_s = float(backoff_max_s)

    # ------------------------------------------------------------------ paths
    @property
    def spool_path(self) -> Path:
        return self.spool_dir / SPOOL_FILE

    @property
    def rejects_path(self) -> Path:
        return self.spool_dir / REJECTS_FILE

    def pending(self) -> int:
        """Number of runs waiting in the spool (non-empty lines)."""
        try:
            with open(self.spool_path, "rb") as fh:
                return sum(1 for line in fh if line.strip())
        except FileNotFoundError:
            return 0

    # ------------------------------------------------------------------ push
    def push(self, run: dict[str, Any]) -> PushResult:
        """Deliver one run record (a dict of DESIGN §2 fields) within ``deadline_s``; never raises
        unless ``strict``. The caller's dict is not modified: its key is ``result.run_key``."""
        return self.push_many([run])

    def push_many(self, runs: Iterable[dict[str, Any]]) -> PushResult:
        """Deliver runs in batches of ≤ 1,000 within one ``deadline_s`` for the whole call; what is
        left when the deadline passes (or the server is found unreachable) is spooled."""
        try:
            return self._push_many(runs)
        except PushError:
            raise
        except Exception as exc:
            if self.strict:
                raise
            log.exception("scalebook: push failed unexpectedly; the run(s) may not be recorded")
            return PushResult(status="error", errors=[{"run_key": None, "http_status": None, "error": repr(exc)}])

    def _push_many(self, runs: Iterable[dict[str, Any]]) -> PushResult:
        deadline = time.monotonic() + self.deadline_s
        records = [self._prepare(run) for run in runs]
        result = PushResult(status="stored", run_keys=[r["run_key"] for r in records])
        if not records:
            return result
        out = _Delivery()
        self._deliver(records, deadline, out)
        result.created, result.existing, result.attempts = out.created, out.existing, out.attempts
        if out.rejected:
            result.rejected = len(out.rejected)
            for rec, status, body in out.rejected:
                log.warning("scalebook: run %s rejected by the server (HTTP %s): %s", rec.get("run_key"), status,
                            _error_message(body))
                result.errors.append({"run_key": rec.get("run_key"), "http_status": status, "error": body})
            try:
                self._append(self.rejects_path, [self._reject_line(rec, status, body, "push")
                                                 for rec, status, body in out.rejected])
            except OSError as exc:
                log.error("scalebook: cannot write %s: %s", self.rejects_path, exc)
                result.errors.append({"run_key": None, "http_status": None, "error": f"rejects file: {exc}"})
        if out.undelivered:
            try:
                self._append(self.spool_path, [_dumps(rec) for rec in out.undelivered])
                result.spooled = len(out.undelivered)
                log.warning("scalebook: API at %s unavailable (%s); %d run(s) spooled to %s (run `scalebook sync`)",
                            self.url, out.error, result.spooled, self.spool_path)
            except OSError as exc:
                result.lost = len(out.undelivered)
                log.error("scalebook: API unavailable (%s) and the spool %s is not writable (%s): %d run(s) "
                          "not recorded: %s", out.error, self.spool_path, exc, result.lost,
                          [r.get("run_key") for r in out.undelivered])
                result.errors.append({"run_key": None, "http_status": None, "error": f"spool: {exc}"})
        if result.lost:
            result.status = "error"
        elif result.spooled and result.rejected:
            result.status = "partial"
        elif result.spooled:
            result.status = "spooled"
        elif result.rejected:
            result.status = "rejected"
        if self.strict and (result.rejected or result.lost):
            raise PushError(f"{result.rejected} run(s) rejected, {result.lost} lost: {result.errors[:1]}", result)
        return result

    @staticmethod
    def _prepare(run: dict[str, Any]) -> dict[str, Any]:
        """A plain-JSON copy of `run` with a run_key (uuid4 hex unless it has one)."""
        if not isinstance(run, dict):
            raise TypeError(f"a run record is a dict, not {type(run).__name__}")
        record = json.loads(_dumps(run))
        if not record.get("run_key"):
            record["run_key"] = uuid.uuid4().hex
        return record

    # ------------------------------------------------------------------ HTTP
    def _deliver(self, records: list[dict], deadline: float, out: _Delivery) -> None:
        """Send `records` in batches, splitting out rejected runs; fills `out` (see _Delivery)."""
        queue = [records[i:i + MAX_BATCH] for i in range(0, len(records), MAX_BATCH)]
        while queue:
            batch = queue.pop(0)
            if out.error is not None:  # the server is unreachable: keep the rest without trying
                out.undelivered.extend(batch)
                continue
            kind, status, body = self._post(batch, deadline, out)
            if kind == "ok":
                out.created += int(body.get("created", 0)) if isinstance(body, dict) else 0
                out.existing += int(body.get("existing", 0)) if isinstance(body, dict) else 0
                out.acked.extend(batch)
            elif kind == "down":
                out.error = str(body)
                out.undelivered.extend(batch)
            else:  # "reject": a 4xx about the content
                details = body.get("error", {}).get("details", []) if isinstance(body, dict) else []
                bad: dict[int, list[dict]] = {}
                for d in details if isinstance(details, list) else []:
                    i = d.get("index") if isinstance(d, dict) else None
                    if isinstance(i, int) and 0 <= i < len(batch):
                        bad.setdefault(i, []).append(d)
                if bad and status in (409, 422):
                    for i, ds in sorted(bad.items()):
                        err = dict(body.get("error", {}), details=ds)
                        out.rejected.append((batch[i], status, {"error": err}))
                    rest = [r for i, r in enumerate(batch) if i not in bad]
                    if rest:
                        queue.insert(0, rest)
                elif len(batch) > 1:  # no per-run detail (or 413): find the culprit by halving
                    mid = len(batch) // 2
                    queue[0:0] = [batch[:mid], batch[mid:]]
                else:
                    out.rejected.append((batch[0], status or 0, body))

    def _post(self, batch: list[dict], deadline: float, out: _Delivery) -> tuple[str, int | None, Any]:
        """POST one batch with retries (post_until). Returns ("ok", status, body), ("reject", status, body)
        for a bad-record 4xx, or ("down", status|None, reason) when the deadline passed or the client is
        misconfigured (401/403/404/405)."""

        def counted() -> None:
            out.attempts += 1

        return post_until(self, "/api/v1/runs", _dumps({"runs": batch}).encode(), deadline, on_attempt=counted)

    # ------------------------------------------------------------------ spool files
    @contextmanager
    def _lock(self, name: str) -> Iterator[None]:
        self.spool_dir.mkdir(parents=True, exist_ok=True)
        with open(self.spool_dir / name, "a") as fh:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh.fileno(), fcntl.LOCK_UN)

    def _append(self, path: Path, lines: list[str]) -> None:
        """Append JSON lines under the spool lock; flush + fsync before returning. A torn last line
        left by a crash is closed with a newline first, so it never swallows the new record."""
        if not lines:
            return
        with self._lock(_SPOOL_LOCK):
            created = not path.exists()
            with open(path, "ab") as fh:
                size = fh.seek(0, os.SEEK_END)
                prefix = b""
                if size:
                    with open(path, "rb") as rd:
                        rd.seek(size - 1)
                        prefix = b"" if rd.read(1) == b"\n" else b"\n"
                fh.write(prefix + "".join(line + "\n" for line in lines).encode())
                fh.flush()
                os.fsync(fh.fileno())
            if created:
                _fsync_dir(path.parent)

    @staticmethod
    def _reject_line(run: Any, status: int | None, body: Any, origin: str) -> str:
        return _dumps({"run": run, "http_status": status, "error": body, "rejected_at": _now(), "origin": origin})

    # ------------------------------------------------------------------ sync
    def sync(self, progress: Callable[[int, int], None] | None = None) -> SyncResult:
        """Replay spool.jsonl in batches of ≤ 1,000 and drop what the server acknowledged.
        ``progress(done, total)`` is called after each batch (runs sent so far, runs read).

        One sync runs at a time per spool directory (a second one waits). Pushes may append while
        it runs. Rejected runs (4xx, or 409: the key is stored with other content) and unreadable
        lines move to rejects.jsonl. The spool is rewritten atomically (temp file + fsync +
        os.replace) only after the acknowledgements, so a crash at any point loses nothing and a
        replay stores nothing twice (run keys). Each batch gets ``deadline_s`` of retries; when
        one fails the rest stays spooled (``remaining``). Never raises unless ``strict``.
        """
        try:
            return self._sync(progress)
        except Exception as exc:
            if self.strict:
                raise
            log.exception("scalebook: sync failed")
            return SyncResult(remaining=self.pending(), error=repr(exc))

    def _sync(self, progress: Callable[[int, int], None] | None = None) -> SyncResult:
        res = SyncResult()
        if not self.spool_path.exists():
            return res
        with self._lock(_SYNC_LOCK):
            with self._lock(_SPOOL_LOCK):
                try:
                    snapshot = self.spool_path.read_bytes()
                except FileNotFoundError:
                    return res
            lines = snapshot.split(b"\n")
            records: list[dict] = []
            owner: dict[int, int] = {}  # id(record) -> line index
            drop: set[int] = set()
            rejects: list[str] = []
            for n, raw in enumerate(lines):
                if not raw.strip():
                    drop.add(n)
                    continue
                try:
                    rec = json.loads(raw)
                    if not isinstance(rec, dict):
                        raise ValueError("not a JSON object")
                except ValueError as exc:
                    log.warning("scalebook: unreadable spool line %d moved to rejects: %s", n + 1, exc)
                    rejects.append(self._reject_line(raw.decode("utf-8", "replace"), None,
                                                     {"error": {"code": "unreadable", "message": str(exc)}}, "sync"))
                    drop.add(n)
                    continue
                if not rec.get("run_key"):  # hand-written line: a key from the content keeps replays exactly-once
                    rec["run_key"] = "spool-" + hashlib.sha256(raw.strip()).hexdigest()[:32]
                records.append(rec)
                owner[id(rec)] = n
            for start in range(0, len(records), MAX_BATCH):
                out = _Delivery()
                self._deliver(records[start:start + MAX_BATCH], time.monotonic() + self.deadline_s, out)
                res.replayed += out.created
                res.already_present += out.existing
                drop.update(owner[id(r)] for r in out.acked)
                for rec, status, body in out.rejected:
                    log.warning("scalebook: spooled run %s rejected (HTTP %s): %s", rec.get("run_key"), status,
                                _error_message(body))
                    rejects.append(self._reject_line(rec, status, body, "sync"))
                    drop.add(owner[id(rec)])
                if progress is not None:
                    progress(min(start + MAX_BATCH, len(records)), len(records))
                if out.error is not None:
                    res.error = out.error
                    break
            res.rejected = len(rejects)
            self._append(self.rejects_path, rejects)  # before the spool forgets them
            if drop:
                self._rewrite(snapshot, lines, drop)
            res.remaining = self.pending()
        return res

    def _rewrite(self, snapshot: bytes, lines: list[bytes], drop: set[int], path: Path | None = None) -> None:
        """Replace the spool (`path`, default spool.jsonl; the live spool too) with the snapshot's kept lines
        plus whatever was appended since."""
        path = path or self.spool_path
        with self._lock(_SPOOL_LOCK):
            current = path.read_bytes() if path.exists() else b""
            if not current.startswith(snapshot):
                log.warning("scalebook: %s changed under sync; left as is (replays are idempotent)", path)
                return
            kept = [raw for n, raw in enumerate(lines) if n not in drop and raw.strip()]
            tail = current[len(snapshot):]
            body = b"".join(raw + b"\n" for raw in kept) + tail.lstrip(b"\n")
            fd, tmp = tempfile.mkstemp(prefix=".spool-", suffix=".tmp", dir=self.spool_dir)
            try:
                with os.fdopen(fd, "wb") as fh:
                    fh.write(body)
                    fh.flush()
                    os.fsync(fh.fileno())
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
            _fsync_dir(self.spool_dir)


def post_until(client: Client, path: str, data: bytes, deadline: float, *,
               user_agent: str = "scalebook-client/0.1",
               special: Callable[[int, Any], tuple[str, int | None, Any] | None] | None = None,
               on_attempt: Callable[[], None] | None = None) -> tuple[str, int | None, Any]:
    """POST the JSON `data` to client.url + `path` until it is answered or `deadline` (time.monotonic())
    passes: the one retry rule of every agent (the push client, live runs). Timeouts, resets, 408, 429
    and 5xx are retried with full-jitter exponential backoff (AWS Architecture Blog, "Exponential Backoff
    and Jitter", 2015), at least the server's Retry-After. Returns ("ok", status, body), ("reject",
    status, body) for a 4xx about the request, or ("down", status | None, reason) when the deadline
    passed or the client is misconfigured (401/403/404/405, a non-JSON answer). `special(status, body)`
    (body: the error answer parsed, None if it was not JSON) may decide an HTTP error first;
    `on_attempt()` is called before each try. Never raises for a network or HTTP failure."""
    headers = {"Content-Type": "application/json", "Accept": "application/json",
               # return=minimal: the answer is the ids, not every stored run echoed back
               "Prefer": "return=minimal", "User-Agent": user_agent}
    if client.token:
        headers["Authorization"] = f"Bearer {client.token}"
    url = client.url + path
    attempt = 0
    while True:
        attempt += 1
        if on_attempt is not None:
            on_attempt()
        remaining = deadline - time.monotonic()
        request = urllib.request.Request(url, data=data, headers=headers, method="POST")
        retry_after = None
        try:
            with urllib.request.urlopen(request, timeout=max(0.05, min(client.timeout_s, remaining))) as resp:
                status, raw = resp.status, resp.read()
            try:
                return "ok", status, json.loads(raw or b"null")
            except ValueError:
                return "down", status, f"HTTP {status} with a non-JSON body from {client.url}: not a scalebook API?"
        except urllib.error.HTTPError as exc:
            status = exc.code
            try:
                parsed = json.loads(exc.read() or b"null")
            except (ValueError, OSError, http.client.HTTPException):
                parsed = None
            decided = special(status, parsed) if special is not None else None
            if decided is not None:
                return decided
            body = parsed if parsed is not None else {
                "error": {"code": "bad_response", "message": f"HTTP {status}", "details": []}}
            if status in _HOLD:
                return "down", status, f"HTTP {status}: {_error_message(body)} (check SCALEBOOK_API_URL/TOKEN)"
            if 400 <= status < 500 and status not in (408, 429):
                return "reject", status, body
            reason = f"HTTP {status}: {_error_message(body)}"
            retry_after = exc.headers.get("Retry-After") if exc.headers else None
        except (OSError, http.client.HTTPException, ValueError) as exc:  # URLError, timeouts, resets
            reason = f"{type(exc).__name__}: {getattr(exc, 'reason', exc)}"
        now = time.monotonic()
        if now >= deadline:
            return "down", None, reason
        delay = random.uniform(0.0, min(client.backoff_max_s, client.backoff_base_s * 2 ** (attempt - 1)))
        try:
            delay = max(delay, float(retry_after)) if retry_after else delay
        except ValueError:
            pass
        time.sleep(max(0.0, min(delay, deadline - now)))
        if time.monotonic() >= deadline:
            return "down", None, reason


def _error_message(body: Any) -> str:
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
        return f"{err.get('code', '')}: {err.get('message', '')}".strip(": ")
    return str(body)[:300]
