"""Shared pieces of the CSV parsers: result types, CSV reading, value parsing, run keys, defaults.

Standard library only (DESIGN §1: `ingest/` must import without third-party packages).

Conventions used by every parser
- A parser turns one CSV file into a :class:`ParseResult`: one run-record dict per data row that
  could be parsed, one :class:`Reject` per row that could not. ``len(records) + len(rejects)``
  always equals the number of data rows (blank lines are not rows; a row of empty cells is).
- Record dicts use only the keys of :data:`core.record.REPORTED_FIELDS`; unknown values are left
  out; anything else worth keeping goes under ``"extra"`` (a JSON-serialisable dict).
- A cell that cannot be read (``'12x'`` in a number column) rejects the whole row with a reason
  that names the column and the value, e.g. ``column 'tok/s/gpu': '12x' is not a number``.
"""

from __future__ import annotations

import csv
import difflib
import hashlib
import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from core.record import (
    COUNT_SUFFIXES,
    RECOMPUTE,
    REPORTED_FIELDS,
    STATUSES,
    parse_param_count,
    parse_tags,
    scale_count,
)
from core.record import parse_bool as bool_value

__all__ = [
    "ParseResult",
    "Reject",
    "RowError",
    "RawRow",
    "read_rows",
    "parse_decimal",
    "parse_float",
    "parse_int",
    "parse_percent",
    "parse_size",
    "parse_param_cell",
    "parse_bool",
    "find_size_token",
    "canonical_recompute",
    "canonical_status",
    "extra_key",
    "row_digest",
    "RunKeys",
    "coerce_defaults",
    "apply_defaults",
    "finish_record",
]


# --------------------------------------------------------------------------------------------
# Result types


@dataclass(frozen=True)
class Reject:
    """A data row that could not become a run.

    line_no: 1-based physical line in the file where the row starts (the header is line 1);
    row: the raw cells as read, column name -> string; reason: what was wrong, naming the
    column and the value.
    """

    line_no: int
    row: dict[str, str]
    reason: str


@dataclass
class ParseResult:
    """What a parser returns: ``records`` (run-record dicts), ``lines`` (the 1-based line in the
    file where each record's row starts, parallel to ``records``) and ``rejects`` (:class:`Reject`)."""

    records: list[dict[str, Any]] = field(default_factory=list)
    rejects: list[Reject] = field(default_factory=list)
    lines: list[int] = field(default_factory=list)


class RowError(ValueError):
    """Raised while converting one row; the parser turns it into a :class:`Reject`."""


def cell_error(column: str, raw: str | None, what: str) -> RowError:
    """The standard reject reason: ``column 'tp': 'two' is not an integer``."""
    return RowError(f"column {column!r}: {raw!r} {what}")


# --------------------------------------------------------------------------------------------
# Reading


@dataclass(frozen=True)
class RawRow:
    """One data row: ``line_no`` (1-based start line), ``cells`` (column -> stripped string;
    missing trailing cells read as ""), and ``problem`` (a reject reason when the row's shape is
    wrong, e.g. more cells than the header has columns; None otherwise)."""

    line_no: int
    cells: dict[str, str]
    problem: str | None = None


def read_rows(path: str | os.PathLike) -> tuple[list[str], list[RawRow]]:
    """Read a CSV file (UTF-8, optional BOM) into its header and its data rows.

    Column names and cells are whitespace-stripped. Blank lines are skipped (they are not data
    rows). A row with more cells than the header is returned with ``problem`` set; a row with
    fewer cells is padded with "" (spreadsheets drop trailing empty cells). An empty file gives
    ``([], [])``.
    """
    with open(path, newline="", encoding="utf-8-sig") as fh:
        reader = csv.reader(fh)
        header: list[str] | None = None
        rows: list[RawRow] = []
        prev_end = 0
        for cells in reader:
            start = prev_end + 1
            prev_end = reader.line_num
            if not cells:  # blank line
                continue
            if header is None:
                header = [c.strip() for c in cells]
                continue
            values = [c.strip() for c in cells]
            problem = None
            if len(values) > len(header):
                surplus = [v for v in values[len(header):] if v]
                if surplus:
                    problem = (f"row has {len(values)} cells but the header has {len(header)} "
                               f"columns (surplus {surplus!r})")
                values = values[: len(header)]
            values += [""] * (len(header) - len(values))
            row = dict(zip(header, values))
            if problem is None and not any(values):
                problem = "row has no values"
            rows.append(RawRow(start, row, problem))
    return (header or []), rows


