"""The CLI's table renderer (service/cli/render.py) and the commands that use it, against a live API
with the nanotron sample and the published tables (both backends): readable at 80 columns without a
TTY (no cell cut to "…", no exponent), numbers with units, `scaling` useful without --model, and the
exit-code rule (0 ok, 1 could not do the job, 2 usage)."""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
import sys

import httpx
import pytest
from conftest import playbook_sample, post_records
from rich.console import Console
from typer.testing import CliRunner

from service.cli import app, render
from service.cli.render import Col

runner = CliRunner()
NARROW = {"COLUMNS": "80"}


def test_number_formats_carry_units_and_never_exponents():
    assert render.number(26110.5) == "26,110" and render.number(26110.5, "tok/s") == "26,110 tok/s"
    assert render.number(3.14159) == "3.14" and render.number(0.000123) == "0.000123"
    assert render.number(0.0123) == "0.0123" and render.number(None) == "—" and render.number(float("nan")) == "—"
    assert render.number(25.07, "GiB", 1) == "25.1 GiB" and render.number(1_048_576) == "1,048,576"
    assert render.pct(0.3917) == "39.2%" and render.size(1.3) == "1.3B" and render.size(0.12) == "120M"
    assert render.size(1200.0) == "1.2T" and render.si(11e12) == "11T"
    assert render.value("mfu_derived", 0.3917) == "39.2%" and render.value("peak_memory_gib", 25.07) == "25.1 GiB"
    assert render.value("tokens_per_sec_per_gpu", 26110.52) == "26,111" and render.value("x", None) == "—"
    assert render.value("extra", {"a": 1}) == '{"a":1}' and render.value("nodes", 4) == "4"
    for v in (1e-9, 2.611e4, 1e15, 123456789.123):
        assert "e" not in render.number(v).lower()


def test_columns_are_dropped_by_rank_and_named():
    cols = [Col("a"), Col("b", drop=2), Col("c", drop=1), Col("d")]
    rows = [["x" * 20, "y" * 20, "z" * 20, "w" * 20]]
    assert render.fit_columns(cols, rows, 200) == [0, 1, 2, 3]
    assert render.fit_columns(cols, rows, 70) == [0, 2, 3]  # b (rank 2) goes first
    assert render.fit_columns(cols, rows, 40) == [0, 3]  # rank-0 columns stay even when too wide
    console = Console(width=60, record=True, force_terminal=False)
    render.table(console, cols, rows)
    out = console.export_text()
    assert "left out to fit 60 characters: b, c" in out and "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 60


@pytest.fixture
def loaded(live_api, data_dir):
    from ingest.parsers import table

    records = list(playbook_sample(data_dir).records)
    for path in sorted((data_dir / "published").glob("*.csv")):
        records += table.parse_file(path).records
    with httpx.Client(base_url=live_api, timeout=120) as client:
        post_records(client, records)
    return live_api


def assert_readable(text: str, width: int = 80) -> None:
    assert "…" not in text, text
    assert not re.search(r"\d\.\d+e[+-]\d+", text), text
    assert max(len(line) for line in text.splitlines()) <= width, text


def test_commands_read_at_80_columns_without_a_tty(loaded, data_dir):
    with open(data_dir / "nanotron" / "bench_sample.csv", newline="") as fh:
        rows = list(csv.DictReader(fh))
    best = max((r for r in rows if r["status"] == "Success" and r["nodes"] in ("1", "1.0")),
               key=lambda r: float(r["tok/s/gpu"]))
    out = runner.invoke(app, ["heatmap", "--framework", "nanotron"], env=NARROW)
    assert out.exit_code == 0, out.output
    assert_readable(out.stdout)
    assert "1–2B" in out.stdout and f"DP{best['dp']} TP{best['tp']} PP{best['pp']}" in out.stdout
    assert f"{round(float(best['tok/s/gpu'])):,}" in out.stdout  # tok/s with separators
    for args in (["runs", "-n", "30"], ["regressions"], ["scaling", "--model", "1.3B"],
                 ["sql", ("SELECT id, model_name, tokens_per_sec_per_gpu, mfu_derived, peak_memory_gib, extra "
                          "FROM runs ORDER BY id LIMIT 20")]):
        out = runner.invoke(app, args, env=NARROW)
        assert out.exit_code == 0, (args, out.output)
        assert_readable(out.stdout)
    assert "39.2%" in runner.invoke(app, ["sql", "SELECT mfu_derived FROM runs ORDER BY id LIMIT 1"], env=NARROW).stdout
    # rich reads $COLUMNS when the console is built, i.e. when the command starts: a fresh process
    wide = subprocess.run([sys.executable, "-m", "service.cli", "heatmap"], capture_output=True, text=True,
                          env={**os.environ, "COLUMNS": "200"}, check=True)
    assert "left out" not in wide.stdout and "ok/OOM/fail" in wide.stdout


