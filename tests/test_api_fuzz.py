"""Schemathesis fuzzes every operation of the OpenAPI spec (DuckDB and PostgreSQL, DESIGN §7): no 5xx, and
every answer matches the documented schema — the coverage phase's boundary cases, then generated valid and
invalid input. (Apart from tests/test_reliability.py so that the two run on different xdist workers.)"""

from __future__ import annotations

import tempfile

import pytest
import schemathesis
from conftest import create_pg_database, drop_pg_database
from hypothesis import HealthCheck, settings
from schemathesis.checks import not_a_server_error
from schemathesis.specs.openapi.checks import response_schema_conformance

from service import store
from service.api import create_app
from service.cli import benchmark as benchtool
from service.db import Database
from service.settings import Settings

# -- schemathesis ------------------------------------------------------------------------------


#: One app for the fuzzer, loaded eagerly (schemathesis' lazy `from_fixture` loader reads
#: `request.node._nodeid`, which pytest 9 no longer has); `fuzz_db` points it at the fuzz's database.
#: Its placeholder database is a per-process temporary DuckDB file, never the user's default one
#: (two xdist workers would fight over its lock at collection time).
_FUZZ_PLACEHOLDER = Database(f"duckdb:///{tempfile.mkdtemp(prefix='sbfuzz')}/placeholder.duckdb")
_FUZZ_PLACEHOLDER.upgrade()
FUZZ_APP = create_app(_FUZZ_PLACEHOLDER, Settings(database_url=None))
# Revoking tokens by random id would lock the rest of the run out (or revoke nothing): DELETE
# /tokens is covered by tests/test_tokens.py instead.
schema = schemathesis.openapi.from_asgi("/openapi.json", FUZZ_APP).exclude(method="DELETE", path_regex="/tokens")


@pytest.fixture(scope="module", params=["duckdb", "postgresql"])
def fuzz_db(request, tmp_path_factory, worker_tag):
    """One database per backend for the whole fuzz (300 realistic runs stored once), served from
    FUZZ_APP. The generated requests write to it as they go (runs, retirements, sweeps): the checks —
    no 5xx, every answer as the schema says — hold whatever is stored, and the order is fixed."""
    from service.api.security import TokenState

    if request.param == "duckdb":
        url, pg_name = f"duckdb:///{tmp_path_factory.mktemp('fuzz') / 'fuzz.duckdb'}", None
    else:
        pg_name = f"sbfuzz_{worker_tag}"
        url = create_pg_database(pg_name)
    database = Database(url)
    try:
        database.upgrade()
        with database.session(write=True) as session:
            store.store_runs(session, list(benchtool.generate_runs(300, 42, prefix="fuzz")))
        FUZZ_APP.state.db = database
        FUZZ_APP.state.tokens = TokenState()
        yield database
    finally:
        FUZZ_APP.state.db = _FUZZ_PLACEHOLDER
        database.dispose()
        if pg_name:
            drop_pg_database(pg_name)


@schema.parametrize()
@settings(max_examples=25, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much,
                                 HealthCheck.function_scoped_fixture, HealthCheck.data_too_large])
def test_api_fuzz(case, fuzz_db):
    """No 5xx, and every answer conforms to the OpenAPI schema, for generated valid and invalid input."""
    case.call_and_validate(checks=[not_a_server_error, response_schema_conformance])
