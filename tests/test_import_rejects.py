"""Import rejects a user can act on (issue 30 item 7), on both backends: every rejected row's line
and reason on screen (up to ten), each reason naming the field and its value, the rejects file in
$SCALEBOOK_DATA_DIR/rejects/ (said on screen) with `line` filled for CSV; `push` of a file that
is not JSON is one clear error, not an empty progress bar. The bad values are written here, so
the expected reasons come from this file, not from the code under test."""

from __future__ import annotations

import csv
import json

import httpx
import pytest
from typer.testing import CliRunner

from service.cli import app
from service.settings import get_settings

runner = CliRunner()
HEADER = ["run_key", "model_name", "model_params", "nodes", "gpus_per_node", "dp", "tp", "pp", "seq_len", "status",
          "tokens_per_sec_per_gpu", "mfu", "gpu_type"]
GOOD = ["k", "llama", "8000000000", "1", "8", "8", "1", "1", "4096", "success", "9000", "0.4", "H100-SXM-80GB"]
#: (column, bad value) per bad row; the row's line in the file is its index + 2 (after the header, a good row)
BAD = [("mfu", "1.4"), ("status", "succes"), ("tokens_per_sec_per_gpu", "-5"), ("dp", "eight")]


@pytest.fixture
def data_dir_env(tmp_path, monkeypatch):
    monkeypatch.setenv("SCALEBOOK_DATA_DIR", str(tmp_path / "data"))
    monkeypatch.setenv("COLUMNS", "80")
    get_settings.cache_clear()
    yield tmp_path / "data"
    get_settings.cache_clear()


