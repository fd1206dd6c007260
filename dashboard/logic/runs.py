"""Run tables, a run's detail grouped by topic, and the side-by-side comparison of 2–4 runs."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import pandas as pd

from core.record import ALL_STATUSES as STATUSES  # noqa: F401 - the one status list (running, lost too)
from dashboard.logic.fmt import config_label, effective_mfu, field_value

Run = Mapping[str, Any]

#: sort choices offered by the Runs page (GET /runs `sort`; '-' = descending)
SORT_CHOICES = {
    "-id": "newest first",
    "id": "oldest first",
    "-tokens_per_sec_per_gpu": "tokens/s per GPU, high → low",
    "-mfu_derived": "MFU (derived), high → low",
    "-mfu": "MFU (reported), high → low",
    "peak_memory_gib": "peak memory, low → high",
    "-peak_memory_gib": "peak memory, high → low",
    "nodes": "nodes, few → many",
    "-nodes": "nodes, many → few",
    "-started_at": "started, latest first",
    "step_time_s": "step time, fast → slow",
}

#: the columns of the runs table, in order
TABLE_COLUMNS = ["id", "started_at", "model_name", "size_B", "nodes", "gpu_type", "config", "status", "retired",
                 "tokens_per_sec_per_gpu", "mfu", "peak_memory_gib", "seq_len", "global_batch_tokens",
                 "framework", "error_class", "source"]

#: the fields of a run, grouped for the detail view and the comparison (same names as the API)
SECTIONS: dict[str, tuple[str, ...]] = {
    "model": ("model_name", "model_params", "model_size_class", "num_layers", "hidden_size", "num_heads",
              "num_kv_heads", "ffn_hidden_size", "vocab_size", "seq_len"),
    "hardware": ("gpu_type", "nodes", "gpus_per_node", "world_size"),
    "parallelism": ("dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size", "grad_accum_steps",
                    "global_batch_tokens", "recompute", "precision"),
    "results": ("status", "tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu", "mfu_derived", "mfu_method",
                "hfu", "hfu_derived", "peak_tflops", "peak_memory_gib", "reserved_memory_gib", "step_time_s",
                "error_class", "error_message"),
    "software": ("framework", "framework_version", "torch_version", "cuda_version", "nccl_version"),
    "provenance": ("id", "run_key", "name", "source", "started_at", "ingested_at", "fingerprint", "retired_at",
                   "retired_reason"),
}


def runs_table(runs: Sequence[Run]) -> pd.DataFrame:
    """The runs as a table with the columns a user scans first (MFU = derived, else reported)."""
    rows = [{
        "id": r.get("id"), "started_at": r.get("started_at"), "model_name": r.get("model_name"),
        "size_B": r.get("model_size_class"), "nodes": r.get("nodes"), "gpu_type": r.get("gpu_type"),
        "config": config_label(r), "status": r.get("status"), "retired": retired_text(r),
        "tokens_per_sec_per_gpu": r.get("tokens_per_sec_per_gpu"), "mfu": effective_mfu(r),
        "peak_memory_gib": r.get("peak_memory_gib"), "seq_len": r.get("seq_len"),
        "global_batch_tokens": r.get("global_batch_tokens"), "framework": r.get("framework"),
        "error_class": r.get("error_class"), "source": r.get("source"),
    } for r in runs]
    return pd.DataFrame(rows, columns=TABLE_COLUMNS)


MISSING = "—"


def retired_text(run: Run) -> str | None:
    """"retired: <reason>" for a retired run (left out of every analytic), None otherwise."""
    if not run.get("retired_at"):
        return None
    return f"retired: {run.get('retired_reason') or 'no reason given'}"


#: the Runs page's choice of retired runs → GET /runs `retired`
RETIRED_CHOICES = {"shown": None, "hidden": False, "only": True}

#: display formats of the runs table's numeric columns (missing values show as MISSING)
TABLE_FORMATS: dict[str, Any] = {
    "id": "{:.0f}", "size_B": "{:g}", "nodes": "{:,.0f}", "tokens_per_sec_per_gpu": "{:,.0f}", "mfu": "{:.1%}",
    "peak_memory_gib": "{:.1f}", "seq_len": "{:,.0f}", "global_batch_tokens": "{:,.0f}",
}


def styled(frame: pd.DataFrame, formats: Mapping[str, Any] | None = None) -> pd.DataFrame:
    """The table as display text for st.dataframe: ``formats`` per column (format strings or
    callables), every missing value shown as "—" (Streamlit would write "None"; a Styler's
    ``na_rep`` is not honoured for nulls)."""
    fmts = {c: f for c, f in (formats or TABLE_FORMATS).items() if c in frame.columns}
    out = pd.DataFrame(index=frame.index)
    for col in frame.columns:
        fmt = fmts.get(col)
        out[col] = [MISSING if _missing(v) else (fmt(v) if callable(fmt) else fmt.format(v) if fmt else str(v))
                    for v in frame[col]]
    return out


def _missing(value: Any) -> bool:
    if value is None or value == "":
        return True
    try:
        return bool(pd.isna(value))
    except (TypeError, ValueError):
        return False


def runs_csv(runs: Sequence[Run]) -> str:
    """Every field of the runs as CSV (``extra`` as a JSON string), in the API's field names."""
    if not runs:
        return ""
    columns: list[str] = []
    for r in runs:
        columns.extend(k for k in r if k not in columns)
    frame = pd.DataFrame([{k: (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v)
                           for k, v in r.items()} for r in runs], columns=columns)
    return frame.to_csv(index=False)