# --------------------------------------------------------------------------------------------
# Values

_NUMBER_RE = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_THOUSANDS_RE = re.compile(r"[+-]?\d{1,3}(?:,\d{3})+(?:\.\d+)?")


def _clean_number(column: str, raw: str) -> tuple[str, bool, bool]:
    """Strip a leading '~'/'≈' (approximate) and a trailing '%' and thousands separators.

    Returns (numeric text, approximate, had_percent_sign)."""
    s = raw.strip()
    approx = False
    if s[:1] in ("~", "≈"):
        approx, s = True, s[1:].strip()
    pct = s.endswith("%")
    if pct:
        s = s[:-1].strip()
    if _THOUSANDS_RE.fullmatch(s):
        s = s.replace(",", "")
    if not _NUMBER_RE.fullmatch(s):
        raise cell_error(column, raw, "is not a number")
    return s, approx, pct


def parse_decimal(column: str, raw: str | None) -> tuple[Decimal, bool, bool] | None:
    """Parse a published number exactly: '5,762', '41%', '~50%', '3.28e+02', '16.0'.

    Returns (value, approximate, had_percent_sign), or None for an empty cell.
    Raises RowError naming the column and value for anything else (including nan/inf)."""
    if raw is None or not raw.strip():
        return None
    s, approx, pct = _clean_number(column, raw)
    try:
        value = Decimal(s)
    except InvalidOperation:  # pragma: no cover - the regex already guarantees a number
        raise cell_error(column, raw, "is not a number") from None
    if not value.is_finite():  # pragma: no cover - the regex excludes nan/inf
        raise cell_error(column, raw, "is not finite")
    return value, approx, pct


def parse_float(column: str, raw: str | None) -> float | None:
    """A plain float ('5,762' -> 5762.0, '3.28e+02' -> 328.0); None when empty.

    A '%' sign is refused here (use :func:`parse_percent` for percent columns)."""
    parsed = parse_decimal(column, raw)
    if parsed is None:
        return None
    value, _approx, pct = parsed
    if pct:
        raise cell_error(column, raw, "is a percentage where a plain number is expected")
    out = float(value)
    if not math.isfinite(out):
        raise cell_error(column, raw, "is out of range")
    return out


def parse_int(column: str, raw: str | None) -> int | None:
    """An integer ('8', '1.0', '1,024' -> 1024); None when empty. '16.5' is refused."""
    parsed = parse_decimal(column, raw)
    if parsed is None:
        return None
    value, approx, pct = parsed
    if pct or approx or value != value.to_integral_value():
        raise cell_error(column, raw, "is not an integer")
    return int(value)


def parse_percent(column: str, raw: str | None) -> tuple[float, bool] | None:
    """A percentage cell as a fraction: '41%' -> 0.41, '41.25' -> 0.4125, '~50%' -> 0.5.

    The column is a percent column whether or not the cell carries a '%' sign. Returns
    (fraction, approximate) or None when empty. The fraction is computed in decimal so that
    '41' gives exactly the float 0.41."""
    parsed = parse_decimal(column, raw)
    if parsed is None:
        return None
    value, approx, _pct = parsed
    return float(value / 100), approx


_SIZE_RE = re.compile(r"([0-9][0-9,]*(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?)\s*([kKmMgGbBtT]?)")
_BINARY_UNITS = {"": 1, "k": 2**10, "m": 2**20, "g": 2**30, "b": 2**30, "t": 2**40}


def parse_param_cell(column: str, raw: str | None) -> int | None:
    """A parameter-count cell ('1.7B', '405B', '1.34G', '760m', '64862437376'; a bare number below
    10,000 is billions) by core.record.parse_param_count, the parser the API and the CLI use. None
    when empty; RowError naming the column and the value otherwise."""
    if raw is None or not raw.strip():
        return None
    try:
        return parse_param_count(raw)
    except ValueError as exc:
        raise cell_error(column, raw, f"is not a parameter count ({exc})") from None


