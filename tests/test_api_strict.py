"""GET strictness on both backends: an unknown query parameter is a 422 naming it, on every GET
route; GET /runs filters by name (exact and prefix) and source; model_params accepts 8B/350M."""

from __future__ import annotations

import pytest

BASE = {"model_name": "llama3-8b", "model_params": 8_030_261_248, "gpu_type": "H100-SXM-80GB",
        "gpus_per_node": 8, "nodes": 2, "tp": 2, "pp": 1, "cp": 1, "status": "success",
        "tokens_per_sec_per_gpu": 4000.0}


@pytest.fixture
def stored(client):
    runs = [{**BASE, "run_key": "a", "name": "sweep_1", "source": "api"},
            {**BASE, "run_key": "b", "name": "sweep_10", "source": "log"},
            {**BASE, "run_key": "c", "name": "sweep%_odd", "source": "log", "model_params": 350_000_000},
            {**BASE, "run_key": "d", "name": "other", "source": "api", "model_params": 1_340_000_000}]
    assert client.post("/api/v1/runs", json={"runs": runs}).status_code == 201
    return client


def keys(client, **params) -> list[str]:
    r = client.get("/api/v1/runs", params=params)
    assert r.status_code == 200, r.text
    return sorted(run["run_key"] for run in r.json()["runs"])


def test_name_exact_prefix_and_source(stored):
    assert keys(stored, name="sweep_1") == ["a"]
    assert keys(stored, name_prefix="sweep_1") == ["a", "b"]
    assert keys(stored, name_prefix="sweep%") == ["c"]  # % is a literal, not a wildcard
    assert keys(stored, name_prefix="sweep") == ["a", "b", "c"]
    assert keys(stored, source="log") == ["b", "c"]
    assert keys(stored, source="log", name_prefix="sweep_") == ["b"]


@pytest.mark.parametrize("value,want", [("350M", ["c"]), ("1.34B", ["d"]), ("1340000000", ["d"]),
                                        ("8,030,261,248", ["a", "b"])])
def test_model_params_accepts_sizes(stored, value, want):
    assert keys(stored, model_params=value) == want


def test_model_params_says_what_it_wants(stored):
    r = stored.get("/api/v1/runs", params={"model_params": "eight"})
    assert r.status_code == 422
    body = r.json()["error"]
    assert body["details"][0]["field"] == "model_params" and "8B" in body["message"]


@pytest.mark.parametrize("path,params", [
    ("/api/v1/runs", {"nmae": "x"}),
    ("/api/v1/runs", {"name": "sweep_1", "sorce": "log"}),
    ("/api/v1/runs/1", {"verbose": "1"}),
    ("/api/v1/heatmap", {"modle": "8B"}),
    ("/api/v1/health", {"x": "1"}),
])
def test_unknown_query_parameters_are_named(stored, path, params):
    r = stored.get(path, params=params)
    assert r.status_code == 422, (path, r.text)
    error = r.json()["error"]
    unknown = [k for k in params if k not in ("name",)]
    assert [d["field"] for d in error["details"]] == unknown
    for name in unknown:
        assert repr(name) in error["message"]


def test_unknown_filter_suggests_the_declared_name(stored):
    detail = stored.get("/api/v1/runs", params={"sorce": "log"}).json()["error"]["details"][0]
    assert detail["message"] == "unknown query parameter; did you mean 'source'?"


def test_every_get_route_is_strict(stored):
    """Each GET route of the app answers 422 to a parameter it cannot have declared."""
    checked = 0
    for path, ops in stored.app.openapi()["paths"].items():
        if "get" in ops and "{" not in path:
            r = stored.get(path, params={"zz_not_a_param": "1"})
            assert r.status_code == 422, path
            assert r.json()["error"]["details"][0]["field"] == "zz_not_a_param"
            checked += 1
    assert checked >= 5
