"""Retired runs visible as such, and exports of every page (issue 30 item 11), on both backends:
GET /runs?retired=true|false, `scalebook runs` marking retired runs and `--retired`, and
`scalebook export` (CSV / JSONL / Parquet, all pages) that `scalebook import runs` reads back
storing nothing new."""

from __future__ import annotations

import csv
import io
import json
import re

import httpx
import pytest
from typer.testing import CliRunner

from service.cli import app

runner = CliRunner()
RUN = {"model_name": "llama3-8b", "model_params": 8_030_261_248, "nodes": 1, "gpus_per_node": 8, "dp": 8, "tp": 1,
       "pp": 1, "seq_len": 4096, "gpu_type": "H100-SXM-80GB", "precision": "bf16", "status": "success",
       "tokens_per_sec_per_gpu": 9000.0, "extra": {"tp_mode": "ALL_REDUCE"}}


def store(base: str, n: int) -> list[int]:
    runs = [{**RUN, "run_key": f"r{i}", "nodes": 1 + i % 3, "dp": 8 * (1 + i % 3),
             "tokens_per_sec_per_gpu": 9000.0 + i} for i in range(n)]
    ids: list[int] = []
    with httpx.Client(base_url=base, timeout=60) as c:
        for start in range(0, n, 1000):
            r = c.post("/api/v1/runs", json={"runs": runs[start:start + 1000]}, headers={"Prefer": "return=minimal"})
            assert r.status_code == 201, r.text
            ids += r.json()["ids"]
    return ids


def test_retired_filter_and_runs_table(live_api, monkeypatch):
    ids = store(live_api, 6)
    with httpx.Client(base_url=live_api) as c:
        assert c.post("/api/v1/runs/retire", json={"ids": ids[:2], "reason": "wrong cluster"}).status_code == 200
        only = c.get("/api/v1/runs", params={"retired": "true"}).json()
        assert sorted(r["id"] for r in only["runs"]) == ids[:2] and only["total"] == 2
        assert all(r["retired_reason"] == "wrong cluster" and r["retired_at"] for r in only["runs"])
        assert c.get("/api/v1/runs", params={"retired": "false"}).json()["total"] == 4
        assert c.get("/api/v1/runs").json()["total"] == 6  # both by default, as before
    monkeypatch.setenv("COLUMNS", "80")
    out = runner.invoke(app, ["runs", "-n", "10"])
    assert out.exit_code == 0, out.output
    assert out.output.count("(retired)") == 2
    lines = out.output.splitlines()
    for run_id in ids:  # a row's status wraps over its lines, up to the next row's first line
        start = next(i for i, line in enumerate(lines) if re.match(rf"│\s*{run_id}\s*│", line))
        end = next((i for i in range(start + 1, len(lines)) if re.match(r"│\s*\d+\s*│", lines[i])), len(lines))
        assert ("(retired)" in "".join(lines[start:end])) == (run_id in ids[:2])
    assert max(len(line) for line in out.output.splitlines()) <= 80
    hidden = runner.invoke(app, ["runs", "--not-retired", "--json"])
    assert json.loads(hidden.stdout)["total"] == 4


@pytest.mark.slow
def test_export_every_page_and_import_it_back(live_api, tmp_path, monkeypatch):
    """2,500 runs: three pages of GET /runs; every one exported, in each format, and re-imported as
    'already present'."""
    ids = store(live_api, 2500)
    with httpx.Client(base_url=live_api) as c:
        c.post("/api/v1/runs/retire", json={"ids": ids[:5], "reason": "test"})
    monkeypatch.setenv("SCALEBOOK_DATA_DIR", str(tmp_path / "data"))
    out = runner.invoke(app, ["export", "--quiet"])  # CSV on stdout
    assert out.exit_code == 0, out.output
    rows = list(csv.DictReader(io.StringIO(out.stdout)))
    assert [int(r["id"]) for r in rows] == ids  # every page, ids ascending
    assert json.loads(rows[0]["extra"])["tp_mode"] == "ALL_REDUCE" and rows[0]["retired_reason"] == "test"
    for suffix in ("csv", "jsonl", "parquet"):
        path = tmp_path / f"runs.{suffix}"
        done = runner.invoke(app, ["export", "-o", str(path), "--quiet"])
        assert done.exit_code == 0 and f"exported 2,500 run(s) as {suffix}" in " ".join(done.output.split())
        back = runner.invoke(app, ["import", "runs", str(path), "--json"])
        summary = json.loads(back.stdout)
        assert (summary["read"], summary["stored"], summary["already_present"], summary["rejected"]) == \
            (2500, 0, 2500, 0), suffix
    lines = (tmp_path / "runs.jsonl").read_text().splitlines()
    assert len(lines) == 2500 and json.loads(lines[-1])["id"] == ids[-1]
    # the filters of `scalebook runs` apply
    some = runner.invoke(app, ["export", "--retired", "--format", "jsonl", "--quiet"])
    assert [json.loads(x)["id"] for x in some.stdout.splitlines()] == ids[:5]
    two = runner.invoke(app, ["export", "--nodes", "2", "--not-retired", "--quiet"])
    assert len(list(csv.DictReader(io.StringIO(two.stdout)))) == sum(1 for i in range(5, 2500) if i % 3 == 1)
    refused = runner.invoke(app, ["export", "--format", "parquet"])
    assert refused.exit_code == 2 and "--output" in refused.output
