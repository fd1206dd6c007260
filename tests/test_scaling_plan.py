"""GET /api/v1/scaling and /api/v1/plan (and their CLI commands) on both backends.

Expected values are computed here independently: best run per node count straight from the nanotron
CSV with the csv module, the Amdahl fit by a brute-force grid search (and scipy's curve_fit when
installed), MFU with the PaLM formula from the raw CSV cells, and the planner's arithmetic by hand."""

from __future__ import annotations

import csv
import json
import math

import numpy as np
import pytest
from conftest import playbook_sample
from typer.testing import CliRunner

from service.analytics.scaling import fit_amdahl

H100_BF16_PEAK = 989e12  # NVIDIA H100 SXM datasheet, dense BF16


def sample_rows(data_dir):
    with open(data_dir / "nanotron" / "bench_sample.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def expected_points(data_dir):
    """{nodes: best successful row by tok/s/gpu} (ties → the earlier row, as ids are in file order)."""
    best = {}
    for row in sample_rows(data_dir):
        n = int(float(row["nodes"]))
        if row["status"] == "Success" and (n not in best or float(row["tok/s/gpu"]) > float(best[n]["tok/s/gpu"])):
            best[n] = row
    return dict(sorted(best.items()))


def grid_fit(n_rel, speedup):
    """Amdahl's serial fraction by brute force: the RSS minimum over s ∈ [0, 1] on a 1e-7 grid near it."""
    n, y = np.asarray(n_rel, float), np.asarray(speedup, float)
    coarse = np.linspace(0.0, 1.0, 100_001)
    rss = ((y[None, :] - 1.0 / (coarse[:, None] + (1 - coarse[:, None]) / n[None, :])) ** 2).sum(axis=1)
    s0 = coarse[np.argmin(rss)]
    fine = np.linspace(max(0.0, s0 - 2e-5), min(1.0, s0 + 2e-5), 40_001)
    rss = ((y[None, :] - 1.0 / (fine[:, None] + (1 - fine[:, None]) / n[None, :])) ** 2).sum(axis=1)
    return float(fine[np.argmin(rss)]), float(rss.min())


def test_scaling_on_the_nanotron_sample_matches_the_csv(nanotron_client, data_dir):
    body = nanotron_client.get("/api/v1/scaling", params={"model_params": "1.34B"}).json()
    expected = expected_points(data_dir)
    assert body["model_size_class"] == 1.3 and body["metric"] == "tokens_per_sec_per_gpu"
    assert body["gpu_type"] == "H100-SXM-80GB" and body["seq_len"] == 4096
    assert [p["nodes"] for p in body["points"]] == list(expected)
    base = expected[min(expected)]
    base_tps, base_world = float(base["tok/s/gpu"]), int(base["dp"]) * int(base["tp"]) * int(base["pp"])
    n_rel, speedups = [], []
    for p, (nodes, row) in zip(body["points"], expected.items()):
        world = int(row["dp"]) * int(row["tp"]) * int(row["pp"])
        tps = float(row["tok/s/gpu"])
        assert p["world_size"] == world
        assert p["tokens_per_sec_per_gpu"] == pytest.approx(tps)
        assert p["aggregate_tokens_per_sec"] == pytest.approx(tps * world)
        assert p["efficiency"] == pytest.approx(tps / base_tps)
        assert p["speedup"] == pytest.approx(tps * world / (base_tps * base_world))
        run = nanotron_client.get(f"/api/v1/runs/{p['best_run_id']}").json()
        assert run["name"] == row["name"] and run["status"] == "success"
        assert (p["config"]["dp"], p["config"]["micro_batch_size"]) == (int(row["dp"]), int(row["mbs"]))
        n_rel.append(nodes / min(expected))
        speedups.append(tps * world / (base_tps * base_world))

    fit = body["amdahl"]
    s, rss = grid_fit(n_rel, speedups)
    assert fit["serial_fraction"] == pytest.approx(s, abs=2e-6)
    assert fit["n_points"] == 3 and fit["base_nodes"] == 1
    assert fit["max_speedup"] == pytest.approx(1 / s, rel=1e-3)
    assert fit["nodes_at_50pct_efficiency"] == pytest.approx(1 + 1 / s, rel=1e-3)
    y = np.asarray(speedups)
    assert fit["r2"] == pytest.approx(1 - rss / ((y - y.mean()) ** 2).sum(), abs=1e-6)
    jac = np.array([-(1 - 1 / n) / (s + (1 - s) / n) ** 2 for n in n_rel])
    assert fit["serial_fraction_stderr"] == pytest.approx(math.sqrt(rss / (3 - 2) / (jac ** 2).sum()), rel=1e-3)
    assert 0 < fit["serial_fraction"] < 0.2  # 1.3B on ≤ 4 nodes of H100 scales well, not perfectly


def test_fit_agrees_with_scipy_curve_fit():
    optimize = pytest.importorskip("scipy.optimize")
    n = np.array([1, 2, 4, 8, 16, 32], float)
    rng = np.random.default_rng(7)
    y = 1 / (0.03 + 0.97 / n) * (1 + rng.normal(0, 0.02, n.size))
    y[0] = 1.0
    ours = fit_amdahl(n, y)
    popt, pcov = optimize.curve_fit(lambda x, s: 1 / (s + (1 - s) / x), n, y, p0=[0.01], bounds=(0, 1))
    assert ours["serial_fraction"] == pytest.approx(popt[0], rel=1e-5)
    # curve_fit's dof is n − 1; ours n − 2 (the base point is pinned at 1 by normalisation)
    assert ours["serial_fraction_stderr"] == pytest.approx(math.sqrt(pcov[0, 0] * (n.size - 1) / (n.size - 2)),
                                                           rel=1e-3)


def synthetic_runs(s=0.05, base_tps=5000.0, nodes=(2, 4, 8, 16), model_params=8_030_261_248):
    """Best configs whose per-GPU throughput follows Amdahl exactly (efficiency 1/(s·n + 1 − s), n
    relative to 2 nodes), a worse config and a failed faster run at every node count."""
    runs = []
    for nn in nodes:
        rel = nn / nodes[0]
        tps = base_tps / (s * rel + 1 - s)
        common = {"model_name": "llama3-8b", "model_params": model_params, "seq_len": 8192, "gpu_type": "H100",
                  "gpus_per_node": 8, "nodes": nn, "precision": "bf16", "num_layers": 32, "hidden_size": 4096}
        runs.append({**common, "run_key": f"best-{nn}", "tp": 2, "zero_stage": 1, "micro_batch_size": 1,
                     "grad_accum_steps": 4, "status": "success", "tokens_per_sec_per_gpu": tps})
        runs.append({**common, "run_key": f"worse-{nn}", "tp": 4, "zero_stage": 1, "micro_batch_size": 1,
                     "grad_accum_steps": 4, "status": "success", "tokens_per_sec_per_gpu": tps * 0.8})
        runs.append({**common, "run_key": f"failed-{nn}", "tp": 1, "status": "failed",
                     "tokens_per_sec_per_gpu": tps * 1.5, "error_class": "collective_timeout"})
    return runs


def test_scaling_recovers_an_exact_amdahl_law(client):
    assert client.post("/api/v1/runs", json={"runs": synthetic_runs(s=0.05)}).status_code == 201
    for metric in ("tokens_per_sec_per_gpu", "mfu"):
        body = client.get("/api/v1/scaling", params={"model_params": "8B", "gpu_type": "h100", "metric": metric}).json()
        assert body["model_size_class"] == 8.0 and [p["nodes"] for p in body["points"]] == [2, 4, 8, 16]
        assert all(p["config"]["tp"] == 2 for p in body["points"])  # best success, not the failed/worse runs
        fit = body["amdahl"]
        assert fit["serial_fraction"] == pytest.approx(0.05, abs=1e-7)
        assert fit["r2"] == pytest.approx(1.0, abs=1e-9) and fit["serial_fraction_stderr"] < 1e-6
        assert fit["base_nodes"] == 2 and fit["max_speedup"] == pytest.approx(20.0, rel=1e-6)
        assert fit["nodes_at_50pct_efficiency"] == pytest.approx(2 * (1 + 1 / 0.05), rel=1e-6)  # 42 nodes
        for p in body["points"]:
            assert p["efficiency"] == pytest.approx(1 / (0.05 * p["nodes"] / 2 + 0.95))


def test_scaling_404_and_single_point(client):
    r = client.get("/api/v1/scaling", params={"model_params": "70B"})
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
    assert client.get("/api/v1/scaling", params={"model_params": "seventy"}).status_code == 400
    single = [{"model_params": 3_000_000_000, "nodes": 4, "gpus_per_node": 8, "tp": 1, "gpu_type": "H100",
               "status": "success", "tokens_per_sec_per_gpu": 9000.0, "run_key": "single"}]
    assert client.post("/api/v1/runs", json={"runs": single}).status_code == 201
    body = client.get("/api/v1/scaling", params={"model_params": "3B"}).json()
    assert len(body["points"]) == 1 and body["amdahl"] is None and "two" in body["amdahl_reason"]


def test_plan_smollm3_worked_example(client):
    params = {"model_params": "3B", "tokens": "11T", "days": 28, "peak_tflops": 720, "mfu": 0.30}
    body = client.get("/api/v1/plan", params=params).json()
    exact = 6 * 3e9 * 11e12 / (720e12 * 0.30 * 28 * 86400)  # = 378.9
    assert body["gpus_exact"] == pytest.approx(exact) and body["gpus"] == 379 == math.ceil(exact)
    # booked in whole nodes: 48 × 8 = 384 GPUs (SmolLM3 trained on 384 H100s), and their GPU-hours
    assert body["nodes"] == 48 and body["gpus_booked"] == 384 and body["gpu_hours"] == pytest.approx(384 * 24 * 28)
    assert body["flops_formula"] == "6·N" and body["total_flops"] == pytest.approx(6 * 3e9 * 11e12)
    assert body["mfu_source"] == "given" and body["peak_source"] == "given"
    assert body["tokens"] == 11 * 10**12 and body["model_params"] == 3 * 10**9
    for tokens in ("1.1e13", "11000000000000", "11,000B"):
        assert client.get("/api/v1/plan", params={**params, "tokens": tokens}).json()["gpus"] == 379


def test_plan_rejects_bad_inputs(client):
    base = {"model_params": "3B", "tokens": "11T", "days": 28, "peak_tflops": 720, "mfu": 0.3}
    for bad, status in [({"tokens": "lots"}, 400), ({"tokens": "-5"}, 400), ({"days": 0}, 422), ({"mfu": 1.5}, 422),
                        ({"model_params": "big"}, 400), ({"peak_tflops": -1}, 422)]:
        r = client.get("/api/v1/plan", params={**base, **bad})
        assert r.status_code == status, (bad, r.text)
        assert r.json()["error"]["message"]
    r = client.get("/api/v1/plan",
                   params={k: v for k, v in base.items() if k != "peak_tflops"} | {"gpu_type": "TPU-v9"})
    assert r.status_code == 400 and "catalog" in r.json()["error"]["message"]
    r = client.get("/api/v1/plan", params={k: v for k, v in base.items() if k != "mfu"} | {"gpu_type": "H100"})
    assert r.status_code == 400 and "mfu" in r.json()["error"]["message"]  # empty store: no recorded MFU


def test_plan_takes_mfu_from_the_models_prediction(nanotron_client):
    body = nanotron_client.get("/api/v1/plan", params={"model_params": "1.34B", "tokens": "100B", "days": 7,
                                                       "gpu_type": "H100"}).json()
    at = body["mfu_run"]["nodes"]
    # the planner's MFU is the model's prediction for its best configuration at that scale: /predict
    # answers the same for that configuration
    pred = nanotron_client.post("/api/v1/predict", json={
        "model_params": "1.34B", "nodes": at, "gpu_type": "H100", **body["mfu_run"]["config"]}).json()
    assert pred["global_batch_tokens"] == body["mfu_run"]["global_batch_tokens"]
    assert body["mfu"] == pytest.approx(pred["predicted"]["mfu"])
    assert body["mfu_source"].startswith("throughput model's prediction")
    assert body["peak_tflops"] == 989 and body["peak_source"].startswith("catalog: H100-SXM-80GB")
    # the GPUs that deliver the predicted tokens/s/GPU: the MFU counts 6N + 12·L·h·s FLOPs per token
    tps = pred["predicted"]["tokens_per_sec_per_gpu"]
    exact = 100e9 / (tps * 7 * 86400)
    assert body["gpus_exact"] == pytest.approx(exact)
    assert body["gpus"] == math.ceil(exact) and body["nodes"] == math.ceil(math.ceil(exact) / 8)
    assert body["total_flops"] > 6 * 1.34e9 * 100e9  # attention FLOPs counted, as in the MFU
    assert body["flops_formula"] == "6·N + 12·L·h·s" and body["total_flops"] == body["flops_per_token"] * 100e9
    assert body["mfu_run"]["evidence_run_ids"]
    # asked in fp8: the MFU is predicted in fp8 and planned against the fp8 peak (one precision for both)
    fp8 = nanotron_client.get("/api/v1/plan", params={"model_params": "1.34B", "tokens": "100B", "days": 7,
                                                      "gpu_type": "H100", "precision": "fp8"}).json()
    assert fp8["mfu_run"]["precision"] == "fp8" and fp8["peak_tflops"] == 1979
    # a framework the records do not hold is said, and the answer still comes (from the prior)
    other = nanotron_client.get("/api/v1/plan", params={"model_params": "1.34B", "tokens": "100B", "days": 7,
                                                        "gpu_type": "H100", "framework": "torchtitan",
                                                        "num_layers": 16, "hidden_size": 2048}).json()
    assert other["mfu_run"]["model"]["framework"] == "torchtitan" and other["mfu_run"]["model"]["status"] == "prior"


def test_scaling_and_plan_cli(live_api, data_dir):
    import httpx
    from conftest import post_records

    from service.cli import app

    with httpx.Client(base_url=live_api, timeout=120) as http:
        post_records(http, playbook_sample(data_dir).records)
        api_body = http.get("/api/v1/scaling", params={"model_params": "1.34B"}).json()
    runner = CliRunner()
    result = runner.invoke(app, ["scaling", "--model", "1.34B", "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == api_body
    result = runner.invoke(app, ["scaling", "--model", "1.34B"])
    assert result.exit_code == 0 and "Amdahl: serial fraction" in result.stdout
    result = runner.invoke(app, ["scaling", "--model", "70B"])
    assert result.exit_code == 1 and "404" in result.output

    args = ["plan", "--model", "3B", "--tokens", "11T", "--days", "28", "--peak-tflops", "720", "--mfu", "0.30"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["gpus"] == 379
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    text = " ".join(result.stdout.split())
    assert text.startswith("384 GPUs (48 nodes × 8) for 3B params on 11T tokens in 28 days")
    assert "379 GPUs' worth of compute (378.9 exactly)" in text
    assert "training FLOPs (6·N per token × tokens)" in text and "258,048 GPU-hours booked" in text


def test_plan_says_at_which_scale_its_mfu_was_predicted(nanotron_client):
    """Planned at a node count where no layout hits the batch exactly (3 nodes: 24 GPUs do not divide
    the sweep's 256 sequences), the MFU comes from the nearest count above that can be proposed, and
    the answer says so — never a note that claims the planned scale was costed."""
    params = {"model_params": "1.34B", "tokens": "100B", "days": 1.5, "gpu_type": "H100"}
    body = nanotron_client.get("/api/v1/plan", params=params).json()
    at, planned = body["mfu_run"]["nodes"], body["nodes"]
    gap = body["mfu_run"]["unpredictable"]
    assert planned == 3 and at > planned and gap["nodes"] == planned, body
    empty = nanotron_client.get("/api/v1/recommend", params={"model_params": "1.34B", "nodes": planned,
                                                             "gpu_type": "H100", "k": 1}).json()
    assert empty["candidates"] == []
    pred = nanotron_client.post("/api/v1/predict", json={
        "model_params": "1.34B", "nodes": at, "gpu_type": "H100", **body["mfu_run"]["config"]}).json()
    assert body["mfu"] == pytest.approx(pred["predicted"]["mfu"])
    note = next(n for n in body["notes"] if n.startswith("MFU predicted at"))
    assert f"predicted at {at} nodes" in note and f"planned {planned}" in note and "global batch" in note


def test_scaling_picks_the_slice_with_the_most_node_counts(client):
    """Issue 30 item 9: ten runs of 8B at one node count on one GPU type and length, one run at each of
    three node counts on another: the curve is the one with three points (the most-recorded slice has
    no curve), and the answer says which slice and why; the heatmap's slices list both."""
    base = {"model_params": 8_030_261_248, "gpus_per_node": 8, "tp": 1, "pp": 1, "status": "success",
            "precision": "bf16"}
    runs = [{**base, "run_key": f"long{i}", "nodes": 1, "dp": 8, "gpu_type": "H100-SXM-96GB-HBM2e",
             "seq_len": 131072, "tokens_per_sec_per_gpu": 1000.0 + i} for i in range(10)]
    runs += [{**base, "run_key": f"curve{n}", "nodes": n, "dp": 8 * n, "gpu_type": "H100-SXM-80GB", "seq_len": 8192,
              "tokens_per_sec_per_gpu": 9000.0 - 100 * n} for n in (1, 2, 4)]
    assert client.post("/api/v1/runs", json={"runs": runs}).status_code == 201
    body = client.get("/api/v1/scaling", params={"model_params": "8B"}).json()
    assert [p["nodes"] for p in body["points"]] == [1, 2, 4]
    assert (body["gpu_type"], body["seq_len"]) == ("H100-SXM-80GB", 8192)
    assert any("2 GPU type × sequence length slices; using H100-SXM-80GB at sequence length 8,192 (3 node counts, "
               "the most; 3 runs)" in n for n in body["notes"]), body["notes"]
    asked = client.get("/api/v1/scaling", params={"model_params": "8B", "gpu_type": "H100-SXM-96GB-HBM2e"}).json()
    assert [p["nodes"] for p in asked["points"]] == [1] and asked["seq_len"] == 131072
    by_runs = client.get("/api/v1/heatmap/slices").json()["slices"]
    assert [(s["gpu_type"], s["runs"], s["node_counts"]) for s in by_runs] == [
        ("H100-SXM-96GB-HBM2e", 10, 1), ("H100-SXM-80GB", 3, 3)]
    by_nodes = client.get("/api/v1/heatmap/slices", params={"most": "nodes"}).json()["slices"]
    assert by_nodes[0]["gpu_type"] == "H100-SXM-80GB"
