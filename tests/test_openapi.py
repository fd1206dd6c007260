"""OpenAPI snapshot (Conbench style): the spec the app generates must equal tests/openapi_snapshot.json.

Any change to the API surface — a new endpoint, a renamed field, a changed type or description —
fails this test until the snapshot is updated on purpose, so API changes show up in review as a
diff of the snapshot. To accept the current spec:

    SCALEBOOK_UPDATE_SNAPSHOT=1 pytest tests/test_openapi.py

(rewrites tests/openapi_snapshot.json, sorted keys, 2-space indent; the test then passes).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from service.api import create_app
from service.settings import Settings

SNAPSHOT = Path(__file__).resolve().parent / "openapi_snapshot.json"


def current_spec() -> dict:
    """The OpenAPI document of a fresh app (no database needed to generate it)."""
    return create_app(None, Settings(database_url=None)).openapi()


def render(spec: dict) -> str:
    return json.dumps(spec, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def test_openapi_matches_snapshot():
    spec = current_spec()
    if os.environ.get("SCALEBOOK_UPDATE_SNAPSHOT") == "1":
        SNAPSHOT.write_text(render(spec), encoding="utf-8")
    if not SNAPSHOT.exists():
        pytest.fail(f"{SNAPSHOT.name} is missing: run SCALEBOOK_UPDATE_SNAPSHOT=1 pytest {Path(__file__).name}")
    expected = json.loads(SNAPSHOT.read_text(encoding="utf-8"))
    if spec != expected:
        added = sorted(set(spec.get("paths", {})) - set(expected.get("paths", {})))
        removed = sorted(set(expected.get("paths", {})) - set(spec.get("paths", {})))
        changed = sorted(p for p in set(spec.get("paths", {})) & set(expected.get("paths", {}))
                         if spec["paths"][p] != expected["paths"][p])
        schemas = sorted(k for k in set(spec.get("components", {}).get("schemas", {}))
                         | set(expected.get("components", {}).get("schemas", {}))
                         if spec.get("components", {}).get("schemas", {}).get(k)
                         != expected.get("components", {}).get("schemas", {}).get(k))
        pytest.fail("the OpenAPI spec differs from tests/openapi_snapshot.json "
                    f"(paths added {added}, removed {removed}, changed {changed}; schemas changed {schemas}). "
                    "If the change is intended: SCALEBOOK_UPDATE_SNAPSHOT=1 pytest tests/test_openapi.py")


def test_snapshot_is_canonical():
    """The snapshot file is exactly what the update writes (stable diffs in review)."""
    if not SNAPSHOT.exists():
        pytest.skip("no snapshot yet")
    text = SNAPSHOT.read_text(encoding="utf-8")
    assert text == render(json.loads(text))


def test_every_operation_documents_its_errors():
    """Operations that take input document 422 with the one error body; /health stays open."""
    spec = current_spec()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            if op.get("parameters") or op.get("requestBody"):
                assert "422" in op["responses"], f"{method.upper()} {path} does not document 422"
    assert "security" not in spec["paths"]["/api/v1/health"]["get"]
