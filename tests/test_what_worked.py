""""What worked?" answers the question asked: first the runs measured on the target (the heatmap's
cell: the size family, nodes, GPU type and sequence length; every framework and precision), then
predictions for the layouts not run there. On the shipped data (examples/data: the nanotron sample
and the published tables, as `scalebook up` loads them) and on the Ultra-Scale sweep's 8.86B runs
(tests/data/nanotron), on both backends. Expected values are read from the CSV files with the csv
module."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest
from conftest import REPO, playbook_sample, post_records
from typer.testing import CliRunner

from core.families import group_cells

PUBLISHED = REPO / "examples" / "data" / "published"
SWEEP_8B = REPO / "tests" / "data" / "nanotron" / "bench_8.86b_1_and_8_nodes.csv"


def shipped_records(data_dir: Path) -> list[dict]:
    """What `scalebook up` imports: the nanotron sample (H100) and every published table."""
    from ingest.parsers import table

    records = list(playbook_sample(data_dir).records)
    for path in sorted(PUBLISHED.glob("*.csv")):
        records += table.parse_file(path).records
    return records


def sweep_records() -> list[dict]:
    from ingest.parsers import nanotron

    return nanotron.parse_file(SWEEP_8B, gpu_type=nanotron.PLAYBOOK_GPU_TYPE).records


@pytest.fixture
def shipped(client, data_dir):
    post_records(client, shipped_records(data_dir))
    return client


def published_row(file: str, model: str, gpus: int) -> dict:
    with open(PUBLISHED / file, newline="") as fh:
        return next(r for r in csv.DictReader(fh) if r["model"] == model and int(r["num_gpus"]) == gpus)


def recommend(client, **params) -> dict:
    r = client.get("/api/v1/recommend", params=params)
    assert r.status_code == 200, r.text
    return r.json()


def config_key(c: dict) -> tuple:
    return tuple(c.get(f) or 0 for f in ("dp", "tp", "pp", "zero_stage", "micro_batch_size", "grad_accum_steps"))


@pytest.mark.parametrize("seq_len", [None, 4096])
def test_8b_on_8_h100_nodes_starts_with_the_heatmaps_cell(shipped, seq_len):
    """The heatmap's 7–8B × 8 cell on the H100 × 4,096 slice is NeMo's Nemotron-8B run (DP32 TP2,
    12,507 tokens/s/GPU): the answer lists it first, as measured, labelled fp8 / NeMo."""
    params = {"model_params": "8B", "nodes": 8, "gpu_type": "H100", "k": 5}
    body = recommend(shipped, **params, **({"seq_len": seq_len} if seq_len else {}))
    row = published_row("nemo_24_07_performance_summary.csv", "Nemotron-8B", 64)
    first = body["measured_on_target"][0]
    assert first["model_name"] == "Nemotron-8B"
    assert first["tokens_per_sec_per_gpu"] == float(row["tokens_per_sec_per_gpu"])
    assert first["label"] == "8B · NeMo 24.07 (Megatron-Core) · fp8"
    assert (first["config"]["dp"], first["config"]["tp"]) == (32, int(row["tp"]))
    # the very run the heatmap shows for that cell
    cells = shipped.get("/api/v1/heatmap", params={"gpu_type": "H100", "seq_len": 4096}).json()["cells"]
    cell = next(c for c in group_cells(cells) if c["family"] == "7–8B" and c["nodes"] == 8)
    assert cell["best"]["id"] == first["run_id"]
    assert body["target"]["seq_len"] == 4096 and body["cell"]["size"] == "the heatmap's 7–8B row"
    # the GPT3-5B run at 2,048 tokens is the same family and nodes, at another sequence length: counted, not listed
    assert body["cell"]["success_at_other_seq_len"].get("2048") == 1
    assert all(m["seq_len"] == 4096 for m in body["measured_on_target"])
    if seq_len is None:
        assert any(n.startswith("seq_len not given: 4096") for n in body["notes"])
    # predictions follow, for layouts not run there; the model they cost is the measured run's
    assert body["target"]["model_params"] == 8_000_000_000 and body["candidates"]
    assert all(c["origin"] == "predicted" for c in body["candidates"])
    if first["memory"] and first["memory"]["disagrees"]:
        assert any(f"run #{first['run_id']}" in n and "the record wins" in n for n in body["notes"])


def test_70b_on_2_h100_nodes_lists_the_recorded_run(shipped):
    """No layout is predicted to fit 70B on 16 H100s, yet NeMo's LLAMA2-70B run (TP4 PP4) ran there:
    the record is listed, and where the memory model disagrees the answer says the record wins."""
    body = recommend(shipped, model_params="70B", nodes=2, gpu_type="H100", seq_len=4096)
    row = published_row("nemo_24_07_performance_summary.csv", "LLAMA2-70B", 16)
    ran = [m for m in body["measured_on_target"] if m["model_name"] == "LLAMA2-70B"]
    assert ran and ran[0]["tokens_per_sec_per_gpu"] == float(row["tokens_per_sec_per_gpu"])
    assert (ran[0]["config"]["tp"], ran[0]["config"]["pp"]) == (int(row["tp"]), int(row["pp"]))
    mem = ran[0]["memory"]
    assert mem is not None and mem["predicted_peak_memory_gib"] > 0
    if mem["disagrees"]:  # the memory model says it does not fit: the record wins, and the answer says so
        assert any(f"run #{ran[0]['run_id']}" in n and "the record wins" in n for n in body["notes"]), body["notes"]
    elif mem["fits_with"]:  # it fits only with a ZeRO stage / recompute the run does not record: said so
        assert mem["fits"] is None
        assert any(f"run #{ran[0]['run_id']}" in n and mem["fits_with"] in n for n in body["notes"]), body["notes"]
    else:
        assert mem["fits"] is True and not any("the record wins" in n for n in body["notes"])
    if not body["candidates"]:
        assert any("listed first: the record wins" in n for n in body["notes"])


@pytest.mark.parametrize("nodes", [1, 8])
def test_8b_on_the_sweep_lists_the_886b_models_best_of_the_cell_first(shipped, nodes):
    """With the Ultra-Scale sweep's 8.86B runs imported, "8B on 1 node" and "8B on 8 nodes" (the
    heatmap's 8B row holds the 8.86B model) start with that model's recorded best of the cell —
    before the published fp8 runs of other 7–8B models — and predict on its recorded dims."""
    stored, rejected = post_records(shipped, sweep_records())
    assert stored > 0 and not rejected
    with open(SWEEP_8B, newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if int(float(r["nodes"])) == nodes]
    ok = [r for r in rows if r["status"] == "Success"]
    best = max(ok, key=lambda r: float(r["tok/s/gpu"]))
    body = recommend(shipped, model_params="8B", nodes=nodes, gpu_type="H100")
    first = body["measured_on_target"][0]
    assert first["model_params"] == 8_860_000_000 and first["label"] == "8.86B · nanotron · bf16"
    assert first["tokens_per_sec_per_gpu"] == pytest.approx(float(best["tok/s/gpu"]))
    assert config_key(first["config"]) == (int(best["dp"]), int(best["tp"]), int(best["pp"]), int(best["zero_stage"]),
                                           int(best["mbs"]), int(float(best["batch_accum"])))
    # costed on the recorded model's dims, not on dims invented for 8.0·10⁹ parameters
    t = body["target"]
    assert (t["model_params"], t["num_layers"], t["hidden_size"]) == (
        8_860_000_000, int(best["num_layers"]), int(best["hidden_size"]))
    assert t["framework"] == "nanotron" and t["precision"] == "bf16"
    ran = {config_key({"dp": int(r["dp"]), "tp": int(r["tp"]), "pp": int(r["pp"]), "zero_stage": int(r["zero_stage"]),
                       "micro_batch_size": int(r["mbs"]), "grad_accum_steps": int(float(r["batch_accum"]))})
           for r in rows}
    assert body["candidates"] and not any(config_key(c["config"]) in ran for c in body["candidates"])
    assert body["cell"]["n_oom"] == sum(r["status"] == "OOM" for r in rows)


def test_an_exact_size_dims_and_a_precision_say_what_the_user_means(shipped):
    post_records(shipped, sweep_records())
    with open(SWEEP_8B, newline="") as fh:
        configs = {(r["dp"], r["tp"], r["pp"], r["zero_stage"], r["mbs"], r["batch_accum"]) for r in csv.DictReader(fh)
                   if r["status"] == "Success" and int(float(r["nodes"])) == 8}
    family = recommend(shipped, model_params="8B", nodes=8, gpu_type="H100", k=50)
    assert family["cell"]["n_configurations"] == len(configs) + 1  # and Nemotron-8B
    # a precise size names one size class (8.00B: three significant figures)
    exact = recommend(shipped, model_params="8.00B", nodes=8, gpu_type="H100", k=50)
    assert exact["cell"]["size"] == "size class 8B"
    assert {m["model_size_class"] for m in exact["measured_on_target"]} == {8.0}
    # dims that the 8.86B model's runs contradict leave them out; the dims given are the ones costed
    dims = recommend(shipped, model_params="8B", nodes=8, gpu_type="H100", hidden_size=4352, num_layers=34, k=50)
    assert 8.9 not in {m["model_size_class"] for m in dims["measured_on_target"]}
    assert (dims["target"]["hidden_size"], dims["target"]["num_layers"]) == (4352, 34)
    # fp8 asked: the fp8 runs first (Nemotron-8B), the answer costed in fp8, on the framework named
    fp8 = recommend(shipped, model_params="8B", nodes=8, gpu_type="H100", precision="fp8", framework="nanotron")
    assert fp8["measured_on_target"][0]["model_name"] == "Nemotron-8B"
    assert fp8["target"]["precision"] == "fp8" and fp8["target"]["framework"] == "nanotron"
    assert any("in fp8 is recorded" in n for n in fp8["notes"]), fp8["notes"]
    # a precision the GPU has no peak for is refused, naming the field
    bad = shipped.get("/api/v1/recommend", params={"model_params": "8B", "nodes": 8, "gpu_type": "A100",
                                                   "precision": "fp8"})
    assert bad.status_code == 400 and bad.json()["error"]["details"][0]["field"] == "precision"
    # /suggest takes the same parameters
    sg = shipped.get("/api/v1/suggest", params={"model_params": "8B", "nodes": 8, "gpu_type": "H100",
                                                "framework": "nanotron", "num_layers": 32, "hidden_size": 4096})
    assert sg.status_code == 200 and sg.json()["target"]["framework"] == "nanotron"
    assert sg.json()["target"]["hidden_size"] == 4096


def test_recommend_cli_starts_with_what_was_measured_at_80_columns(live_api, data_dir, monkeypatch):
    import httpx

    from service.cli import app

    with httpx.Client(base_url=live_api, timeout=120) as http:
        post_records(http, shipped_records(data_dir))
        nemotron = http.get("/api/v1/runs", params={"model_name": "Nemotron-8B", "nodes": 8}).json()["runs"][0]
    monkeypatch.setenv("COLUMNS", "80")
    out = CliRunner().invoke(app, ["recommend", "--model", "8B", "--nodes", "8", "--gpu-type", "H100"])
    assert out.exit_code == 0, out.output
    assert max(len(line) for line in out.output.splitlines()) <= 80, out.output
    text = out.output
    measured_at = text.index("measured on this target")
    assert text.index(f"#{nemotron['id']}") > measured_at and "12,507" in text
    assert text.index("predicted for layouts not run here") > text.index(f"#{nemotron['id']}")


def test_a_run_that_leaves_out_zero_and_recompute_is_not_called_a_disagreement():
    """NeMo's 8B fp8 run on 8 H100 nodes (DP32 TP2 MBS4, as published: no ZeRO stage, no recompute)
    does not fit at ZeRO-0 without recompute, what the memory model takes for unrecorded fields: the
    verdict names the least memory-saving setting of those fields under which it fits, and does not
    call the record wrong; recorded as ZeRO-0 with no recompute, the same run is a disagreement."""
    from service.analytics.memory import estimate_memory
    from service.analytics.on_target import memory_verdict

    run = {"model_name": "llama3-8b", "model_params": 8_030_000_000, "num_layers": 32, "hidden_size": 4096,
           "num_heads": 32, "num_kv_heads": 8, "ffn_hidden_size": 14336, "vocab_size": 128256,
           "gated_linear_unit": True, "seq_len": 4096, "gpu_type": "H100-SXM-80GB", "gpus_per_node": 8,
           "nodes": 8, "dp": 32, "tp": 2, "pp": 1, "cp": 1, "ep": 1, "micro_batch_size": 4,
           "grad_accum_steps": None, "zero_stage": None, "recompute": None, "precision": "fp8",
           "framework": "nemo", "status": "success"}
    plain = estimate_memory({**run, "zero_stage": 0, "recompute": "none"})
    assert plain.fits is False  # the premise: as taken, it does not fit
    mem = memory_verdict(run)
    assert mem is not None and mem["disagrees"] is False and mem["fits"] is None and mem["fits_with"]
    setting = {"zero_stage": 1 if "ZeRO-1" in mem["fits_with"] else 3 if "ZeRO-3" in mem["fits_with"] else None,
               "recompute": next((m for m in ("selective", "full") if m in mem["fits_with"]), None)}
    assert estimate_memory({**run, **{k: v for k, v in setting.items() if v is not None}}).fits is True
    # without data parallelism ZeRO shards nothing: it is never the setting named
    alone = memory_verdict({**run, "dp": 1, "nodes": 1, "gpus_per_node": 2})
    assert alone is not None and "ZeRO" not in (alone["fits_with"] or "")
    stated = memory_verdict({**run, "zero_stage": 0, "recompute": "none"})
    assert stated is not None and stated["disagrees"] is True and stated["fits_with"] is None
