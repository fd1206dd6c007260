"""The CLI's one table renderer (rich) and its number formats.

Tables must read at 80 columns and without a TTY (piped output gets rich's default 80 columns, or
$COLUMNS): cells are never cut to "recor…". A column whose content does not fit wraps (``fold``);
when even the narrowest useful widths of all columns exceed the width, the least important columns
(highest ``drop`` rank, rightmost first) are left out and a line under the table names them and
says how to see everything (``--json``, ``--format csv``, a wider terminal).

Numbers carry their units and never print in exponent form (:func:`number`, :func:`value`):
``26,110 tok/s``, ``39.2%``, ``25.1 GiB``, ``1.3B``; SQL answers are formatted by column name
(:func:`value`), so ``mfu`` prints as a percentage and ``tokens_per_sec_per_gpu`` with thousands
separators.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from core.families import size_label

#: columns never get narrower than this when they wrap (a 3-letter header stays whole)
MIN_WRAP_WIDTH = 8
#: a header longer than this folds (``tokens_per_sec_per_gpu`` → two lines)
MAX_HEADER_WIDTH = 11
#: the cap on a column's wanted width when deciding what fits (longer content wraps)
MAX_WANTED_WIDTH = 24


@dataclass(frozen=True)
class Col:
    """A table column: ``header``; ``justify`` ("left"/"right"); ``drop``: 0 = always kept, higher
    = left out earlier when the table does not fit."""

    header: str
    justify: str = "left"
    drop: int = 0


def _wanted(col: Col, cells: Sequence[str]) -> int:
    """The width a column asks for: its longest cell line (capped at MAX_WANTED_WIDTH; longer lines
    wrap), at least its longest word in a cell, and its header up to MAX_HEADER_WIDTH (a longer
    header such as ``tokens_per_sec_per_gpu`` folds over two lines)."""
    longest_line = max((len(line) for c in cells for line in c.splitlines()), default=0)
    longest_word = max((len(w) for c in cells for w in c.split()), default=0)
    return max(min(longest_line, MAX_WANTED_WIDTH), min(longest_word, MAX_WANTED_WIDTH),
               min(len(col.header), MAX_HEADER_WIDTH), 1)


def fit_columns(cols: Sequence[Col], rows: Sequence[Sequence[str]], width: int) -> list[int]:
    """Indexes of the columns kept so that the table fits ``width`` characters: drop the column with
    the highest ``drop`` rank (the rightmost among equals) until the wanted widths plus borders fit;
    columns of rank 0 are never dropped."""
    keep = list(range(len(cols)))
    wanted = [_wanted(c, [r[i] for r in rows]) for i, c in enumerate(cols)]
    while True:
        total = sum(wanted[i] for i in keep) + 3 * len(keep) + 1
        if total <= width:
            return keep
        droppable = [i for i in keep if cols[i].drop > 0]
        if not droppable:
            return keep
        keep.remove(max(droppable, key=lambda i: (cols[i].drop, i)))


def table(console: Console, cols: Sequence[Col], rows: Sequence[Sequence[str]], title: str | None = None,
          lines: bool = False, more_hint: str = "--json") -> None:
    """Print ``rows`` (already formatted strings) under ``cols`` on ``console``: fitted to its width
    (see :func:`fit_columns`), wrapping rather than truncating, then a note naming any column left out."""
    keep = fit_columns(cols, rows, console.width)
    t = Table(title=title, show_lines=lines, title_justify="left", expand=False)
    for i in keep:
        t.add_column(cols[i].header, justify=cols[i].justify, overflow="fold", no_wrap=False,  # type: ignore[arg-type]
                     min_width=min(_wanted(cols[i], [r[i] for r in rows]), MIN_WRAP_WIDTH))
    for r in rows:
        t.add_row(*(Text(r[i]) for i in keep))
    console.print(t)
    left_out = [cols[i].header for i in range(len(cols)) if i not in keep]
    if left_out:
        console.print(f"({len(left_out)} column(s) left out to fit {console.width} characters: "
                      f"{', '.join(left_out)}; {more_hint} or a wider terminal shows them)")


def number(value: Any, unit: str = "", digits: int | None = None) -> str:
    """A number for people: thousands separators, no exponent, ``unit`` appended; "—" for None/NaN.
    Floats: ≥ 100 → no decimals, ≥ 1 → 2 significant decimals, < 1 → 3 significant digits
    (``digits`` forces a count of decimals)."""
    if value is None or isinstance(value, bool) or (isinstance(value, float) and not math.isfinite(value)):
        return "—"
    if not isinstance(value, (int, float)):
        return str(value)
    if isinstance(value, int) and digits is None:
        text = f"{value:,}"
    elif digits is not None:
        text = f"{value:,.{digits}f}"
    else:
        a = abs(value)
        if a >= 100 or a == 0:
            text = f"{value:,.0f}"
        elif a >= 1:
            text = f"{value:,.2f}"
        elif a >= 0.001:
            text = f"{value:.{max(0, 2 - math.floor(math.log10(a)))}f}"
        else:
            text = f"{value:.6f}".rstrip("0")
    return f"{text} {unit}".rstrip() if unit else text


def pct(fraction: Any, digits: int = 1) -> str:
    """0.3917 → "39.2%"; "—" when missing."""
    if not isinstance(fraction, (int, float)) or isinstance(fraction, bool) or not math.isfinite(fraction):
        return "—"
    return f"{100 * fraction:.{digits}f}%"


def size(billions: Any) -> str:
    """Model size class in billions (core.families.size_label: 1.3 → "1.3B", 0.12 → "120M"); "—" when missing."""
    if not isinstance(billions, (int, float)):
        return "—"
    return size_label(billions)


def si(n: Any) -> str:
    """11e12 → "11T", 3e9 → "3B", 5e5 → "500,000"."""
    if not isinstance(n, (int, float)):
        return "—"
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if n >= div:
            return f"{n / div:g}{suffix}"
    return f"{n:,.0f}"


_SUPERSCRIPT = str.maketrans("-0123456789", "⁻⁰¹²³⁴⁵⁶⁷⁸⁹")


def power_of_ten(x: Any, digits: int = 2) -> str:
    """4.8e22 → "4.8×10²²" (a FLOP count as papers write it; no "e+22" in a table); "—" for None."""
    if not isinstance(x, (int, float)) or x != x:
        return "—"
    if x == 0:
        return "0"
    mantissa, exponent = f"{x:.{digits - 1}e}".split("e")
    return f"{mantissa}×10{str(int(exponent)).translate(_SUPERSCRIPT)}"


_PERCENT_COLUMNS = ("mfu", "hfu", "efficiency")


def value(column: str, v: Any) -> str:
    """An SQL answer's cell formatted by its column name: MFU/HFU/efficiency fractions as
    percentages, ``*_gib`` with GiB, throughput and counts with separators, other floats without
    exponents, JSON as compact JSON, None as "—"."""
    if v is None:
        return "—"
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str, separators=(",", ":"))
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    name = column.lower()
    if isinstance(v, float) and any(name == p or name.startswith(p + "_") or name.endswith("_" + p)
                                    for p in _PERCENT_COLUMNS) and 0 <= v <= 1.5:
        return pct(v)
    if name.endswith("_gib"):
        return number(v, "GiB", digits=1)
    if name == "id" or name.endswith("_id") or name in ("nodes", "dp", "tp", "pp", "cp", "ep", "zero_stage"):
        return str(v) if isinstance(v, int) else number(v)
    return number(v)


#: the eight block heights of a sparkline, lowest first
SPARK_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: Sequence[float | None], width: int) -> str:
    """`values` (a series in order; None = no value) as at most `width` block characters, lowest value ▁,
    highest █: a longer series is cut into `width` consecutive buckets, each drawn at its mean; a
    bucket without values is a space. "" for no values or width < 1."""
    known = [v for v in values if v is not None and math.isfinite(v)]
    if not known or width < 1:
        return ""
    n = len(values)
    w = min(width, n)
    buckets = [values[i * n // w:(i + 1) * n // w] for i in range(w)]
    means = [(sum(b) / len(b)) if (b := [v for v in bucket if v is not None and math.isfinite(v)]) else None
             for bucket in buckets]
    lo, hi = min(known), max(known)
    span = hi - lo
    top = len(SPARK_BARS) - 1
    return "".join(" " if m is None else SPARK_BARS[round((m - lo) / span * top) if span else top // 2]
                   for m in means)


def extrapolation_lines(rows: Sequence[dict[str, Any]]) -> list[str]:
    """Which of an answer's rows (/recommend candidates, /suggest suggestions) are predicted by
    extrapolation, and from what (each row's `extrapolation` reasons): the reasons every row shares
    once, then each row's own, by its rank (1-based). [] when every row interpolates."""
    reasons = [list(r.get("extrapolation") or []) for r in rows]
    shared = [x for x in reasons[0] if all(x in rs for rs in reasons)] if reasons else []
    lines = ["  extrapolates (every row): " + "; ".join(shared)] if shared else []
    for i, rs in enumerate(reasons, 1):
        own = [x for x in rs if x not in shared]
        if own:
            lines.append(f"  #{i} extrapolates: " + "; ".join(own))
    return lines
