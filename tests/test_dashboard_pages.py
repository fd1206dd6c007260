"""One AppTest per dashboard page against a live API loaded with the real data (/work/shared/data,
parsed by the ingest parsers and POSTed through the API). Expected values are computed straight
from the nanotron CSV with the csv module. The heatmap runs on DuckDB and PostgreSQL; the other
pages on DuckDB only (they read through the same HTTP API)."""

from __future__ import annotations

import csv
import json
from collections import Counter
from datetime import date, datetime
from pathlib import Path

import httpx
import pandas as pd
import pytest
import streamlit as st
from conftest import free_port, playbook_sample, post_records
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "app.py")
DUCKDB = pytest.mark.parametrize("backend", ["duckdb"], indirect=True)
TIMEOUT = 60


@pytest.fixture(autouse=True)
def fresh_cache():
    """Cached API answers are process-wide: never let one test see another test's API."""
    st.cache_data.clear()
    yield
    st.cache_data.clear()


def csv_rows(data_dir) -> list[dict]:
    with open(data_dir / "nanotron" / "bench_sample.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def csv_best(data_dir, nodes: int, key: str = "tok/s/gpu") -> dict:
    """The successful CSV row with the highest `key` at `nodes` nodes."""
    ok = [r for r in csv_rows(data_dir) if r["status"] == "Success" and int(float(r["nodes"])) == nodes]
    return max(ok, key=lambda r: float(r[key]))


def csv_label(row: dict) -> str:
    return (f"DP{row['dp']} TP{row['tp']} PP{row['pp']} "
            f"GAS{int(float(row['batch_accum']))} Z{row['zero_stage']} MBS{row['mbs']}")


def csv_summary(row: dict) -> str:
    """The heatmap cell of a CSV row on one line: config, MFU (the CSV's %), Mem Alloc (GiB)."""
    dims, rest = csv_label(row).split(" GAS")
    return f"{dims} · GAS{rest} · MFU {float(row['mfu']):.1f}% · {float(row['Mem Alloc (GB)']):.1f} GiB"


def load(url: str, data_dir, published: bool = True) -> int:
    """POST the nanotron sample (and the published tables) through the API; returns runs stored."""
    from ingest.parsers import table

    records = list(playbook_sample(data_dir).records)
    if published:
        for path in sorted((data_dir / "published").glob("*.csv")):
            records += table.parse_file(path).records
    with httpx.Client(base_url=url, timeout=60) as client:
        stored, _rejected = post_records(client, records)
    return stored


def app(page: str | None = None) -> AppTest:
    """Run the dashboard (router) and switch to `page` (the heatmap is the default page)."""
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    if page:
        at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def texts(at: AppTest) -> str:
    """Every markdown / caption / message text of the page, joined."""
    parts = [e.value for kind in ("markdown", "caption", "info", "warning", "error", "success", "title", "subheader")
             for e in getattr(at, kind)]
    return "\n".join(str(p) for p in parts)


def frame_with(at: AppTest, *columns: str) -> pd.DataFrame:
    """The first dataframe of the page that has all `columns`."""
    for df in at.dataframe:
        value = df.value
        if isinstance(value, pd.DataFrame) and set(columns) <= set(value.columns):
            return value
    raise AssertionError(f"no dataframe with columns {columns}: {[list(d.value.columns) for d in at.dataframe]}")


# --- heatmap (both backends) ------------------------------------------------------------------

def test_heatmap_page_shows_the_best_config_per_cell(live_api, data_dir, backend):
    load(live_api, data_dir)
    at = app()
    assert at.title[0].value == "Best configuration per model size × nodes"
    # default: tokens/s per GPU on the most-recorded comparable slice (the nanotron sweep's H100 × 4,096
    # tokens plus the published H100 rows at 4,096), said on the page; families as rows, configs written
    assert at.radio(key="hm_metric").value == "tokens_per_sec_per_gpu"
    assert at.selectbox(key="hm_gpu").value == "H100-SXM-80GB" and at.selectbox(key="hm_seq").value == 4096
    assert "most-recorded comparable slice: **H100-SXM-80GB**, sequence length **4,096**" in texts(at)
    chart = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert chart["data"][0]["texttemplate"] == "%{text}"  # the configurations fit the cells
    assert (chart["data"][0]["zmin"], chart["data"][0]["zmax"]) == (0, 60)  # the fixed colour scale
    grid = at.table[0].value
    assert "1–2B" in grid.index and "7–8B" in grid.index and "6.7B" not in grid.index
    assert "too many to write the configurations" not in texts(at)
    # one click widens to every GPU type and sequence length: a link that puts it in the URL
    # (the browser test follows it); the same URL opened here
    link = next(m.value for m in at.markdown if "All GPUs &amp; lengths" in m.value)
    assert 'href="?hm_gpu=any&amp;hm_seq=any"' in link and 'target="_self"' in link
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.query_params.update(hm_gpu="any", hm_seq="any")
    at.run()
    assert at.selectbox(key="hm_gpu").value == "any" and at.selectbox(key="hm_seq").value == "any"
    assert "Every GPU type and sequence length are mixed" in texts(at)
    assert any("Back to the most-recorded slice (H100-SXM-80GB, sequence length 4,096)" in m.value for m in at.markdown)

    # only the nanotron sweep: the 1–2B family × {1, 2, 4} nodes
    at.selectbox(key="hm_fw").select("nanotron").run()
    assert not at.exception
    table = at.table[0].value
    assert list(table.columns) == ["1 node", "2 nodes", "4 nodes"] and list(table.index) == ["1–2B"]
    for nodes, column in ((1, "1 node"), (2, "2 nodes"), (4, "4 nodes")):
        best = csv_best(data_dir, nodes)
        cell = table.loc["1–2B", column]
        dims, rest = csv_label(best).split(" GAS")
        assert cell.startswith(f"{dims} · GAS{rest} · ") and f"MFU {float(best['mfu']):.1f}%" in cell
        assert cell.endswith(f"1.3B · {float(best['Mem Alloc (GB)']):.1f} GiB")
    chart = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert chart["data"][0]["text"][0][0].startswith(csv_label(csv_best(data_dir, 1)).replace(" GAS", "<br>GAS"))

    # a cell's runs: every CSV row of that node count, best first
    at.selectbox(key="hm_cell").set_value("1–2B × 2 nodes").run()
    runs = frame_with(at, "config", "tokens_per_sec_per_gpu", "status")
    assert len(runs) == sum(1 for r in csv_rows(data_dir) if int(float(r["nodes"])) == 2)
    assert runs.iloc[0]["config"] == csv_label(csv_best(data_dir, 2))
    assert "run(s) in 1–2B × 2 nodes" in texts(at)
    link = next(p.proto for p in at.get("page_link") if "What worked?" in p.proto.label)
    assert "model_params=1.3B" in link.query_string and "nodes=2" in link.query_string  # the cell's question
    labels = [b.proto.label for b in at.get("download_button")]
    assert "Cells as CSV" in labels and ("Heatmap as PNG" in labels or "Heatmap as HTML" in labels)

    # date range: only the runs started from 2025-01-01 on (the CSV's `date` column; undated rows drop out)
    at.date_input(key="hm_after").set_value(date(2025, 1, 1)).run()
    dated = Counter((int(float(r["nodes"])), r["status"]) for r in csv_rows(data_dir)
                    if r["date"] and datetime.fromisoformat(r["date"]).date() >= date(2025, 1, 1))
    for nodes in {n for n, _ in dated}:
        at.selectbox(key="hm_cell").set_value(f"1–2B × {nodes} node{'s' if nodes > 1 else ''}").run()
        ok, oom, other = (dated[nodes, s] for s in ("Success", "OOM", "Other"))
        assert any(c.value.endswith(f"ok {ok} · OOM {oom} · failed {other}") for c in at.caption)


@DUCKDB
def test_heatmap_empty_database_says_how_to_import(live_api):
    at = app()
    assert any("scalebook import nanotron --gpu-type GPU FILE" in i.value for i in at.info)
    assert not at.error


@pytest.mark.parametrize("page", [None, "app_pages/what_worked.py", "app_pages/explore.py", "app_pages/runs.py",
                                  "app_pages/scaling.py", "app_pages/failures.py", "app_pages/sql.py",
                                  "app_pages/sweeps.py"])
def test_every_page_says_when_the_api_is_down(monkeypatch, page):
    url = f"http://127.0.0.1:{free_port()}"
    monkeypatch.setenv("SCALEBOOK_API_URL", url)
    at = app(page)
    assert at.error, texts(at)
    message = at.error[0].value
    assert f"cannot reach the scalebook API at {url}" in message and "scalebook serve" in message


@DUCKDB
def test_token_required_then_accepted(live_api, data_dir, monkeypatch):
    load(live_api, data_dir, published=False)
    admin = httpx.post(f"{live_api}/api/v1/tokens", json={"name": "dash", "scope": "read"}).json()["token"]
    at = app()
    assert at.error and "set SCALEBOOK_TOKEN" in at.error[0].value
    st.cache_data.clear()
    monkeypatch.setenv("SCALEBOOK_TOKEN", admin)
    at = app()
    assert not at.error and at.table[0].value.shape == (1, 3)


# --- other pages (DuckDB) ---------------------------------------------------------------------

@DUCKDB
def test_what_worked_page_answers_with_evidence(live_api, data_dir):
    load(live_api, data_dir)
    at = app("app_pages/what_worked.py")
    at.text_input(key="ww_model").input("1.34B")
    at.number_input(key="ww_nodes").set_value(4)
    at.selectbox(key="ww_gpu").select("H100-SXM-80GB")
    at.number_input(key="ww_seq").set_value(4096)
    at.button(key="ww_submit").click().run()
    assert not at.exception and not at.error
    measured = {csv_label(r): float(r["tok/s/gpu"]) for r in sorted(
        (r for r in csv_rows(data_dir) if r["status"] == "Success" and int(float(r["nodes"])) == 4),
        key=lambda r: float(r["tok/s/gpu"]))}  # best run per config wins (sorted ascending)
    def number(text: str) -> float:  # the table writes "40,150"; a missing value is "—"
        return float(text.replace(",", ""))

    # first what ran on the target, best first, with the sweep's own figures
    ran = frame_with(at, "run", "model", "config", "tokens_per_sec_per_gpu", "memory model")
    assert ran.iloc[0]["config"] == csv_label(csv_best(data_dir, 4))
    assert ran.iloc[0]["model"] == "1.34B · nanotron · bf16"
    for _, row in ran.iterrows():
        assert number(row["tokens_per_sec_per_gpu"]) == pytest.approx(measured[row["config"]], abs=0.5)
    # then predictions for the layouts not run there
    cands = frame_with(at, "config", "predicted_tokens_per_sec_per_gpu", "interval", "evidence")
    assert not set(cands["config"]) & set(measured)
    assert all(number(v) > 0 for v in cands["predicted_tokens_per_sec_per_gpu"])
    assert not ({"None", "nan"} & set(cands.to_numpy().ravel().astype(str)))
    page = texts(at)
    assert "**Target:** 1.3B on 4 node(s) × 8 GPUs (32) of H100-SXM-80GB, seq 4096" in page
    assert "**Evidence:**" in page and "**Interval:**" in page
    nxt = frame_with(at, "config", "expected_improvement", "why")  # "Plan the next runs" (GET /suggest)
    assert len(nxt) > 0 and all(float(v.rstrip("%")) >= 0 for v in nxt["expected_improvement"])
    assert not set(nxt["config"]) & set(measured)  # never a configuration already recorded here


@DUCKDB
def test_what_worked_link_answers_when_opened_and_submissions_go_into_the_url(live_api, data_dir):
    load(live_api, data_dir)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    at.query_params.update({"model_params": "1.34B", "nodes": "4", "gpu_type": "H100-SXM-80GB", "seq_len": "4096"})
    at.switch_page("app_pages/what_worked.py").run()
    assert not at.exception and not at.error and not at.warning
    assert "**Target:** 1.3B on 4 node(s) × 8 GPUs (32) of H100-SXM-80GB, seq 4096" in texts(at)
    assert at.text_input(key="ww_model").value == "1.34B" and at.number_input(key="ww_nodes").value == 4
    at.number_input(key="ww_nodes").set_value(2)
    at.button(key="ww_submit").click().run()
    assert at.query_params["nodes"] in ("2", ["2"]) and "on 2 node(s)" in texts(at)
    # another link in the same session (a heatmap cell's): its own question is answered
    at.query_params.clear()
    at.query_params.update({"model_params": "1.34B", "nodes": "1", "gpu_type": "H100", "k": "3"})
    at.run()
    assert not at.exception and "on 1 node(s)" in texts(at) and at.number_input(key="ww_nodes").value == 1
    assert at.selectbox(key="ww_gpu").value == "H100"  # shown as the link asks it


@DUCKDB
def test_runs_page_filters_pages_and_compares(live_api, data_dir):
    stored = load(live_api, data_dir)
    at = app("app_pages/runs.py")
    assert f"**{stored:,} runs** match" in texts(at)
    assert len(frame_with(at, "id", "config", "status")) == 100

    ooms = sum(1 for r in csv_rows(data_dir) if r["status"] == "OOM")
    at.selectbox(key="runs_fw").select("nanotron").run()
    at.selectbox(key="runs_status").select("oom").run()
    assert f"**{ooms:,} runs** match" in texts(at)
    at.selectbox(key="runs_limit").select(25).run()
    assert "showing 1–25 (page 1 of 4)" in texts(at)
    at.button(key="runs_next").click().run()
    assert "showing 26–50 (page 2 of 4)" in texts(at)
    table = frame_with(at, "id", "config", "status")
    assert set(table.status) == {"oom"} and len(table) == 25

    # the two best 1-node runs of the sweep side by side
    at.selectbox(key="runs_status").select("any").run()
    at.selectbox(key="runs_nodes").select(1).run()
    at.selectbox(key="runs_sort").select("-tokens_per_sec_per_gpu").run()
    top = frame_with(at, "id", "config", "status")
    assert top.iloc[0]["config"] == csv_label(csv_best(data_dir, 1))
    cmp_table = frame_with(at, f"#{top.iloc[0]['id']}", f"#{top.iloc[1]['id']}")
    assert "micro_batch_size" in cmp_table.index
    assert "field(s) differ (highlighted): " in texts(at) and "micro_batch_size" in texts(at)
    # run detail: the sections as tables, numbers for people (issue 30 item 11)
    best = csv_best(data_dir, 1)
    assert at.number_input(key="runs_detail_id").value == int(top.iloc[0]["id"])  # the table shows text
    detail = pd.concat([d.value for d in at.dataframe if list(d.value.columns) == ["field", "value"]])
    detail = detail.set_index("field")
    assert detail.loc["dp", "value"] == best["dp"]
    assert detail.loc["tokens_per_sec_per_gpu", "value"] == f"{float(best['tok/s/gpu']):,.0f} tok/s"
    assert detail.loc["mfu", "value"] == f"{float(best['mfu']):.1f}%"  # the CSV's percent, reported
    assert cmp_table.loc["mfu"].tolist()[0] == detail.loc["mfu", "value"]
    labels = [b.proto.label for b in at.get("download_button")]
    assert "This page as CSV" in labels
    assert any(label.startswith("All ") and label.endswith(" matching runs as CSV") for label in labels)

    # a retired run: listed with its reason, the filter finds it, the detail says so
    run_id = int(top.iloc[0]["id"])
    httpx.post(f"{live_api}/api/v1/runs/retire", json={"ids": [run_id], "reason": "rerun on a fixed node"})
    st.cache_data.clear()
    at.radio(key="runs_retired").set_value("only").run()
    only = frame_with(at, "id", "status", "retired")
    assert only.id.tolist() == [str(run_id)] and only.retired.tolist() == ["retired: rerun on a fixed node"]
    assert "**1 runs** match" in texts(at)
    assert "rerun on a fixed node. Kept and listed here" in texts(at)
    at.radio(key="runs_retired").set_value("hidden").run()
    assert str(run_id) not in frame_with(at, "id", "status", "retired").id.tolist()


@DUCKDB
def test_scaling_page(live_api, data_dir):
    load(live_api, data_dir, published=False)
    at = app("app_pages/scaling.py")
    probe = httpx.get(f"{live_api}/api/v1/scaling", params={"model_params": 1_300_000_000})
    assert probe.status_code == 200, probe.text  # the endpoint the page reads exists
    points = frame_with(at, "nodes", "tokens_per_sec_per_gpu", "efficiency")
    assert [int(n) for n in points.nodes] == [1, 2, 4]
    for nodes, tps in zip(points.nodes, points.tokens_per_sec_per_gpu):
        shown = float(str(tps).replace(",", ""))  # the page shows numbers with thousands separators
        assert shown == pytest.approx(float(csv_best(data_dir, int(nodes))["tok/s/gpu"]), abs=1.0)
    assert "serial fraction" in texts(at) and at.get("plotly_chart")

    at.button(key="plan_submit").click().run()
    assert not at.exception
    probe = httpx.get(f"{live_api}/api/v1/plan", params={"model_params": 3_000_000_000, "tokens": 11 * 10**12,
                                                         "days": 28, "gpu_type": "H100-SXM-80GB"}, timeout=60)
    assert probe.status_code == 200, probe.text
    plan = probe.json()
    assert at.success and at.success[0].value.startswith(
        f"{plan['gpus_booked']:,} GPUs ({plan['nodes']:,} nodes × 8; the compute needs {plan['gpus']:,})")
    assert "GPUs booked (whole nodes)" in at.table[-1].value.index
    assert "training FLOPs ((6·N + 12·L·h·s)·tokens)" in at.table[-1].value.index  # what the count counts
    # the planner's form takes the framework and precision too: asked in fp8, the MFU is predicted in fp8
    at.selectbox(key="plan_prec").select("fp8")
    at.button(key="plan_submit").click().run()
    assert not at.exception and not at.error
    values = [str(v) for v in at.table[-1].value.iloc[:, 0]]
    assert any(v.startswith("catalog: H100-SXM-80GB fp8 dense") for v in values), values


@DUCKDB
def test_failures_page_counts_match_the_csv(live_api, data_dir):
    load(live_api, data_dir, published=False)
    at = app("app_pages/failures.py")
    assert not at.error
    counts = Counter((int(float(r["nodes"])), r["status"]) for r in csv_rows(data_dir))
    by_nodes = frame_with(at, "nodes", "runs", "oom", "other_failed", "failure_rate")
    for _, row in by_nodes.iterrows():
        assert (row.success, row.oom, row.other_failed) == (counts[row.nodes, "Success"], counts[row.nodes, "OOM"],
                                                            counts[row.nodes, "Other"])
    classes = frame_with(at, "oom_gpu")
    assert classes["oom_gpu"].sum() == sum(v for (n, s), v in counts.items() if s == "OOM")
    rates = frame_with(at, "zero_stage", "runs", "failed", "failure_rate")
    zero = Counter(r["zero_stage"] for r in csv_rows(data_dir))
    assert dict(zip(rates.zero_stage.astype(str), rates.runs)) == dict(zero)
    latest = frame_with(at, "id", "error_class", "error_message")
    assert len(latest) == 20 and "success" not in set(latest.status)


@DUCKDB
def test_sql_page_runs_a_query(live_api, data_dir):
    load(live_api, data_dir, published=False)
    at = app("app_pages/sql.py")
    assert "FROM runs" in at.text_area(key="sql_query").value
    at.button(key="sql_run").click().run()
    probe = httpx.post(f"{live_api}/api/v1/sql", json={"query": "SELECT 1"})
    assert probe.status_code == 200, probe.text
    assert not at.error, [e.value for e in at.error]
    result = frame_with(at, "model_size_class", "nodes", "runs")
    counts = Counter(int(float(r["nodes"])) for r in csv_rows(data_dir))
    assert dict(zip(result.nodes, result.runs)) == dict(counts)
    assert any(b.proto.label == "Result as CSV" for b in at.get("download_button"))
    # a refused query: the API's message, no traceback
    at.text_area(key="sql_query").input("DELETE FROM runs").run()
    at.button(key="sql_run").click().run()
    assert at.error and "query_rejected" in at.error[0].value


@DUCKDB
def test_explore_page_links_the_scatter_to_the_table(live_api, data_dir):
    load(live_api, data_dir, published=False)
    at = app("app_pages/explore.py")
    rows = csv_rows(data_dir)
    statuses = Counter(r["status"].lower().replace("other", "failed") for r in rows)
    caption = texts(at)
    assert f"{len(rows):,} runs" in caption and f"success {statuses['success']:,}" in caption
    table = frame_with(at, "id", "status", "tokens_per_sec_per_gpu")
    assert len(table) == len(rows)  # nothing selected yet: every run listed
    assert not ({"None", "nan"} & set(table.to_numpy().ravel().astype(str)))
    at.selectbox(key="ex_color").set_value("status").run()
    chart = json.loads(at.get("plotly_chart")[0].proto.spec)
    assert {t["name"] for t in chart["data"]} == {"success"}  # failures have no tok/s to place
    at.selectbox(key="ex_status").select("oom").run()
    assert f"{statuses['oom']:,} runs" in texts(at)


@DUCKDB
def test_explore_page_ranges_narrow_scatter_parallel_axes_and_table(live_api, data_dir):
    load(live_api, data_dir, published=False)
    at = app("app_pages/explore.py")
    rows = csv_rows(data_dir)
    nodes = sorted({int(float(r["nodes"])) for r in rows if r.get("nodes")})
    assert len(nodes) >= 2
    at.multiselect(key="ex_narrow").set_value(["nodes"]).run()
    at.slider(key="ex_range_nodes").set_range(nodes[0], nodes[0]).run()
    assert not at.exception, [e.value for e in at.exception]
    want = sum(1 for r in rows if r.get("nodes") and float(r["nodes"]) == nodes[0])
    table = frame_with(at, "id", "nodes")
    assert len(table) == want and set(table["nodes"].astype(str)) == {str(nodes[0])}  # shown formatted
    assert f"{want:,} of {len(rows):,} runs in the chosen ranges" in texts(at)
    assert len(at.get("plotly_chart")) == 1  # the parallel coordinates are drawn on request
    at.toggle(key="ex_parcoords_on").set_value(True).run()
    parcoords = json.loads(at.get("plotly_chart")[1].proto.spec)["data"][0]
    narrowed = [d for d in parcoords["dimensions"] if d.get("constraintrange")]
    assert [d["label"] for d in narrowed] == ["nodes"] and narrowed[0]["constraintrange"] == [nodes[0], nodes[0]]


@DUCKDB
def test_runs_page_retires_and_unretires_a_run(live_api):
    """The run detail's button: Retire posts /runs/retire with the reason; Un-retire posts
    /runs/unretire (it used to post {"retired": false} to /runs/retire, which forbids that field:
    a 422 every time)."""
    run = {"model_name": "llama3-8b", "model_params": 8_000_000_000, "seq_len": 4096, "gpu_type": "H100",
           "gpus_per_node": 8, "nodes": 1, "tp": 1, "pp": 1, "cp": 1, "micro_batch_size": 1,
           "grad_accum_steps": 1, "precision": "bf16", "status": "success", "tokens_per_sec_per_gpu": 1000.0}
    run_id = httpx.post(f"{live_api}/api/v1/runs", json=run).json()["id"]
    at = app("app_pages/runs.py")
    at.number_input(key="runs_detail_id").set_value(run_id).run()
    at.text_input(key="runs_retire_reason").input("wrong gpu_type recorded").run()
    at.button(key="runs_retire_go").click().run()
    assert not at.error, [e.value for e in at.error]
    assert f"Run #{run_id} retired." in [s.value for s in at.success]
    stored = httpx.get(f"{live_api}/api/v1/runs/{run_id}").json()
    assert stored["retired_at"] is not None and stored["retired_reason"] == "wrong gpu_type recorded"

    st.cache_data.clear()
    at = app("app_pages/runs.py")
    at.number_input(key="runs_detail_id").set_value(run_id).run()
    assert "Un-retire this run" in [b.label for b in at.button]
    at.button(key="runs_retire_go").click().run()
    assert not at.error, [e.value for e in at.error]
    assert f"Run #{run_id} un-retired." in [s.value for s in at.success]
    assert httpx.get(f"{live_api}/api/v1/runs/{run_id}").json()["retired_at"] is None


@DUCKDB
def test_what_worked_form_defaults_to_the_most_recorded_gpu_and_asks_for_the_shape(live_api, data_dir):
    load(live_api, data_dir)
    counts = httpx.post(f"{live_api}/api/v1/sql", json={
        "query": "SELECT gpu_type, count(*) AS n FROM runs WHERE gpu_type IS NOT NULL GROUP BY gpu_type "
                 "ORDER BY n DESC, gpu_type LIMIT 1"}).json()["rows"]
    at = app("app_pages/what_worked.py")
    assert at.selectbox(key="ww_gpu").value == counts[0][0]  # never "any", never an arbitrary one
    at.text_input(key="ww_model").input("1.34B")
    at.number_input(key="ww_nodes").set_value(2)
    at.selectbox(key="ww_fw").select("nanotron")
    at.selectbox(key="ww_prec").select("bf16")
    at.number_input(key="ww_num_layers").set_value(16)
    at.number_input(key="ww_hidden_size").set_value(2048)
    at.button(key="ww_submit").click().run()
    assert not at.exception and not at.error
    asked = {k: (v[0] if isinstance(v, list) else v) for k, v in at.query_params.items()}
    assert (asked["framework"], asked["precision"], asked["num_layers"], asked["hidden_size"]) == (
        "nanotron", "bf16", "16", "2048")
    assert "note: costed on" not in texts(at)  # the dims given are costed, not a recorded model's


@DUCKDB
def test_what_if_panel_predicts_any_configuration_with_the_step_bar(live_api, data_dir):
    load(live_api, data_dir, published=False)
    best = csv_best(data_dir, 4)
    at = AppTest.from_file(APP, default_timeout=TIMEOUT)
    at.run()
    at.query_params.update({"model_params": "1.34B", "nodes": "4", "gpu_type": "H100-SXM-80GB", "seq_len": "4096"})
    at.switch_page("app_pages/what_worked.py").run()
    assert not at.exception and not at.error
    # seeded with the best configuration measured on the target
    seeded = {f: at.number_input(key=f"wi_{f}").value for f in ("dp", "tp", "pp", "micro_batch_size")}
    assert seeded == {"dp": int(best["dp"]), "tp": int(best["tp"]), "pp": int(best["pp"]),
                      "micro_batch_size": int(best["mbs"])}
    assert at.number_input(key="wi_grad_accum_steps").value == int(float(best["batch_accum"]))
    at.selectbox(key="wi_zero_stage").select(int(best["zero_stage"]))
    at.button(key="wi_submit").click().run()
    assert not at.exception and not at.error
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["measured on this target"] == f"{float(best['tok/s/gpu']):,.0f}"
    bars = [json.loads(c.proto.spec) for c in at.get("plotly_chart")]
    step = next(b for b in bars if len(b["data"]) == 5 and all(t["type"] == "bar" for t in b["data"]))
    assert [t["name"] for t in step["data"]][:2] == ["compute", "pipeline bubble"]
    seconds = sum(t["x"][0] for t in step["data"])
    assert metrics["step time"] == f"{seconds:.2f} s"
    # 8 nodes: nobody ran it; the answer says it extrapolates
    at.number_input(key="wi_nodes").set_value(8)
    at.number_input(key="wi_dp").set_value(0)
    at.button(key="wi_submit").click().run()
    assert {m.label: m.value for m in at.metric}["measured on this target"] == "not run"
    assert "extrapolates" in texts(at)
    # an impossible configuration: the API's 422, naming the field, on the page
    at.number_input(key="wi_dp").set_value(3)
    at.button(key="wi_submit").click().run()
    assert not at.exception and at.error and "world_size" in at.error[0].value
