"""The runs measured on a target: the heatmap cell a user would look at (DESIGN §4, "What worked?").

"What worked on 8 nodes for an 8B model?" is first answered with what ran there. The cell is:

- the model size: a size given as a round number ("8B", "70B": at most SIZE_DIGITS significant
  figures, the precision of model_size_class) names the heatmap's row, the size FAMILY of
  core/families.py ("8B" → the 7–8B row, which holds 8.03B and 8.86B models); a more precise one
  ("8.03B", 8030261248, "1.34B") names one size class; model dims narrow it further (a run whose
  recorded dims differ from the given ones is left out);
- the same node count, GPU type (catalog name), GPUs per node (a run that does not say matches) and
  sequence length (the slice the heatmap is drawn on);
- the same kind of model, dense or mixture-of-experts (runs.is_moe, core.model.is_moe): the heatmap
  keeps them in rows of their own ("30–34B" and "30–34B MoE (A3B)"), and a target is dense (the
  memory and throughput models cost dense layouts), so Qwen3-30B-A3B's runs do not answer "30B";
- every framework and precision: each run is labelled with its exact model size, framework and
  precision.

Successful, not retired runs, one per distinct configuration (model, framework, precision and
CONFIG_FIELDS; its best run, with how many runs it has), ordered: first those in the precision the
answer is costed in (a bf16 question is not answered by an fp8 throughput), then by how near
their model is to the size asked (|ln ratio|), then by the one best-run rule (service/ranking.py:
the metric, then MFU, then the lower id). Each listed run carries the memory model's verdict
(service/analytics/memory.estimate_memory) for its own configuration: when the model says it does
not fit, the record wins and the answer says that the models disagree.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import Session

from core import hardware
from core.families import family_of
from core.model import model_size_class
from core.rules import CONFIG_FIELDS, best_key
from service.analytics.memory import estimate_memory
from service.db import fetch_select
from service.tables import Run, RunCell

__all__ = ["CONFIG_FIELDS", "DIM_FIELDS", "Cell", "Measured", "config_value", "measured", "names_family"]

#: significant figures of model_size_class: a size asked with no more than these names a family row
SIZE_DIGITS = 2
#: the model's dims a target may give (and a recorded run may record)
DIM_FIELDS = ("num_layers", "hidden_size", "num_heads", "num_kv_heads", "ffn_hidden_size", "vocab_size")

_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+)(?:[eE][+-]?\d+)?\s*[kKmMbBgGtT]?\s*$")


def significant_digits(value: str | int | float) -> int:
    """Significant figures of a size as written: '8B' 1, '70B' 1, '1.3B' 2, '8.03B' 3, '8e9' 1,
    8030261248 10 (trailing zeros of a whole number do not count: 8000000000 → 1)."""
    text = str(value).strip()
    m = _NUMBER.match(text)
    if m is None:
        return 0
    digits = m.group(1).replace(".", "").lstrip("0")
    if "." not in m.group(1):
        digits = digits.rstrip("0")
    return max(1, len(digits))


def names_family(value: str | int | float) -> bool:
    """True when a model size asked as `value` names the heatmap's family row (at most SIZE_DIGITS
    significant figures: "8B", "70B", "1.3B"), False when it names one size class ("8.03B",
    "1.34B", 8030261248)."""
    return significant_digits(value) <= SIZE_DIGITS


@dataclass(frozen=True)
class Cell:
    """The heatmap cell of a target: the size asked (parameters), read as a family or a size class,
    the given model dims (narrowing it), node count, GPUs per node, GPU type (catalog name), seq_len."""

    model_params: int
    family: bool
    nodes: int
    gpus_per_node: int
    gpu_type: str | None
    seq_len: int | None
    dims: dict[str, int | None] = field(default_factory=dict)
    moe: bool = False  # the heatmap's mixture-of-experts row of the size (runs.is_moe); False: the dense row

    def size_text(self) -> str:
        """"the heatmap's 7–8B row" or "size class 8.9B" (how the cell reads the size asked; "… MoE
        row" / "MoE size class …" for the mixture-of-experts runs)."""
        size_b = self.model_params / 1e9
        if self.family:
            return f"the heatmap's {family_of(size_b).label}{' MoE' if self.moe else ''} row"
        return f"{'MoE ' if self.moe else ''}size class {model_size_class(self.model_params):g}B"

    def holds(self, size_class: float | None) -> bool:
        """Whether a run of this size class (billions) is in the cell's size: its family's range
        [lo, hi), or the size class asked."""
        if size_class is None:
            return False
        if self.family:
            fam = family_of(self.model_params / 1e9)
            return fam.lo_b <= size_class < fam.hi_b
        return size_class == model_size_class(self.model_params)

    def size_filter(self, column: Any = Run.model_size_class) -> sa.ColumnElement[bool]:
        """The same condition (holds) on `column` (runs.model_size_class), in SQL."""
        if self.family:
            fam = family_of(self.model_params / 1e9)
            cond = column >= fam.lo_b
            return cond if math.isinf(fam.hi_b) else sa.and_(cond, column < fam.hi_b)
        return column == model_size_class(self.model_params)


@dataclass
class Measured:
    """What ran on the target: `runs` (listed, ordered as the module docstring says), the cell's counts
    (`n_success` runs and `n_configurations` distinct configurations, `n_oom`, `n_failed`), the
    successful runs of the same cell at other sequence lengths ({seq_len: runs}; None = unstated)."""

    runs: list[dict[str, Any]]
    n_success: int = 0
    n_configurations: int = 0
    n_oom: int = 0
    n_failed: int = 0
    other_seq_lens: dict[int | None, int] = field(default_factory=dict)

    def summary(self, cell: Cell) -> dict[str, Any]:
        """The cell as the API shows it."""
        return {"size": cell.size_text(), "nodes": cell.nodes, "gpus_per_node": cell.gpus_per_node,
                "gpu_type": cell.gpu_type, "seq_len": cell.seq_len, "n_success": self.n_success,
                "n_configurations": self.n_configurations, "n_oom": self.n_oom, "n_failed": self.n_failed,
                "success_at_other_seq_len": {("unstated" if k is None else str(k)): v
                                             for k, v in sorted(self.other_seq_lens.items(),
                                                                key=lambda kv: (kv[0] is None, kv[0] or 0))}}


def _conflicts(run: dict[str, Any], dims: dict[str, int | None]) -> bool:
    """A run whose recorded dims differ from the given ones is another model."""
    return any(v is not None and run.get(k) is not None and run[k] != v for k, v in dims.items())


#: how a NULL configuration field of a recorded row is matched against a configuration: ZeRO and
#: recompute have documented defaults (0, none); EP unstated matches EP 1 because the recommender
#: proposes dense layouts only and no model here costs EP. dp/tp/pp/cp have no default: a NULL one
#: matches nothing.
CONFIG_DEFAULTS = {"ep": 1, "zero_stage": 0, "recompute": "none"}


def config_value(row: dict[str, Any], f: str) -> Any:
    """A configuration field of a recorded row for matching, NULL read as CONFIG_DEFAULTS says (dp,
    tp, pp, cp stay None)."""
    v = row.get(f)
    return CONFIG_DEFAULTS.get(f) if v is None else v


def config_values(rows: list[dict[str, Any]], fields: tuple[str, ...]) -> list[tuple]:
    """Each row's `fields` read by config_value, as tuples in row order (read field by field)."""
    cols = [[default if (v := r.get(f)) is None else v for r in rows] for f, default in
            ((f, CONFIG_DEFAULTS.get(f)) for f in fields)]
    return list(zip(*cols)) if cols else [() for _ in rows]


def config_key(run: dict[str, Any]) -> tuple:
    """A run's configuration: its CONFIG_FIELDS read by config_value."""
    return tuple(config_value(run, f) for f in CONFIG_FIELDS)


def size_label(model_params: int | None, size_class: float | None) -> str:
    """The exact model size: '8.86B', '8.03B', '70B', '350M' (3 significant figures)."""
    n = model_params or (size_class or 0) * 1e9
    if not n:
        return "?"
    return f"{n / 1e9:.3g}B" if n >= 1e9 else f"{n / 1e6:.3g}M"


#: what the memory model takes for a configuration field a recorded run leaves out
_MEMORY_ASSUMES = {"zero_stage": "ZeRO-0", "recompute": "no recompute", "grad_accum_steps": "GAS ≥ PP"}


def memory_verdict(run: dict[str, Any]) -> dict[str, Any] | None:
    """The memory model's prediction for a recorded run's own configuration (its model, framework,
    precision), or None when a degree or the micro-batch is unknown (nothing to cost). `assumed`: what
    the model took for the fields the run does not record (ZeRO stage 0, no recompute); `fits_with`:
    when it does not fit so, the least memory-saving setting of those unrecorded fields under which it
    fits (_fits_with) — then `fits` is None (the record does not say enough to decide); `disagrees`:
    the run succeeded and the model says it does not fit under any setting of what it leaves out."""
    if any(run.get(f) is None for f in ("dp", "tp", "pp", "cp", "micro_batch_size", "seq_len")):
        return None
    record = {k: v for k, v in run.items() if k != "extra"}
    try:
        est = estimate_memory(record)
    except ValueError:
        return None
    fits, fits_with = est.fits, None
    if fits is False:
        fits_with = _fits_with(record)
        if fits_with is not None:  # the fields the run leaves out decide it: not a disagreement
            fits = None
    return {"predicted_peak_memory_gib": est.predicted_peak_memory_gib, "usable_memory_gib": est.usable_memory_gib,
            "fits": fits, "disagrees": fits is False, "fits_with": fits_with,
            "assumed": [text for f, text in _MEMORY_ASSUMES.items() if run.get(f) is None]}


#: the memory-saving settings tried, least change first, for the fields a recorded run leaves out
_SAVINGS = ((("zero_stage", 1),), (("recompute", "selective"),), (("zero_stage", 1), ("recompute", "selective")),
            (("recompute", "full"),), (("zero_stage", 1), ("recompute", "full")),
            (("zero_stage", 3), ("recompute", "full")))


def _fits_with(record: dict[str, Any]) -> str | None:
    """The least memory-saving setting of the fields `record` leaves out (ZeRO stage, recompute) under
    which the memory model says it fits, as text ("ZeRO-1, selective recompute"); None when no such
    setting fits (or the run records both fields): then the model truly disagrees with the record."""
    sharded = (record.get("dp") or 1) * (record.get("cp") or 1) > 1  # ZeRO shards over DP·CP: nothing at 1
    for setting in _SAVINGS:
        if any(record.get(f) is not None or (f == "zero_stage" and not sharded) for f, _ in setting):
            continue
        try:
            est = estimate_memory({**record, **dict(setting)})
        except ValueError:
            continue
        if est.fits:
            return ", ".join(f"ZeRO-{v}" if f == "zero_stage" else f"{v} recompute" for f, v in setting)
    return None


def measured(session: Session, cell: Cell, *, precision: str | None, limit: int = 10) -> Measured:
    """The successful runs of `cell`, one per distinct configuration, best first as the module
    docstring says, at most `limit` listed (the counts cover all). `precision`: the precision the
    answer is costed in (its runs first). Each listed run: run_id, label (exact size · framework ·
    precision), model_name, model_params, model_size_class, the dims, framework, precision,
    seq_len, gpus_per_node, config {CONFIG_FIELDS}, global_batch_tokens, tokens_per_sec_per_gpu,
    mfu (mfu_derived, else the reported), peak_memory_gib, n_runs, source, memory (memory_verdict).

    Read from run_cells (service/run_cells.py: the finished runs grouped, kept in the write transaction)
    instead of the cell's runs: one query of a few hundred groups for the runs and the counts."""
    groups = _cell_groups(session, cell)
    rows = [g for g in groups if g["status"] == "success" and g["seq_len"] == cell.seq_len
            and not _conflicts(g, cell.dims)]
    # one entry per distinct configuration of one model, framework and precision: its best run (that of
    # the group whose best run ranks first: service/ranking's rule, core.rules.best_key), in that order
    seen: dict[tuple, dict[str, Any]] = {}
    for g in sorted(rows, key=lambda g: best_key({"id": g["best_id"], "tokens_per_sec_per_gpu": g["best_tps"],
                                                  "mfu_derived": g["best_mfu"]})):
        key = (g["model_params"], g["model_size_class"], *(g[d] for d in DIM_FIELDS), g["gated_linear_unit"],
               g["framework"], g["precision"], config_key(g))
        if key in seen:
            seen[key]["n_runs"] += g["n_runs"]
        else:
            seen[key] = _best_run(g)
    wanted = hardware.canonical_precision(precision)
    asked = cell.model_params

    def order(item: tuple[int, dict[str, Any]]) -> tuple:
        i, r = item
        n = r["model_params"] or (r["model_size_class"] or 0) * 1e9
        near = abs(math.log(n / asked)) if n else math.inf
        return (r["precision"] != wanted, round(near, 6), i)

    ranked = [r for _, r in sorted(enumerate(seen.values()), key=order)]
    out = Measured([_entry(r) for r in ranked[:limit]], n_success=sum(g["n_runs"] for g in rows),
                   n_configurations=len(ranked))
    _count(groups, cell, out)
    return out


#: the run_cells columns a cell's answer reads
_GROUP_COLUMNS = ("model_params", "model_size_class", *DIM_FIELDS, "gated_linear_unit", "seq_len", "gpu_type",
                  "gpus_per_node", "nodes", *CONFIG_FIELDS, "precision", "framework", "status", "n_runs", "best_id",
                  "best_tps", "best_mfu", "best_model_name", "best_source", "best_peak_memory_gib",
                  "best_global_batch_tokens")


def _cell_groups(session: Session, cell: Cell) -> list[dict[str, Any]]:
    """The run_cells groups of the cell: size (and MoE or dense), nodes, GPU type and GPUs per node, every
    seq_len and status (the groups hold the finished, not retired runs only)."""
    gpu = RunCell.gpu_type.is_(None) if cell.gpu_type is None else RunCell.gpu_type == cell.gpu_type
    query = sa.select(*(getattr(RunCell, c) for c in _GROUP_COLUMNS)).where(
        cell.size_filter(RunCell.model_size_class), RunCell.is_moe == cell.moe, RunCell.nodes == cell.nodes, gpu,
        sa.or_(RunCell.gpus_per_node.is_(None), RunCell.gpus_per_node == cell.gpus_per_node))
    keys, fetched = fetch_select(session, query)
    return [dict(zip(keys, row)) for row in fetched]


def _best_run(g: dict[str, Any]) -> dict[str, Any]:
    """A group's best run as the cell lists it (the columns _entry reads), with the group's run count."""
    run = {k: g[k] for k in ("model_params", "model_size_class", *DIM_FIELDS, "gated_linear_unit", "seq_len",
                             "gpu_type", "gpus_per_node", "nodes", *CONFIG_FIELDS, "precision", "framework")}
    return {**run, "id": g["best_id"], "model_name": g["best_model_name"], "source": g["best_source"],
            "global_batch_tokens": g["best_global_batch_tokens"], "tokens_per_sec_per_gpu": g["best_tps"],
            "mfu_derived": g["best_mfu"], "mfu": g["best_mfu"], "peak_memory_gib": g["best_peak_memory_gib"],
            "n_runs": g["n_runs"]}


def _entry(r: dict[str, Any]) -> dict[str, Any]:
    size = size_label(r["model_params"], r["model_size_class"])
    label = " · ".join(x for x in (size, r["framework"] or "framework?", r["precision"] or "precision?"))
    mfu = r["mfu_derived"] if r["mfu_derived"] is not None else r["mfu"]
    return {"run_id": r["id"], "label": label, "model_name": r["model_name"], "model_params": r["model_params"],
            "model_size_class": r["model_size_class"], **{d: r[d] for d in DIM_FIELDS},
            "gated_linear_unit": r["gated_linear_unit"],
            "framework": r["framework"], "precision": r["precision"], "seq_len": r["seq_len"],
            "gpus_per_node": r["gpus_per_node"], "config": {f: r[f] for f in CONFIG_FIELDS},
            "global_batch_tokens": r["global_batch_tokens"], "tokens_per_sec_per_gpu": r["tokens_per_sec_per_gpu"],
            "mfu": mfu, "peak_memory_gib": r["peak_memory_gib"], "n_runs": r["n_runs"], "source": r["source"],
            "memory": memory_verdict({**r, "gpu_type": r["gpu_type"], "nodes": r["nodes"]})}


def _count(groups: list[dict[str, Any]], cell: Cell, out: Measured) -> None:
    """OOM and other failed runs at the cell's seq_len, successes at other seq_lens (from the cell's groups)."""
    for g in groups:
        seq, status, n = g["seq_len"], g["status"], g["n_runs"]
        if seq == cell.seq_len:
            if status == "oom":
                out.n_oom += int(n)
            elif status != "success":
                out.n_failed += int(n)
        elif status == "success":
            out.other_seq_lens[seq] = out.other_seq_lens.get(seq, 0) + int(n)


def disagreement_notes(m: Measured) -> list[str]:
    """One note per listed run the memory model says does not fit (the record wins), or fits only with
    a setting of the fields the run does not record (which the note names)."""
    notes = []
    for r in m.runs:
        mem = r.get("memory") or {}
        if mem.get("disagrees"):
            assumed = (f" (taking {', '.join(mem['assumed'])}: the run does not record them)"
                       if mem.get("assumed") else "")
            notes.append(f"the memory model predicts {mem['predicted_peak_memory_gib']:.1f} GiB per GPU for run "
                         f"#{r['run_id']} ({r['label']}){assumed}, more than the {mem['usable_memory_gib']:.1f} GiB "
                         "usable, yet it ran on this target: the models disagree with the record, and the record "
                         "wins")
        elif mem.get("fits_with"):
            notes.append(f"run #{r['run_id']} ({r['label']}): taking {', '.join(mem['assumed'])} (the run does not "
                         f"record them), the memory model predicts {mem['predicted_peak_memory_gib']:.1f} GiB per GPU, "
                         f"more than the {mem['usable_memory_gib']:.1f} GiB usable; with {mem['fits_with']} it fits")
    return notes
