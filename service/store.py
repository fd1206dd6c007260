"""The run store: validate, derive, insert idempotently; fetch and page through runs.

Functions take a Session from `Database.session()` and never commit themselves (`ingest` opens
and commits its own). The set-based insert itself is service/bulk.py.
"""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.orm import Session

from core.record import RUNNING
from service import bulk, derive, lifecycle, run_cells, run_configs, steps
from service.db import Database, json_list_contains, locked
from service.errors import BadRequest, Conflict, NotFound, ValidationFailed
from service.schemas import RunIn
from service.tables import Run

_COLUMN_SET = frozenset(c.name for c in Run.__table__.columns)


def validate_records(payloads: list[Any]) -> list[dict[str, Any]]:
    """Validate and derive a list of raw records; all-or-nothing.

    Returns one `runs` row dict per record (without id). Raises ValidationFailed whose details
    list every problem as {index, field, value, message}.
    """
    details: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []
    for index, payload in enumerate(payloads):
        if not isinstance(payload, dict):
            details.append({"index": index, "field": None, "value": payload,
                            "message": f"a run must be a JSON object, got {type(payload).__name__}"})
            continue
        try:
            rec = RunIn.model_validate(payload)
        except ValidationError as exc:
            for err in exc.errors(include_url=False):
                field = ".".join(str(p) for p in err["loc"]) or None
                value = err.get("input")
                if err["type"] == "extra_forbidden":
                    msg = f"unknown field '{field}' (put framework-specific values under 'extra')"
                else:
                    msg = f"{field}: {err['msg']}" if field else err["msg"]
                details.append({"index": index, "field": field, "value": _jsonable(value), "message": msg})
            continue
        reported = dict(rec.__dict__)  # == rec.model_dump() for this flat model, 10x cheaper
        row, errors = derive.complete(reported)
        if errors:
            details.extend({"index": index, **e.as_dict()} for e in errors)
            continue
        misfits = _column_misfits(row)
        if misfits:
            details.extend({"index": index, **m} for m in misfits)
            continue
        row["run_key"] = rec.run_key or uuid.uuid4().hex
        row["content_hash"] = derive.content_hash(reported)
        rows.append(row)
    if details:
        n_bad = len({d["index"] for d in details})
        first = details[0]
        raise ValidationFailed(
            f"{n_bad} of {len(payloads)} run(s) rejected; first: run {first['index']}: {first['message']}",
            details)
    return rows


_INT_LIMITS = {c.name: (2**63 - 1 if isinstance(c.type, sa.BigInteger) else 2**31 - 1)
               for c in Run.__table__.columns if isinstance(c.type, (sa.Integer, sa.BigInteger))}
_TEXT_COLUMNS = tuple(c.name for c in Run.__table__.columns if isinstance(c.type, (sa.String, sa.Text)))


def _column_misfits(row: dict[str, Any]) -> list[dict[str, Any]]:
    """Values, reported or derived, that no column of either backend can hold: integers beyond
    INTEGER (2^31 − 1) / BIGINT (2^63 − 1) — e.g. world_size = nodes × gpus_per_node — and text
    with NUL characters (PostgreSQL refuses them). Caught here as a 422 naming the field rather
    than failing in the database as a 5xx."""
    out = []
    for name, limit in _INT_LIMITS.items():
        v = row.get(name)
        if v is not None and not -limit - 1 <= v <= limit:
            out.append({"field": name, "value": v,
                        "message": f"{name}: {v} is out of range (at most {limit:,})"})
    for name in _TEXT_COLUMNS:
        v = row.get(name)
        if v is not None and "\x00" in v:
            out.append({"field": name, "value": v, "message": f"{name}: text must not contain NUL (\\u0000)"})
    return out


def _jsonable(value: Any) -> Any:
    try:
        json.dumps(value, allow_nan=False)
        return value
    except (TypeError, ValueError):
        return repr(value)


