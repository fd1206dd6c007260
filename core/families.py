"""Model-size families: the heatmap's size classes grouped on a FIXED log grid (standard library only).

GET /api/v1/heatmap answers one cell per (model_size_class, nodes), and model_size_class is the
reported parameter count rounded to two significant figures, so one model family spreads over many
rows (6.7, 6.8, 6.9, 7, 7.1, 7.5, 8B are all "a 7–8B model"). This module folds those cells into
one row per family, for the dashboard's landing page and the CLI:

- :data:`FAMILIES`: the grid, fixed (not derived from the data, so a row means the same thing on
  every database): half-open ranges of total parameters in billions, each boundary near the
  geometric mean of the two neighbouring model sizes people train (125M, 350M, 760M, 1.3B, 3B,
  7–8B, 13B, 20B, 30–34B, 70B, 175B, 405B, 1T);
- :func:`family_of`: the family of one size class;
- :func:`is_moe_cell`, :func:`moe_active_b`: whether a cell holds mixture-of-experts runs (the API's
  ``moe`` flag: core.model.is_moe, the one rule) and their active parameters (billions) when its best
  run says (an ``A3B``-style model name, core.model.active_params) — MoE rows are kept apart from
  dense rows of the same total size and labelled "30–34B MoE (A3B)" (or "175B MoE" when the active
  count is unknown);
- :func:`group_cells`: the cells of one family × node count merged into one: the best cell by the
  ONE best-run rule (core.rules.best_key of its best run), run counts summed, the exact size classes
  kept in ``sizes``.

The exact size of the best run stays in the merged cell (``model_size_class`` of the chosen cell
and its ``best`` run), so nothing is hidden by the grouping.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from core.model import active_params, is_moe
from core.rules import best_key

Cell = Mapping[str, Any]


@dataclass(frozen=True)
class Family:
    """One row of the grid: total parameters in [lo_b, hi_b) billions, shown as ``label``."""

    label: str
    lo_b: float
    hi_b: float


#: the fixed log grid (billions of total parameters); boundaries are about the geometric means of
#: neighbouring anchors, e.g. 4.7 ≈ √(3 × 7.5) between "3B" and "7–8B".
FAMILIES: tuple[Family, ...] = (
    Family("≤200M", 0.0, 0.2),
    Family("350M", 0.2, 0.55),
    Family("760M", 0.55, 1.0),
    Family("1–2B", 1.0, 2.0),
    Family("3B", 2.0, 4.7),
    Family("7–8B", 4.7, 10.0),
    Family("13B", 10.0, 17.0),
    Family("20B", 17.0, 25.0),
    Family("30–34B", 25.0, 50.0),
    Family("70B", 50.0, 100.0),
    Family("175B", 100.0, 270.0),
    Family("405B", 270.0, 700.0),
    Family("1T+", 700.0, math.inf),
)


def size_label(size_b: float) -> str:
    """A model size class (billions) as people write it: 1.3 -> "1.3B", 1200 -> "1.2T", 0.12 -> "120M"."""
    if size_b >= 1000:
        return f"{size_b / 1000:g}T"
    if size_b < 1:
        return f"{size_b * 1000:g}M"
    return f"{size_b:g}B"


def family_of(size_b: float) -> Family:
    """The family whose range holds ``size_b`` (total parameters, billions; ≥ 0).

    Raises ValueError for a negative or NaN size."""
    if not size_b >= 0:  # also catches NaN
        raise ValueError(f"model size must be a non-negative number of billions, got {size_b!r}")
    for fam in FAMILIES:
        if fam.lo_b <= size_b < fam.hi_b:
            return fam
    return FAMILIES[-1]  # pragma: no cover - the last range is open-ended


def family_named(text: str) -> Family:
    """The family a user means by `text`: its label ("7–8B", "7-8B") or a size in it ("8B", "1.34B",
    "350M", "8e9": core.record.parse_param_count) — `--model 8B` is the 7–8B family. Raises ValueError
    naming the labels when `text` is neither."""
    from core.record import parse_param_count

    wanted = text.strip().replace("-", "–").lower()
    for fam in FAMILIES:
        if fam.label.lower() == wanted:
            return fam
    try:
        return family_of(parse_param_count(text) / 1e9)
    except ValueError:
        raise ValueError(f"{text!r} is neither a model size (8B, 1.34B, 350M, 8e9) nor a family "
                         f"({', '.join(f.label for f in FAMILIES)})") from None


#: what :func:`row_label` puts after a family's label for a mixture-of-experts row
MOE_MARK = " MoE"


def family_index(label: str) -> float:
    """Sort position of a row label made by :func:`row_label` (by size; a family's MoE rows right
    after its dense row)."""
    base, moe, _ = label.partition(MOE_MARK)
    for i, fam in enumerate(FAMILIES):
        if fam.label == base:
            return i + (0.5 if moe else 0.0)
    return len(FAMILIES)


def is_moe_cell(cell: Cell) -> bool:
    """Whether a heatmap cell holds mixture-of-experts runs: the API's ``moe`` flag, else (a cell
    without one) core.model.is_moe of its best run."""
    if "moe" in cell and cell["moe"] is not None:
        return bool(cell["moe"])
    best = cell.get("best") or {}
    return is_moe(best, {})


def moe_active_b(cell: Cell) -> float | None:
    """Active parameters (billions) of a mixture-of-experts cell's best run: from its model name's
    "A3B" token (core.model.active_params); None for a dense cell or when unknown."""
    if not is_moe_cell(cell):
        return None
    best = cell.get("best") or {}
    active = active_params(best.get("model_name"), {})
    return None if active is None else round(active / 1e9, 1)


def row_label(cell: Cell) -> str:
    """The family row of a heatmap cell: "7–8B"; for mixture-of-experts runs "30–34B MoE (A3B)",
    or "175B MoE" when the active parameter count is unknown (GPT-OSS-120B's name does not say)."""
    fam = family_of(float(cell["model_size_class"]))
    if not is_moe_cell(cell):
        return fam.label
    active = moe_active_b(cell)
    return f"{fam.label}{MOE_MARK}" + ("" if active is None else f" (A{active:g}B)")


def group_cells(cells: Iterable[Cell], metric: str = "tokens_per_sec_per_gpu") -> list[dict[str, Any]]:
    """Merge the API's per-size-class cells into one cell per (family row, nodes).

    Input: GET /api/v1/heatmap ``cells`` (``model_size_class``, ``nodes``, ``best``, ``config_label``,
    ``n_success``, ``n_oom``, ``n_failed``). Output: the same keys (the chosen cell's
    ``model_size_class``, ``best`` and ``config_label``; the counts summed over the family) plus
    ``family`` (the row label, see :func:`row_label`) and ``sizes`` (the sorted distinct size classes
    merged). The chosen cell is the one whose best run comes first by core.rules.best_key. Sorted by family then nodes.
    """
    groups: dict[tuple[str, int], list[Cell]] = {}
    for cell in cells:
        if cell.get("model_size_class") is None:
            continue
        groups.setdefault((row_label(cell), int(cell["nodes"])), []).append(cell)
    out = []
    for (label, nodes), members in groups.items():
        chosen = min(members, key=lambda c: best_key(c.get("best"), metric))
        merged = dict(chosen)
        merged.update(
            family=label, nodes=nodes,
            sizes=sorted({float(c["model_size_class"]) for c in members}),
            n_success=sum(int(c.get("n_success") or 0) for c in members),
            n_oom=sum(int(c.get("n_oom") or 0) for c in members),
            n_failed=sum(int(c.get("n_failed") or 0) for c in members),
        )
        out.append(merged)
    out.sort(key=lambda c: (family_index(c["family"]), c["family"], c["nodes"]))
    return out
