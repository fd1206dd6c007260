"""GET /api/v1/regressions and `scalebook regressions` on both backends, with synthetic histories.
Medians, MADs and robust z-scores are recomputed here with the statistics module."""

from __future__ import annotations

import json
import statistics
from datetime import datetime, timedelta

import pytest
from typer.testing import CliRunner

T0 = datetime(2026, 1, 1, 12, 0, 0)
CONFIG = {"model_name": "llama3-8b", "model_params": 8_030_261_248, "num_layers": 32, "hidden_size": 4096,
          "seq_len": 8192, "gpu_type": "H100-SXM-80GB", "gpus_per_node": 8, "nodes": 2, "tp": 1, "pp": 1,
          "zero_stage": 1, "micro_batch_size": 1, "grad_accum_steps": 8, "recompute": "selective",
          "precision": "bf16", "framework": "torchtitan", "framework_version": "0.2.0", "torch_version": "2.9.0",
          "cuda_version": "12.8", "nccl_version": "2.27.3"}
A_HISTORY = [1000.0, 1008.0, 993.0, 1005.0, 996.0, 1010.0, 990.0, 1002.0, 998.0, 1004.0]  # ≈ 1000 ± 1 %
B_HISTORY = [600.0, 604.0, 597.0, 603.0, 598.0, 606.0, 595.0, 601.0, 599.0, 602.0]


def run(key, value, day, **over):
    return {**CONFIG, "run_key": key, "started_at": (T0 + timedelta(days=day)).isoformat(),
            "status": "success", "tokens_per_sec_per_gpu": value, **over}


def post(client, runs):
    r = client.post("/api/v1/runs", json={"runs": runs})
    assert r.status_code == 201, r.text
    return {x["run_key"]: x for x in r.json()["runs"]}


def robust(x, history):
    med = statistics.median(history)
    mad = statistics.median([abs(h - med) for h in history])
    return med, mad, (x - med) / (1.4826 * mad) if mad else None


def test_drop_is_flagged_noise_is_not_and_fingerprints_stay_apart(client):
    runs = [run(f"a{i}", v, i) for i, v in enumerate(A_HISTORY)]
    runs += [run("a-drop", 800.0, 20), run("a-noise", 990.0, 21)]
    # fingerprint B: 4 nodes, same dates; mixed into A's history its runs would all look like drops
    runs += [run(f"b{i}", v, i, nodes=4) for i, v in enumerate(B_HISTORY)] + [run("b-noise", 590.0, 22, nodes=4)]
    runs.reverse()  # ids in the opposite order of started_at: history must follow started_at
    stored = post(client, runs)
    body = client.get("/api/v1/regressions").json()
    assert body["metric"] == "tokens_per_sec_per_gpu" and body["threshold"] == 3.5
    assert body["fingerprints_checked"] == 2
    assert body["runs_checked"] == (len(A_HISTORY) + 2 - 3) + (len(B_HISTORY) + 1 - 3)
    assert [f["run_id"] for f in body["flags"]] == [stored["a-drop"]["id"]]

    flag = body["flags"][0]
    med, mad, z = robust(800.0, A_HISTORY)
    assert flag["value"] == 800.0 and flag["n_history"] == len(A_HISTORY)
    assert flag["baseline_median"] == pytest.approx(med) and flag["mad"] == pytest.approx(mad)
    assert flag["z"] == pytest.approx(z) and flag["z"] < -3.5 and flag["method"] == "robust_z"
    assert flag["drop_pct"] == pytest.approx(100 * (med - 800) / med)
    assert flag["fingerprint"] == stored["a-drop"]["fingerprint"] != stored["b-noise"]["fingerprint"]
    assert sorted(flag["history_run_ids"]) == sorted(stored[f"a{i}"]["id"] for i in range(len(A_HISTORY)))
    assert flag["config"]["nodes"] == 2 and flag["config"]["nccl_version"] == "2.27.3"
    assert flag["started_at"].startswith("2026-01-21")
    # the 990 run against 11 earlier runs (800 included) is well inside the spread
    _, _, z_noise = robust(990.0, A_HISTORY + [800.0])
    assert z_noise > -3.5


