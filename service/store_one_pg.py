"""PostgreSQL: a single new run stored in one autocommit statement.

The common single POST (a training job reporting one run) used to be five round trips to the
server: the pool's liveness ping, BEGIN, the INSERT into runs, the run_configs upsert, COMMIT.
Each round trip wakes the server process and then this one; on a 2-core machine the wake-ups,
not the work, were most of the ~3–5 ms. Here the INSERT and the upsert are one statement whose
second part is a data-modifying CTE reading the first's RETURNING id (PostgreSQL runs every
data-modifying WITH statement exactly once, to completion, in the statement's snapshot), sent
in autocommit mode: one round trip after the ping, one transaction, one WAL flush at its commit
(synchronous_commit as configured, so an acknowledged run is as durable as before).

`ON CONFLICT (run_key) DO NOTHING`: when the run_key is stored already (a retry, a conflicting
resend, or a concurrent request that won), nothing is written — the upsert reads no row from the
empty CTE — and the caller answers through the checked path (200 for the same content, 409 for
different content), exactly as for a batch.
"""

from __future__ import annotations

import functools
from typing import Any

from service import run_configs


@functools.lru_cache(maxsize=2)
def _statement(with_config: bool) -> str:
    """The statement, with psycopg named parameters `<runs column>_0` and `cfg_<run_configs
    column>` (the best-run ids come from the inserted row)."""
    from service.store import _insert_or_skip_pg

    sql = f"WITH ins AS ({_insert_or_skip_pg(1)})"
    if with_config:
        values = ", ".join("ins.id" if c.endswith("_best_id") else f"%(cfg_{c})s::{run_configs._pg_type(c)}"
                           for c in run_configs.COLUMNS)
        sql += (f", cfg AS (INSERT INTO run_configs ({run_configs._COLS}) SELECT {values} FROM ins "
                f"{run_configs._UPSERT_TAIL})")
    return sql + " SELECT id FROM ins"


def store_one(db: Any, row: dict[str, Any]) -> int | None:
    """Store `row` (one validated `runs` row without id) in one autocommit statement on
    PostgreSQL `db` (a service.db.Database); sets its `id` and `ingested_at` and returns the id,
    or None when its run_key is stored already (nothing written). Raises DatabaseUnavailable,
    or Conflict for a violation other than the run_key's, as Database.session does."""
    from service.store import insert_params_pg

    params = insert_params_pg([row])
    groups = run_configs.partials([{**row, "id": 0}])  # 0: the best-run ids are ins.id in SQL
    for group in groups.values():
        params.update({f"cfg_{c}": v for c, v in group.items()})
    with db.autocommit() as conn:
        found = conn.exec_driver_sql(_statement(bool(groups)), params).scalar()
    if found is None:
        return None
    row["id"] = int(found)
    return row["id"]
