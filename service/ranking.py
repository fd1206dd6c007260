"""The best-run ranking as SQL (the Python form is core.rules.best_key; both implement one rule):
the higher metric first (runs without it last), then the higher MFU (mfu_derived, falling back to the
reported mfu; runs without it last), then the lower id. The heatmap and scaling queries use it."""

from __future__ import annotations

from typing import Any

import sqlalchemy as sa
from sqlalchemy.orm import QueryableAttribute

__all__ = ["SqlExpr", "best_order"]

#: a SQL expression or an ORM column attribute (Run.id)
SqlExpr = sa.ColumnElement[Any] | QueryableAttribute[Any]


def best_order(value: SqlExpr, mfu: SqlExpr, run_id: SqlExpr) -> list[sa.ColumnElement[Any]]:
    """The ranking as a SQL ORDER BY over the columns given: value DESC NULLS LAST, MFU DESC NULLS
    LAST, id ASC (the order of core.rules.best_key)."""
    return [value.desc().nulls_last(), mfu.desc().nulls_last(), run_id.asc()]