def store_runs(session: Session, payloads: list[Any]) -> tuple[list[Any], int, int]:
    """Store records idempotently, all-or-nothing, in the session's transaction. Returns (runs in
    request order, created, existing).

    The one write path, whatever the batch size: validate → look up the run_keys → insert the new
    runs set-based (service/bulk.py) → answer. Same run_key + same content → the stored run
    (counted as existing); same run_key + different content (stored, or twice in the request) →
    Conflict (409) naming the keys, nothing stored. A run_key a concurrent request stores between
    the look-up and the insert (PostgreSQL) is looked up again and answered as a retry: 200 for
    the same content, 409 for different content — never a unique-violation error. The one exception
    to immutability (DESIGN §9): a stored `running` run (lost or not) receiving its run_key with a
    finished status is finished — see `_finish_open_runs` — and answered as existing. An empty list
    stores nothing and answers ([], 0, 0). Raises ValidationFailed (422) as validate_records.

    New runs are answered from the rows just written (StoredRun); stored ones are read back as
    `Run` rows.
    """
    rows = validate_records(payloads)
    by_key, order = _by_key(rows)
    if not by_key:
        return [], 0, 0
    stored = bulk.stored_hashes(session, list(by_key))
    now = datetime.now(UTC).replace(tzinfo=None)
    changed = [k for k, r in by_key.items() if k in stored and stored[k] != r["content_hash"]]
    if changed:  # a different record under a stored key: the finish of an open run, or a conflict
        payload_of = dict(zip(order, payloads))
        # a finished run enters the per-configuration summary (an open one never is in it)
        with run_configs.refreshing(session, [Run.run_key.in_(changed)]), \
                run_cells.refreshing(session, [Run.run_key.in_(changed)]):
            stored.update(_finish_open_runs(session, {k: payload_of[k] for k in changed}, by_key, order, now))
    _raise_conflicts(stored, by_key, order)
    new_rows = [r for k, r in by_key.items() if k not in stored]
    for r in new_rows:
        r["ingested_at"] = now
        if r["status"] == RUNNING:  # opened now: its first sign of life
            r["last_heartbeat_at"] = now
    ids = bulk.insert(session, new_rows)
    raced = [r["run_key"] for r in new_rows if r["run_key"] not in ids]
    if raced:  # stored by a concurrent request since the look-up
        later = bulk.stored_hashes(session, raced)
        _raise_conflicts(later, by_key, order)
        stored.update(later)
    out: dict[str, Any] = {}
    for r in new_rows:
        if r["run_key"] in ids:
            r["id"] = ids[r["run_key"]]
            out[r["run_key"]] = StoredRun(r)
    if stored:
        out.update((r.run_key, r) for r in session.scalars(sa.select(Run).where(Run.run_key.in_(list(stored)))))
    # the per-configuration summary, in this transaction; last, so that a PostgreSQL writer holds the
    # summary rows it shares with a concurrent one for the shortest time before its commit
    run_configs.add(session, [r for r in new_rows if r["run_key"] in ids])
    run_cells.add(session, [r for r in new_rows if r["run_key"] in ids])
    return [out[k] for k in order], len(ids), len(by_key) - len(ids)


def _finish_open_runs(session: Session, payloads: dict[str, Any], by_key: dict[str, dict[str, Any]],
                      order: list[str], now: datetime) -> dict[str, str]:
    """Settle the live runs among `payloads` ({run_key: raw record whose content hash differs from the
    stored run's}). A live run's record is its opening record's reported fields overlaid by those the
    finishing record states (so a finish may send its status and figures only), validated and derived
    again as any new run:
    - a stored `running` run (lost or not) and a finished status: the run is finished — its columns
      become that record's, content_hash its hash, last_heartbeat_at `now`; id and ingested_at stay;
    - a live run already finished, and a record that, overlaid on it, changes nothing: a retry of the
      finish (the spool's replay), answered as the stored run.
    Returns {run_key: content_hash} for those keys (by_key gets their merged rows); every other key is
    left to the caller's conflict check (409). Raises ValidationFailed for a merged record that does not
    validate (its index is the request's)."""
    from core.record import REPORTED_FIELDS
    from ingest.parsers.runs import as_reported

    live = sa.select(Run).where(Run.run_key.in_(list(payloads)), Run.last_heartbeat_at.is_not(None))
    settled: dict[str, str] = {}
    for run in session.scalars(locked(session, live)):
        key, payload = run.run_key, payloads[run.run_key]
        if not isinstance(payload, dict) or (run.status == RUNNING and payload.get("status", "success") == RUNNING):
            continue  # an open run re-opened with other content: a conflict
        stated = as_reported({f: getattr(run, f) for f in REPORTED_FIELDS if getattr(run, f) is not None},
                             keep_step_headline=False)
        merged = {**stated, **payload, "extra": {**(stated.get("extra") or {}), **(payload.get("extra") or {})}}
        merged["extra"] = merged["extra"] or None
        merged = steps.with_headline(session, run.id, merged)  # a series and no headline: its steady median
        try:
            row = validate_records([merged])[0]
        except ValidationFailed as exc:
            for detail in exc.details:
                detail["index"] = order.index(key)
            raise ValidationFailed(f"finishing run {key!r}: {exc.message}", exc.details) from None
        if run.status == RUNNING:
            for column, value in row.items():
                if column != "run_key":
                    setattr(run, column, value)
            run.last_heartbeat_at = now
        elif row["content_hash"] != run.content_hash:
            continue  # a finished run changed: immutable, a conflict
        by_key[key] = row
        settled[key] = row["content_hash"]
    session.flush()
    return settled