def parse_size(column: str, raw: str | None, *, binary: bool = False) -> tuple[int, str] | None:
    """A count with an optional magnitude suffix: '16M', '4M', '1T', '1048576' -> (count, suffix).
    None when empty. (Parameter counts: parse_param_cell.)

    Suffixes K/M/G(=B)/T are decimal (core.record.COUNT_SUFFIXES); ``binary=True`` reads them as
    powers of two (K=2^10, M=2^20, ...) for token batch sizes ('16M' tokens -> 16,777,216).
    Raises RowError for anything else or for a count that is not a whole number."""
    if raw is None or not raw.strip():
        return None
    m = _SIZE_RE.fullmatch(raw.strip())
    if not m:
        raise cell_error(column, raw, "is not a count (expected e.g. '1.7B', '405B', '16M' or digits)")
    digits, suffix = m.group(1), m.group(2).lower()
    if "," in digits:
        if not _THOUSANDS_RE.fullmatch(digits):
            raise cell_error(column, raw, "is not a count")
        digits = digits.replace(",", "")
    value = Decimal(digits) * (_BINARY_UNITS[suffix] if binary else COUNT_SUFFIXES[suffix.upper()])
    if value != value.to_integral_value() or value < 0:
        raise cell_error(column, raw, "is not a whole count")
    return int(value), suffix


_SIZE_TOKEN_RE = re.compile(r"(?<![A-Za-z0-9.])(\d+(?:\.\d+)?)([MmBbTt])(?![A-Za-z0-9])")


def find_size_token(text: str) -> int | None:
    """The first parameter-count token in a model name: 'LLAMA3-8B' -> 8e9, 'GPT OSS 120B' ->
    120e9, 'Qwen3_30B_a3B' -> 30e9 (the total; 'a3B', the active count, is glued to a letter),
    'MPT-760m' -> 760e6, 'GPT 1T' -> 1e12. None when the name has no such token ('DeepSeekV3')."""
    m = _SIZE_TOKEN_RE.search(text or "")
    if not m:
        return None
    return scale_count(m.group(1), m.group(2))


def parse_bool(column: str, raw: str | None) -> bool | None:
    """A cell as a bool (core.record.parse_bool's words: True/False, yes/no, 1/0, on/off, any case);
    None when empty; RowError naming the column and value otherwise."""
    if raw is None or not raw.strip():
        return None
    try:
        return bool_value(column, raw)
    except ValueError:
        raise cell_error(column, raw, "is not True/False") from None


# --------------------------------------------------------------------------------------------
# Vocabulary


def canonical_recompute(column: str, raw: str | None) -> str | None:
    """Activation checkpointing as one of :data:`RECOMPUTE`.

    'True', 'full', 'recompute_layer: true' -> 'full'; 'selective', 'selective (per op)',
    'selective layer' -> 'selective'; 'False', 'False (recompute_layer: false)', 'no', 'none' ->
    'none'. None when empty; RowError for anything else."""
    if raw is None or not raw.strip():
        return None
    s = raw.strip().lower()
    if "recompute_layer: true" in s or s.startswith(("true", "full", "yes")) or s == "1":
        return "full"
    if s.startswith("selective") or s == "sac":
        return "selective"
    if "recompute_layer: false" in s or s.startswith(("false", "no")) or s == "0":
        return "none"
    raise cell_error(column, raw, f"is not a recompute setting (expected one of {RECOMPUTE})")


_STATUS_WORDS = {
    "success": "success", "succeeded": "success", "ok": "success", "completed": "success",
    "oom": "oom", "out of memory": "oom",
    "other": "failed", "failed": "failed", "fail": "failed", "failure": "failed", "error": "failed",
    "timeout": "timeout", "timed out": "timeout",
    "nccl_error": "nccl_error", "nccl error": "nccl_error",
}


def canonical_status(column: str, raw: str) -> str:
    """'Success' -> 'success', 'OOM' -> 'oom', 'Other'/'Failed' -> 'failed', ... (one of
    :data:`STATUSES`). RowError for an unknown word."""
    s = raw.strip().lower()
    if s in _STATUS_WORDS:
        return _STATUS_WORDS[s]
    raise cell_error(column, raw, f"is not a known status (expected e.g. {STATUSES})")


