"""The run store: validate, derive, insert idempotently; fetch and page through runs.

Functions take a Session from `Database.session()` and never commit themselves.
Bulk inserts into DuckDB go through an Arrow table (set-based, ~10^5 rows/s) rather than
`executemany` (~10^3 rows/s); PostgreSQL uses COPY. Ids are drawn from the sequence before the
insert, so a batch is answered from the rows written, without reading them back.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import uuid
from datetime import UTC, datetime
from typing import Any

import pyarrow as pa
import sqlalchemy as sa
from pydantic import ValidationError
from sqlalchemy.orm import Session

from service import derive, run_configs
from service.errors import BadRequest, Conflict, NotFound, ValidationFailed
from service.schemas import RunIn
from service.tables import RUN_ID_SEQ, Run

RUN_COLUMNS = [c for c in Run.__table__.columns if c.name != "id"]
COLUMN_NAMES = [c.name for c in Run.__table__.columns]
_EXTRA_AT = COLUMN_NAMES.index("extra")
_COLUMN_SET = frozenset(COLUMN_NAMES)


def _arrow_type(col: sa.Column) -> pa.DataType:
    t = col.type
    if isinstance(t, (sa.BigInteger, sa.Integer)):
        return pa.int64()
    if isinstance(t, sa.Double | sa.Float):
        return pa.float64()
    if isinstance(t, sa.DateTime):
        return pa.timestamp("us")
    return pa.string()


ARROW_SCHEMA = pa.schema([(c.name, _arrow_type(c)) for c in Run.__table__.columns])


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


def store_runs(session: Session, payloads: list[Any], *, bulk: bool = False) -> tuple[list[Any], int, int]:
    """Store records idempotently, all-or-nothing. Returns (runs in request order, created, existing).

    Same run_key + same content → the stored run (counted as existing); same run_key + different
    content → Conflict (409) naming the keys. Raises ValidationFailed (422) as validate_records.

    Runs are returned as objects with every `runs` column as an attribute (what RunOut reads):
    new runs are built from the rows just written (ids come from the sequence up front), so a
    batch costs no second round trip; runs already stored are read back as `Run` rows. Inserts are
    set-based: DuckDB through an Arrow table (`bulk=True` or more than a few rows), PostgreSQL
    through COPY; a single run into DuckDB is one INSERT … RETURNING; a few runs into PostgreSQL
    one INSERT … ON CONFLICT DO NOTHING RETURNING. Concurrent requests storing the same run_key
    (PostgreSQL; DuckDB writes are serialised): the later one finds the key stored and answers
    as for a retry (200, or 409 for different content), never a unique-violation error.
    """
    return _store_rows(session, validate_records(payloads), bulk)


def ingest(db: Any, payloads: list[Any], *, wait: bool = True) -> tuple[list[Any], int, int] | None:
    """The API's write path (POST /api/v1/runs): `store_runs` in a write session of `db`
    (a service.db.Database), or, on a DuckDB file, through its ingest journal (service/journal.py)
    when the request has at most journal.SMALL_REQUEST runs, all with new run_keys: the runs get
    ids, are made durable in the journal (one appended line, fdatasync) and are answered from
    memory; they reach `runs` at the next flush. Same answers and errors as `store_runs`.

    On PostgreSQL a request of one run is stored by `store_one_pg.store_one` in one autocommit
    statement (runs and run_configs together); a run_key already stored takes the checked path.

    `wait=False` (for the event loop): only a journal write that needs no waiting — the write
    lock free, no flush due, the keys new; otherwise None, and nothing was written (validation
    errors are raised as always). A journal write blocks ~1 ms: a key lookup and an fdatasync.
    """
    from service import journal as ingest_journal

    journal = db.journal
    if journal is not None and not journal.broken and len(payloads) <= ingest_journal.SMALL_REQUEST:
        rows = validate_records(payloads)
        by_key, order, conflicts = _by_key(rows)
        if not conflicts:
            answered = _journal_write(db, journal, by_key, order, wait)
            if answered is not None:
                return answered
        if not wait:
            return None
        with db.session(write=True) as session:  # retries of stored keys, conflicts: the checked path
            return _store_rows(session, rows, bulk=False)
    if not wait:
        return None
    if db.dialect == "postgresql" and len(payloads) == 1:
        from service import store_one_pg  # one new run: one autocommit statement

        rows = validate_records(payloads)
        if store_one_pg.store_one(db, rows[0]) is not None:
            return [StoredRun(rows[0])], 1, 0
        with db.session(write=True) as session:  # stored already: a retry or a conflict
            return _store_rows(session, rows, bulk=False)
    with db.session(write=True) as session:
        return store_runs(session, payloads, bulk=len(payloads) > SMALL_INSERT)


def _journal_write(db: Any, journal: Any, by_key: dict[str, dict[str, Any]], order: list[str],
                   wait: bool) -> tuple[list[Any], int, int] | None:
    """The journal path of `ingest`; None when a key is stored already (or, with wait=False,
    when the write lock is busy or a flush is due)."""
    lock = db.write_lock
    if not lock.acquire(blocking=wait):
        return None
    try:
        if not wait and (len(journal.pending) + len(by_key) >= journal.flush_rows
                         or not journal.has_ids(len(by_key))):
            return None  # a flush or an id query is due: the worker thread does this one
        if journal.stored(list(by_key)):
            return None
        new_rows = list(by_key.values())
        now = datetime.now(UTC).replace(tzinfo=None)
        for r, run_id in zip(new_rows, journal.next_ids(len(new_rows))):
            r["id"], r["ingested_at"] = run_id, now
        journal.append(new_rows)
        if len(journal.pending) >= journal.flush_rows:
            _flush_quietly(db)
        out = {r["run_key"]: StoredRun(r) for r in new_rows}
        return [out[k] for k in order], len(new_rows), 0
    finally:
        lock.release()


def _flush_quietly(db: Any) -> None:
    """Flush after an acknowledged journal write: a failure leaves the runs journaled (durable,
    retried by the next session) and must not turn the acknowledgement into an error."""
    import logging

    try:
        db.flush()
    except Exception as exc:  # noqa: BLE001 - the runs are durable in the journal; the next session retries
        logging.getLogger(__name__).warning("ingest journal flush failed, runs stay journaled: %s",
                                            getattr(exc, "message", exc))


def _by_key(rows: list[dict[str, Any]]) -> tuple[dict[str, dict[str, Any]], list[str], list[dict[str, Any]]]:
    """({run_key: first row}, run_keys in request order, in-request conflicts)."""
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
    return by_key, order, conflicts


def _store_rows(session: Session, rows: list[dict[str, Any]], bulk: bool) -> tuple[list[Any], int, int]:
    by_key, order, conflicts = _by_key(rows)
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql" and len(by_key) <= SMALL_INSERT and not conflicts:
        new_rows, stored = _insert_small_pg(session, by_key, order)
    else:
        new_rows, stored = _insert_checked(session, by_key, order, conflicts, dialect, bulk)
    if new_rows:  # the per-configuration summary: merged (PostgreSQL) or folded when due (DuckDB)
        with _as_dbapi_error("INSERT INTO run_configs … ON CONFLICT DO UPDATE"):
            run_configs.record(session, new_rows)
    out: dict[str, Any] = {r["run_key"]: StoredRun(r) for r in new_rows}
    if stored:
        out.update((r.run_key, r) for r in session.scalars(sa.select(Run).where(Run.run_key.in_(list(stored)))))
    return [out[k] for k in order], len(new_rows), len(by_key) - len(new_rows)


DATETIME_COLUMNS = tuple(c.name for c in Run.__table__.columns if isinstance(c.type, sa.DateTime))


def insert_journaled(session: Session, rows: list[dict[str, Any]], *, skip_stored: bool = False) -> int:
    """Insert runs that already have ids and ingested_at (the ingest journal's), in id order, and
    record them in run_configs. `skip_stored`: leave out run_keys already in `runs` (a replay
    after a crash that came between a flush's commit and the journal's truncation). Returns how
    many were inserted."""
    rows = sorted(rows, key=lambda r: r["id"])
    if skip_stored:
        stored = _stored_hashes(session, [r["run_key"] for r in rows], session.get_bind().dialect.name)
        rows = [r for r in rows if r["run_key"] not in stored]
    if not rows:
        return 0
    if len(rows) > SMALL_INSERT:
        _insert_arrow(session, rows)
    else:
        session.connection().execute(_INSERT_ALL, [{c: r.get(c) for c in COLUMN_NAMES} for r in rows])
    with _as_dbapi_error("INSERT INTO run_configs … ON CONFLICT DO UPDATE"):
        run_configs.record(session, rows)
    return len(rows)


#: attempts at inserting a request's new runs when concurrent requests store the same run_keys
_RACE_RETRIES = 3


def _raise_conflicts(stored: dict[str, str], by_key: dict[str, dict[str, Any]], order: list[str],
                     conflicts: list[dict[str, Any]]) -> None:
    for index, key in enumerate(order):
        if key in stored and stored[key] != by_key[key]["content_hash"]:
            conflicts.append({"index": index, "field": "run_key", "value": key,
                              "message": "a run with this run_key is already stored with different content"})
    if conflicts:
        raise Conflict(f"{len(conflicts)} run_key conflict(s); first: {conflicts[0]['value']}", conflicts)


def _insert_checked(session: Session, by_key: dict[str, dict[str, Any]], order: list[str],
                    conflicts: list[dict[str, Any]], dialect: str, bulk: bool) -> tuple[list[dict], dict[str, str]]:
    """Look the keys up, raise Conflict for changed content, insert the rest. Returns (new rows,
    {stored key: content hash}). On PostgreSQL the insert runs in a savepoint and is retried
    after a unique violation (a concurrent request committed one of the keys first)."""
    for attempt in range(_RACE_RETRIES):
        stored = _stored_hashes(session, list(by_key), dialect)
        _raise_conflicts(stored, by_key, order, conflicts)
        new_rows = [r for k, r in by_key.items() if k not in stored]
        if not new_rows:
            return new_rows, stored
        if dialect != "postgresql":  # DuckDB: writes are serialised by Database's write lock
            _write(session, new_rows, dialect, bulk)
            return new_rows, stored
        try:
            with session.begin_nested():
                _write(session, new_rows, dialect, bulk)
            return new_rows, stored
        except sa.exc.IntegrityError:
            if attempt == _RACE_RETRIES - 1:
                raise
    raise AssertionError("unreachable")


@functools.lru_cache(maxsize=32)
def _insert_or_skip_pg(n: int) -> str:
    """`INSERT INTO runs … VALUES (n rows) ON CONFLICT (run_key) DO NOTHING RETURNING run_key, id`
    with psycopg named parameters `<column>_<row>`. Plain SQL built once per n: SQLAlchemy cannot
    cache a statement with ON CONFLICT and would compile it on every request (~2 ms)."""
    rows = ", ".join("(" + ", ".join(f"%({c}_{i})s::json" if c == "extra" else f"%({c}_{i})s" for c in INSERT_COLUMNS)
                     + ")" for i in range(n))
    return (f"INSERT INTO runs ({', '.join(INSERT_COLUMNS)}) VALUES {rows} "
            "ON CONFLICT (run_key) DO NOTHING RETURNING run_key, id")


def insert_params_pg(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The parameters of `_insert_or_skip_pg(len(rows))` (`<column>_<row>`, extra as JSON text),
    after setting each row's ingested_at to now (naive UTC)."""
    now = datetime.now(UTC).replace(tzinfo=None)
    params: dict[str, Any] = {}
    for i, r in enumerate(rows):
        r["ingested_at"] = now
        for c in INSERT_COLUMNS:
            params[f"{c}_{i}"] = r.get(c)
        if params[f"extra_{i}"] is not None:
            params[f"extra_{i}"] = json.dumps(params[f"extra_{i}"])
    return params


def _insert_small_pg(session: Session, by_key: dict[str, dict[str, Any]],
                     order: list[str]) -> tuple[list[dict], dict[str, str]]:
    """PostgreSQL, a few runs: one `INSERT … ON CONFLICT (run_key) DO NOTHING RETURNING` (ids from
    the column default). Keys it skipped are stored already — by an earlier or a concurrent
    request — and are checked for changed content (409) afterwards. One round trip for new runs."""
    params = insert_params_pg(list(by_key.values()))
    result = session.connection().exec_driver_sql(_insert_or_skip_pg(len(by_key)), params)
    inserted = {key: run_id for key, run_id in result}
    skipped = [k for k in by_key if k not in inserted]
    stored = _stored_hashes(session, skipped, "postgresql") if skipped else {}
    _raise_conflicts(stored, by_key, order, [])
    new_rows = []
    for key, run_id in inserted.items():
        by_key[key]["id"] = run_id
        new_rows.append(by_key[key])
    return new_rows, stored


#: a Core INSERT of every column (compiled once; the ORM bulk path recompiles per call)
_INSERT_ALL = sa.insert(Run.__table__)
#: columns an INSERT names (id comes from the sequence default)
INSERT_COLUMNS = [c for c in COLUMN_NAMES if c != "id"]


def _write(session: Session, new_rows: list[dict[str, Any]], dialect: str, bulk: bool) -> None:
    """Give `new_rows` ids and ingested_at, and insert them set-based."""
    now = datetime.now(UTC).replace(tzinfo=None)
    if dialect == "duckdb" and len(new_rows) == 1 and not bulk:
        new_rows[0]["ingested_at"] = now
        new_rows[0]["id"] = _insert_one_duckdb(session, new_rows[0])
        return
    for r, run_id in zip(new_rows, _next_ids(session, len(new_rows), dialect)):
        r["ingested_at"] = now
        r["id"] = run_id
    if dialect == "duckdb" and (bulk or len(new_rows) > SMALL_INSERT):
        _insert_arrow(session, new_rows)
    elif dialect == "postgresql" and len(new_rows) > SMALL_INSERT:
        _insert_copy(session, new_rows)
    else:
        session.connection().execute(_INSERT_ALL, [{c: r.get(c) for c in COLUMN_NAMES} for r in new_rows])


_INSERT_ONE_DUCKDB = (f"INSERT INTO runs ({', '.join(INSERT_COLUMNS)}) VALUES "
                      f"({', '.join('CAST(? AS JSON)' if c == 'extra' else '?' for c in INSERT_COLUMNS)}) RETURNING id")


def _insert_one_duckdb(session: Session, row: dict[str, Any]) -> int:
    """One run into DuckDB: a single INSERT … RETURNING id on the raw connection (no separate
    nextval query, no SQLAlchemy compilation: ~2 ms instead of ~5 ms for the 57-column row)."""
    values = [row.get(c) for c in INSERT_COLUMNS]
    extra_at = INSERT_COLUMNS.index("extra")
    if values[extra_at] is not None:
        values[extra_at] = json.dumps(values[extra_at])
    raw = session.connection().connection.driver_connection
    with _as_dbapi_error(_INSERT_ONE_DUCKDB):
        return raw.execute(_INSERT_ONE_DUCKDB, values).fetchone()[0]


#: up to this many new rows go through one executemany INSERT (cheaper than a bulk path to set up)
SMALL_INSERT = 20


class StoredRun(dict):
    """A just-written run: the row dict itself, with every `runs` column also readable as an
    attribute (`run.id`, `run.extra`), as on a `Run` row — without the ORM bookkeeping (~30 µs per
    object) and without copying. `extra` is the dict that was stored as JSON."""

    __slots__ = ()

    def __getattr__(self, name: str) -> Any:
        if name in _COLUMN_SET:
            return self.get(name)
        raise AttributeError(name)


def _stored_hashes(session: Session, keys: list[str], dialect: str) -> dict[str, str]:
    """{run_key: content_hash} of the given keys already stored. DuckDB scans an IN list of many
    keys (~30 ms at 10^6 rows) but not `= ANY(list)` (~7 ms), so it gets the latter; one key is an
    index lookup."""
    if dialect == "duckdb":
        raw = session.connection().connection.driver_connection
        if len(keys) == 1:  # an index lookup; through SQLAlchemy it costs twice as much
            return dict(raw.execute("SELECT run_key, content_hash FROM runs WHERE run_key = ?", keys).fetchall())
        return dict(raw.execute("SELECT run_key, content_hash FROM runs WHERE run_key = ANY(?)", [keys]).fetchall())
    return {k: h for k, h in session.execute(
        sa.select(Run.run_key, Run.content_hash).where(Run.run_key.in_(keys))).all()}


def _next_ids(session: Session, n: int, dialect: str) -> list[int]:
    """`n` fresh ids from runs_id_seq, in one query."""
    if n == 1:
        return [session.scalar(sa.select(RUN_ID_SEQ.next_value()))]
    series = "range(:n)" if dialect == "duckdb" else "generate_series(1, :n)"
    return list(session.scalars(sa.text(f"SELECT nextval('runs_id_seq') FROM {series}"), {"n": n}))


def _insert_arrow(session: Session, rows: list[dict[str, Any]]) -> None:
    """Set-based insert of many rows (ids included) into DuckDB through an Arrow table."""
    data = {name: [r.get(name) for r in rows] for name in COLUMN_NAMES}
    data["extra"] = [json.dumps(v) if v is not None else None for v in data["extra"]]
    table = pa.table(data, schema=ARROW_SCHEMA)
    raw = session.connection().connection.driver_connection
    view = f"_ingest_{uuid.uuid4().hex}"
    cols = ", ".join(COLUMN_NAMES)
    select = ", ".join("CAST(extra AS JSON)" if name == "extra" else name for name in COLUMN_NAMES)
    sql = f"INSERT INTO runs ({cols}) SELECT {select} FROM {view}"
    raw.register(view, table)
    try:
        with _as_dbapi_error(sql):
            raw.execute(sql)
    finally:
        raw.unregister(view)


def _insert_copy(session: Session, rows: list[dict[str, Any]]) -> None:
    """Set-based insert of many rows (ids included) into PostgreSQL with COPY FROM STDIN."""
    raw = session.connection().connection.driver_connection
    sql = f"COPY runs ({', '.join(COLUMN_NAMES)}) FROM STDIN"
    with _as_dbapi_error(sql), raw.cursor() as cur, cur.copy(sql) as copy:
        for r in rows:
            values = [r.get(name) for name in COLUMN_NAMES]
            if values[_EXTRA_AT] is not None:
                values[_EXTRA_AT] = json.dumps(values[_EXTRA_AT])
            copy.write_row(values)


@contextlib.contextmanager
def _as_dbapi_error(statement: str):
    """Driver errors from the raw (Arrow/COPY) paths as the SQLAlchemy exceptions the ORM path
    raises (IntegrityError for a unique violation, …), so Database.session() maps them alike."""
    try:
        yield
    except sa.exc.DBAPIError:
        raise
    except Exception as exc:
        if type(exc).__module__.split(".")[0] not in ("duckdb", "_duckdb", "psycopg"):
            raise
        base = Exception
        for candidate in type(exc).__mro__:
            if candidate.__name__ == "Error" and candidate.__module__.split(".")[0] in ("duckdb", "_duckdb", "psycopg"):
                base = candidate
                break
        raise sa.exc.DBAPIError.instance(statement, None, exc, base) from exc


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
    "error_class", "fingerprint", "run_key",
)
#: columns accepted by `sort` (prefix '-' for descending)
SORT_COLUMNS = ("id", "started_at", "ingested_at", "nodes", "model_params", "tokens_per_sec_per_gpu", "mfu",
                "mfu_derived", "tflops_per_gpu", "peak_memory_gib", "step_time_s", "world_size")


def list_runs(session: Session, filters: dict[str, Any], *, sort: str = "id", limit: int = 100,
              cursor: str | None = None, started_after: datetime | None = None,
              started_before: datetime | None = None, name_prefix: str | None = None
              ) -> tuple[list[Run], str | None, int]:
    """A page of runs matching equality `filters`, keyset-paginated on (sort column, id).

    Returns (runs, next_cursor or None, total matching). NULLs sort last. Raises BadRequest for
    an unknown filter/sort column or a malformed cursor.
    """
    conds = []
    for name, value in filters.items():
        if value is None:
            continue
        if name not in FILTER_COLUMNS:
            raise BadRequest(f"cannot filter on '{name}'", [{"field": name, "value": value, "message": "unknown filter"}])
        conds.append(getattr(Run, name) == value)
    if name_prefix:  # LIKE with % and _ escaped: a literal prefix
        conds.append(Run.name.startswith(name_prefix, autoescape=True))
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
