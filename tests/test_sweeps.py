"""Sweeps (issue 29): POST/GET /api/v1/sweeps, the grid's valid combinations, a sweep's progress read
from the runs that name it, runs' `sweep` and `tags` (filters, heatmap, SQL), and `scalebook sweep`
at 80 columns. Both backends, real databases."""

from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.sweeps import grid_configs

GRID = {"name": "llama-1b-1node", "strategy": "grid", "budget": 6,
        "target": {"model_params": "1.34B", "nodes": 1, "gpus_per_node": 8, "gpu_type": "H100", "seq_len": 4096,
                   "global_batch_tokens": 1048576},
        "grid": {"tp": [1, 2], "micro_batch_size": [1, 2, 4]}}


def _run(sweep: str | None, tp: int, mbs: int, tps: float | None, status: str = "success", **extra) -> dict:
    dp = 8 // tp
    return {"model_params": 1_340_000_000, "nodes": 1, "gpus_per_node": 8, "gpu_type": "H100-SXM-80GB",
            "seq_len": 4096, "dp": dp, "tp": tp, "pp": 1, "cp": 1, "zero_stage": 0, "micro_batch_size": mbs,
            "grad_accum_steps": 1048576 // (dp * mbs * 4096), "recompute": "none", "precision": "bf16",
            "framework": "nanotron", "status": status, "tokens_per_sec_per_gpu": tps, "sweep": sweep, **extra}


def test_grid_is_every_valid_combination_of_the_listed_values():
    ctx = {"model_params": 10**9, "nodes": 1, "gpus_per_node": 8, "seq_len": 4096, "global_batch_tokens": 1048576,
           "num_heads": 12, "num_layers": 4}
    got = grid_configs(ctx, {"tp": [1, 2, 3, 8], "pp": [1, 8], "micro_batch_size": [1, 64],
                             "zero_stage": [0, 1], "ep": [1, 2]})
    # TP 3 does not divide 8 GPUs, TP 8 not 12 heads, PP 8 exceeds 4 layers; MBS 64 overshoots the batch
    # with DP 8 (8·64·4096 > 2^20) but not with DP 4; ZeRO 1 needs DP > 1; EP 2 divides DP·CP
    assert {c["tp"] for c in got} == {1, 2} and {c["pp"] for c in got} == {1}
    assert all(c["dp"] * c["micro_batch_size"] * c["grad_accum_steps"] * 4096 == 1048576 for c in got)
    assert {(c["tp"], c["micro_batch_size"]) for c in got} == {(1, 1), (2, 1), (2, 64)}
    assert len(got) == 3 * 2 * 2  # × ZeRO 0/1 × EP 1/2
    assert grid_configs({**ctx, "nodes": 1, "gpus_per_node": 1}, {"zero_stage": [1]}) == []
    assert {c["dp"] for c in grid_configs(ctx, {"tp": [1, 2, 4], "dp": [2, 4]})} == {2, 4}


def test_create_is_idempotent_and_refuses_bad_definitions(client):
    r = client.post("/api/v1/sweeps", json=GRID)
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["left"] == 6 and body["handed_out"] == 0 and body["budget_left"] == 6 and body["best"] is None
    assert body["target"]["gpu_type"] == "H100-SXM-80GB" and body["target"]["model_params"] == 1_340_000_000
    assert body["target"]["world_size"] == 8 and body["min_expected_improvement"] is None
    assert client.post("/api/v1/sweeps", json=GRID).status_code == 200  # same definition: the stored sweep
    r = client.post("/api/v1/sweeps", json={**GRID, "budget": 7})
    assert r.status_code == 409 and "another definition" in r.json()["error"]["message"]
    bad = [({**GRID, "name": "g2", "grid": {"tpp": [1]}}, "grid.tpp"),
           ({**GRID, "name": "g3", "grid": {"tp": [3, 5]}}, "grid"),
           ({**GRID, "name": "g4", "grid": {"recompute": ["some"]}}, "grid.recompute"),
           ({**GRID, "name": "g5", "target": {**GRID["target"], "seq_len": None}}, "target.seq_len"),
           ({**GRID, "name": "g6", "target": {**GRID["target"], "model_params": "big"}}, "target.model_params"),
           ({**GRID, "name": "g7", "strategy": "suggest"}, "grid")]
    for payload, field in bad:
        r = client.post("/api/v1/sweeps", json=payload)
        assert r.status_code == 422, (payload, r.text)
        assert any(d["field"] == field for d in r.json()["error"]["details"]), (field, r.text)
    r = client.post("/api/v1/sweeps", json={"name": "s1", "strategy": "suggest", "budget": 5,
                                            "target": {"model_params": "8B", "nodes": 2}})
    assert r.status_code == 201 and r.json()["min_expected_improvement"] == 0.01 and r.json()["left"] is None
    names = [s["name"] for s in client.get("/api/v1/sweeps").json()["sweeps"]]
    assert names == ["s1", "llama-1b-1node"]
    assert client.get("/api/v1/sweeps/nope").status_code == 404