def extra_key(column: str) -> str:
    """A column name as an ``extra`` key: 'AllReduce (GB/s)' -> 'allreduce_gb_s'."""
    key = re.sub(r"[^0-9a-z]+", "_", column.strip().lower()).strip("_")
    return key or "column"


# --------------------------------------------------------------------------------------------
# Run keys


def row_digest(cells: Mapping[str, str]) -> str:
    """sha256 hex of a row's normalised content: non-empty cells only, names and values stripped,
    sorted by name. Empty cells are left out so that adding an empty column to a file does not
    change its keys."""
    norm = {k.strip(): v.strip() for k, v in cells.items() if k and v and v.strip()}
    blob = json.dumps(norm, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class RunKeys:
    """Hands out run keys, unique within one file and identical for the same file every time.

    Two byte-identical rows in one file get ``key`` and ``key~2`` (by order in the file)."""

    MAX_LEN = 200

    def __init__(self) -> None:
        self._seen: dict[str, int] = {}

    def make(self, base: str) -> str:
        base = base[: self.MAX_LEN - 4]
        n = self._seen.get(base, 0) + 1
        self._seen[base] = n
        return base if n == 1 else f"{base}~{n}"


# --------------------------------------------------------------------------------------------
# Defaults and finishing

#: Fields a caller may not set through defaults.
_NOT_DEFAULTABLE = frozenset({"run_key", "extra", "source"})


def coerce_defaults(defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Validate and type the CLI defaults (``gpu_type="H100-SXM-80GB"``, ``gpus_per_node="8"``).

    Keys must be run-record fields (not run_key/source/extra); values are converted to the
    field's type ('8' -> 8). None values are dropped. Raises ValueError naming the field."""
    out: dict[str, Any] = {}
    for key, value in defaults.items():
        if value is None:
            continue
        if key not in REPORTED_FIELDS or key in _NOT_DEFAULTABLE:
            allowed = sorted(set(REPORTED_FIELDS) - _NOT_DEFAULTABLE)
            raise ValueError(f"unknown default field {key!r}; expected one of {allowed}")
        kind = REPORTED_FIELDS[key]
        try:
            if kind == "i":
                if isinstance(value, bool):
                    raise RowError("bool")
                value = value if isinstance(value, int) else parse_int(key, str(value))
                if value is None:
                    raise RowError("empty")
            elif kind == "f":
                value = float(value) if isinstance(value, (int, float)) else parse_float(key, str(value))
                if value is None or not math.isfinite(value):
                    raise RowError("not finite")
            elif kind == "b":
                value = bool_value(key, value)
            elif kind == "l":
                value = parse_tags(value)
            else:
                value = str(value).strip()
        except (RowError, TypeError, ValueError):
            kind_name = {"i": "an integer", "f": "a number", "b": "true or false", "l": "a list of tags"}[kind]
            raise ValueError(f"default {key}={value!r} is not {kind_name}") from None
        if key == "status" and value not in STATUSES:
            raise ValueError(f"default status={value!r} is not one of {STATUSES}")
        if key == "recompute" and value not in RECOMPUTE:
            raise ValueError(f"default recompute={value!r} is not one of {RECOMPUTE}")
        out[key] = value
    return out


def apply_defaults(record: dict[str, Any], defaults: Mapping[str, Any]) -> None:
    """Fill the fields the record lacks (None or absent) from ``defaults``, in place."""
    for key, value in defaults.items():
        if record.get(key) is None:
            record[key] = value


def finish_record(record: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    """Drop None values, attach ``extra`` (when non-empty, None values dropped) and check that
    every key is a run-record field. Returns the record."""
    out = {k: v for k, v in record.items() if v is not None}
    extra = {k: v for k, v in extra.items() if v is not None}
    if extra:
        out["extra"] = dict(sorted(extra.items()))
    unknown = set(out) - set(REPORTED_FIELDS)
    if unknown:  # a programming error in a parser, never a data problem
        raise AssertionError(f"parser produced unknown fields {sorted(unknown)}")
    return out



class UnknownColumns(ValueError):
    """A file has columns the importer does not understand (message names each, with the nearest
    known name)."""


def check_columns(header: Sequence[str], known: Callable[[str], bool], vocabulary: Sequence[str], *,
                  where: str, extra_columns: bool = False) -> None:
    """Refuse columns ``known`` does not accept, unless ``extra_columns`` (they go to ``extra``).

    The message names every unknown column and, where one is close (difflib ratio ≥ 0.6), the
    nearest name of ``vocabulary``: "unknown column 'tokens_per_sec_per_gup' (did you mean
    'tokens_per_sec_per_gpu'?)". Raises :class:`UnknownColumns`."""
    unknown = [c for c in header if c and not known(c)]
    if not unknown or extra_columns:
        return
    parts = []
    for col in unknown:
        near = difflib.get_close_matches(col, list(vocabulary), n=1, cutoff=0.6)
        parts.append(f"{col!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
    raise UnknownColumns(f"{where}: unknown column(s) {', '.join(parts)}; rename them, map them with "
                         "--map FROM=TO, or keep them in extra with --extra-columns")


def rename_columns(header: list[str], rows: list[RawRow], mapping: Mapping[str, str], where: str
                   ) -> tuple[list[str], list[RawRow]]:
    """Apply ``--map FROM=TO`` renames to a header and its rows. ValueError for a FROM the file lacks."""
    if not mapping:
        return header, rows
    absent = [k for k in mapping if k not in header]
    if absent:
        raise ValueError(f"{where}: --map names column(s) {absent} that the file does not have")
    header = [mapping.get(c, c) for c in header]
    rows = [RawRow(r.line_no, {mapping.get(k, k): v for k, v in r.cells.items()}, r.problem) for r in rows]
    return header, rows


def parse_rows(path: str | os.PathLike, defaults: Mapping[str, Any], *, required: Sequence[str], layout: str,
               parse_row: Callable[[Mapping[str, str], Mapping[str, Any]], dict[str, Any]],
               key_for: Callable[[Mapping[str, str]], str],
               known: Callable[[str], bool] | None = None, vocabulary: Sequence[str] = (),
               extra_columns: bool = False, column_map: Mapping[str, str] | None = None,
               aliases: Mapping[str, str] | None = None) -> ParseResult:
    """The loop both CSV parsers share: read `path`, check the layout, turn each data row into a
    record (with `run_key = RunKeys().make(key_for(cells))`) or a Reject naming the problem.

    ``column_map`` renames columns first (``--map``), then ``aliases`` (other accepted spellings of
    the parser's columns, e.g. run-record names) where the file lacks the canonical column; with
    ``known`` every other column must be
    one the parser understands (:func:`check_columns`; ``extra_columns`` keeps them in extra).
    Raises ValueError for bad defaults, a header lacking a `required` column ("not a <layout>"),
    or unknown columns (:class:`UnknownColumns`); otherwise every data row ends up in exactly one
    of records / rejects.
    """
    defaults = coerce_defaults(defaults)
    header, rows = read_rows(path)
    result = ParseResult()
    if not header:
        return result
    header, rows = rename_columns(header, rows, column_map or {}, os.fspath(path))
    spelled = {a: c for a, c in (aliases or {}).items() if a in header and c not in header}
    header, rows = rename_columns(header, rows, spelled, os.fspath(path))
    missing = [c for c in required if c not in header]
    if missing:
        raise ValueError(f"{os.fspath(path)}: not a {layout} (no column(s) {missing})")
    if known is not None:
        check_columns(header, known, vocabulary, where=os.fspath(path), extra_columns=extra_columns)
    keys = RunKeys()
    for raw in rows:
        if raw.problem:
            result.rejects.append(Reject(raw.line_no, raw.cells, raw.problem))
            continue
        try:
            record = parse_row(raw.cells, defaults)
        except RowError as exc:
            result.rejects.append(Reject(raw.line_no, raw.cells, str(exc)))
            continue
        record["run_key"] = keys.make(key_for(raw.cells))
        result.records.append(record)
        result.lines.append(raw.line_no)
    return result
