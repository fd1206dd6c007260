"""The SQL page's pure parts: the example query and the answer of POST /api/v1/sql as a table.

Answer shape: ``{"columns": [...], "rows": [[...], ...], "row_count": N, "truncated": bool,
"elapsed_ms": float}``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pandas as pd

#: portable over DuckDB and PostgreSQL: the best throughput per model size and node count
EXAMPLE_QUERY = """SELECT model_size_class, nodes,
       count(*) AS runs,
       sum(CASE WHEN status = 'success' THEN 1 ELSE 0 END) AS ok,
       max(tokens_per_sec_per_gpu) AS best_tok_s_gpu,
       max(coalesce(mfu_derived, mfu)) AS best_mfu
FROM runs
GROUP BY model_size_class, nodes
ORDER BY model_size_class, nodes"""


def result_frame(body: Mapping[str, Any]) -> pd.DataFrame:
    """The rows under their column names (duplicate names made unique: "x", "x_2")."""
    columns = list(body.get("columns") or [])
    seen: dict[str, int] = {}
    unique = []
    for c in columns:
        name = str(c)
        seen[name] = seen.get(name, 0) + 1
        unique.append(name if seen[name] == 1 else f"{name}_{seen[name]}")
    rows = body.get("rows") or []
    if not unique and rows:
        unique = [f"col{i + 1}" for i in range(len(rows[0]))]
    return pd.DataFrame(rows, columns=unique)


def result_caption(body: Mapping[str, Any], elapsed_s: float | None = None) -> str:
    """"42 rows · 3 ms in the database · 9 ms round trip" (+ a note when the row cap cut it)."""
    n = body.get("row_count")
    if n is None:
        n = len(body.get("rows") or [])
    text = f"{n:,} row{'s' if n != 1 else ''}"
    if body.get("truncated"):
        text += " (truncated by the server's row cap: add LIMIT or aggregate)"
    if body.get("elapsed_ms") is not None:
        text += f" · {float(body['elapsed_ms']):,.0f} ms in the database"
    if elapsed_s is not None:
        text += f" · {elapsed_s * 1000:,.0f} ms round trip"
    return text
