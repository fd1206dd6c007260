"""Issue 15 item 3, "never a guess": a parallelism degree the input neither states nor implies is
stored as NULL (not 1), every reader copes with it, and the throughput fit leaves such runs out.
Both backends (real DuckDB file, real PostgreSQL)."""

from __future__ import annotations

import json

import httpx
import pytest
from conftest import REPO, playbook_sample
from typer.testing import CliRunner

from core.rules import config_label
from service.analytics import throughput as th
from service.cli import app

LOGS = REPO / "tests" / "data" / "logs"

#: a successful 1.34B H100 run (like the nanotron sample's) that states only TP: pp, cp, ep and dp
#: stay unknown (world 16 = dp·2·pp·cp has several solutions)
UNSTATED = {"name": "tp-only", "status": "success", "model_name": "nanotron-1.34B", "model_params": 1_340_000_000,
            "gpu_type": "H100-SXM-80GB", "precision": "bf16", "framework": "nanotron", "seq_len": 4096,
            "nodes": 2, "gpus_per_node": 8, "tp": 2, "micro_batch_size": 2, "grad_accum_steps": 4,
            "zero_stage": 1, "tokens_per_sec_per_gpu": 9000.0}


def _post(client, rec: dict) -> dict:
    r = client.post("/api/v1/runs", json=rec)
    assert r.status_code == 201, r.text
    return r.json()


def test_unstated_degrees_are_stored_as_null(client):
    run = _post(client, UNSTATED)
    got = client.get(f"/api/v1/runs/{run['id']}").json()
    assert (got["tp"], got["pp"], got["cp"], got["ep"], got["dp"]) == (2, None, None, None, None)
    assert got["world_size"] == 16 and got["extra"]["derived_fields"] == ["world_size"]
    assert "assumed_fields" not in got["extra"]
    assert config_label(got).startswith("DP? TP2 PP? CP?")

    # the known degrees fill the world (dp 8 · tp 2 = 16): pp and cp are determined, and named
    run = _post(client, {**UNSTATED, "name": "dp-tp", "dp": 8})
    got = client.get(f"/api/v1/runs/{run['id']}").json()
    assert (got["dp"], got["tp"], got["pp"], got["cp"], got["ep"]) == (8, 2, 1, 1, None)
    assert got["extra"]["derived_fields"] == ["cp", "global_batch_tokens", "pp", "world_size"]

    # a known layout that breaks the invariant is still refused, naming the values
    r = client.post("/api/v1/runs", json={**UNSTATED, "name": "bad", "dp": 3, "pp": 1, "cp": 1})
    assert r.status_code == 422 and "tp·pp·cp·dp = 2·1·1·3 = 6 != world_size 16" in r.text


def _cell(client, size: float, nodes: int) -> dict:
    cells = client.get("/api/v1/heatmap").json()["cells"]
    return next(c for c in cells if c["model_size_class"] == size and c["nodes"] == nodes)


def test_analytics_answer_with_null_degree_runs(nanotron_client):
    before = _cell(nanotron_client, 1.3, 2)
    for i in range(5):  # a fingerprint history for the regressions check: the last run drops by a third
        tps = 9000.0 + i - 3000 * (i == 4)
        _post(nanotron_client, {**UNSTATED, "name": f"tp-only-{i}", "tokens_per_sec_per_gpu": tps,
                                "started_at": f"2025-01-0{i + 1}T00:00:00"})
    _post(nanotron_client, {**UNSTATED, "name": "oom-unknown", "status": "oom", "tokens_per_sec_per_gpu": None,
                            "error_class": "oom_gpu"})

    heat = nanotron_client.get("/api/v1/heatmap")
    assert heat.status_code == 200, heat.text
    after = _cell(nanotron_client, 1.3, 2)  # the runs count in their cell, whatever their layout
    assert (after["n_success"], after["n_oom"]) == (before["n_success"] + 5, before["n_oom"] + 1)

    rec = nanotron_client.get("/api/v1/recommend", params={"model_params": "1.34B", "nodes": 2})
    assert rec.status_code == 200, rec.text
    body = rec.json()
    assert any("5 successful run(s) with an unknown parallelism degree" in n for n in body["notes"]), body["notes"]
    # no candidate rests on (or is) a run whose layout is unknown
    for c in body["candidates"]:
        assert None not in (c["config"]["tp"], c["config"]["pp"], c["config"]["cp"], c["config"]["dp"])
        assert all(None not in (e["config"]["tp"], e["config"]["pp"], e["config"]["cp"]) for e in c["evidence"])

    scaling = nanotron_client.get("/api/v1/scaling", params={"model_params": "1.34B"})
    assert scaling.status_code == 200, scaling.text
    reg = nanotron_client.get("/api/v1/regressions", params={"min_drop": 0.2})
    assert reg.status_code == 200, reg.text
    flagged = [f for f in reg.json()["flags"] if f["name"] == "tp-only-4"]
    assert flagged and flagged[0]["config"]["pp"] is None  # its history: the runs with the same unknowns