def ingest(db: Database, payloads: list[Any]) -> tuple[list[Any], int, int]:
    """The API's write path (POST /api/v1/runs): `store_runs` in one write session of `db`, committed
    before it returns (an acknowledged run is a committed run)."""
    with db.session(write=True) as session:
        return store_runs(session, payloads)


def _by_key(rows: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], list[str]]:
    """({run_key: first row}, run_keys in request order); Conflict for a run_key that appears twice
    in the request with different content."""
    by_key: dict[str, dict[str, Any]] = {}
    order: list[str] = []
    conflicts: list[dict[str, Any]] = []
    for index, row in enumerate(rows):
        key = row["run_key"]
        order.append(key)
        seen = by_key.get(key)
        if seen is None:
            by_key[key] = row
        elif seen["content_hash"] != row["content_hash"]:
            conflicts.append({"index": index, "field": "run_key", "value": key,
                              "message": "run_key appears twice in this request with different content"})
    if conflicts:
        raise Conflict(f"{len(conflicts)} run_key conflict(s); first: {conflicts[0]['value']}", conflicts)
    return by_key, order


def _raise_conflicts(stored: dict[str, str], by_key: dict[str, dict[str, Any]], order: list[str]) -> None:
    """Conflict naming each request index whose run_key is stored with a different content hash."""
    conflicts = [{"index": index, "field": "run_key", "value": key,
                  "message": "a run with this run_key is already stored with different content"}
                 for index, key in enumerate(order) if key in stored and stored[key] != by_key[key]["content_hash"]]
    if conflicts:
        raise Conflict(f"{len(conflicts)} run_key conflict(s); first: {conflicts[0]['value']}", conflicts)