def test_scaling_without_model_lists_the_sizes(loaded):
    out = runner.invoke(app, ["scaling"], env=NARROW)
    assert out.exit_code == 0, out.output
    assert "pick one with --model" in out.stdout and "1.3B" in out.stdout
    line = next(ln for ln in out.stdout.splitlines() if "│ 1.3B " in ln)
    assert "1, 2, 4" in line  # the nanotron sweep's node counts


def test_exit_codes_follow_the_documented_rule(monkeypatch):
    help_text = runner.invoke(app, ["--help"], env={"COLUMNS": "200"}).stdout
    assert "0 = done; 1 = the command could not do its job" in help_text and "2 = usage error" in help_text
    assert runner.invoke(app, ["heatmap", "--no-such-option"]).exit_code == 2
    monkeypatch.setenv("SCALEBOOK_API_URL", "http://127.0.0.1:9")
    down = runner.invoke(app, ["runs"])
    assert down.exit_code == 1 and "cannot reach the scalebook API" in down.output


def test_power_of_ten_as_papers_write_it():
    assert render.power_of_ten(4.8e22) == "4.8×10²²" and render.power_of_ten(1.24e-5) == "1.2×10⁻⁵"
    assert render.power_of_ten(None) == "—" and render.power_of_ten(0) == "0"


def test_recommend_table_names_recompute_once_and_the_evidence_hardware(capsys, monkeypatch):
    from service.cli.analytics import render_recommendation

    monkeypatch.setenv("COLUMNS", "80")
    cfg = {"dp": 64, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "zero_stage": 3, "micro_batch_size": 6,
           "grad_accum_steps": 3, "recompute": "full"}
    body = {"target": {"model_size_class": 8.0, "nodes": 8, "gpus_per_node": 8, "gpu_type": "H100-SXM-80GB",
                       "seq_len": 2048, "global_batch_tokens": 2359296},
            "model": {"status": "fitted", "n_runs": 77, "framework": "nanotron", "gpu_type": "H100-SXM-80GB",
                      "loo_median_rel_err": 0.06},
            "notes": [], "candidates": [{
                "config": cfg, "measured": None,
                "predicted": {"tokens_per_sec_per_gpu": 2818.0, "interval": [2418.0, 3285.0], "mfu": 0.466,
                              "peak_memory_gib": 29.0},
                "evidence": [{"run_id": 455, "model_size_class": 30.0, "nodes": 16, "gpu_type": "A100-SXM-40GB",
                              "distance": 2.01}]}]}
    render_recommendation(body)
    out = capsys.readouterr().out
    assert out.count("RC:full") == 1 and "A100-SXM-40GB" in out and "…" not in out
    assert max(len(line) for line in out.splitlines()) <= 80


def test_runs_model_is_a_size_as_everywhere_else(loaded):
    """`scalebook runs --model 8B` filters by size (as recommend, suggest, predict, plan read --model):
    the size's family, the heatmap's 7–8B row (4.7–10B, core/families.py); the stored name is
    --model-name."""
    out = runner.invoke(app, ["runs", "--model", "8B", "-n", "200", "--json"], env=NARROW)
    assert out.exit_code == 0, out.output
    runs = json.loads(out.stdout)["runs"]
    assert runs and all(4.7 <= r["model_size_class"] < 10 for r in runs)
    assert any(r["model_params"] == 8_000_000_000 for r in runs)
    name = runs[0]["model_name"]
    named = json.loads(runner.invoke(app, ["runs", "--model-name", name, "-n", "200", "--json"], env=NARROW).stdout)
    assert named["runs"] and all(r["model_name"] == name for r in named["runs"])
    table = runner.invoke(app, ["runs", "--model", "8B"], env=NARROW)
    assert table.exit_code == 0 and "no runs match" not in table.stdout
    assert_readable(table.stdout)


def test_help_paragraphs_fill_80_columns():
    """A command's help is wrapped by the terminal, not by the docstring's own line breaks (typer keeps
    those after the first paragraph: `plan --help` came out ragged at 80 columns, issue 30 item 5)."""
    from service.cli.base import reflow

    assert reflow("Title\n  line.\n\nOne\ntwo.\n- a\n  b\n- c\n\f\nraw\n  kept") == \
        "Title line.\n\nOne two.\n- a b\n- c\n\f\nraw\n  kept"
    out = subprocess.run([sys.executable, "-m", "service.cli", "plan", "--help"], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "80", "TERM": "dumb"}, check=True).stdout
    prose = out[out.index("Usage"):out.index("Options")].splitlines()[2:-1]
    assert max(len(line) for line in out.splitlines()) <= 80
    # a line followed by another of its paragraph is filled (the ragged help had 30-character lines)
    assert all(len(line.rstrip()) >= 60 for line, after in zip(prose, prose[1:]) if line.strip() and after.strip()), out
    assert "the MFU is the throughput model's prediction for the target" in " ".join(" ".join(prose).split())