def test_null_degree_runs_do_not_feed_the_throughput_fit(database, data_dir):
    from service import store

    records = playbook_sample(data_dir).records
    with database.session(write=True) as s:
        store.store_runs(s, records)
    with database.session() as s:
        before = th.load_configs(s)
        assert th.count_unknown_layout(s) == 0
    with database.session(write=True) as s:
        store.store_runs(s, [{**UNSTATED, "name": f"u{i}", "tokens_per_sec_per_gpu": 1e4 + i} for i in range(5)])
    with database.session() as s:
        after = th.load_configs(s)
        assert th.count_unknown_layout(s) == 5
    def by_id(rows: list[dict]) -> list[dict]:  # GROUP BY gives no order
        return sorted(rows, key=lambda r: r["first_id"])

    assert by_id(after) == by_id(before)  # not one configuration row more, none changed
    assert all(None not in (r["dp"], r["tp"], r["pp"], r["cp"]) for r in after)
    assert th.skipped_note(5).startswith("5 successful run(s)") and th.skipped_note(0) is None


def test_log_stating_cp2_stores_cp2_and_leaves_the_rest_null(live_api, tmp_path):
    """A torchtitan log whose command line says CP 2 (and no device mesh): cp=2, tp/pp/dp unknown."""
    lines = (LOGS / "torchtitan_success.log").read_text().splitlines()
    lines = [line for line in lines if "device mesh" not in line]
    lines[0] = lines[0].replace("--job.config_file", "--parallelism.context_parallel_degree 2 --job.config_file")
    log = tmp_path / "titan_cp2.log"
    log.write_text("\n".join(lines) + "\n")
    result = CliRunner().invoke(app, ["import", "log", str(log), "--name", "titan-cp2", "--nodes", "1",
                                      "--gpu-type", "H100-SXM-80GB", "--precision", "bf16",
                                      "--rejects", str(tmp_path / "r.csv"), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stored"] == 1
    [run] = httpx.get(f"{live_api}/api/v1/runs", params={"name": "titan-cp2"}, timeout=30).json()["runs"]
    assert run["cp"] == 2 and run["gpus_per_node"] == 8 and run["world_size"] == 8
    assert (run["tp"], run["pp"], run["dp"], run["ep"]) == (None, None, None, None)
    assert "cp" not in (run["extra"].get("derived_fields") or []) and "assumed_fields" not in run["extra"]


@pytest.mark.parametrize("label_in, want", [
    ({"dp": 8, "tp": None, "pp": 1, "cp": None, "ep": None}, "DP8 TP? PP1 CP?"),
    ({"dp": 8, "tp": 2, "pp": 1, "cp": 1, "ep": 4}, "DP8 TP2 PP1 EP4"),
])
def test_config_label_never_shows_an_unknown_degree_as_1(label_in, want):
    assert config_label(label_in).startswith(want)


def test_dashboard_detail_shows_an_unknown_degree_as_unknown():
    from dashboard.logic.runs import UNKNOWN_DEGREE, detail_sections

    frame = detail_sections({"id": 1, "tp": 2, "dp": None, "pp": None, "cp": None, "ep": None})["parallelism"]
    shown = dict(zip(frame["field"], frame["value"]))
    assert shown == {"dp": UNKNOWN_DEGREE, "tp": "2", "pp": UNKNOWN_DEGREE, "cp": UNKNOWN_DEGREE}
