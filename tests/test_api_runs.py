"""POST/GET /api/v1/runs on both backends: validation, all-or-nothing batches, idempotency,
filters and cursor pagination, the one error body shape."""

from __future__ import annotations

import math

import pytest

BASE = {"model_name": "llama3-8b", "model_params": 8_030_261_248, "num_layers": 32, "hidden_size": 4096,
        "seq_len": 8192, "gpu_type": "H100 80GB HBM3", "gpus_per_node": 8, "nodes": 2, "tp": 2,
        "pp": 1, "cp": 1, "zero_stage": 1, "micro_batch_size": 1, "grad_accum_steps": 8, "precision": "bf16",
        "framework": "nanotron", "status": "success", "tokens_per_sec_per_gpu": 4000.0}


def run(**over):
    return {**BASE, **over}


def assert_error_shape(body: dict, code: str) -> None:
    assert set(body) == {"error"}
    assert body["error"]["code"] == code
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert isinstance(body["error"]["details"], list)


def test_single_run_derives_fields(client):
    r = client.post("/api/v1/runs", json=run(run_key="a"))
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["world_size"] == 16 and body["dp"] == 8  # 16 GPUs / (tp 2 · pp 1 · cp 1)
    assert body["global_batch_tokens"] == 8 * 1 * 8 * 8192
    assert body["extra"]["derived_fields"] == ["dp", "global_batch_tokens", "world_size"]
    # without pp and cp, dp is not determined: NULL, and so is what rests on it
    loose = client.post("/api/v1/runs", json={k: v for k, v in run(run_key="b").items() if k not in ("pp", "cp")})
    assert loose.status_code == 201, loose.text
    assert [loose.json()[k] for k in ("dp", "pp", "cp", "ep", "global_batch_tokens")] == [None] * 5
    assert body["gpu_type"] == "H100-SXM-80GB" and body["extra"]["gpu_type_reported"] == "H100 80GB HBM3"
    assert body["model_size_class"] == 8.0
    expected = (6 * 8_030_261_248 + 12 * 32 * 4096 * 8192) * 4000.0 / 989e12  # PaLM appendix B
    assert math.isclose(body["mfu_derived"], expected, rel_tol=1e-9)
    assert body["mfu_method"] == "6N+12Lhs" and body["peak_tflops"] == 989.0
    assert client.get(f"/api/v1/runs/{body['id']}").json()["run_key"] == "a"


def test_idempotency_same_content_200_different_409(client):
    first = client.post("/api/v1/runs", json=run(run_key="k"))
    again = client.post("/api/v1/runs", json=run(run_key="k"))
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json()["id"] == first.json()["id"]
    conflict = client.post("/api/v1/runs", json=run(run_key="k", tokens_per_sec_per_gpu=4001.0))
    assert conflict.status_code == 409
    assert_error_shape(conflict.json(), "conflict")
    assert conflict.json()["error"]["details"][0]["value"] == "k"
    assert client.get("/api/v1/runs").json()["total"] == 1


def test_prefer_return_minimal_answers_ids_in_request_order(client):
    minimal = {"Prefer": "return=minimal"}
    first = client.post("/api/v1/runs", json=run(run_key="m0"), headers=minimal)
    assert first.status_code == 201 and first.headers["preference-applied"] == "return=minimal"
    (m0,) = first.json()["ids"]
    assert first.json() == {"ids": [m0], "created": 1, "existing": 0}
    batch = {"runs": [run(run_key="m1", nodes=4), run(run_key="m0"), run(run_key="m2", nodes=8)]}
    answer = client.post("/api/v1/runs", json=batch, headers={"Prefer": 'handling=strict, return="minimal"'})
    assert answer.status_code == 201 and set(answer.json()) == {"ids", "created", "existing"}
    ids = answer.json()["ids"]
    assert (answer.json()["created"], answer.json()["existing"], ids[1]) == (2, 1, m0)
    assert [client.get(f"/api/v1/runs/{i}").json()["run_key"] for i in ids] == ["m1", "m0", "m2"]
    assert client.get(f"/api/v1/runs/{ids[2]}").json()["world_size"] == 64  # derived as without the header
    full = client.post("/api/v1/runs", json=batch, headers={"Prefer": "return=representation"})
    assert full.status_code == 200 and [r["id"] for r in full.json()["runs"]] == ids
    assert "preference-applied" not in full.headers
    conflict = client.post("/api/v1/runs", json=run(run_key="m0", nodes=16), headers=minimal)
    assert conflict.status_code == 409  # errors keep the one error shape
    assert_error_shape(conflict.json(), "conflict")


def test_server_assigns_run_key(client):
    a = client.post("/api/v1/runs", json=run()).json()
    b = client.post("/api/v1/runs", json=run()).json()
    assert a["run_key"] and b["run_key"] and a["run_key"] != b["run_key"]