#: how the detail view shows a parallelism degree the run does not state (NULL)
UNKNOWN_DEGREE = "? (not stated)"


def detail_sections(run: Run) -> dict[str, pd.DataFrame]:
    """A run's fields as one small (field, value) table per section; unset fields left out, except
    the parallelism degrees dp/tp/pp/cp: an unknown one shows as "? (not stated)", never as 1.
    ``extra`` comes last, flattened one level."""
    out: dict[str, pd.DataFrame] = {}
    for section, fields in SECTIONS.items():
        rows = [(f, field_value(f, run.get(f)) if run.get(f) is not None else UNKNOWN_DEGREE) for f in fields
                if run.get(f) is not None or f in ("dp", "tp", "pp", "cp")]
        if rows:
            out[section] = pd.DataFrame(rows, columns=["field", "value"])
    extra = run.get("extra")
    if isinstance(extra, dict) and extra:
        out["extra"] = pd.DataFrame([(k, field_value(k, v)) for k, v in sorted(extra.items())],
                                    columns=["field", "value"])
    return out


def _same(values: Iterable[Any]) -> bool:
    vals = [None if v == "" else v for v in values]
    first = vals[0]
    for v in vals[1:]:
        if isinstance(first, float) or isinstance(v, float):
            if first is None or v is None or abs(float(first) - float(v)) > 1e-9 * max(1.0, abs(float(first))):
                return False
        elif v != first:
            return False
    return True


def compare_runs(runs: Sequence[Run], only_differences: bool = False) -> tuple[pd.DataFrame, list[str]]:
    """Runs side by side: one row per field (grouped by section, then ``extra.*``), one column per
    run ("#12"). Returns the table and the fields whose values differ between the runs."""
    fields = [f for fields in SECTIONS.values() for f in fields]
    extras = sorted({k for r in runs if isinstance(r.get("extra"), dict) for k in r["extra"]})

    def value(run: Run, name: str) -> Any:
        if name.startswith("extra."):
            extra = run.get("extra") if isinstance(run.get("extra"), dict) else {}
            v = extra.get(name[len("extra."):])
        else:
            v = run.get(name)
        return json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v

    names = [f for f in fields if any(r.get(f) is not None for r in runs)] + [f"extra.{k}" for k in extras]
    names = [n for n in names if n not in ("id",)]
    table = {n: [value(r, n) for r in runs] for n in names}
    differing = [n for n, vals in table.items() if not _same(vals)]
    shown = differing if only_differences else names
    columns = [f"#{r.get('id')}" for r in runs]
    frame = pd.DataFrame([[_cell(n, v) for v in table[n]] for n in shown], index=pd.Index(shown, name="field"),
                         columns=columns)
    return frame, differing


def _cell(name: str, value: Any) -> str:
    """A compared value, formatted by its field (``extra.allreduce_gb_s`` as allreduce_gb_s)."""
    return MISSING if value is None else field_value(name.removeprefix("extra."), value)


DIFF_STYLE = "background-color: #fff3b0; font-weight: 600"


def style_differences(frame: pd.DataFrame, differing: Sequence[str]):
    """A pandas Styler that highlights the rows of ``differing`` fields (for st.dataframe)."""
    marked = set(differing)
    return frame.style.apply(lambda row: [DIFF_STYLE if row.name in marked else "" for _ in row], axis=1)


def diff_markdown(frame: pd.DataFrame, differing: Sequence[str]) -> str:
    """The comparison as a markdown table with differing rows in bold (for text-only views)."""
    marked = set(differing)
    head = "| field | " + " | ".join(frame.columns) + " |\n|---|" + "---|" * len(frame.columns) + "\n"
    body = []
    for name, row in frame.iterrows():
        cells = [str(v).replace("|", "\\|") for v in row]
        if name in marked:
            body.append(f"| **{name}** | " + " | ".join(f"**{c}**" if c and c != MISSING else c for c in cells) + " |")
        else:
            body.append(f"| {name} | " + " | ".join(cells) + " |")
    return head + "\n".join(body)


def parse_ids(text: str) -> list[int]:
    """"12, 15 #20" -> [12, 15, 20] (order kept, duplicates dropped, junk ignored)."""
    out: list[int] = []
    for token in text.replace(",", " ").replace("#", " ").split():
        if token.isdigit() and int(token) not in out:
            out.append(int(token))
    return out
