"""Issue 30 item 2: a mixture-of-experts model and a dense model of one size class are two heatmap
rows, in the API, the CLI and the dashboard alike. On the shipped data (examples/data, posted through
the API as `scalebook up` imports it), both backends: Qwen3-30B-A3B (MoE, EP 8) and MPT-30B (dense)
both ran on one node; GPT-OSS-120B (MoE) is not in the dense 175B row. Expected figures are read
from the published CSV files with the csv module."""

from __future__ import annotations

import csv
import json

import httpx
import pytest
from conftest import REPO, post_records
from test_what_worked import shipped_records
from typer.testing import CliRunner

from core.families import row_label
from core.model import is_moe

PUBLISHED = REPO / "examples" / "data" / "published"


def csv_rows(file: str, model: str) -> list[dict]:
    with open(PUBLISHED / file, newline="") as fh:
        return [r for r in csv.DictReader(fh) if r["model"] == model and r["status"] == "Success"]


def best_tps(rows: list[dict], gpus: int) -> float:
    """The best tokens/s per GPU of the rows on `gpus` GPUs of 8-GPU nodes (GB200/GB300 nodes hold 4)."""
    return max(float(r["tokens_per_sec_per_gpu"]) for r in rows
               if int(r["num_gpus"]) == gpus and not r["gpu_type"].startswith("DGX-GB"))


@pytest.fixture
def shipped(client, data_dir):
    post_records(client, shipped_records(data_dir))
    return client


def test_is_moe_is_the_one_rule():
    assert is_moe({"ep": 8}, {}) and is_moe({"model_name": "Qwen3-30B-A3B"}, None)
    assert is_moe({"model_name": "Qwen3_235B_a22B", "ep": None}, {})
    assert is_moe({}, {"num_experts": 128}) and is_moe({}, {"active_params": 3e9})
    assert not is_moe({"model_name": "MPT-30b", "ep": 1}, {}) and not is_moe({"model_name": "GPT OSS 120B"}, {})


def test_api_heatmap_keeps_moe_and_dense_of_one_size_apart(shipped):
    cells = shipped.get("/api/v1/heatmap").json()["cells"]
    one_node_30b = {c["moe"]: c for c in cells if c["model_size_class"] == 30.0 and c["nodes"] == 1}
    assert set(one_node_30b) == {False, True}
    dense, moe = one_node_30b[False], one_node_30b[True]
    mpt = csv_rows("llmfoundry_mpt_benchmarks.csv", "MPT-30b")
    assert dense["best"]["model_name"] == "MPT-30b"
    assert dense["best"]["tokens_per_sec_per_gpu"] == best_tps(mpt, 8)  # 2,084 on H100 at seq 1,024
    assert dense["n_success"] == sum(1 for r in mpt if int(r["num_gpus"]) == 8)
    qwen = csv_rows("nemo_megatron_bridge_performance_summary.csv", "Qwen3_30B_a3B")
    assert moe["best"]["model_name"] == "Qwen3_30B_a3B" and moe["best"]["ep"] > 1
    assert moe["best"]["tokens_per_sec_per_gpu"] == best_tps(qwen, 8)
    # GPT-OSS-120B: MoE cells only; the dense 120B class (Megatron-LM's GPT 119B) is its own cell
    for c in cells:
        if c["best"] and c["best"]["model_name"] == "GPT OSS 120B":
            assert c["moe"] is True
        if c["best"] and c["best"]["model_name"] == "GPT 119B":
            assert c["moe"] is False
    # the drill-down lists one kind: dense or MoE runs of the cell
    for flag, names in ((False, {"MPT-30b"}), (True, {"Qwen3_30B_a3B", "Qwen3_30B_a3B (tokendrop)"})):
        body = shipped.get("/api/v1/heatmap/cell", params={"model_size_class": 30, "nodes": 1,
                                                            "moe": str(flag).lower()}).json()
        assert body["moe"] is flag and {r["model_name"] for r in body["runs"]} == names
        assert all(r["is_moe"] is flag for r in body["runs"])
    both = shipped.get("/api/v1/heatmap/cell", params={"model_size_class": 30, "nodes": 1}).json()["runs"]
    assert len(both) == dense["n_success"] + dense["n_oom"] + dense["n_failed"] + moe["n_success"] + \
        moe["n_oom"] + moe["n_failed"]


