"""Parser for nanotron benchmark CSVs: the Ultra-Scale Playbook sweep format and nanotron's own
bench columns (``nanotron/trainer.py`` ``create_table_log``). Standard library only.

Input: a CSV with at least the columns ``dp``, ``tp``, ``pp``; usually also ``job_id``, ``name``,
``nodes``, ``seq_len``, ``mbs``, ``batch_accum``, ``gbs``, ``mTFLOPs``, ``hTFLOPs``, ``tok/s/gpu``,
``Mem Alloc (GB)``, ``Mem Res (GB)``, model dims, ``dtype``, ``zero_stage``, and — in the
playbook's post-processed sweep file — ``date``, ``status``, ``oom_error``, ``mfu``, ``log_file``.
Optional newer columns ``cp``, ``ep``, ``recompute_layer`` are read when present.

Output: one run record per row (``source="nanotron-csv"``), units:
- tokens_per_sec_per_gpu: tokens/s per GPU (``tok/s/gpu``); tflops_per_gpu: model TFLOP/s per GPU
  (``mTFLOPs``; the hardware figure ``hTFLOPs`` goes to extra);
- mfu: fraction in [0, 1] (the ``mfu`` column is a percentage);
- peak_memory_gib / reserved_memory_gib: GiB — nanotron writes ``max_memory_allocated() / 1024**3``
  under the header "Mem Alloc (GB)", so the numbers already are GiB;
- global_batch_tokens: dp·mbs·batch_accum·seq_len. The playbook file's ``gbs`` is in *samples* on
  successful rows and in *tokens* on failed rows (DESIGN §8), so it is only checked against the
  product (``extra.gbs_unit`` says which it matched; ``extra.gbs_mismatch`` when neither);
- model_params: from the run-name prefix (``1.34G_dp8_...`` -> 1,340,000,000), because
  ``Total Params`` over-counts for PP > 1 (tied embeddings are counted on two stages).
- status: Success -> success, OOM -> oom (error_class oom_gpu), Other -> failed. Files without a
  ``status`` column (nanotron only writes a row after a measured step) get success when a
  throughput is present, else failed, and ``extra.status_inferred``.

What the file does not say is never guessed:

- gpu_type: a nanotron bench CSV has no hardware column, so the caller states it (``gpu_type=``,
  ``scalebook import nanotron --gpu-type``; :data:`PLAYBOOK_GPU_TYPE` for the Ultra-Scale Playbook
  sweep, which ran on H100 SXM): without it the file is refused (ValueError, nothing stored).
- precision: from ``dtype``; a row that leaves it empty (the sweep's failed rows) gets the caller's
  ``precision=`` (``--precision``) or none (NULL: no MFU against a guessed peak).
- framework "nanotron" (the file's format), model_name "nanotron-<size>" from the name prefix,
  gpus_per_node = world_size / nodes when that divides (derived). Other defaults only fill fields the
  file leaves empty.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from core.hardware import canonical_precision
from core.record import scale_count
from ingest.parsers.common import (
    ParseResult,
    RowError,
    apply_defaults,
    canonical_recompute,
    canonical_status,
    cell_error,
    extra_key,
    finish_record,
    parse_bool,
    parse_decimal,
    parse_float,
    parse_int,
    parse_param_cell,
    parse_percent,
    parse_rows,
    row_digest,
)

SOURCE = "nanotron-csv"
#: the hardware of the Ultra-Scale Playbook sweep (H100 SXM 80 GB; the playbook's "Benchmarking
#: thousands of configurations" section), for callers that import that sweep's files
PLAYBOOK_GPU_TYPE = "H100-SXM-80GB"
FRAMEWORK = "nanotron"
REQUIRED_COLUMNS = ("dp", "tp", "pp")

#: integer columns -> run-record field
_INT_FIELDS = {
    "seq_len": "seq_len",
    "mbs": "micro_batch_size",
    "batch_accum": "grad_accum_steps",
    "dp": "dp",
    "tp": "tp",
    "pp": "pp",
    "cp": "cp",
    "ep": "ep",
    "zero_stage": "zero_stage",
    "hidden_size": "hidden_size",
    "num_layers": "num_layers",
    "num_heads": "num_heads",
    "num_kv_heads": "num_kv_heads",
    "vocab_size": "vocab_size",
}
#: float columns -> run-record field
_FLOAT_FIELDS = {
    "tok/s/gpu": "tokens_per_sec_per_gpu",
    "mTFLOPs": "tflops_per_gpu",
    "Mem Alloc (GB)": "peak_memory_gib",
    "Mem Res (GB)": "reserved_memory_gib",
}
#: numeric columns kept in extra (plus every column whose name ends in "(GB/s)")
_EXTRA_NUMBERS = ("hTFLOPs", "ddp_bucket_cap_mb", "max_pos", "Total Params Numeric", "num_params")
_EXTRA_INTS = ("ddp_bucket_cap_mb", "max_pos")
#: True/False columns kept in extra (an unreadable value is kept as its string)
_EXTRA_BOOLS = ("tp_async_comm", "accumulate_grad_in_fp32", "tie_word_embeddings", "after_pp_fix",
                "oom_error")
#: columns consumed by the code below (everything else goes to extra as a string)
_SPECIAL = frozenset({"job_id", "name", "nodes", "gbs", "mfu", "dtype", "date", "status",
                      "recompute_layer"})

_PREFIX_RE = re.compile(r"^(\d+(?:\.\d+)?)([KMGTB])(?=_|$)", re.IGNORECASE)
_NAME_TOKEN_RE = re.compile(r"(?:^|_)(dp|tp|pp|cp|ep|acc|mbs|seq|zero)(\d+)(?=_|$)")
_NAME_TOKEN_FIELDS = {"dp": "dp", "tp": "tp", "pp": "pp", "cp": "cp", "ep": "ep",
                      "acc": "grad_accum_steps", "mbs": "micro_batch_size", "seq": "seq_len",
                      "zero": "zero_stage"}
_JOB_SAFE_RE = re.compile(r"[^A-Za-z0-9_.-]+")


#: text columns of nanotron's bench CSV kept in extra as they are
_EXTRA_TEXT = ("pp_engine", "tp_mode", "hidden_act", "Total Params", "Local Params", "log_file")


def known_column(column: str) -> bool:
    """A column this parser understands (mapped to a field, or one of nanotron's extra columns)."""
    return (column in _INT_FIELDS or column in _FLOAT_FIELDS or column in _SPECIAL or column in _EXTRA_NUMBERS
            or column in _EXTRA_BOOLS or column in _EXTRA_TEXT or column.endswith("(GB/s)"))


def parse_file(path: str | os.PathLike, *, extra_columns: bool = False, column_map: Mapping[str, str] | None = None,
               **defaults: Any) -> ParseResult:
    """Parse a nanotron bench CSV into run records and rejects.

    ``defaults``: run-record fields from the CLI (e.g. ``gpu_type="H100-SXM-80GB"``,
    ``gpus_per_node=8``); see the module docstring for which parser assumptions they replace.
    Run-record names of the mapped columns are accepted too (``tokens_per_sec_per_gpu`` for
    ``tok/s/gpu``, ``micro_batch_size`` for ``mbs``, ...).
    A column this parser does not know (:func:`known_column`) is refused unless ``extra_columns``
    (kept in extra) or renamed by ``column_map`` (``--map``). Raises ValueError for bad defaults,
    unknown columns or a header without the dp/tp/pp columns (not a nanotron bench file), and when
    ``gpu_type`` is not given (the file does not say which GPU it ran on); every data row otherwise
    ends up in exactly one of records / rejects.
    """
    aliases = {fld: col for col, fld in {**_INT_FIELDS, **_FLOAT_FIELDS}.items() if fld != col}
    vocabulary = [*_INT_FIELDS, *_FLOAT_FIELDS, *_SPECIAL, *_EXTRA_NUMBERS, *_EXTRA_BOOLS, *_EXTRA_TEXT, *aliases]
    result = parse_rows(path, defaults, required=REQUIRED_COLUMNS, layout="nanotron bench CSV",
                        parse_row=parse_row, key_for=_run_key, known=known_column, vocabulary=vocabulary,
                        extra_columns=extra_columns, column_map=column_map, aliases=aliases)
    if not defaults.get("gpu_type") and (result.records or result.rejects):  # the layout was checked first
        raise ValueError("gpu_type: a nanotron bench CSV does not say which GPU it ran on; state it "
                         f"(--gpu-type; {PLAYBOOK_GPU_TYPE} for the Ultra-Scale Playbook sweep)")
    return result


def _run_key(cells: Mapping[str, str]) -> str:
    """nanotron-csv:<job_id>:<row digest> (job ids repeat across reruns; the digest tells them apart)."""
    job = _JOB_SAFE_RE.sub("_", cells.get("job_id", "")).strip("_")[:64] or "nojob"
    return f"{SOURCE}:{job}:{row_digest(cells)[:12]}"


def parse_row(cells: Mapping[str, str], defaults: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Convert one row (column -> string) into a run record (without run_key).

    Raises RowError naming the column and value when a cell cannot be read or dp/tp/pp is empty.
    """
    defaults = defaults or {}
    rec: dict[str, Any] = {"source": SOURCE, "name": cells.get("name") or None}
    extra: dict[str, Any] = {}

    for col, fld in _INT_FIELDS.items():
        if col in cells:
            rec[fld] = parse_int(col, cells[col])
    for col, fld in _FLOAT_FIELDS.items():
        if col in cells:
            rec[fld] = parse_float(col, cells[col])
    for dim in REQUIRED_COLUMNS:
        if rec.get(dim) is None:
            raise RowError(f"column {dim!r}: empty; the parallel layout (dp, tp, pp) is required")
    if cells.get("mfu"):
        rec["mfu"], _approx = parse_percent("mfu", cells["mfu"]) or (None, False)

    _topology(cells, rec, extra, defaults)
    _global_batch(cells, rec, extra)
    _model(cells, rec, extra, defaults)
    _status(cells, rec, extra)
    _extras(cells, extra)

    rec["framework"] = defaults.get("framework", FRAMEWORK)
    rec["gpu_type"] = defaults.get("gpu_type")
    rec["precision"] = canonical_precision(cells.get("dtype")) or canonical_precision(defaults.get("precision"))
    rec["recompute"] = canonical_recompute("recompute_layer", cells.get("recompute_layer"))
    if cells.get("hidden_act"):
        # the bench's model config (hidden_act is its LlamaConfig's): nanotron's Llama MLP is gated,
        # gate_up_proj then down_proj (src/nanotron/models/llama.py, class MLP), whatever the activation
        rec["gated_linear_unit"] = True
    if cells.get("date"):
        try:
            rec["started_at"] = datetime.fromisoformat(cells["date"]).isoformat()
        except ValueError:
            raise cell_error("date", cells["date"], "is not a date/time") from None
    if cells.get("job_id"):
        extra["job_id"] = cells["job_id"]

    apply_defaults(rec, defaults)
    return finish_record(rec, extra)


def _topology(cells: Mapping[str, str], rec: dict, extra: dict, defaults: Mapping) -> None:
    """world_size = dp·tp·pp·cp; nodes from the column ('1.0' -> 1); gpus_per_node = world/nodes
    when it divides (a gpus_per_node default wins; nodes is then derived from it if missing)."""
    world = rec["dp"] * rec["tp"] * rec["pp"] * (rec.get("cp") or 1)
    rec["world_size"] = world
    nodes = parse_int("nodes", cells.get("nodes"))
    gpn = defaults.get("gpus_per_node")
    if gpn is None and nodes and world % nodes == 0:
        gpn = world // nodes
    if nodes is None and gpn:
        nodes = -(-world // gpn)  # a partial node is still a node
        extra["nodes_derived"] = True
    rec["nodes"], rec["gpus_per_node"] = nodes, gpn


def _global_batch(cells: Mapping[str, str], rec: dict, extra: dict) -> None:
    """global_batch_tokens = dp·mbs·batch_accum·seq_len; ``gbs`` is checked against the sample and
    token counts (it is in samples on successful playbook rows, in tokens on failed ones)."""
    gbs_parsed = parse_decimal("gbs", cells.get("gbs"))
    gbs = None
    if gbs_parsed is not None:
        if gbs_parsed[2] or gbs_parsed[0] != gbs_parsed[0].to_integral_value():
            raise cell_error("gbs", cells["gbs"], "is not a whole number")
        gbs = int(gbs_parsed[0])
        extra["gbs"] = gbs
    parts = [rec.get(f) for f in ("dp", "micro_batch_size", "grad_accum_steps")]
    seq = rec.get("seq_len")
    if all(p is not None for p in parts):
        dp, mbs, gas = (int(p) for p in parts if p is not None)
        samples = dp * mbs * gas
        tokens = samples * seq if seq is not None else None
        if tokens is not None:
            rec["global_batch_tokens"] = tokens
        if gbs is not None:
            if gbs == samples:
                extra["gbs_unit"] = "samples"
            elif tokens is not None and gbs == tokens:
                extra["gbs_unit"] = "tokens"
            else:
                extra["gbs_mismatch"] = f"gbs {gbs} is neither dp*mbs*batch_accum ({samples}) " \
                                        f"nor that times seq_len ({tokens})"
    elif gbs is not None and seq is not None:
        # Fall back on the playbook convention: samples on success, tokens otherwise.
        ok = (cells.get("status") or "").strip().lower() == "success"
        rec["global_batch_tokens"] = gbs * seq if ok else gbs
        extra["global_batch_tokens_from_gbs"] = True


def _model(cells: Mapping[str, str], rec: dict, extra: dict, defaults: Mapping) -> None:
    """model_params / model_name from the run-name prefix; compare the name's dp/tp/... tokens
    with the columns (``extra.name_mismatch`` lists disagreements: the columns are kept)."""
    name = cells.get("name") or ""
    m = _PREFIX_RE.match(name)
    if m:
        rec["model_params"] = model_params_from_name(name)
        suffix = m.group(2).lower()
        unit = "B" if suffix in ("g", "b") else suffix.upper()
        rec["model_name"] = defaults.get("model_name", f"nanotron-{m.group(1)}{unit}")
    elif cells.get("num_params"):
        # The playbook's num_params column is the corrected size in billions (1.34 on every row).
        value = (parse_decimal("num_params", cells["num_params"]) or (0,))[0]
        rec["model_params"] = scale_count(value, "B")
        extra["model_params_from"] = "num_params (billions)"
    elif cells.get("Total Params") and rec["pp"] == 1:
        rec["model_params"] = parse_param_cell("Total Params", cells["Total Params"])
        extra["model_params_from"] = "Total Params"

    mismatch = {}
    for token, value in _NAME_TOKEN_RE.findall(name):
        fld = _NAME_TOKEN_FIELDS[token]
        if rec.get(fld) is not None and rec[fld] != int(value):
            mismatch[fld] = {"name": int(value), "column": rec[fld]}
    if mismatch:
        extra["name_mismatch"] = mismatch


def _status(cells: Mapping[str, str], rec: dict, extra: dict) -> None:
    """status and error_class; see the module docstring."""
    raw = cells.get("status") or ""
    oom_flag = parse_bool_lenient(cells.get("oom_error"))
    if raw:
        status = canonical_status("status", raw)
    else:
        if oom_flag is True:
            status = "oom"
        elif rec.get("tokens_per_sec_per_gpu"):
            status = "success"
        else:
            status = "failed"
        extra["status_inferred"] = True
    rec["status"] = status
    if status == "oom":
        rec["error_class"] = "oom_gpu"
    if raw and raw.lower() not in ("success", "oom"):
        extra["status_reported"] = raw


def parse_bool_lenient(raw: str | None) -> bool | str | None:
    """True/False when readable, the stripped string otherwise, None when empty."""
    try:
        return parse_bool("", raw)
    except RowError:
        return raw.strip() if raw else None


def _extras(cells: Mapping[str, str], extra: dict) -> None:
    """Everything not mapped to a record field: bandwidths and other numbers as numbers,
    flags as booleans, the rest (tp_mode, pp_engine, log_file, Total/Local Params, ...) as text."""
    mapped = set(_INT_FIELDS) | set(_FLOAT_FIELDS) | _SPECIAL
    for col, value in cells.items():
        if not value or col in mapped:
            continue
        if col in _EXTRA_NUMBERS or col.endswith("(GB/s)"):
            number = parse_float(col, value)
            if number is None:
                continue
            whole = col in _EXTRA_INTS and number.is_integer()
            extra[extra_key(col)] = int(number) if whole else number
        elif col in _EXTRA_BOOLS:
            extra[extra_key(col)] = parse_bool_lenient(value)
        else:
            extra[extra_key(col)] = value


def model_params_from_name(name: str) -> int | None:
    """The parameter count in a nanotron run name's prefix: '1.34G_dp8_...' -> 1,340,000,000;
    '469G_...' -> 469e9; '350M_...' -> 350e6. None without a prefix."""
    m = _PREFIX_RE.match(name or "")
    if not m:
        return None
    return scale_count(m.group(1), m.group(2))
