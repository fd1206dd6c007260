"""CSV parsers that turn benchmark files into run records (DESIGN §2, §8). Standard library only.

- :func:`parse_nanotron` — nanotron / Ultra-Scale Playbook sweep CSVs (``source="nanotron-csv"``);
- :func:`parse_table` — published tables in the common 33-column layout
  (``source="published-table"``).

Both take ``(path, **defaults)`` and return a :class:`ParseResult` of ``records`` (run-record dicts
with a deterministic ``run_key``) and ``rejects`` (:class:`Reject`: line, raw row, reason).
:func:`detect_format` tells the two layouts apart from a file's header.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ingest.parsers.common import ParseResult, Reject, read_rows
from ingest.parsers.nanotron import parse_file as parse_nanotron
from ingest.parsers.table import parse_file as parse_table

#: format name -> parser
PARSERS: dict[str, Callable[..., ParseResult]] = {
    "nanotron": parse_nanotron,
    "table": parse_table,
}


def detect_format(path: str | os.PathLike) -> str | None:
    """'nanotron' for a nanotron bench CSV (has tok/s/gpu or mTFLOPs next to dp/tp/pp), 'table'
    for the published-table layout (has model, gpu_type, num_gpus), None otherwise."""
    header, _rows = read_rows(path)
    cols = set(header)
    if {"dp", "tp", "pp"} <= cols and cols & {"tok/s/gpu", "mTFLOPs", "batch_accum"}:
        return "nanotron"
    if {"model", "gpu_type", "num_gpus"} <= cols:
        return "table"
    return None


__all__ = ["PARSERS", "ParseResult", "Reject", "detect_format", "parse_nanotron", "parse_table"]
