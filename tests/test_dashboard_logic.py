"""Unit tests of dashboard/logic (pure functions, no Streamlit) on real data shapes: the API's
answers for the Ultra-Scale Playbook nanotron sample (loaded once into a DuckDB file). Expected
values are computed straight from the CSV with the csv module."""

from __future__ import annotations

import csv
import io
import shutil
from collections import Counter
from datetime import datetime

import pandas as pd
import pytest
from conftest import playbook_sample, post_records
from fastapi.testclient import TestClient

from dashboard.logic import failures as fl
from dashboard.logic import heatmap as hm
from dashboard.logic import options as opt
from dashboard.logic import recommend as rec
from dashboard.logic import runs as rl
from dashboard.logic import scaling as sc
from dashboard.logic import sql as sq
from dashboard.logic.fmt import (
    compact,
    config_label,
    nodes_label,
    pct,
    size_label,
    split_label,
)
from service.api import create_app
from service.client import ApiDown, ApiError, Client, clean_params
from service.db import Database
from service.settings import Settings


def csv_rows(data_dir):
    with open(data_dir / "nanotron" / "bench_sample.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def csv_best(data_dir, nodes: int) -> dict:
    """The successful row with the highest tok/s/gpu at `nodes` nodes."""
    ok = [r for r in csv_rows(data_dir) if r["status"] == "Success" and int(float(r["nodes"])) == nodes]
    return max(ok, key=lambda r: float(r["tok/s/gpu"]))


def playbook_text(row: dict) -> str:
    """The Playbook cell text of a CSV row: config, MFU (the CSV's percentage), Mem Alloc (GiB)."""
    return (f"DP{row['dp']} TP{row['tp']} PP{row['pp']}\n"
            f"GAS{int(float(row['batch_accum']))} Z{row['zero_stage']} MBS{row['mbs']}\n"
            f"MFU {float(row['mfu']):.1f}%\n{float(row['Mem Alloc (GB)']):.1f} GiB")


@pytest.fixture(scope="module")
def api(duckdb_template, tmp_path_factory, data_dir):
    """A TestClient over a DuckDB file holding the nanotron sample (loaded through the API)."""

    path = tmp_path_factory.mktemp("dashboard_logic") / "scalebook.duckdb"
    shutil.copy(duckdb_template, path)
    db = Database(f"duckdb:///{path}")
    db.prepare(auto_upgrade=False)
    with TestClient(create_app(db, Settings(database_url=None))) as client:
        stored, rejected = post_records(client, playbook_sample(data_dir).records)
        assert stored == 312 and not rejected
        yield client
    db.dispose()


@pytest.fixture(scope="module")
def cells(api):
    return api.get("/api/v1/heatmap", params={"metric": "mfu"}).json()["cells"]


@pytest.fixture(scope="module")
def all_runs(api):
    return api.get("/api/v1/runs", params={"limit": 1000}).json()["runs"]


# --- formats ----------------------------------------------------------------------------------

def test_formats():
    assert [size_label(s) for s in (1.3, 8.0, 0.12, 405.0, 1200.0, None)] == \
        ["1.3B", "8B", "120M", "405B", "1.2T", "?"]  # as the CLI and the family rows write it
    assert nodes_label(1) == "1 node" and nodes_label(4) == "4 nodes"
    assert pct(0.39178) == "39.2%" and pct(None) == "?"
    assert [compact(v) for v in (40149.94, 950.2, 1234.0, 2.5e6, None)] == ["40.1k", "950", "1.23k", "2.5M", "?"]
    assert split_label("DP8 TP1 PP1 GAS16 Z1 MBS2") == ("DP8 TP1 PP1", "GAS16 Z1 MBS2")
    assert split_label("DP8 TP4 PP1 CP4 EP2 GAS? Z? MBS1 RC:full") == ("DP8 TP4 PP1 CP4 EP2", "GAS? Z? MBS1 RC:full")


def test_config_label_matches_the_api_label_of_every_best_run(cells):
    for cell in cells:
        assert config_label(cell["best"]) == cell["config_label"]
    cfg = {"dp": 8, "tp": 4, "pp": 1, "cp": 4, "ep": 1, "zero_stage": None, "micro_batch_size": 1,
           "grad_accum_steps": None, "recompute": "selective"}
    assert config_label(cfg) == "DP8 TP4 PP1 CP4 GAS? Z? MBS1 RC:selective"


# --- heatmap ----------------------------------------------------------------------------------

def playbook_lines(row: dict, metric: str = "tokens_per_sec_per_gpu") -> list[str]:
    """The landing cell of a CSV row: config (two lines), tok/s and MFU (ranking metric first), then
    the exact size class with the peak memory."""
    tps = f"{compact(float(row['tok/s/gpu']))} tok/s"
    mfu = f"MFU {float(row['mfu']):.1f}%"
    return [f"DP{row['dp']} TP{row['tp']} PP{row['pp']}",
            f"GAS{int(float(row['batch_accum']))} Z{row['zero_stage']} MBS{row['mbs']}",
            *([tps, mfu] if metric == "tokens_per_sec_per_gpu" else [mfu, tps]),
            f"1.3B · {float(row['Mem Alloc (GB)']):.1f} GiB"]


def test_grid_and_cell_text_match_the_csv(cells, data_dir):
    grid = hm.build_grid(cells, "mfu")
    # 1.34G → size class 1.3 → the "1–2B" family of the fixed grid; the sample has ≤ 4 nodes
    assert grid.rows == ["1–2B"] and grid.nodes == [1, 2, 4]
    for nodes in grid.nodes:
        cell = grid.cell("1–2B", nodes)
        # MFU derived ∝ tok/s here
        assert hm.cell_lines(cell, "mfu") == playbook_lines(csv_best(data_dir, nodes), "mfu")
    assert hm.cell_text(grid.cell("1–2B", 1), "mfu").startswith("DP8 TP1 PP1\nGAS16 Z0 MBS2\nMFU 39.2%\n")
    # colour values: MFU in percent on the fixed scale, whatever the ranking metric
    values = grid.values()
    assert values[0][0] == pytest.approx(100 * (cells[0]["best"]["mfu_derived"]))
    assert hm.MFU_SCALE == (0.0, 60.0)
    fig = hm.figure(grid)
    assert (fig.data[0].zmin, fig.data[0].zmax, fig.data[0].zauto) == (0.0, 60.0, False)
    assert grid.locate("1–2B", "2") == ("1–2B", 2) and grid.locate("9B", "2") is None


def test_cell_counts_match_the_csv(cells, data_dir):
    counts = Counter((int(float(r["nodes"])), r["status"]) for r in csv_rows(data_dir))
    for cell in hm.group(cells):
        n = cell["nodes"]
        ok, oom, other = (counts[n, s] for s in ("Success", "OOM", "Other"))
        assert hm.cell_counts(cell) == f"ok {ok} · OOM {oom} · failed {other}"
    busiest = max((1, 2, 4), key=lambda n: sum(counts[n, s] for s in ("Success", "OOM", "Other")))
    assert hm.default_cell(hm.group(cells)) == f"1–2B × {busiest} nodes"


def failure_cell(**over):
    return {"model_size_class": 80.0, "nodes": 2, "best": None, "config_label": None, "n_success": 0,
            "n_oom": 5, "n_failed": 2, **over}


def test_failure_only_cells_are_marked_not_empty(cells):
    cell = failure_cell()
    assert hm.cell_text(cell) == "✗ OOM 5 · failed 2"
    assert hm.failure_text(failure_cell(n_failed=0)) == "✗ OOM 5"
    assert hm.failure_text(failure_cell(n_oom=0, n_failed=0)) == "✗ no success"
    grid = hm.build_grid([*cells, cell], "mfu")
    assert grid.rows == ["1–2B", "70B"]  # 80B lies in the fixed 50–100B family
    fig = hm.figure(grid)
    best_trace, failed_trace, centres = fig.data
    assert (failed_trace.name, centres.name) == ("failures only", "cells")
    row, col = grid.rows.index("70B"), grid.nodes.index(2)
    assert best_trace.z[row][col] is None and failed_trace.z[row][col] == 1.0
    assert failed_trace.text[row][col] == "✗ OOM 5 · failed 2" and failed_trace.textfont.color == hm.FAILED_TEXT
    assert len(centres.x) == len(grid.cells) and centres.marker.opacity == 0
    k = list(zip(centres.x, centres.y)).index(("2", "70B"))
    assert centres.customdata[k].startswith("<b>70B × 2 nodes</b> (sizes 80B)<br>✗ OOM 5 · failed 2")
    assert grid.locate(centres.y[k], centres.x[k]) == ("70B", 2) and best_trace.hoverinfo == "skip"
    table = hm.label_table(grid)
    assert table.loc["70B", "2 nodes"] == "✗ OOM 5 · failed 2" and table.loc["70B", "1 node"] == ""


def test_cells_without_mfu_get_their_own_colour(cells):
    best = {**cells[0]["best"], "mfu": None, "mfu_derived": None, "id": 99999}
    grid = hm.build_grid([{**cells[0], "model_size_class": 8.0, "best": best}], "tokens_per_sec_per_gpu")
    fig = hm.figure(grid)
    assert [t.name for t in fig.data] == ["best run", "no MFU", "cells"]
    assert fig.data[0].z[0][0] is None and fig.data[1].z[0][0] == 1.0
    assert fig.data[1].text[0][0].startswith("DP8 TP1 PP1<br>")


def test_figure_writes_the_cells_and_sizes_the_text(cells, data_dir):
    grid = hm.build_grid(cells, "tokens_per_sec_per_gpu")
    fig = hm.figure(grid)
    assert [t.name for t in fig.data] == ["best run", "cells"]  # no failure-only cell in the sample
    trace = fig.data[0]
    assert list(trace.x) == ["1", "2", "4"] and list(trace.y) == ["1–2B"]
    assert trace.texttemplate == "%{text}" and trace.textfont.size >= 10
    assert trace.text[0][0] == "<br>".join(playbook_lines(csv_best(data_dir, 1)))
    assert fig.layout.xaxis.type == "category" and fig.layout.yaxis.autorange == "reversed"
    # many columns: no text written (unreadable), hover only
    wide = [{**cells[0], "nodes": n} for n in range(1, 41)]
    assert hm.text_font_size(hm.build_grid(wide, "mfu")) == 0
    assert hm.figure(hm.build_grid(wide, "mfu")).data[0].texttemplate is None
    # zoom keeps only the chosen rows / columns
    assert hm.build_grid(cells, "mfu", nodes=[2, 4]).nodes == [2, 4]
    # long lines wrap at a space so the columns stay narrow
    long_cell = {**cells[0], "config_label": "DP16 TP2 PP8 EP32 GAS21 Z3 MBS1 RC:full"}
    assert all(len(line) <= hm.LINE_CHARS for line in hm.cell_lines(long_cell))


def test_label_table_and_csv(cells, data_dir):
    grid = hm.build_grid(cells, "tokens_per_sec_per_gpu")
    table = hm.label_table(grid)
    assert list(table.columns) == ["1 node", "2 nodes", "4 nodes"] and list(table.index) == ["1–2B"]
    assert table.loc["1–2B", "1 node"] == " · ".join(playbook_lines(csv_best(data_dir, 1)))
    grouped = hm.group(cells)
    frame = hm.cells_frame(grouped)
    back = pd.read_csv(io.StringIO(frame.to_csv(index=False)))
    assert list(back.columns) == hm.CSV_COLUMNS and len(back) == 3
    one = back[back.nodes == 1].iloc[0]
    assert one.tokens_per_sec_per_gpu == pytest.approx(float(csv_best(data_dir, 1)["tok/s/gpu"]))
    assert one.family == "1–2B" and str(one.sizes) == "1.3"
    choices = hm.cell_choices(grouped)
    assert list(choices) == ["1–2B × 1 node", "1–2B × 2 nodes", "1–2B × 4 nodes"]
    assert hm.choice_label(choices["1–2B × 1 node"]).startswith("1–2B × 1 node — DP8 TP1 PP1 GAS16 Z0 MBS2 · ok ")


# --- runs -------------------------------------------------------------------------------------

def test_runs_table_and_csv(all_runs):
    table = rl.runs_table(all_runs)
    assert list(table.columns) == rl.TABLE_COLUMNS and len(table) == 312
    assert set(table.status) == {"success", "oom", "failed"}
    text = rl.runs_csv(all_runs[:5])
    back = pd.read_csv(io.StringIO(text))
    assert len(back) == 5 and {"run_key", "tokens_per_sec_per_gpu", "mfu_derived", "extra"} <= set(back.columns)
    assert back.extra.iloc[0].startswith("{")  # extra as JSON
    assert rl.runs_csv([]) == ""


def test_compare_highlights_what_differs(api, data_dir):
    cell = api.get("/api/v1/heatmap/cell", params={"model_size_class": 1.3, "nodes": 1}).json()["runs"]
    a, b = cell[0], cell[1]  # the two best 1-node runs: DP8 GAS16 MBS2 Z0 vs DP8 GAS32 MBS1 Z0
    frame, differing = rl.compare_runs([a, b])
    assert list(frame.columns) == [f"#{a['id']}", f"#{b['id']}"]
    assert {"micro_batch_size", "grad_accum_steps", "tokens_per_sec_per_gpu", "run_key"} <= set(differing)
    assert not {"dp", "tp", "pp", "seq_len", "gpu_type", "global_batch_tokens", "zero_stage"} & set(differing)
    assert frame.loc["micro_batch_size"].tolist() == ["2", "1"]
    only, _ = rl.compare_runs([a, b], only_differences=True)
    assert list(only.index) == differing
    css = rl.style_differences(frame, differing).to_html().split("</style>")[0]
    rule = css[css.index("#T_"):css.index("{")]  # the selectors that get the highlight
    marked = {i for i, name in enumerate(frame.index) if f"_row{i}_col0" in rule and f"_row{i}_col1" in rule}
    assert marked == {list(frame.index).index(f) for f in differing} and rl.DIFF_STYLE.split(";")[0] in css
    md = rl.diff_markdown(frame, differing)
    assert "| **micro_batch_size** | **2** | **1** |" in md and "| dp | 8 | 8 |" in md


def test_detail_sections_and_ids(all_runs):
    run = all_runs[0]
    sections = rl.detail_sections(run)
    assert list(sections)[:3] == ["model", "hardware", "parallelism"] and "extra" in sections
    par = dict(sections["parallelism"].values.tolist())
    assert par["dp"] == str(run["dp"]) and par["micro_batch_size"] == str(run["micro_batch_size"])
    assert rl.parse_ids("12, 15 #20 x 12") == [12, 15, 20]


def test_detail_and_compare_show_numbers_for_people(all_runs):
    """No raw 70000000000 or 0.505: percentages, separators, units (issue 30 item 11)."""
    run = next(r for r in all_runs if r.get("mfu_derived") and r.get("peak_memory_gib"))
    sections = rl.detail_sections(run)
    fields = {k: v for frame in sections.values() for k, v in frame.values.tolist()}
    assert fields["mfu_derived"] == f"{100 * run['mfu_derived']:.1f}%"
    assert fields["model_params"].startswith(f"{run['model_params']:,} (")
    assert fields["peak_memory_gib"] == f"{run['peak_memory_gib']:.1f} GiB"
    assert fields["tokens_per_sec_per_gpu"] == f"{run['tokens_per_sec_per_gpu']:,.0f} tok/s"
    assert fields["seq_len"] == f"{run['seq_len']:,}"
    other = next(r for r in all_runs if r["id"] != run["id"] and r.get("mfu_derived"))
    frame, _ = rl.compare_runs([run, other])
    assert frame.loc["mfu_derived"].tolist() == [f"{100 * r['mfu_derived']:.1f}%" for r in (run, other)]
    assert frame.loc["model_params"].tolist()[0] == fields["model_params"]
    retired = {**run, "retired_at": "2026-11-24T10:00:00", "retired_reason": "wrong cluster"}
    assert rl.retired_text(retired) == "retired: wrong cluster" and rl.retired_text(run) is None
    assert rl.runs_table([retired, run]).retired.tolist()[0] == "retired: wrong cluster"


# --- recommend --------------------------------------------------------------------------------

def test_candidates_rows_on_a_real_answer(api, data_dir):
    body = api.get("/api/v1/recommend", params={"model_params": "1.34B", "nodes": 2, "gpu_type": "H100-SXM-80GB",
                                                  "seq_len": 4096}).json()
    rows = rec.candidate_rows(body["candidates"], body["target"])
    first = body["candidates"][0]
    cfg = first["config"]
    assert rows.iloc[0]["config"].startswith(f"DP{cfg['dp']} TP{cfg['tp']} PP{cfg['pp']}")
    assert rows.iloc[0]["predicted_tokens_per_sec_per_gpu"] == pytest.approx(
        first["predicted"]["tokens_per_sec_per_gpu"])
    assert rows["evidence"].iloc[0].startswith(f"#{first['evidence'][0]['run_id']} ")
    assert "fitted on" in rec.model_text(body["model"])
    slow = {**body["model"], "n_not_competitive": 12, "competitive_fraction": 0.7}
    assert "(12 configurations under 70 % of their cell's best not fitted)" in rec.model_text(slow)
    assert rec.target_text(body["target"]).startswith("1.3B on 2 node(s) × 8 GPUs (16) of H100-SXM-80GB, seq 4096")


def test_measured_rows_and_the_form_default_on_a_real_answer(api, data_dir):
    body = api.get("/api/v1/recommend", params={"model_params": "1.34B", "nodes": 2, "gpu_type": "H100-SXM-80GB",
                                                  "seq_len": 4096}).json()
    rows = rec.measured_rows(body["measured_on_target"])
    best = csv_best(data_dir, 2)
    assert rows.iloc[0]["config"].startswith(f"DP{best['dp']} TP{best['tp']} PP{best['pp']}")
    assert rows.iloc[0]["tokens_per_sec_per_gpu"] == pytest.approx(float(best["tok/s/gpu"]))
    assert rows.iloc[0]["model"] == "1.34B · nanotron · bf16" and rows.iloc[0]["run"].startswith("#")
    assert rec.cell_text(body["cell"]).startswith("size class 1.3B × 2 nodes of H100-SXM-80GB, seq 4096: ")
    assert rec.memory_verdict({"memory": {"predicted_peak_memory_gib": 135.6, "fits": False, "disagrees": True}}) \
        == "model says no (136 GiB): it ran"
    assert rec.memory_verdict({}) == "not checked"
    # the form's GPU type: the most recorded, never an arbitrary one
    assert rec.default_gpu({"counts": {"gpu_type": {"A100-SXM-40GB": 40, "H100-SXM-80GB": 312}}}) == "H100-SXM-80GB"
    assert rec.default_gpu({"gpu_type": ["A100", "H100"]}) is None


def test_what_if_texts_and_step_bar_on_a_real_answer(api, data_dir):
    from dashboard.logic import whatif as wi

    asked = {"model_params": "1.34B", "nodes": 2, "gpus_per_node": 8, "gpu_type": "H100-SXM-80GB"}
    answer = api.get("/api/v1/recommend", params={**asked, "seq_len": 4096}).json()
    seed = wi.seed(asked, answer)
    best = csv_best(data_dir, 2)
    assert (seed["dp"], seed["tp"], seed["pp"], seed["micro_batch_size"]) == (
        int(best["dp"]), int(best["tp"]), int(best["pp"]), int(best["mbs"]))  # the best measured configuration
    body = wi.predict_body({**seed, "framework": "the records'", "dp": 0})
    assert "dp" not in body and "framework" not in body and body["model_params"] == "1.34B"
    pred = api.post("/api/v1/predict", json=body).json()
    frame = wi.breakdown_frame(pred["predicted"])
    assert frame.seconds.sum() == pytest.approx(pred["predicted"]["step_time_s"], rel=1e-6)
    assert frame.share.sum() == pytest.approx(1.0)
    fig = wi.breakdown_figure(pred["predicted"])
    assert [t.name for t in fig.data] == [name for _, name, _ in wi.TERMS] and fig.layout.barmode == "stack"
    assert wi.fits_text(pred).startswith("✓ ran on this target (run #")
    assert wi.model_text(pred["model"]).startswith("fitted on ")
    assert wi.evidence_rows(pred["evidence"]).iloc[0]["run"] == f"#{pred['measured']['run_id']}"
    oom = {"memory": {"predicted_peak_memory_gib": 70.0, "usable_memory_gib": 78.4, "recorded_oom_run_id": 12},
           "fits": False}
    assert wi.fits_text(oom) == "✗ does not fit: a recorded OOM (run #12) implies it; predicted 70.0 of 78.4 GiB usable"


def test_memory_and_evidence_texts():
    fits = {"memory": {"predicted_peak_memory_gib": 32.18, "gpu_memory_gib": 80.0, "fits": True}}
    assert rec.memory_check(fits) == "✓ fits: 32.2 of 80 GiB predicted"
    assert rec.memory_check({"memory": {"predicted_peak_memory_gib": 91.0, "gpu_memory_gib": 80.0, "fits": False}}) \
        == "✗ does not fit: 91.0 of 80 GiB predicted"
    assert rec.memory_check({}) == "memory not checked"
    cand = {"evidence": [{"run_id": 818, "model_size_class": 1.3, "nodes": 2, "gpu_type": "H100-SXM-80GB",
                          "distance": 0.69},
                         {"run_id": 9, "model_size_class": 3.6, "nodes": 4, "gpu_type": "A100-SXM-80GB",
                          "distance": 1.9}],
            "predicted": {"interval": [5900.4, 7100.2]}}
    text = rec.evidence_text(cand, {"gpu_type": "H100-SXM-80GB"})
    assert text.startswith("#818 1.3B × 2 nodes (d 0.69); #9 3.6B × 4 nodes on A100-SXM-80GB")
    assert rec.interval_text(cand) == "5,900–7,100"
    assert rec.recommend_params("8B ", 8, 8, "any", 0, 0)["gpu_type"] is None


# --- scaling & planner ------------------------------------------------------------------------

def test_scaling_points_and_amdahl_curve(data_dir):
    points = [{"nodes": n, "world_size": 8 * n, "tokens_per_sec_per_gpu": float(csv_best(data_dir, n)["tok/s/gpu"]),
               "best_run_id": n, "config": {"dp": 8 * n, "tp": 1, "pp": 1}} for n in (4, 1, 2)]
    frame = sc.points_frame(points)
    assert frame.nodes.tolist() == [1, 2, 4]
    assert frame.aggregate_tokens_per_sec.iloc[1] == pytest.approx(16 * float(csv_best(data_dir, 2)["tok/s/gpu"]))
    assert frame.efficiency.iloc[0] == 1.0 and frame.efficiency.iloc[2] < 1
    s = 0.02
    curve = sc.amdahl_curve(frame, {"serial_fraction": s, "base_nodes": 1})
    assert curve.aggregate_tokens_per_sec.iloc[0] == pytest.approx(frame.aggregate_tokens_per_sec.iloc[0])
    last = curve.iloc[-1]
    assert last.nodes == 4 and last.efficiency == pytest.approx(1 / (s * 4 + 1 - s))
    assert sc.amdahl_curve(frame, None).empty
    fig = sc.figure(frame, curve)
    assert {t.name for t in fig.data} >= {"measured (best run per node count)", "ideal (linear)", "Amdahl fit"}
    text = sc.amdahl_summary({"serial_fraction": s, "serial_fraction_stderr": 0.005, "r2": 0.99, "base_nodes": 1,
                              "max_speedup": 50.0, "nodes_at_50pct_efficiency": 51.0})
    assert text.startswith("serial fraction 2.00% ± 0.50%: speedup at most 50× the 1-node")
    assert "50% at ≈ 51 nodes" in text
    assert sc.amdahl_summary(None, "only 1 node count measured") == "no Amdahl fit: only 1 node count measured"


def test_scaling_on_a_real_answer(api, data_dir):
    body = api.get("/api/v1/scaling", params={"model_params": "1.34B", "gpu_type": "H100-SXM-80GB"}).json()
    frame = sc.points_frame(body["points"])
    assert frame.nodes.tolist() == [1, 2, 4]
    assert frame.tokens_per_sec_per_gpu.tolist() == pytest.approx([float(csv_best(data_dir, n)["tok/s/gpu"])
                                                                   for n in (1, 2, 4)])
    assert frame.config.iloc[0] == "DP8 TP1 PP1 GAS16 Z0 MBS2"
    s = body["amdahl"]["serial_fraction"]
    curve = sc.amdahl_curve(frame, body["amdahl"])
    assert curve.efficiency.iloc[-1] == pytest.approx(1 / (s * 4 + 1 - s))
    assert sc.amdahl_summary(body["amdahl"], body["amdahl_reason"]).startswith(f"serial fraction {pct(s, 2)}")


def test_planner_texts_on_a_real_answer(api):
    # the SmolLM3 playbook example: 3B, 11T tokens, 28 days, 720 TFLOP/s at 30 % MFU → 379 GPUs
    plan = api.get("/api/v1/plan", params={"model_params": "3B", "tokens": "11T", "days": 28, "mfu": 0.30,
                                           "peak_tflops": 720}).json()
    assert sc.plan_headline(plan).startswith("384 GPUs (48 nodes × 8; the compute needs 379) at MFU 30.0% (given) "
                                             "and 720 TFLOP/s peak (given)")
    rows = dict(sc.plan_rows(plan).values.tolist())
    assert rows["GPUs the compute needs"] == "379" and rows["GPUs booked (whole nodes)"] == "384"
    assert rows["MFU"] == "30.0%" and rows["training tokens"] == "11,000,000,000,000"
    # 6·3e9·11e12 = 1.98e23, written as papers write it, with what it counts
    assert rows["training FLOPs ((6·N)·tokens)"] == "1.98×10²³"
    assert "notes" not in rows and "formula" not in rows
    # MFU from the throughput model's prediction at the planned scale
    nearest = api.get("/api/v1/plan", params={"model_params": "1.34B", "tokens": "1T", "days": 7,
                                              "gpu_type": "H100-SXM-80GB"}).json()
    assert "throughput model's prediction" in sc.plan_headline(nearest)
    rows = dict(sc.plan_rows(nearest).values.tolist())
    assert rows["GPU type"] == "H100-SXM-80GB"
    def cell(size, nodes, gpu, seq, runs=1):
        return {"model_size_class": size, "nodes": nodes, "n_success": runs, "best": {"gpu_type": gpu, "seq_len": seq}}

    cells = [cell(7.0, 1, "H100", 4096, 50), cell(7.0, 2, "H100", 8192), cell(1.3, 2, "H100", 2048),
             cell(1.3, 4, "H100", 2048), cell(1.3, 8, "A100", 2048)]
    assert sc.default_target(cells) == {"model_size_class": 1.3, "gpu_type": "H100", "seq_len": 2048}
    assert sc.default_target([]) == {}


# --- failures ---------------------------------------------------------------------------------

def test_failure_aggregates_match_the_csv(api, cells, all_runs, data_dir):
    counts = Counter((int(float(r["nodes"])), r["status"]) for r in csv_rows(data_dir))
    by_nodes = fl.by_nodes(cells)
    for _, row in by_nodes.iterrows():
        n = row.nodes
        assert (row.success, row.oom, row.other_failed) == (counts[n, "Success"], counts[n, "OOM"], counts[n, "Other"])
        assert row.failure_rate == pytest.approx((counts[n, "OOM"] + counts[n, "Other"]) / row.runs)
    classes = fl.class_by_nodes(all_runs)
    assert classes.loc[1, "oom_gpu"] == counts[1, "OOM"]  # the parser classifies OOM rows as oom_gpu
    assert classes.loc[4, "unclassified (failed)"] == counts[4, "Other"]
    configs = fl.by_config(all_runs, limit=1000)
    assert configs.failures.sum() == sum(v for (n, s), v in counts.items() if s != "Success")
    assert configs.failures.is_monotonic_decreasing
    layouts = Counter((int(float(r["nodes"])), f"DP{r['dp']} TP{r['tp']} PP{r['pp']} Z{r['zero_stage']}")
                      for r in csv_rows(data_dir) if r["status"] != "Success")
    (top_nodes, top_layout), top_n = layouts.most_common(1)[0]
    assert configs.failures.iloc[0] == top_n
    row = configs[(configs.nodes == top_nodes) & (configs.layout == top_layout)].iloc[0]
    assert row.failures == top_n and row.oom + row.failed == top_n
    fig = fl.class_figure(classes)
    assert fig.layout.barmode == "stack" and len(fig.data) == len(classes.columns)
    latest = fl.latest_errors(all_runs, limit=5)
    assert len(latest) == 5 and latest.id.is_monotonic_decreasing and "success" not in set(latest.status)
    rates = fl.dimension_failure_rates("zero_stage", {1: (10, 7), 0: (4, 4), None: (0, 0)})
    assert rates.zero_stage.tolist() == [0, 1] and rates.failure_rate.tolist() == [0.0, pytest.approx(0.3)]


# --- options, sql, client ---------------------------------------------------------------------

def test_options_from_runs_and_cells(all_runs, cells, data_dir):
    runs = opt.collect_runs(all_runs[:3], cells)
    assert len({r["id"] for r in runs}) == len(runs)
    o = opt.options(all_runs)
    assert o["gpu_type"] == ["H100-SXM-80GB"] and o["nodes"] == [1, 2, 4] and o["seq_len"] == [4096]
    from datetime import date, datetime

    days = sorted(datetime.fromisoformat(r["date"]).date() for r in csv_rows(data_dir) if r["date"])
    assert o["framework"] == ["nanotron"] and o["dates"] == [days[0], days[-1]]  # the CSV's `date` column
    assert opt.distinct([{"x": 3}, {"x": 1}, {"x": None}, {"x": 3}], "x") == [1, 3]
    assert opt.date_bounds(date(2025, 1, 2), date(2025, 1, 3)) == {
        "started_after": "2025-01-02T00:00:00", "started_before": "2025-01-04T00:00:00"}
    assert opt.parse_day("2025-03-04T10:00:00Z") == date(2025, 3, 4) and opt.parse_day("junk") is None


def test_options_from_one_sql_query(api, data_dir):
    body = api.post("/api/v1/sql", json={"query": opt.options_sql()}).json()
    o = opt.from_sql(body)
    rows = csv_rows(data_dir)
    assert o["gpu_type"] == ["H100-SXM-80GB"] and o["nodes"] == sorted({int(float(r["nodes"])) for r in rows})
    assert o["counts"]["nodes"] == dict(Counter(int(float(r["nodes"])) for r in rows))
    assert o["slice"] == ("H100-SXM-80GB", 4096, len(rows))  # the one (GPU, seq) pair of the sample
    # a retired run leaves the count, as it leaves the heatmap: the page and `scalebook heatmap` say the same
    first = api.get("/api/v1/runs", params={"limit": 1}).json()["runs"][0]
    assert api.post("/api/v1/runs/retire", json={"ids": [first["id"]], "reason": "test"}).status_code == 200
    o = opt.from_sql(api.post("/api/v1/sql", json={"query": opt.options_sql()}).json())
    top = api.get("/api/v1/heatmap/slices").json()["slices"][0]
    assert o["slice"] == (top["gpu_type"], top["seq_len"], top["runs"]) == ("H100-SXM-80GB", 4096, len(rows) - 1)
    assert api.post("/api/v1/runs/unretire", json={"ids": [first["id"]]}).status_code == 200  # the module's data
    days = sorted(datetime.fromisoformat(r["date"]).date() for r in rows if r["date"])
    assert o["dates"] == [days[0], days[-1]] and all(isinstance(n, int) for n in o["nodes"])


def test_styled_tables_show_missing_values_as_a_dash(all_runs):
    table = rl.runs_table(all_runs[:3])
    table.loc[0, "mfu"] = None
    table.loc[1, "started_at"] = None
    shown = rl.styled(table)
    assert shown.loc[0, "mfu"] == "—" and shown.loc[1, "started_at"] == "—"
    assert not ({"None", "nan", "NaN", "<NA>"} & set(shown.to_numpy().ravel()))
    assert shown.loc[2, "mfu"].endswith("%") and "," in shown.loc[2, "tokens_per_sec_per_gpu"]


def test_fit_errors_are_what_the_chart_shows():
    frame = sc.points_frame([{"nodes": n, "world_size": 8 * n, "tokens_per_sec_per_gpu": t, "efficiency": e}
                             for n, t, e in ((1, 100.0, 1.0), (2, 90.0, 0.9), (4, 60.0, 0.6))])
    errors = sc.fit_errors(frame, {"serial_fraction": 0.1, "base_nodes": 1})
    fit2 = (1 / (0.1 + 0.9 / 2)) / 2  # Amdahl efficiency at 2× the base nodes
    assert errors.loc[1, "fit_efficiency"] == pytest.approx(fit2)
    assert errors.loc[1, "error_pp"] == pytest.approx(100 * (fit2 - 0.9))
    text = sc.fit_quality(errors)
    worst = errors["error_pp"].abs().idxmax()
    assert f"at {int(errors.loc[worst, 'nodes'])} nodes" in text and "percentage points" in text
    assert sc.fit_errors(frame, None).empty


def test_explore_query_and_frame(api):
    from dashboard.logic import explore as ex

    query = ex.explore_sql({"gpu_type": "H100-SXM-80GB", "status": "oom", "seq_len": 4096, "framework": None})
    assert "gpu_type = 'H100-SXM-80GB'" in query and "seq_len = 4096" in query and "framework" not in query.split(
        "where")[1]
    assert ex.sql_literal("it's") == "'it''s'"
    with pytest.raises(ValueError):
        ex.explore_sql({"dp; drop table runs": 1})
    df = ex.frame(api.post("/api/v1/sql", json={"query": query}).json())
    expected = api.get("/api/v1/runs", params={"status": "oom", "limit": 1}).json()["total"]
    assert len(df) == expected and set(df.status) == {"oom"}
    fig = ex.scatter(ex.frame(api.post("/api/v1/sql", json={"query": ex.explore_sql({})}).json()), "nodes",
                     "tokens_per_sec_per_gpu")
    assert {t.name for t in fig.data} == {"success"}  # failed runs have no tok/s: left out of this scatter
    assert all(len(t.customdata) == len(t.x) for t in fig.data)
    event = {"selection": {"points": [{"customdata": [5]}, {"customdata": [3]}, {"customdata": [5]}]}}
    assert ex.selected_ids(type("E", (), event)()) == [5, 3]


def test_explore_ranges_narrow_the_runs_and_show_on_the_parallel_axes():
    from dashboard.logic import explore as ex

    df = pd.DataFrame({"id": [1, 2, 3, 4], "nodes": [1.0, 2.0, 8.0, None], "mfu_derived": [0.30, 0.41, 0.38, 0.5],
                       "tp": [1.0, 1.0, 1.0, 1.0], "status": ["success"] * 4})
    assert ex.bounds(df, "nodes") == (1, 8) and isinstance(ex.bounds(df, "nodes")[0], int)
    assert ex.bounds(df, "mfu_derived") == (0.30, 0.5)
    assert ex.bounds(df, "tp") is None  # one value: nothing to narrow
    narrowed = ex.apply_ranges(df, {"nodes": (2, 8), "mfu_derived": (0.35, 0.45)})
    assert narrowed["id"].tolist() == [2, 3]  # run 4 has no node count: not in any node range
    assert ex.apply_ranges(df, {})["id"].tolist() == [1, 2, 3, 4]
    fig = ex.parallel(narrowed, ["nodes", "mfu_derived"], "status", {"nodes": (2, 8)})
    dims = fig.data[0].dimensions
    assert list(dims[0].constraintrange) == [2, 8] and dims[1].constraintrange is None


def test_recommend_question_round_trips_through_the_url():
    from dashboard.logic import recommend as rq

    query = rq.recommend_params("8B", 8, 8, "H100", 0, 4_194_304, 3)
    url = rq.url_from_query(query)
    assert url == {"model_params": "8B", "nodes": "8", "gpus_per_node": "8", "gpu_type": "H100",
                   "global_batch_tokens": "4194304", "k": "3"}
    assert rq.query_from_url(url) == query
    # the framework, precision and model shape travel too
    shaped = rq.recommend_params("8B", 8, 8, "H100", shape={"framework": "nanotron", "precision": "the records'",
                                                            "num_layers": 32, "hidden_size": 0,
                                                            "gated_linear_unit": False})
    assert (shaped["framework"], shaped["precision"], shaped["num_layers"], shaped["hidden_size"]) == (
        "nanotron", None, 32, None)
    shaped_url = rq.url_from_query(shaped)
    assert shaped_url["gated_linear_unit"] == "false" and "precision" not in shaped_url
    assert rq.query_from_url(shaped_url) == shaped
    with pytest.raises(ValueError, match="gated_linear_unit='maybe'"):
        rq.query_from_url({"model_params": "8B", "nodes": "8", "gated_linear_unit": "maybe"})
    assert rq.query_from_url({"nodes": "8"}) is None and rq.query_from_url({}) is None
    with pytest.raises(ValueError, match="nodes='eight'"):
        rq.query_from_url({"model_params": "8B", "nodes": "eight"})
    with pytest.raises(ValueError, match="at most 50"):
        rq.query_from_url({"model_params": "8B", "nodes": "8", "k": "500"})


def test_sql_result_table():
    body = {"columns": ["nodes", "n", "n"], "rows": [[1, 65, 2], [2, 120, 3]], "row_count": 2, "truncated": True,
            "elapsed_ms": 3.2}
    frame = sq.result_frame(body)
    assert list(frame.columns) == ["nodes", "n", "n_2"] and frame.n.tolist() == [65, 120]
    caption = sq.result_caption(body, 0.012)
    assert caption.startswith("2 rows (truncated")
    assert "3 ms in the database" in caption and "12 ms round trip" in caption
    assert "FROM runs" in sq.EXAMPLE_QUERY


def test_client_errors_and_params():
    from conftest import free_port

    url = f"http://127.0.0.1:{free_port()}"
    with pytest.raises(ApiDown) as down:
        Client(url, timeout=2).get("/heatmap")
    assert f"cannot reach the scalebook API at {url}" in str(down.value) and "scalebook serve" in str(down.value)
    assert clean_params({"a": None, "b": "", "c": True, "d": 3}) == {"c": "true", "d": 3}
    missing = ApiError(404, "not_found", "Not Found")
    assert missing.endpoint_missing and not ApiError(404, "not_found", "no successful run").endpoint_missing
