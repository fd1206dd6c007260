"""`scalebook heatmap` shows one comparable slice (issue 30 item 1) and `--model` means a size the
same way in heatmap and runs (item 6), on both backends, at 80 columns, over the shipped data
(the nanotron sweep and the published tables, posted through the API as `scalebook up` loads them)."""

from __future__ import annotations

import csv
import json

import httpx
import pytest
from conftest import playbook_sample, post_records
from typer.testing import CliRunner

from service.cli import app

runner = CliRunner()


@pytest.fixture
def shipped(live_api, data_dir, monkeypatch):
    from ingest.parsers import table

    records = list(playbook_sample(data_dir).records)
    for path in sorted((data_dir / "published").glob("*.csv")):
        records += table.parse_file(path).records
    with httpx.Client(base_url=live_api, timeout=120) as client:
        post_records(client, records)
    monkeypatch.setenv("COLUMNS", "80")
    return live_api


def wide(monkeypatch) -> None:
    """A 200-column console (rich fixed the CLI console's width when it was created)."""
    from service.cli.base import console

    monkeypatch.setattr(console, "width", 200)


def test_heatmap_shows_and_names_one_slice(shipped, data_dir, monkeypatch):
    with open(data_dir / "nanotron" / "bench_sample.csv", newline="") as fh:
        sweep = list(csv.DictReader(fh))
    assert {r["seq_len"] for r in sweep} == {"4096"}  # the sweep: H100 SXM (its importer is told), 4,096 tokens
    out = runner.invoke(app, ["heatmap"])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "slice: H100-SXM-80GB, sequence length 4,096 (" in text and "the most-recorded of" in text
    assert "--all-slices mixes them" in text
    assert max(len(line) for line in out.output.splitlines()) <= 80
    body = json.loads(runner.invoke(app, ["heatmap", "--json"]).stdout)
    bests = [c["best"] for c in body["cells"] if c["best"]]
    assert bests and {(b["gpu_type"], b["seq_len"]) for b in bests} == {("H100-SXM-80GB", 4096)}
    # widened: every GPU type and length, with the GPU in the table and a word about it
    wide(monkeypatch)
    mixed = runner.invoke(app, ["heatmap", "--all-slices"])
    assert mixed.exit_code == 0 and "every GPU type and sequence length mixed" in mixed.output
    assert "GPU" in mixed.output and "GB300" in mixed.output  # a 4-GPU GB300 node is there, and says so
    everything = json.loads(runner.invoke(app, ["heatmap", "--all-slices", "--json"]).stdout)
    assert len(everything["cells"]) > len(body["cells"])
    # one of the two named: the most-recorded length on that GPU
    b200 = json.loads(runner.invoke(app, ["heatmap", "--gpu-type", "B200", "--json"]).stdout)
    assert {c["best"]["gpu_type"] for c in b200["cells"] if c["best"]} == {"B200"}
    assert len({c["best"]["seq_len"] for c in b200["cells"] if c["best"]}) == 1


def test_model_means_a_size_family_in_heatmap_and_runs(shipped, monkeypatch):
    wide(monkeypatch)
    grid = runner.invoke(app, ["heatmap", "--all-slices", "--model", "8B"])
    assert grid.exit_code == 0, grid.output
    rows = [line for line in grid.output.splitlines() if line.startswith("│ ") and "│" in line[2:]]
    families = {line.split("│")[1].strip() for line in rows} - {""}
    assert families == {"7–8B"}
    listed = json.loads(runner.invoke(app, ["runs", "--model", "8B", "-n", "1000", "--json"]).stdout)
    assert listed["total"] > 0 and all(4.7 <= r["model_size_class"] < 10 for r in listed["runs"])
    named = json.loads(runner.invoke(app, ["runs", "--model-name", listed["runs"][0]["model_name"], "--json"]).stdout)
    assert named["total"] >= 1 and {r["model_name"] for r in named["runs"]} == {listed["runs"][0]["model_name"]}
    bad = runner.invoke(app, ["runs", "--model", "big"])
    assert bad.exit_code == 2 and "--model" in bad.output