def test_family_rows_moe_apart_in_the_dashboard_grid(shipped):
    from dashboard.logic import heatmap as hm

    cells = shipped.get("/api/v1/heatmap").json()["cells"]
    grid = hm.build_grid(cells)
    assert grid.cell("30–34B", 1)["best"]["model_name"] == "MPT-30b"
    assert grid.cell("30–34B MoE (A3B)", 1)["best"]["model_name"] == "Qwen3_30B_a3B"
    assert grid.row_labels.index("30–34B MoE (A3B)") == grid.row_labels.index("30–34B") + 1
    dense_175 = [grid.cell("175B", n) for n in grid.nodes if grid.cell("175B", n)]
    assert dense_175 and all(c["best"] is None or c["best"]["model_name"] != "GPT OSS 120B" for c in dense_175)
    gpt_oss = [grid.cell("175B MoE", n) for n in grid.nodes if grid.cell("175B MoE", n)]
    assert gpt_oss and {c["best"]["model_name"] for c in gpt_oss} == {"GPT OSS 120B"}
    assert {row_label(c) for c in cells if c["moe"]} >= {"30–34B MoE (A3B)", "175B MoE (A22B)"}


def test_cli_heatmap_shows_both_rows_at_80_columns(live_api, data_dir, monkeypatch):
    from service.cli import app

    with httpx.Client(base_url=live_api, timeout=120) as http:
        post_records(http, shipped_records(data_dir))
    monkeypatch.setenv("COLUMNS", "80")
    runner = CliRunner()
    out = runner.invoke(app, ["heatmap", "--all-slices", "--model", "30B", "--max-nodes", "2"])
    assert out.exit_code == 0, out.output
    assert max(len(line) for line in out.output.splitlines()) <= 80, out.output
    rows = [[part.strip() for part in line.split("│")[1:-1]] for line in out.output.splitlines()
            if line.startswith("│ ")]
    one_node = {r[0]: r for r in rows if r[0] and r[1] == "1"}
    assert set(one_node) == {"30–34B", "30–34B MoE (A3B)"}, out.output
    assert "2,084" in one_node["30–34B"]  # MPT-30b's best on one node (CSV), no longer hidden
    sizes = runner.invoke(app, ["heatmap", "--all-slices", "--exact-sizes", "--model", "30B", "--max-nodes", "1"])
    labels = {line.split("│")[1].strip() for line in sizes.output.splitlines() if line.startswith("│ ")} - {""}
    assert labels == {"30B", "30B MoE"}, sizes.output
    exact = json.loads(runner.invoke(app, ["heatmap", "--all-slices", "--json"]).stdout)
    assert {c["moe"] for c in exact["cells"] if c["model_size_class"] == 30.0 and c["nodes"] == 1} == {False, True}


def test_what_worked_answers_from_the_dense_row(shipped):
    """"What worked?" reads the heatmap cell the user would look at: for "30B" (a dense target: the
    memory and throughput models cost dense layouts) the dense 30–34B row, never Qwen3-30B-A3B's MoE
    runs (which the heatmap shows in a row of their own)."""
    two = shipped.get("/api/v1/recommend", params={"model_params": "30B", "nodes": 2, "gpu_type": "H100"}).json()
    assert two["cell"]["size"] == "the heatmap's 30–34B row"
    assert not any("Qwen" in (r["model_name"] or "") for r in two["measured_on_target"]), two["measured_on_target"]
    one = shipped.get("/api/v1/recommend", params={"model_params": "30B", "nodes": 1, "gpu_type": "H100",
                                                    "seq_len": 2048}).json()
    mpt = csv_rows("llmfoundry_mpt_benchmarks.csv", "MPT-30b")
    want = max(float(r["tokens_per_sec_per_gpu"]) for r in mpt
               if int(r["num_gpus"]) == 8 and r["gpu_type"] == "h100_80gb" and r["seq_len"] == "2048")
    assert one["measured_on_target"][0]["model_name"] == "MPT-30b"
    assert one["measured_on_target"][0]["tokens_per_sec_per_gpu"] == want
