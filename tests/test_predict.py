"""POST /api/v1/predict and `scalebook predict` on the shipped nanotron sample (the Ultra-Scale
Playbook sweep, 1.34B, 1-4 H100 nodes), on both backends. Expected figures come from the CSV with
the csv module, not from our code."""

from __future__ import annotations

import csv
import json

import pytest
from conftest import playbook_sample, post_records
from typer.testing import CliRunner


def sample_rows(data_dir) -> list[dict]:
    with open(data_dir / "nanotron" / "bench_sample.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def csv_config(r: dict) -> dict:
    return {"dp": int(r["dp"]), "tp": int(r["tp"]), "pp": int(r["pp"]), "zero_stage": int(r["zero_stage"]),
            "micro_batch_size": int(r["mbs"]), "grad_accum_steps": int(float(r["batch_accum"]))}


def best_row(data_dir, nodes: int) -> dict:
    ok = [r for r in sample_rows(data_dir) if r["status"] == "Success" and int(float(r["nodes"])) == nodes]
    return max(ok, key=lambda r: float(r["tok/s/gpu"]))


def test_predict_a_configuration_nobody_ran(nanotron_client, data_dir):
    """8 nodes: the sample stops at 4. The answer is a prediction with its interval, the recorded runs
    of the layout it rests on, and says it extrapolates in node count."""
    body = {"model_params": "1.34B", "nodes": 8, "gpu_type": "H100", "dp": 16, "tp": 4, "pp": 1,
            "micro_batch_size": 1, "grad_accum_steps": 16, "zero_stage": 1}
    r = nanotron_client.post("/api/v1/predict", json=body)
    assert r.status_code == 200, r.text
    a = r.json()
    p = a["predicted"]
    lo, hi = p["interval"]
    assert lo < p["tokens_per_sec_per_gpu"] < hi and 0 < p["mfu"] < 1
    assert a["global_batch_tokens"] == 16 * 1 * 16 * 4096 and a["measured"] is None
    # the step's terms add up to the step, and the step to the throughput: tokens per GPU per step / s
    assert sum(p["breakdown_s"].values()) == pytest.approx(p["step_time_s"], rel=1e-6)
    assert p["tokens_per_sec_per_gpu"] == pytest.approx(1_048_576 / 64 / p["step_time_s"], rel=1e-6)
    # evidence: recorded TP4 PP1 runs of the sample (the same layout), at 1-4 nodes
    tp4 = {int(float(x["nodes"])) for x in sample_rows(data_dir)
           if x["status"] == "Success" and x["tp"] == "4" and x["pp"] == "1"}
    assert a["evidence"] and all(e["config"]["tp"] == 4 and e["config"]["pp"] == 1 for e in a["evidence"])
    assert {e["nodes"] for e in a["evidence"]} <= tp4 and all(e["distance"] > 0 for e in a["evidence"])
    assert a["model"]["status"] == "fitted" and a["model"]["extrapolates"] is True
    assert any("8 nodes" in why and "1–4" in why for why in a["model"]["extrapolation"]), a["model"]
    assert a["fits"] is a["memory"]["fits"] and a["memory"]["predicted_peak_memory_gib"] > 0
    assert a["target"]["seq_len"] == 4096 and any("seq_len not given" in n for n in a["notes"])


def test_predict_a_recorded_configuration_shows_the_measurement(nanotron_client, data_dir):
    row = best_row(data_dir, 2)
    cfg = csv_config(row)
    a = nanotron_client.post("/api/v1/predict", json={"model_params": "1.34B", "nodes": 2, "gpu_type": "H100",
                                                      "seq_len": 4096, **cfg}).json()
    same = [float(x["tok/s/gpu"]) for x in sample_rows(data_dir)
            if x["status"] == "Success" and int(float(x["nodes"])) == 2 and csv_config(x) == cfg]
    assert a["measured"]["tokens_per_sec_per_gpu"] == pytest.approx(max(same))
    assert a["measured"]["n_runs"] == len(same) and a["fits"] is True
    assert a["config"] == {**cfg, "cp": 1, "ep": 1, "recompute": "none"}
    # beside the prediction, which rests on that very run (distance 0) and is anchored on it
    assert a["evidence"][0]["distance"] == 0 and a["evidence"][0]["run_id"] == a["measured"]["run_id"]
    assert abs(a["predicted"]["tokens_per_sec_per_gpu"] / max(same) - 1) < 0.1


def test_a_layout_recorded_with_another_zero_stage_is_pointed_out(nanotron_client, data_dir):
    """Left out, the ZeRO stage is taken as 0; when the layout ran on the target with another stage
    (the sample's best 2-node run), the answer is not a bare "not run": a note names that run."""
    row = best_row(data_dir, 2)
    cfg = csv_config(row)
    stage = cfg.pop("zero_stage")
    assert stage != 0  # the CSV's best 2-node run is ZeRO-1
    a = nanotron_client.post("/api/v1/predict", json={"model_params": "1.34B", "nodes": 2, "gpu_type": "H100",
                                                      "seq_len": 4096, **cfg}).json()
    same = [float(x["tok/s/gpu"]) for x in sample_rows(data_dir) if x["status"] == "Success"
            and int(float(x["nodes"])) == 2 and csv_config(x) == {**cfg, "zero_stage": stage}]
    note = next(n for n in a["notes"] if n.startswith("this layout ran on the target with"))
    assert a["measured"] is None and f"zero_stage={stage}" in note and f"{max(same):,.0f} tokens/s" in note
    said = nanotron_client.post("/api/v1/predict", json={"model_params": "1.34B", "nodes": 2, "gpu_type": "H100",
                                                         "seq_len": 4096, **cfg, "zero_stage": stage}).json()
    assert said["measured"]["tokens_per_sec_per_gpu"] == pytest.approx(max(same))
    assert not any(n.startswith("this layout ran on the target with") for n in said["notes"])


@pytest.mark.parametrize(("change", "field"), [
    ({"dp": 4}, "dp"),                                           # 4·2·1·1 = 8 != 16 GPUs
    ({"nodes": 1, "gpus_per_node": 6, "dp": 2, "tp": 3, "num_heads": 16}, "tp"),  # 16 heads over TP 3
    ({"pp": 2, "dp": 4, "num_layers": 1}, "pp"),                 # a stage holds at least one layer
    ({"grad_accum_steps": None, "global_batch_tokens": 1_000_000}, "global_batch_tokens"),  # not whole
    ({"grad_accum_steps": None}, "grad_accum_steps"),            # no batch at all
    ({"gpu_type": "Z999"}, "gpu_type"),                          # not in the catalog
    ({"gpu_type": "A100", "precision": "fp8"}, "precision"),     # no fp8 peak on A100
    ({"cp": 3, "dp": 1, "tp": 1, "nodes": 1, "gpus_per_node": 3}, "cp"),  # 4096 tokens over CP 3
    ({"tp_size": 2}, "tp_size"),                                 # not a run-record field
])
def test_an_impossible_configuration_is_a_422_naming_the_field(nanotron_client, change, field):
    body = {"model_params": "1.34B", "nodes": 2, "gpu_type": "H100", "seq_len": 4096, "dp": 8, "tp": 2,
            "micro_batch_size": 1, "grad_accum_steps": 8}
    body.update(change)
    r = nanotron_client.post("/api/v1/predict", json={k: v for k, v in body.items() if v is not None})
    assert r.status_code == 422, r.text
    err = r.json()["error"]
    assert field in {d.get("field") for d in err["details"]} or field in err["message"], err


def test_predict_costs_the_dims_and_framework_given(nanotron_client):
    """Dims given are the model costed (no inference note); an unrecorded framework falls back to
    the prior and says so; GPT's two-matrix MLP is accepted and passed on."""
    base = {"model_params": "1.34B", "nodes": 2, "gpu_type": "H100", "seq_len": 4096, "dp": 8, "tp": 2,
            "micro_batch_size": 1, "grad_accum_steps": 8}
    dims = {"num_layers": 16, "hidden_size": 2048, "num_heads": 32, "num_kv_heads": 32, "ffn_hidden_size": 8192,
            "vocab_size": 131072, "gated_linear_unit": True}
    a = nanotron_client.post("/api/v1/predict", json={**base, **dims}).json()
    assert {k: a["target"][k] for k in dims} == dims
    assert not any("inferred" in n for n in a["notes"]), a["notes"]
    other = nanotron_client.post("/api/v1/predict", json={**base, **dims, "framework": "megatron-lm"}).json()
    assert other["model"]["status"] == "prior" and other["model"]["extrapolates"] is True
    assert any("megatron-lm" in n for n in other["notes"])
    nano = nanotron_client.post("/api/v1/predict", json={**base, **dims, "framework": "NANOTRON"}).json()
    assert nano["target"]["framework"] == "nanotron"


def test_predict_cli_at_80_columns(live_api, data_dir, monkeypatch):
    import httpx

    from service.cli import app

    with httpx.Client(base_url=live_api, timeout=120) as http:
        post_records(http, playbook_sample(data_dir).records)
    monkeypatch.setenv("COLUMNS", "80")
    runner = CliRunner()
    row = best_row(data_dir, 4)
    cfg = csv_config(row)
    args = ["predict", "--model", "1.34B", "--nodes", "4", "--gpu-type", "H100", "--dp", str(cfg["dp"]),
            "--tp", str(cfg["tp"]), "--pp", str(cfg["pp"]), "--zero-stage", str(cfg["zero_stage"]),
            "--micro-batch-size", str(cfg["micro_batch_size"]), "--grad-accum-steps", str(cfg["grad_accum_steps"])]
    out = runner.invoke(app, args)
    assert out.exit_code == 0, out.output
    assert max(len(line) for line in out.output.splitlines()) <= 80
    assert f"measured on this target: {float(row['tok/s/gpu']):,.0f} tok/s/GPU" in out.output
    assert "step time" in out.output and "compute" in out.output and "█" in out.output
    js = runner.invoke(app, [*args, "--json"])
    assert js.exit_code == 0
    assert json.loads(js.output)["measured"]["tokens_per_sec_per_gpu"] == pytest.approx(float(row["tok/s/gpu"]))
    unrun = runner.invoke(app, ["predict", "--model", "1.34B", "--nodes", "8", "--gpu-type", "H100", "--dp", "16",
                                "--tp", "4", "--micro-batch-size", "1", "--grad-accum-steps", "16"])
    assert unrun.exit_code == 0, unrun.output
    assert "measured on this target: not run" in unrun.output and "extrapolates" in unrun.output
    bad = runner.invoke(app, ["predict", "--model", "1.34B", "--nodes", "2", "--dp", "3", "--tp", "2",
                              "--grad-accum-steps", "4"])
    assert bad.exit_code == 1 and "world_size" in bad.output


def test_inferred_dims_do_not_rule_a_layout_out(nanotron_client):
    """A 469B model named by its size alone: the inferred dims are a guess, so a TP they do not divide is
    costed with a note asking for the model's dims (as /recommend's layouts are not constrained by
    them); the same TP against dims the question gives is a 422 naming tp."""
    body = {"model_params": "469B", "nodes": 32, "gpu_type": "H100", "seq_len": 4096, "dp": 1, "tp": 16,
            "pp": 16, "micro_batch_size": 1, "grad_accum_steps": 256}
    r = nanotron_client.post("/api/v1/predict", json=body)
    assert r.status_code == 200, r.text
    assert any("inferred from model_params" in n and "tp 16" in n for n in r.json()["notes"]), r.json()["notes"]
    given = nanotron_client.post("/api/v1/predict", json={**body, "num_heads": 136, "hidden_size": 17408,
                                                          "num_layers": 128})
    assert given.status_code == 422 and given.json()["error"]["details"][0]["field"] == "tp", given.text