def test_mad_zero_falls_back_to_a_relative_drop(client):
    runs = [run(f"c{i}", 1000.0, i, nodes=8) for i in range(5)]
    runs += [run("c-5pct", 950.0, 10, nodes=8), run("c-15pct", 850.0, 11, nodes=8)]
    stored = post(client, runs)
    flags = client.get("/api/v1/regressions").json()["flags"]
    assert [f["run_id"] for f in flags] == [stored["c-15pct"]["id"]]
    assert flags[0]["method"] == "relative_drop" and flags[0]["z"] is None and flags[0]["mad"] == 0
    assert flags[0]["drop_pct"] == pytest.approx(15.0) and flags[0]["baseline_median"] == 1000.0
    # a stricter fallback threshold also catches the 5 % drop
    flags = client.get("/api/v1/regressions", params={"min_drop": 0.04}).json()["flags"]
    assert {f["run_id"] for f in flags} == {stored["c-5pct"]["id"], stored["c-15pct"]["id"]}


def test_min_history_since_and_failures(client):
    runs = [run(f"d{i}", v, i, nodes=16) for i, v in enumerate([500.0, 505.0, 495.0])]
    runs += [run("d-drop", 300.0, 10, nodes=16),
             run("d-oom", 10.0, 11, nodes=16, status="oom", error_class="oom_gpu")]  # failures are not judged
    stored = post(client, runs)
    assert [f["run_id"] for f in client.get("/api/v1/regressions").json()["flags"]] == [stored["d-drop"]["id"]]
    body = client.get("/api/v1/regressions", params={"min_history": 4}).json()
    assert body["flags"] == [] and body["fingerprints_checked"] == 0  # 4 successes < min_history + 1
    since = (T0 + timedelta(days=10)).isoformat()
    assert len(client.get("/api/v1/regressions", params={"since": since}).json()["flags"]) == 1
    later = (T0 + timedelta(days=10, hours=1)).isoformat()
    assert client.get("/api/v1/regressions", params={"since": later}).json()["flags"] == []
    assert client.get("/api/v1/regressions", params={"threshold": 100}).json()["flags"] == []
    assert client.get("/api/v1/regressions", params={"metric": "step_time_s"}).status_code == 422
    assert client.get("/api/v1/regressions", params={"min_history": 1}).status_code == 422


def test_mfu_metric(client):
    runs = [run(f"e{i}", v, i, nodes=32) for i, v in enumerate(A_HISTORY)] + [run("e-drop", 700.0, 30, nodes=32)]
    stored = post(client, runs)
    flags = client.get("/api/v1/regressions", params={"metric": "mfu"}).json()["flags"]
    assert [f["run_id"] for f in flags] == [stored["e-drop"]["id"]]
    assert flags[0]["value"] == pytest.approx(stored["e-drop"]["mfu_derived"])  # MFU ∝ tokens/s here


def test_regressions_cli(live_api):
    import httpx

    from service.cli import app

    with httpx.Client(base_url=live_api, timeout=120) as http:
        runs = [run(f"f{i}", v, i, nodes=64) for i, v in enumerate(A_HISTORY)] + [run("f-drop", 800.0, 30, nodes=64)]
        assert http.post("/api/v1/runs", json={"runs": runs}).status_code == 201
    runner = CliRunner()
    result = runner.invoke(app, ["regressions", "--json"])
    assert result.exit_code == 0, result.output
    body = json.loads(result.stdout)
    assert len(body["flags"]) == 1 and body["flags"][0]["value"] == 800.0
    result = runner.invoke(app, ["regressions"])
    assert result.exit_code == 0 and "1 flagged" in result.stdout and "800" in result.stdout
    assert f"#{body['flags'][0]['run_id']}" in result.stdout