@pytest.mark.parametrize("bad, field, value", [
    ({"dp": 3}, "dp", 3),                                   # tp·pp·cp·dp = 6 != 16
    ({"mfu": 1.5}, "mfu", 1.5),
    ({"tokens_per_sec_per_gpu": -1.0}, "tokens_per_sec_per_gpu", -1.0),
    ({"status": "exploded"}, "status", "exploded"),
    ({"recompute": "sometimes"}, "recompute", "sometimes"),
    ({"zero_stage": 4}, "zero_stage", 4),
    ({"nodes": "two"}, "nodes", "two"),
    ({"tokens_per_second": 5.0}, "tokens_per_second", 5.0),  # unknown field
    ({"ep": 3}, "ep", 3),                                   # 3 does not divide dp·cp·tp = 16
    ({"world_size": 64}, "world_size", 64),                 # 2 nodes × 8 GPUs cannot hold 64
    ({"tokens_per_sec_per_gpu": 1e9}, "tokens_per_sec_per_gpu", 1e9),  # derived MFU > 1
])
def test_validation_names_field_and_value(client, bad, field, value):
    r = client.post("/api/v1/runs", json=run(**bad))
    assert r.status_code == 422, r.text
    body = r.json()
    assert_error_shape(body, "validation_error")
    fields = {d["field"]: d for d in body["error"]["details"]}
    assert field in fields, body
    assert fields[field]["value"] == value
    assert field in fields[field]["message"] or str(value) in fields[field]["message"]
    assert client.get("/api/v1/runs").json()["total"] == 0


def test_nan_and_infinity_rejected(client):
    for literal in (b"NaN", b"Infinity", b"-Infinity"):
        body = b'{"status": "success", "tokens_per_sec_per_gpu": ' + literal + b"}"
        r = client.post("/api/v1/runs", content=body, headers={"content-type": "application/json"})
        assert r.status_code == 422
        assert r.json()["error"]["details"][0]["field"] == "tokens_per_sec_per_gpu"
    assert client.get("/api/v1/runs").json()["total"] == 0


def test_batch_all_or_nothing_reports_every_bad_index(client):
    batch = [run(run_key=f"r{i}") for i in range(5)]
    batch[1]["dp"] = 5
    batch[3]["mfu"] = 2.0
    r = client.post("/api/v1/runs", json={"runs": batch})
    assert r.status_code == 422
    assert sorted({d["index"] for d in r.json()["error"]["details"]}) == [1, 3]
    assert client.get("/api/v1/runs").json()["total"] == 0
    ok = client.post("/api/v1/runs", json={"runs": [b for i, b in enumerate(batch) if i not in (1, 3)]})
    assert ok.status_code == 201 and ok.json()["created"] == 3
    replay = client.post("/api/v1/runs", json={"runs": [b for i, b in enumerate(batch) if i not in (1, 3)]})
    assert replay.status_code == 200 and replay.json() == {**replay.json(), "created": 0, "existing": 3}
    assert [x["run_key"] for x in replay.json()["runs"]] == ["r0", "r2", "r4"]


def test_batch_limit_and_bad_bodies(client):
    too_many = client.post("/api/v1/runs", json={"runs": [run() for _ in range(1001)]})
    assert too_many.status_code == 413
    assert_error_shape(too_many.json(), "payload_too_large")
    not_json = client.post("/api/v1/runs", content=b"{nope", headers={"content-type": "application/json"})
    assert not_json.status_code == 400
    assert_error_shape(not_json.json(), "bad_request")
    a_list = client.post("/api/v1/runs", json=[run()])
    assert a_list.status_code == 400
    assert client.get("/api/v1/runs").json()["total"] == 0


def test_oversized_body_413(database):
    from fastapi.testclient import TestClient

    from service.api import create_app
    from service.settings import Settings

    with TestClient(create_app(database, Settings(max_body_bytes=10_000))) as c:
        r = c.post("/api/v1/runs", content=b"[" + b" " * 20_000 + b"]", headers={"content-type": "application/json"})
        assert r.status_code == 413
        assert_error_shape(r.json(), "payload_too_large")


def test_filters_and_cursor_pagination(client):
    runs = [run(run_key=f"p{i}", nodes=1 + i % 3, tokens_per_sec_per_gpu=1000.0 + i,
                status="success" if i % 5 else "oom") for i in range(60)]
    assert client.post("/api/v1/runs", json={"runs": runs}).status_code == 201
    expected = sorted((r for r in runs if r["nodes"] == 2 and r["status"] == "success"),
                      key=lambda r: -r["tokens_per_sec_per_gpu"])
    seen, cursor = [], None
    while True:
        params = {"nodes": 2, "status": "success", "sort": "-tokens_per_sec_per_gpu", "limit": 7}
        if cursor:
            params["cursor"] = cursor
        page = client.get("/api/v1/runs", params=params).json()
        assert page["total"] == len(expected)
        seen += [r["run_key"] for r in page["runs"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == [r["run_key"] for r in expected]
    assert client.get("/api/v1/runs", params={"gpu_type": "h100_80gb"}).json()["total"] == 60
    bad = client.get("/api/v1/runs", params={"sort": "password"})
    assert bad.status_code == 400 and bad.json()["error"]["details"][0]["field"] == "sort"
    assert client.get("/api/v1/runs", params={"cursor": "garbage"}).status_code == 400
    missing = client.get("/api/v1/runs/999999")
    assert missing.status_code == 404
    assert_error_shape(missing.json(), "not_found")


def test_health(client, backend):
    body = client.get("/api/v1/health").json()
    assert body["status"] == "ok" and body["backend"] == backend and body["schema_revision"]