def test_runs_carry_sweep_and_tags_filtered_everywhere(client):
    client.post("/api/v1/sweeps", json=GRID)
    runs = [_run("llama-1b-1node", 1, 1, 9000.0, tags=["baseline", "nccl-2.21"]),
            _run("llama-1b-1node", 2, 2, 11000.0, tags=[" after-fix ", "after-fix", ""]),
            _run("llama-1b-1node", 1, 4, None, status="oom"),
            _run(None, 2, 4, 12000.0, tags=["baseline-old"])]
    r = client.post("/api/v1/runs", json={"runs": runs})
    assert r.status_code == 201, r.text
    stored = r.json()["runs"]
    assert stored[1]["tags"] == ["after-fix"] and stored[3]["sweep"] is None
    assert client.get("/api/v1/runs", params={"sweep": "llama-1b-1node"}).json()["total"] == 3
    page = client.get("/api/v1/runs", params={"tag": "baseline"}).json()
    assert [r["tags"] for r in page["runs"]] == [["baseline", "nccl-2.21"]]  # whole tags: not "baseline-old"
    assert client.get("/api/v1/runs", params={"tag": "after-fix", "sweep": "llama-1b-1node"}).json()["total"] == 1
    r = client.post("/api/v1/runs", json={**runs[0], "run_key": "t1", "tags": [1, 2]})
    assert r.status_code == 422 and r.json()["error"]["details"][0]["field"].startswith("tags")
    cells = client.get("/api/v1/heatmap", params={"sweep": "llama-1b-1node"}).json()["cells"]
    assert len(cells) == 1 and cells[0]["best"]["tokens_per_sec_per_gpu"] == 11000.0  # not the 12,000 outside
    sql = client.post("/api/v1/sql", json={"query": "SELECT sweep, count(*) AS n FROM runs GROUP BY sweep "
                                                    "ORDER BY sweep NULLS LAST"}).json()
    assert sql["rows"] == [["llama-1b-1node", 3], [None, 1]]

    body = client.get("/api/v1/sweeps/llama-1b-1node").json()
    assert body["counts"] == {"success": 2, "oom": 1}
    assert body["best"]["tokens_per_sec_per_gpu"] == 11000.0 and body["best"]["label"].startswith("DP4 TP2")
    assert [p["tokens_per_sec_per_gpu"] for p in body["best_over_time"]] == [9000.0, 11000.0, 11000.0]
    assert [r["status"] for r in body["runs"]] == ["success", "success", "oom"]


def test_sweep_commands_read_at_80_columns(live_api):
    runner = CliRunner()
    env = {"COLUMNS": "80"}
    out = runner.invoke(app, ["sweep", "create", "llama-1b-1node", "--model", "1.34B", "--nodes", "1", "--gpu-type",
                              "H100", "--seq-len", "4096", "--global-batch-tokens", "1048576", "--strategy", "grid",
                              "--grid", "tp=1,2", "--grid", "micro_batch_size=1,2,4", "--budget", "6"], env=env)
    assert out.exit_code == 0, out.output
    assert "6 configuration(s) in the grid" in out.stdout
    bad = runner.invoke(app, ["sweep", "create", "x", "--model", "1B", "--grid", "tq=1"], env=env)
    assert bad.exit_code == 2
    import httpx

    with httpx.Client(base_url=live_api) as http:
        assert http.post("/api/v1/runs", json=_run("llama-1b-1node", 2, 2, 11000.0)).status_code == 201
    for args in (["sweep", "show", "llama-1b-1node"], ["sweep", "list"], ["runs", "--sweep", "llama-1b-1node"]):
        out = runner.invoke(app, args, env=env)
        assert out.exit_code == 0, out.output
        assert "…" not in out.stdout and max(len(line) for line in out.stdout.splitlines()) <= 80, out.stdout
        assert "11,000" in out.stdout
    out = runner.invoke(app, ["sweep", "show", "llama-1b-1node", "--json"], env=env)
    assert out.exit_code == 0 and '"best"' in out.stdout
    out = runner.invoke(app, ["sweep", "show", "nope"], env=env)
    assert out.exit_code == 1 and re.search(r"no sweep named", out.output)


@pytest.mark.parametrize("value", ["a, b", '["a", "b"]', ["a", "b", "a"]])
def test_tags_are_read_as_written(value):
    from core.record import parse_tags

    assert parse_tags(value) == ["a", "b"]