def write_bad_csv(path) -> None:
    with open(path, "w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(HEADER)
        w.writerow(GOOD)
        for i, (col, value) in enumerate(BAD):
            row = list(GOOD)
            row[0] = f"bad{i}"
            row[HEADER.index(col)] = value
            w.writerow(row)


def test_import_shows_each_reject_with_line_field_and_value(live_api, data_dir_env, tmp_path, monkeypatch):
    path = tmp_path / "bad.csv"
    write_bad_csv(path)
    monkeypatch.chdir(tmp_path)
    out = runner.invoke(app, ["import", "runs", str(path)])
    assert out.exit_code == 1
    text = " ".join(out.output.split())
    assert f"{path}: read 5, stored 1, already present 0, rejected 4" in text
    rejects = data_dir_env / "rejects" / "bad.rejects.csv"
    assert f"every rejected row with its reason: {rejects}" in text
    assert not (tmp_path / "bad.rejects.csv").exists()  # not in the current directory
    with open(rejects, newline="") as fh:
        rows = list(csv.DictReader(fh))
    assert [int(r["line"]) for r in rows] == [3, 4, 5, 6]  # the physical lines of the bad rows
    for r, (col, value) in zip(rows, BAD):
        assert col in r["reason"] and value.lstrip("-") in r["reason"], r["reason"]
        assert f"line {r['line']}: " in text  # on screen too, with its line
        assert json.loads(r["row"])["run_key"] == f"bad{BAD.index((col, value))}"
    assert "status = 'succes'" in text  # the value the enum refused, not only the allowed ones
    # 80 columns, but for lines naming a file (pytest's paths are long; soft-wrapped by the terminal, so a
    # copied path stays whole)
    assert max(len(line) for line in out.output.splitlines() if str(tmp_path) not in line) <= 80


def test_table_import_rejects_carry_their_line(live_api, data_dir_env, data_dir, tmp_path):
    src = data_dir / "published" / "llama3_405b_table4.csv"
    with open(src, newline="") as fh:
        rows = list(csv.DictReader(fh))
    bad = [i for i, r in enumerate(rows) if r["num_gpus"] and r["dp"] and int(r["dp"]) * int(r["tp"] or 1)
           * int(r["pp"] or 1) * int(r["cp"] or 1) != int(r["num_gpus"])]
    assert bad
    out = runner.invoke(app, ["import", "table", str(src)])
    assert out.exit_code == 1
    with open(data_dir_env / "rejects" / "llama3_405b_table4.rejects.csv", newline="") as fh:
        got = list(csv.DictReader(fh))
    assert [int(r["line"]) for r in got] == [i + 2 for i in bad]
    assert all(f"world_size {rows[i]['num_gpus']}" in r["reason"] for r, i in zip(got, bad))
    assert f"line {bad[0] + 2}: " in out.output


def test_push_of_malformed_json_is_one_clear_error(live_api, data_dir_env, tmp_path):
    broken = tmp_path / "runs.json"
    broken.write_text('{"model_params": 8e9, "nodes": 1\n')
    out = runner.invoke(app, ["push", str(broken)])
    text = " ".join(out.output.split())
    assert out.exit_code == 1
    assert "not JSON or JSONL" in text and "line 2, column 1" in text and "nothing sent" in text
    assert "0/0" not in out.output and "importing" not in out.output
    control = tmp_path / "control.json"  # json's "Invalid control character at": said once, not "at at"
    control.write_text('{"bad json\n')
    said = " ".join(runner.invoke(app, ["push", str(control)]).output.split())
    assert "Invalid control character at line 1, column 11" in said and " at at " not in said
    empty = tmp_path / "empty.json"
    empty.write_text("[]")
    out = runner.invoke(app, ["push", str(empty)])
    assert out.exit_code == 1 and "holds no run record" in " ".join(out.output.split())
    assert httpx.get(f"{live_api}/api/v1/runs").json()["total"] == 0

    # JSONL with one broken line: the good lines are stored, the broken one is a reject with its line
    good = {"run_key": "p1", "model_params": 8_000_000_000, "nodes": 1, "gpus_per_node": 8, "dp": 8}
    mixed = tmp_path / "mixed.jsonl"
    mixed.write_text(json.dumps(good) + "\n{oops\n" + json.dumps({**good, "run_key": "p2"}) + "\n")
    out = runner.invoke(app, ["push", str(mixed)])
    assert out.exit_code == 1
    assert "line 2: not JSON" in " ".join(out.output.split()) and "'{oops'" in out.output
    assert httpx.get(f"{live_api}/api/v1/runs").json()["total"] == 2


def test_a_gpu_type_read_as_a_catalog_name_is_said(live_api, data_dir_env, tmp_path):
    """A typo in gpu_type matches the catalog's H100 PCIe pattern: the import says what it was
    stored as, and the reported name stays in extra (issue 30 item 8)."""
    run = {"run_key": "typo", "model_params": 8_000_000_000, "nodes": 1, "gpus_per_node": 8, "dp": 8,
           "gpu_type": "H100-PCIe-typo", "precision": "bf16"}
    path = tmp_path / "typo.jsonl"
    path.write_text(json.dumps(run) + "\n" + json.dumps({**run, "run_key": "exact", "gpu_type": "H100-PCIe-80GB"}))
    out = runner.invoke(app, ["push", str(path)])
    assert out.exit_code == 0, out.output
    text = " ".join(out.output.split())
    assert "gpu_type 'H100-PCIe-typo' stored as 'H100-PCIe-80GB' (1 run(s); the reported name is kept in " \
           "extra.gpu_type_reported)" in text
    assert "'H100-PCIe-80GB' stored as" not in text  # a catalog name is not an interpretation
    summary = json.loads(runner.invoke(app, ["push", str(path), "--json"]).stdout)
    assert summary["canonicalised"] == [{"field": "gpu_type", "reported": "H100-PCIe-typo", "stored": "H100-PCIe-80GB",
                                         "runs": 1}]
    [stored] = httpx.get(f"{live_api}/api/v1/runs", params={"run_key": "typo"}).json()["runs"]
    assert stored["extra"]["gpu_type_reported"] == "H100-PCIe-typo"
