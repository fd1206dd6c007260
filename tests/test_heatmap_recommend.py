"""Heatmap and recommendation on the imported nanotron sample, on both backends. Expected
answers are computed straight from the CSV with the csv module, not from our code."""

from __future__ import annotations

import csv
import json
from collections import defaultdict

import pytest
from conftest import playbook_sample


def sample_rows(data_dir):
    with open(data_dir / "nanotron" / "bench_sample.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def expected_cells(data_dir):
    """{nodes: (best successful row by tok/s/gpu, counts)} from the raw CSV."""
    cells = defaultdict(lambda: {"best": None, "Success": 0, "OOM": 0, "Other": 0})
    for row in sample_rows(data_dir):
        cell = cells[int(float(row["nodes"]))]
        cell[row["status"]] += 1
        if row["status"] == "Success" and (cell["best"] is None
                                           or float(row["tok/s/gpu"]) > float(cell["best"]["tok/s/gpu"])):
            cell["best"] = row
    return dict(cells)


def test_heatmap_best_per_cell_matches_csv(nanotron_client, data_dir):
    body = nanotron_client.get("/api/v1/heatmap").json()
    expected = expected_cells(data_dir)
    cells = {(c["model_size_class"], c["nodes"]): c for c in body["cells"]}
    assert set(cells) == {(1.3, n) for n in expected}  # 1.34G → size class 1.3 (2 significant figures)
    for nodes, exp in expected.items():
        cell = cells[(1.3, nodes)]
        best = cell["best"]
        assert best["name"] == exp["best"]["name"]
        assert best["tokens_per_sec_per_gpu"] == pytest.approx(float(exp["best"]["tok/s/gpu"]))
        assert (cell["n_success"], cell["n_oom"], cell["n_failed"]) == (exp["Success"], exp["OOM"], exp["Other"])
        row = exp["best"]
        assert cell["config_label"].startswith(f"DP{row['dp']} TP{row['tp']} PP{row['pp']}")
        assert f"GAS{int(float(row['batch_accum']))} Z{row['zero_stage']} MBS{row['mbs']}" in cell["config_label"]


def test_heatmap_mfu_metric_picks_highest_derived_mfu(nanotron_client):
    cells = nanotron_client.get("/api/v1/heatmap", params={"metric": "mfu"}).json()["cells"]
    for cell in cells:
        runs = nanotron_client.get("/api/v1/heatmap/cell", params={
            "model_size_class": cell["model_size_class"], "nodes": cell["nodes"], "metric": "mfu"}).json()["runs"]
        best_mfu = max(r["mfu_derived"] for r in runs if r["status"] == "success")
        assert cell["best"]["mfu_derived"] == pytest.approx(best_mfu)
        assert runs[0]["id"] == cell["best"]["id"]  # drill-down lists the cell best first


def test_failure_only_cell_is_reported_not_empty(nanotron_client):
    ooms = [{"model_params": 80_000_000_000, "nodes": 2, "gpus_per_node": 8, "tp": 8, "status": "oom",
             "error_class": "oom_gpu", "run_key": f"oom{i}"} for i in range(3)]
    ooms.append({"model_params": 80_000_000_000, "nodes": 2, "gpus_per_node": 8, "tp": 8, "status": "nccl_error",
                 "error_class": "collective_timeout", "run_key": "nccl"})
    assert nanotron_client.post("/api/v1/runs", json={"runs": ooms}).status_code == 201
    cell = next(c for c in nanotron_client.get("/api/v1/heatmap").json()["cells"]
                if c["model_size_class"] == 80 and c["nodes"] == 2)
    assert cell["best"] is None and cell["config_label"] is None
    assert (cell["n_success"], cell["n_oom"], cell["n_failed"]) == (0, 3, 1)


def test_heatmap_filters(nanotron_client):
    assert nanotron_client.get("/api/v1/heatmap", params={"gpu_type": "A100"}).json()["cells"] == []
    assert len(nanotron_client.get("/api/v1/heatmap", params={"gpu_type": "h100"}).json()["cells"]) == 3
    assert nanotron_client.get("/api/v1/heatmap", params={"seq_len": 2048}).json()["cells"] == []
    assert nanotron_client.get("/api/v1/heatmap", params={"metric": "bogus"}).status_code == 422


#: the documented fields of a cell's `best` (CellBest in the OpenAPI document)
CELL_BEST_FIELDS = [
    "id", "run_key", "name", "source", "model_name", "model_params", "model_size_class", "gpu_type", "gpus_per_node",
    "nodes", "world_size", "seq_len", "global_batch_tokens", "dp", "tp", "pp", "cp", "ep", "zero_stage",
    "micro_batch_size", "grad_accum_steps", "recompute", "precision", "framework", "status", "started_at",
    "tokens_per_sec_per_gpu", "tflops_per_gpu", "mfu", "mfu_derived", "hfu", "hfu_derived", "peak_memory_gib",
    "step_time_s",
]


@pytest.mark.parametrize("metric", ["tokens_per_sec_per_gpu", "mfu"])
def test_heatmap_best_is_the_stored_run_narrowed_to_the_documented_fields(nanotron_client, metric):
    """Every cell's `best` has exactly the CellBest fields, each equal to GET /runs/{id}'s: the
    narrow read of the best runs cannot drift from the stored run."""
    # a run with every field of the narrow read set (started_at with an offset, CP/EP, recompute,
    # reported MFU/HFU) in a cell of its own, next to the sample's runs
    full = {"run_key": "every-field", "name": "8b cp2 ep2", "source": "wandb", "model_name": "llama3-8b",
            "model_params": 8_030_261_248, "num_layers": 32, "hidden_size": 4096, "num_heads": 32, "seq_len": 8192,
            "gpu_type": "H100", "gpus_per_node": 8, "nodes": 4, "dp": 4, "tp": 2, "pp": 2, "cp": 2, "ep": 2,
            "zero_stage": 1, "micro_batch_size": 1, "grad_accum_steps": 8, "recompute": "full",
            "precision": "bf16", "framework": "megatron", "framework_version": "0.9", "status": "success",
            "started_at": "2025-03-04T05:06:07+02:00", "tokens_per_sec_per_gpu": 3900.5, "tflops_per_gpu": 301.2,
            "mfu": 0.31, "hfu": 0.4, "peak_memory_gib": 70.25, "step_time_s": 4.5,
            "extra": {"active_params": 2_000_000_000}}  # MoE (EP 2): MFU from the active parameters
    assert nanotron_client.post("/api/v1/runs", json=full).status_code == 201
    spec = nanotron_client.get("/openapi.json").json()["components"]["schemas"]["CellBest"]
    assert sorted(spec["properties"]) == sorted(CELL_BEST_FIELDS)

    cells = nanotron_client.get("/api/v1/heatmap", params={"metric": metric}).json()["cells"]
    bests = [c["best"] for c in cells if c["best"] is not None]
    assert len(bests) == len(cells) == 4 and "every-field" in {b["run_key"] for b in bests}
    for best in bests:
        assert list(best) == CELL_BEST_FIELDS
        stored = nanotron_client.get(f"/api/v1/runs/{best['id']}").json()
        assert best == {name: stored[name] for name in CELL_BEST_FIELDS}
    mine = next(b for b in bests if b["run_key"] == "every-field")
    assert mine["started_at"] == "2025-03-04T03:06:07Z" and (mine["cp"], mine["ep"]) == (2, 2)
    assert [name for name in CELL_BEST_FIELDS if mine[name] is None] == []


def _csv_config(r: dict) -> tuple:
    return (int(r["dp"]), int(r["tp"]), int(r["pp"]), int(r["zero_stage"]), int(r["mbs"]), int(float(r["batch_accum"])))


def _config(c: dict) -> tuple:
    return (c["dp"], c["tp"], c["pp"], c["zero_stage"], c["micro_batch_size"], c["grad_accum_steps"])


def test_recommend_lists_what_ran_on_the_target_first_then_predicts_the_rest(nanotron_client, data_dir):
    """What worked? starts with what worked: the runs measured on the cell, best first, with the
    CSV's figures; then predictions for layouts NOT run there (never one the cell recorded)."""
    body = nanotron_client.get("/api/v1/recommend", params={"model_params": "1.34B", "nodes": 2, "k": 10}).json()
    rows = [r for r in sample_rows(data_dir) if int(float(r["nodes"])) == 2]
    ok = [r for r in rows if r["status"] == "Success"]
    measured = body["measured_on_target"]
    assert len(measured) == 10 and body["cell"]["n_configurations"] == len({_csv_config(r) for r in ok})
    assert body["cell"]["n_oom"] == sum(r["status"] == "OOM" for r in rows)
    assert measured[0]["tokens_per_sec_per_gpu"] == pytest.approx(max(float(r["tok/s/gpu"]) for r in ok))
    tps = [m["tokens_per_sec_per_gpu"] for m in measured]
    assert tps == sorted(tps, reverse=True)
    for m in measured:
        assert m["label"] == "1.34B · nanotron · bf16" and m["seq_len"] == 4096
        same = [float(r["tok/s/gpu"]) for r in ok if _csv_config(r) == _config(m["config"])]
        assert m["tokens_per_sec_per_gpu"] == pytest.approx(max(same)) and m["n_runs"] == len(same)
        assert m["memory"]["fits"] is not None  # the memory model's verdict for its own configuration
    assert body["model"]["status"] == "fitted" and body["model"]["n_runs"] > 50
    cands = body["candidates"]
    ran = {_csv_config(r) for r in rows}
    assert cands
    for c in cands:
        assert c["origin"] == "predicted" and c["measured"] is None and _config(c["config"]) not in ran
        lo, hi = c["predicted"]["interval"]
        assert lo < c["predicted"]["tokens_per_sec_per_gpu"] < hi and 0 < c["predicted"]["mfu"] < 1
        assert c["evidence"] and all(e["gpu_type"] == "H100-SXM-80GB" for e in c["evidence"])


def test_recommend_unrecorded_node_count_predicts_for_the_target(nanotron_client, data_dir):
    body = nanotron_client.get("/api/v1/recommend", params={
        "model_params": "1.34B", "nodes": 8, "global_batch_tokens": 1_048_576, "k": 10}).json()
    cands = body["candidates"]
    assert cands, "layouts recorded at 1-4 nodes must be predicted for 8 nodes"
    rows = sample_rows(data_dir)
    ooms = [r for r in rows if r["status"] == "OOM"]
    for c in cands:
        cfg = c["config"]
        assert c["origin"] == "predicted" and c["measured"] is None
        assert cfg["dp"] * cfg["tp"] * cfg["pp"] * cfg["cp"] == 64
        assert cfg["dp"] * cfg["micro_batch_size"] * cfg["grad_accum_steps"] * 4096 == 1_048_576  # exact batch
        assert c["memory"]["fits"] is True
        assert min(e["distance"] for e in c["evidence"]) > 0
        # never a config that a recorded OOM with the same or more sharding already ruled out
        for o in ooms:
            same_mp = (int(o["tp"]), int(o["pp"])) == (cfg["tp"], cfg["pp"])
            more_sharded = (int(o["zero_stage"]) >= cfg["zero_stage"]
                            and (cfg["zero_stage"] == 0 or int(o["dp"]) >= cfg["dp"]))
            assert not (same_mp and more_sharded and int(o["mbs"]) <= cfg["micro_batch_size"]), (c, o["name"])


def test_throughput_model_predicts_held_out_cells(database, data_dir):
    """Fitted on the 1- and 2-node runs only, the model predicts the 4-node runs it never saw:
    the median error is bounded and the best predicted 4-node layout is among the measured best."""
    import statistics

    from service import store
    from service.analytics import throughput as th
    from service.tables import Run

    records = playbook_sample(data_dir).records
    with database.session(write=True) as s:
        store.store_runs(s, records)
    with database.session() as s:
        train = th.load_configs(s, exclude=Run.nodes == 4)
        held = [r for r in th.load_configs(s) if r["nodes"] == 4]
    assert train and held and all(r["nodes"] != 4 for r in train)
    model = th.Model(train)
    fit = model.fit_for("H100-SXM-80GB", "nanotron")
    # fitted on the configurations that compete in their cell; the slow ones are counted, not fitted
    assert fit.status == "fitted" and fit.n_configurations + fit.n_not_competitive == len(train)
    assert 0 < fit.n_not_competitive < len(train)
    preds = [(model.predict(r, "nanotron")["tokens_per_sec_per_gpu"], r["tokens_per_sec_per_gpu"]) for r in held]
    errors = [abs(p - m) / m for p, m in preds]
    assert statistics.median(errors) < 0.35
    # the configurations that could be the answer (within COMPETITIVE_FRACTION of the 4-node best) are
    # predicted within the 10 % (median)
    best = max(m for _, m in preds)
    close = [abs(p - m) / m for p, m in preds if m >= th.COMPETITIVE_FRACTION * best]
    assert close and statistics.median(close) <= 0.10
    best_real = max(m for _, m in preds)
    top_pred = max(preds)[1]
    assert top_pred >= 0.85 * best_real


def test_retired_runs_leave_recommend_and_heatmap(nanotron_client):
    before = nanotron_client.get("/api/v1/heatmap").json()
    n_before = sum(c["n_success"] for c in before["cells"]) if isinstance(before, dict) else None
    r = nanotron_client.post("/api/v1/runs/retire", json={"filter": {"nodes": 2}, "reason": "test: bad cluster"})
    assert r.status_code == 200, r.text
    ids = r.json()["ids"]
    assert r.json()["changed"] == len(ids) > 0
    run = nanotron_client.get(f"/api/v1/runs/{ids[0]}").json()
    assert run["retired_at"] and run["retired_reason"] == "test: bad cluster"  # still queryable
    body = nanotron_client.get("/api/v1/recommend", params={"model_params": "1.34B", "nodes": 2}).json()
    assert all(c["origin"] == "predicted" for c in body["candidates"])
    assert all(e["nodes"] != 2 for c in body["candidates"] for e in c["evidence"])
    after = nanotron_client.get("/api/v1/heatmap").json()
    if n_before is not None:
        assert all(c["nodes"] != 2 or c["n_success"] == 0 for c in after["cells"])
    again = nanotron_client.post("/api/v1/runs/retire", json={"ids": ids[:3], "reason": "x"}).json()
    assert again["changed"] == 0
    back = nanotron_client.post("/api/v1/runs/unretire", json={"filter": {"nodes": 2}}).json()
    assert sorted(back["ids"]) == sorted(ids)
    bad = nanotron_client.post("/api/v1/runs/retire", json={"filter": {"colour": "red"}, "reason": "x"})
    assert bad.status_code == 400 and bad.json()["error"]["details"][0]["field"] == "colour"
    assert nanotron_client.post("/api/v1/runs/retire", json={"reason": "x"}).status_code == 400


def test_recommend_bad_target(nanotron_client):
    r = nanotron_client.get("/api/v1/recommend", params={"model_params": "eight", "nodes": 2})
    assert r.status_code == 400
    assert r.json()["error"]["details"][0] == {"index": None, "field": "model_params", "value": "eight",
                                               "message": "unparseable size"} or \
        r.json()["error"]["details"][0]["field"] == "model_params"


@pytest.mark.parametrize("text, expected", [("8B", 8e9), ("1.34B", 1.34e9), ("8e9", 8e9), ("470", 470e9),
                                            ("70b", 70e9), ("125M", 125e6), (8030261248, 8030261248)])
def test_parse_model_params(text, expected):
    from service.analytics.target import parse_model_params

    assert parse_model_params(text) == int(expected)


def _world_and_batch_ok(cfg: dict, world: int, gbt: int, seq: int) -> bool:
    return (cfg["dp"] * cfg["tp"] * cfg["pp"] * cfg["cp"] == world
            and cfg["dp"] * cfg["micro_batch_size"] * cfg["grad_accum_steps"] * seq == gbt)


def test_suggest_is_valid_new_and_moves_after_a_result(nanotron_client, data_dir):
    params = {"model_params": "1.34B", "nodes": 4, "gpu_type": "H100", "seq_len": 4096,
              "global_batch_tokens": 1_048_576, "n": 5}
    body = nanotron_client.get("/api/v1/suggest", params=params).json()
    assert body["best_recorded"]["tokens_per_sec_per_gpu"] == pytest.approx(max(
        float(r["tok/s/gpu"]) for r in sample_rows(data_dir) if r["status"] == "Success" and float(r["nodes"]) == 4))
    recorded = {(int(r["dp"]), int(r["tp"]), int(r["pp"]), int(r["zero_stage"]), int(r["mbs"]),
                 int(float(r["batch_accum"]))) for r in sample_rows(data_dir) if float(r["nodes"]) == 4}
    sugg = body["suggestions"]
    assert len(sugg) == 5
    for s in sugg:
        c = s["config"]
        assert _world_and_batch_ok(c, 32, 1_048_576, 4096)
        assert (c["dp"], c["tp"], c["pp"], c["zero_stage"], c["micro_batch_size"],
                c["grad_accum_steps"]) not in recorded
        assert s["predicted"]["peak_memory_gib"] < 80 and s["expected_improvement"] >= 0 and s["why"]
    eis = [s["expected_improvement"] for s in sugg]
    assert eis == sorted(eis, reverse=True)
    # record the first suggestion (as an OOM): it is never suggested again, and the list moves on
    first = sugg[0]["config"]
    run = {"run_key": "suggest-test-1", "source": "api", "model_params": 1_340_000_000, "nodes": 4, "gpus_per_node": 8,
           "gpu_type": "H100", "seq_len": 4096, "framework": "nanotron", "precision": "bf16", "status": "oom", **first}
    assert nanotron_client.post("/api/v1/runs", json=run).status_code == 201
    after = nanotron_client.get("/api/v1/suggest", params=params).json()["suggestions"]
    assert first not in [s["config"] for s in after]
    assert [s["config"] for s in after] != [s["config"] for s in sugg]


def test_suggest_cli_matches_the_api(live_api, data_dir):
    import csv as csvmod
    import io

    import httpx
    from conftest import post_records
    from typer.testing import CliRunner

    from service.cli import app

    with httpx.Client(base_url=live_api, timeout=120) as http:
        post_records(http, playbook_sample(data_dir).records)
        api_body = http.get("/api/v1/suggest", params={"model_params": "1.34B", "nodes": 8, "n": 3}).json()
    runner = CliRunner()
    out = runner.invoke(app, ["suggest", "--model", "1.34B", "--nodes", "8", "-n", "3", "--json"])
    assert out.exit_code == 0, out.output
    cli_body = json.loads(out.stdout)["suggestions"]
    # the same layouts in the same order; the numbers of two separate fits agree to float precision
    assert [s["config"] for s in cli_body] == [s["config"] for s in api_body["suggestions"]]
    for ours, theirs in zip(cli_body, api_body["suggestions"]):
        assert ours["predicted"]["tokens_per_sec_per_gpu"] == pytest.approx(
            theirs["predicted"]["tokens_per_sec_per_gpu"], rel=1e-6)
        assert ours["expected_improvement"] == pytest.approx(theirs["expected_improvement"], rel=1e-5, abs=1e-9)
    out = runner.invoke(app, ["suggest", "--model", "1.34B", "--nodes", "8", "-n", "3", "--format", "csv"])
    rows = list(csvmod.DictReader(io.StringIO(out.stdout)))
    assert [int(r["dp"]) for r in rows] == [s["config"]["dp"] for s in api_body["suggestions"]]
    assert [int(r["micro_batch_size"]) for r in rows] == [s["config"]["micro_batch_size"]
                                                          for s in api_body["suggestions"]]


def test_recommend_and_suggest_on_an_empty_store_answer_empty_with_the_reason(client):
    for path in ("/api/v1/recommend", "/api/v1/suggest"):
        r = client.get(path, params={"model_params": "8B", "nodes": 4})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body.get("candidates", body.get("suggestions")) == [] and "no recorded" in body["notes"][0]


def test_a_gpu_without_a_bf16_peak_is_costed_in_its_runs_precision(client, data_dir):
    """V100 has no bf16 (hardware catalog): a V100 target is costed in the precision its runs
    recorded (here fp16) and says so, rather than answering nothing or against another peak."""
    from conftest import playbook_sample, post_records

    records = [{**r, "run_key": "v100-" + r["run_key"], "gpu_type": "Tesla V100-SXM2-32GB", "precision": "fp16"}
               for r in playbook_sample(data_dir).records]
    stored, _ = post_records(client, records)
    assert stored > 0
    body = client.get("/api/v1/recommend", params={"model_params": "1.34B", "nodes": 2,
                                                   "gpu_type": "V100-SXM2-32GB", "seq_len": 4096}).json()
    assert body["target"]["precision"] == "fp16" and body["candidates"], body["notes"]
    assert any("costed in fp16" in n and "no bf16 peak" in n for n in body["notes"])
    top = body["candidates"][0]["predicted"]
    assert 0 < top["mfu"] < 1  # a fraction of the fp16 peak (125 TFLOP/s), not of a bf16 one


def test_recommend_says_which_model_dims_it_inferred(nanotron_client):
    """A size nobody recorded, asked without dims: the dims the answer is costed on are inferred from
    model_params and the notes say which and how (never silently)."""
    body = nanotron_client.get("/api/v1/recommend", params={"model_params": "70B", "nodes": 8,
                                                            "global_batch_tokens": 4_194_304}).json()
    inferred = [n for n in body["notes"] if "inferred from model_params" in n]
    assert len(inferred) == 1 and "neither given nor recorded" in inferred[0]
    assert "num_layers=" in inferred[0] and "hidden_size=" in inferred[0]
    given = nanotron_client.get("/api/v1/recommend", params={
        "model_params": "70B", "nodes": 8, "global_batch_tokens": 4_194_304, "num_layers": 80, "hidden_size": 8192,
        "num_heads": 64, "num_kv_heads": 8, "ffn_hidden_size": 28672, "vocab_size": 128256}).json()
    assert not any("num_layers=" in n for n in given["notes"])


def test_a_host_oom_vetoes_no_layout_but_a_gpu_oom_does(client, database):
    """recommend/suggest's recorded-OOM veto (_oom_rows -> oom_implied) reads only OOMs that can be about
    GPU memory: an `oom_host` run (the kernel's or cgroup's OOM killer) is left out; an `oom_gpu` run and
    an OOM recorded without a class still veto."""
    from types import SimpleNamespace

    import sqlalchemy as sa

    from service.analytics.recommend import _oom_rows, oom_implied
    from service.tables import Run

    base = {"source": "api", "model_params": 8_000_000_000, "nodes": 1, "gpus_per_node": 8, "gpu_type": "H100",
            "seq_len": 4096, "framework": "nanotron", "precision": "bf16", "status": "oom", "dp": 8, "tp": 1,
            "pp": 1, "cp": 1, "zero_stage": 1, "recompute": "none"}
    runs = [{**base, "run_key": "gpu-oom", "micro_batch_size": 4, "error_class": "oom_gpu"},
            {**base, "run_key": "host-oom", "micro_batch_size": 1, "error_class": "oom_host"},
            {**base, "run_key": "unclassified-oom", "micro_batch_size": 8}]
    assert client.post("/api/v1/runs", json={"runs": runs}).status_code == 201, "stored"
    with database.session() as s:
        gpu, size, seq = s.execute(sa.select(Run.gpu_type, Run.model_size_class, Run.seq_len)).first()
        ctx = SimpleNamespace(gpu_type=gpu, size_class=size, seq_len=seq)
        ooms = _oom_rows(s, ctx)  # type: ignore[arg-type]
    assert sorted(o["micro_batch_size"] for o in ooms) == [4, 8]
    cfg = {"dp": 8, "tp": 1, "pp": 1, "cp": 1, "zero_stage": 1, "recompute": "none"}
    # MBS 2 is implied by no recorded OOM (the host OOM at MBS 1 says nothing); MBS 4 by the GPU OOM
    assert oom_implied({**cfg, "micro_batch_size": 2}, ctx, ooms) is None  # type: ignore[arg-type]
    assert oom_implied({**cfg, "micro_batch_size": 4}, ctx, ooms)["micro_batch_size"] == 4  # type: ignore[arg-type,index]


def test_a_target_no_run_measured_takes_batch_and_framework_from_the_nearest_configuration(database, data_dir):
    """complete_target ranks the recorded configurations (target.ranked_rows) only when a completion asks
    for them: a target no run was measured on (a node count never recorded) takes the global batch and
    the framework of the nearest one, and says so; one measured on takes them from its run."""
    from service import store
    from service.analytics import target as tg
    from service.analytics import throughput as th

    with database.session(write=True) as s:
        store.store_runs(s, playbook_sample(data_dir).records)
    with database.session() as s:
        rows, _ = th.read_configs(s)
        notes: list[str] = []
        ctx, _, found = tg.complete_target(s, tg.Target(model_params=1_340_000_000, nodes=3), rows, notes)
        assert not found.runs and ctx.nodes == 3
        nearest = tg.ranked_rows(rows, ctx.size_class, 3, ctx.seq_len, ctx.gpu_type)
        n = nearest[0]
        assert ctx.global_batch_tokens == n["dp"] * n["micro_batch_size"] * n["grad_accum_steps"] * n["seq_len"]
        assert ctx.framework == [r for r in nearest if r["gpu_type"] == ctx.gpu_type][0]["framework"]
        assert any("the nearest recorded configuration's" in x for x in notes)
        assert any("the nearest recorded configurations'" in x for x in notes)
        measured_notes: list[str] = []
        ctx2, _, found2 = tg.complete_target(s, tg.Target(model_params=1_340_000_000, nodes=2), rows, measured_notes)
        assert found2.runs and ctx2.global_batch_tokens == found2.runs[0]["global_batch_tokens"]
        assert any("measured on this target" in x for x in measured_notes)