class StoredRun(dict):
    """A just-written run: the row dict itself, with every `runs` column also readable as an
    attribute (`run.id`, `run.extra`), as on a `Run` row — without the ORM bookkeeping (~30 µs per
    object) and without copying. `extra` is the dict that was stored as JSON."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if name in _COLUMN_SET:
            return self.get(name)
        raise AttributeError(name)


def get_run(session: Session, run_id: int) -> Run:
    """The run with this id; NotFound otherwise."""
    run = session.get(Run, run_id)
    if run is None:
        raise NotFound(f"no run with id {run_id}", [{"field": "id", "value": run_id, "message": "not found"}])
    return run


#: columns accepted as equality filters on GET /api/v1/runs
FILTER_COLUMNS = (
    "name", "model_name", "model_params", "model_size_class", "source", "gpu_type", "gpus_per_node", "nodes",
    "world_size", "seq_len", "dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size",
    "grad_accum_steps", "global_batch_tokens", "recompute", "precision", "framework", "status",
    "error_class", "fingerprint", "run_key", "sweep",
)
#: columns accepted by `sort` (prefix '-' for descending)
SORT_COLUMNS = ("id", "started_at", "ingested_at", "nodes", "model_params", "tokens_per_sec_per_gpu", "mfu",
                "mfu_derived", "tflops_per_gpu", "peak_memory_gib", "step_time_s", "world_size")


def list_runs(session: Session, filters: dict[str, Any], *, sort: str = "id", limit: int = 100,
              cursor: str | None = None, started_after: datetime | None = None,
              started_before: datetime | None = None, name_prefix: str | None = None,
              retired: bool | None = None, size_range: tuple[float, float] | None = None,
              lost_cutoff: datetime | None = None, tag: str | None = None
              ) -> tuple[list[Run], str | None, int]:
    """A page of runs matching equality `filters`, keyset-paginated on (sort column, id);
    `retired` True: retired runs only, False: runs not retired, None: both. `size_range` (lo, hi):
    model_size_class in [lo, hi) billions (a size family). A `status` filter reads statuses as the API
    answers them (service/lifecycle.py): `running` / `lost` split the open runs at `lost_cutoff`
    (now − lost_after_s, naive UTC; default: now − core.lifecycle.DEFAULT_LOST_AFTER_S). `tag`: runs
    whose tags include it.

    Returns (runs, next_cursor or None, total matching). NULLs sort last. Raises BadRequest for
    an unknown filter/sort column or a malformed cursor.
    """
    conds = []
    for name, value in filters.items():
        if value is None:
            continue
        if name not in FILTER_COLUMNS:
            raise BadRequest(f"cannot filter on '{name}'",
                             [{"field": name, "value": value, "message": "unknown filter"}])
        if name == "status":
            if lost_cutoff is None:
                from core.lifecycle import DEFAULT_LOST_AFTER_S
                lost_cutoff = lifecycle.lost_cutoff(lifecycle.utcnow(), DEFAULT_LOST_AFTER_S)
            conds.append(lifecycle.status_condition(value, lost_cutoff))
            continue
        conds.append(getattr(Run, name) == value)
    if name_prefix:  # LIKE with % and _ escaped: a literal prefix
        conds.append(Run.name.startswith(name_prefix, autoescape=True))
    if retired is not None:
        conds.append(Run.retired_at.is_not(None) if retired else Run.retired_at.is_(None))
    if tag is not None:
        conds.append(json_list_contains(session, Run.tags, tag))
    if size_range is not None:
        conds.append(Run.model_size_class >= size_range[0])
        if size_range[1] != float("inf"):
            conds.append(Run.model_size_class < size_range[1])
    if started_after:
        conds.append(Run.started_at >= naive_utc(started_after))
    if started_before:
        conds.append(Run.started_at < naive_utc(started_before))
    desc = sort.startswith("-")
    col_name = sort.lstrip("-")
    if col_name not in SORT_COLUMNS:
        raise BadRequest(f"cannot sort by '{col_name}'; one of {', '.join(SORT_COLUMNS)}",
                         [{"field": "sort", "value": sort, "message": "unknown sort column"}])
    col = getattr(Run, col_name)
    total = session.scalar(sa.select(sa.func.count()).select_from(Run).where(*conds))
    page_conds = list(conds)
    if cursor:
        last_value, last_id = _decode_cursor(cursor, col)
        if col_name == "id":
            page_conds.append(Run.id < last_id if desc else Run.id > last_id)
        elif last_value is None:
            page_conds.append(sa.and_(col.is_(None), Run.id > last_id))
        else:
            beyond = col < last_value if desc else col > last_value
            page_conds.append(sa.or_(beyond, sa.and_(col == last_value, Run.id > last_id), col.is_(None)))
    if col_name == "id":
        order = [Run.id.desc() if desc else Run.id.asc()]
    else:
        order = [col.is_(None), col.desc() if desc else col.asc(), Run.id.asc()]
    runs = list(session.scalars(sa.select(Run).where(*page_conds).order_by(*order).limit(limit + 1)))
    next_cursor = None
    if len(runs) > limit:
        runs = runs[:limit]
        last = runs[-1]
        next_cursor = _encode_cursor(getattr(last, col_name), last.id)
    return runs, next_cursor, int(total or 0)


def open_runs(session: Session, lost_cutoff: datetime, status: str | None = None, limit: int = 200) -> list[Run]:
    """The open runs (stored `running`), most recently heard from first; `status` "running" / "lost"
    keeps those that read so at `lost_cutoff` (service/lifecycle.py). At most `limit`."""
    cond = lifecycle.status_condition(status, lost_cutoff) if status else Run.status == RUNNING
    return list(session.scalars(sa.select(Run).where(cond)
                                .order_by(Run.last_heartbeat_at.desc().nulls_last(), Run.id.desc()).limit(limit)))


def naive_utc(moment: datetime) -> datetime:
    """Stored timestamps are naive UTC: convert aware datetimes, keep naive ones."""
    if moment.tzinfo is not None:
        return moment.astimezone(UTC).replace(tzinfo=None)
    return moment


def _encode_cursor(value: Any, run_id: int) -> str:
    if isinstance(value, datetime):
        value = {"dt": value.isoformat()}
    return base64.urlsafe_b64encode(json.dumps([value, run_id]).encode()).decode()


def _decode_cursor(cursor: str, col) -> tuple[Any, int]:
    try:
        value, run_id = json.loads(base64.urlsafe_b64decode(cursor.encode()))
        if isinstance(value, dict):
            value = datetime.fromisoformat(value["dt"])
        if not isinstance(run_id, int):
            raise ValueError
        return value, run_id
    except Exception as exc:
        raise BadRequest("malformed cursor", [{"field": "cursor", "value": cursor,
                                                "message": "pass next_cursor from the previous page"}]) from exc
