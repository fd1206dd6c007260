"""Progress display of long CLI work (service/cli/progress.py): plain periodic lines on stderr
when it is not a terminal (a 100,000-row import, a spool sync), a rich bar on a terminal, nothing
with --quiet, and stdout (--json) untouched."""

from __future__ import annotations

import io
import json
import re

import pytest
from typer.testing import CliRunner

from service.cli import app
from service.cli.progress import Progress

runner = CliRunner()
LINE = re.compile(r"^importing \S+: ([\d,]+)/([\d,]+) runs \((\d+)%\), [\d,]+ runs/s(, .+ left)?$")


def write_runs(path, n: int, prefix: str) -> None:
    with open(path, "w") as fh:
        fh.writelines(json.dumps({"run_key": f"{prefix}-{i}", "name": f"{prefix} {i}", "model_params": 8_030_261_248,
                                 "nodes": 1 + i % 8, "gpus_per_node": 8, "tp": 1 + i % 2, "seq_len": 4096,
                                 "micro_batch_size": 1 + i % 4, "gpu_type": "H100", "status": "success",
                                 "tokens_per_sec_per_gpu": 1000.0 + i % 977}) + "\n" for i in range(n))


# One backend and 20,000 runs: this checks the CLI's display (a 100,000-run import prints the same
# lines; see the README), and big imports through PostgreSQL take minutes on a small machine;
# storing runs on both backends is covered by the tests below and test_api_runs.py.
@pytest.mark.parametrize("backend", ["duckdb"], indirect=True)
def test_a_20000_row_import_shows_progress_lines_when_not_a_tty(live_api, tmp_path):
    path = tmp_path / "sweep.jsonl"
    write_runs(path, 20_000, "progress")
    result = runner.invoke(app, ["push", str(path), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["stored"] == 20_000  # --json stdout stays one JSON document
    lines = result.stderr.strip().splitlines()
    steps = [LINE.match(line) for line in lines[:-1]]
    assert all(steps), lines
    assert len(steps) >= 9  # a line at least every 10 %
    done = [int(m.group(1).replace(",", "")) for m in steps]
    assert done == sorted(done) and all(m.group(2) == "20,000" for m in steps)
    assert {int(m.group(3)) // 10 * 10 for m in steps} >= {10, 20, 30, 40, 50, 60, 70, 80, 90}
    assert re.match(r"^importing \S+: 20,000 runs in [\d.]+ s \([\d,]+ runs/s\)$", lines[-1]), lines[-1]


def test_quiet_silences_progress(live_api, tmp_path):
    path = tmp_path / "small.jsonl"
    write_runs(path, 3_000, "quiet")
    loud = runner.invoke(app, ["push", str(path), "--json"])
    assert loud.exit_code == 0 and "importing" in loud.stderr
    quiet = runner.invoke(app, ["push", str(path), "--json", "--quiet"])
    assert quiet.exit_code == 0, quiet.output
    assert quiet.stderr == ""
    assert json.loads(quiet.stdout)["already_present"] == 3_000


def test_sync_shows_progress(live_api, tmp_path):
    spool = tmp_path / "spool"
    spool.mkdir()
    write_runs(spool / "spool.jsonl", 2_500, "spooled")
    result = runner.invoke(app, ["sync", "--spool-dir", str(spool), "--json"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["replayed"] == 2_500
    lines = result.stderr.strip().splitlines()
    assert any(re.match(r"^syncing \S+: [\d,]+/2,500 runs \(\d+%\)", line) for line in lines), lines
    assert re.match(r"^syncing \S+: 2,500 runs in ", lines[-1]), lines


class FakeTerminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_terminal_gets_a_rich_bar_with_rate_and_time_left(monkeypatch):
    monkeypatch.setenv("TERM", "xterm")
    out = FakeTerminal()
    with Progress("importing x.csv", total=4_000, stream=out) as bar:
        for _ in range(4):
            bar.advance(1_000)
    text = out.getvalue()
    assert "importing x.csv" in text and "4000/4000" in text and "100%" in text and "runs/s" in text
    assert not re.search(r"^importing x.csv: ", text, re.MULTILINE)  # not the plain lines
