"""Run records in the run record's own columns (DESIGN §2): what `scalebook sql ... --format csv`
exports, JSONL of run objects, or rows from a Parquet file. Standard library only.

:func:`parse_rows` turns an iterable of ``(line_no, row dict)`` into a :class:`ParseResult`:

- every column must be a run-record field (:data:`core.record.REPORTED_FIELDS`) or one of the
  ``server_columns`` the service computes (id, ingested_at, content_hash, model_size_class,
  mfu_derived, ... -- dropped: the server recomputes them); anything else is an error naming the
  column and the nearest known name, unless ``extra_columns`` (kept in ``extra``) or renamed by
  ``column_map``;
- cells are typed as the field: "" / None -> absent, integers, floats, JSON for ``extra`` (CSV);
- what the server added is taken back out, so an exported run imports as the run that was
  reported: fields named in ``extra.derived_fields`` / ``extra.assumed_fields`` are dropped (the
  server derives them again), and the fields named in ``extra.canonicalised_fields`` get their
  reported names back from ``extra.<field>_reported``.
"""

from __future__ import annotations

import csv
import json
import math
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from core.record import REPORTED_FIELDS, parse_bool, parse_tags
from ingest.parsers.common import ParseResult, Reject, UnknownColumns, check_columns

__all__ = ["as_reported", "iter_csv", "iter_jsonl", "parse_rows"]

_SERVER_EXTRA = ("derived_fields", "assumed_fields", "canonicalised_fields", "dims_source")


def iter_csv(path: str | os.PathLike) -> Iterable[tuple[int, dict[str, Any]]]:
    """(line number, row) for each data row of a CSV file with a header."""
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.DictReader(fh)
        for row in reader:
            yield reader.line_num, {(k or "").strip(): v for k, v in row.items()}


def iter_jsonl(path: str | os.PathLike) -> Iterable[tuple[int, Any]]:
    """(line number, parsed object or the raw line when it is not JSON) for each non-blank line."""
    with open(path, encoding="utf-8") as fh:
        for n, line in enumerate(fh, 1):
            if line.strip():
                try:
                    yield n, json.loads(line)
                except json.JSONDecodeError:
                    yield n, line.rstrip("\n")


def _typed(field: str, value: Any) -> Any:
    """A cell as the field's type; ValueError naming the field and value."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return None
    if isinstance(value, float) and math.isnan(value):  # Parquet/pandas empty cell
        return None
    kind = REPORTED_FIELDS[field]
    try:
        if kind == "i":
            number = float(value) if isinstance(value, str) else value
            if isinstance(number, bool) or float(number) != int(float(number)):
                raise ValueError
            return int(float(number))
        if kind == "f":
            return float(value)
        if kind == "b":
            return parse_bool(field, value)
        if kind == "j":
            return json.loads(value) if isinstance(value, str) else value
        if kind == "l":
            return parse_tags(value)
    except (TypeError, ValueError):
        kind_name = {"i": "an integer", "f": "a number", "b": "true or false", "j": "a JSON object",
                     "l": "a list of strings"}[kind]
        raise ValueError(f"column {field!r}: {value!r} is not {kind_name}") from None
    return str(value) if kind != "t" or isinstance(value, str) else value.isoformat()


def as_reported(record: dict[str, Any], *, keep_step_headline: bool = True) -> dict[str, Any]:
    """`record` (a stored run's reported fields) with what the server added taken back out (module
    docstring): the run as it was reported. Changes and returns `record`.

    A live run's headline derived from its steps (the fields in ``extra.headline_from_steps``) cannot be
    derived again where the steps are not (an import elsewhere): with `keep_step_headline` those values
    stay, still named in ``extra.derived_fields``. The server's own finish of a live run passes False (it
    derives them again from the steps it holds)."""
    extra = record.get("extra")
    if not isinstance(extra, dict):
        return record
    extra = dict(extra)
    from_steps = set((extra.get("headline_from_steps") or {}).get("fields") or []) if keep_step_headline else set()
    for field in list(extra.get("derived_fields") or []) + list(extra.get("assumed_fields") or []):
        if field in from_steps:
            continue
        if field in REPORTED_FIELDS:
            record.pop(field, None)
        elif field.startswith("extra."):  # a key the server set in extra (extra.tie_word_embeddings)
            extra.pop(field[len("extra."):], None)
    for field in extra.get("canonicalised_fields") or []:
        if f"{field}_reported" in extra:
            record[field] = extra.pop(f"{field}_reported")
    for key in _SERVER_EXTRA:
        extra.pop(key, None)
    if from_steps:
        extra["derived_fields"] = sorted(from_steps)
    if extra:
        record["extra"] = extra
    else:
        record.pop("extra", None)
    return record


def parse_rows(rows: Iterable[tuple[int, Any]], *, where: str, server_columns: Sequence[str] = (),
               extra_columns: bool = False, column_map: Mapping[str, str] | None = None) -> ParseResult:
    """Run records from ``(line_no, row)`` pairs (module docstring). A row that is not an object
    or has a cell of the wrong type becomes a :class:`Reject`. Raises :class:`UnknownColumns` for
    columns that are neither run-record fields nor ``server_columns`` (all rows are checked
    before anything is returned: a file is accepted or refused as a whole)."""
    mapping = dict(column_map or {})
    known = set(REPORTED_FIELDS) | set(server_columns)
    result = ParseResult()
    seen: dict[str, None] = {}
    pending: list[tuple[int, dict[str, Any]]] = []
    for line_no, row in rows:
        if not isinstance(row, dict):
            result.rejects.append(Reject(line_no, {"row": str(row)[:500]}, f"line {line_no}: not a JSON object"))
            continue
        row = {mapping.get(k, k): v for k, v in row.items()}
        seen.update(dict.fromkeys(row))
        pending.append((line_no, row))
    check_columns(list(seen), known.__contains__, sorted(known), where=where, extra_columns=extra_columns)
    for line_no, row in pending:
        record: dict[str, Any] = {}
        unknown: dict[str, Any] = {}
        try:
            for key, value in row.items():
                if key in REPORTED_FIELDS:
                    typed = _typed(key, value)
                    if typed is not None:
                        record[key] = typed
                elif key not in known and value not in (None, ""):
                    unknown[key] = value
        except ValueError as exc:
            result.rejects.append(Reject(line_no, {k: str(v) for k, v in row.items()}, str(exc)))
            continue
        if unknown:
            record["extra"] = {**(record.get("extra") or {}), **unknown}
        result.records.append(as_reported(record))
        result.lines.append(line_no)
    return result


__all__ += ["UnknownColumns"]
