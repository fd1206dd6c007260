"""Real `scalebook serve` / `scalebook up` processes: clean shutdown on SIGTERM and Ctrl-C (exit 0,
no traceback, nothing lost), the quick start from a clean data dir, several API processes on one
PostgreSQL, and changes made with outside SQL seen by the next answer (no state in the process)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
from conftest import REPO, free_port
from test_api_runs import run

from service import run_cells, run_configs
from service.tables import Base

RECOMMEND = {"model_params": "8B", "nodes": 2}


class Proc:
    """A `scalebook` subprocess (from this checkout) with its output in a file; `base` is its API."""

    def __init__(self, tmp_path: Path, args: list[str], env: dict[str, str], port: int):
        self.base = f"http://127.0.0.1:{port}"
        self.log_path = tmp_path / f"{args[0]}-{port}.log"
        self.log = open(self.log_path, "wb")  # noqa: SIM115 - closed in stop()
        clean = {k: v for k, v in os.environ.items() if not k.startswith("SCALEBOOK_")}
        self.proc = subprocess.Popen([sys.executable, "-m", "service.cli", *args], env={**clean, **env},
                                     stdout=self.log, stderr=subprocess.STDOUT, cwd=REPO)

    def output(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_until(self, ready, what: str, timeout_s: float = 180.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            assert self.proc.poll() is None, f"exited with {self.proc.returncode}: {self.output()[-3000:]}"
            try:
                if ready():
                    return
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"{what} not ready: {self.output()[-3000:]}"
            time.sleep(0.2)

    def healthy(self) -> bool:
        return httpx.get(f"{self.base}/api/v1/health", timeout=5).status_code == 200

    def stop(self, sig: int = signal.SIGTERM) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise
        self.log.close()
        return self.proc.returncode


def serve(tmp_path: Path, db_url: str) -> Proc:
    port = free_port()
    p = Proc(tmp_path, ["serve", "--port", str(port), "--log-level", "warning"],
             {"SCALEBOOK_DATABASE_URL": db_url}, port)
    p.wait_until(p.healthy, "scalebook serve")
    return p


@pytest.mark.integration
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_stops_cleanly_and_keeps_what_it_acknowledged(db_url, tmp_path, sig):
    server = serve(tmp_path, db_url)
    try:
        posted = httpx.post(f"{server.base}/api/v1/runs", json={"runs": [run(run_key=f"k{i}") for i in range(5)]})
        assert posted.status_code == 201
    finally:
        rc = server.stop(sig)
    assert rc == 0, server.output()[-3000:]
    assert "Traceback" not in server.output()
    assert "leaked" not in server.output()
    again = serve(tmp_path, db_url)
    try:
        assert httpx.get(f"{again.base}/api/v1/runs").json()["total"] == 5
    finally:
        assert again.stop(signal.SIGINT) == 0


@pytest.mark.integration
@pytest.mark.slow
def test_up_from_a_clean_data_dir_serves_the_example_data_and_stops_on_sigterm(tmp_path):
    """The quick start: `scalebook up` on an empty data dir migrates the embedded DuckDB, imports
    examples/data and starts the dashboard; SIGTERM stops the API and the dashboard, exit 0. The
    terminal shows the import and what is up, not the servers' logs (those are in data/logs/)."""
    port, dash_port = free_port(), free_port()
    data_dir = tmp_path / "data"
    up = Proc(tmp_path, ["up", "--port", str(port), "--dashboard-port", str(dash_port)],
              {"SCALEBOOK_DATA_DIR": str(data_dir)}, port)
    try:
        up.wait_until(lambda: httpx.get(f"http://127.0.0.1:{dash_port}/_stcore/health", timeout=5).status_code == 200,
                      "the dashboard")
        runs = httpx.get(f"{up.base}/api/v1/runs", params={"framework": "nanotron", "limit": 1}).json()
        assert runs["total"] > 100  # the Ultra-Scale Playbook sample, imported through the API
        heatmap = httpx.get(f"{up.base}/api/v1/heatmap", params={"framework": "nanotron"}).json()["cells"]
        assert heatmap and all(c["best"] is None or c["best"]["framework"] == "nanotron" for c in heatmap)
        assert any(c["best"] for c in heatmap)
        up.wait_until(lambda: "scalebook is up" in up.output(), "the closing line")
        terminal = up.output()
        assert f"Logs: {data_dir / 'logs'}" in " ".join(terminal.split())
        # the servers' own lines are in their logs, not between the import's lines
        assert "GET /api/v1" not in terminal and "INFO:" not in terminal and "You can now view" not in terminal
        assert "GET /api/v1/health" in (data_dir / "logs" / "api.log").read_text()
        assert "1 rejected" in terminal and "world_size 16384" in terminal  # a reject's reason, on screen
    finally:
        rc = up.stop(signal.SIGTERM)
    assert rc == 0, up.output()[-3000:]
    assert "Traceback" not in up.output()
    for p in (port, dash_port):  # the children are gone: nothing answers on their ports
        with pytest.raises(httpx.TransportError):
            httpx.get(f"http://127.0.0.1:{p}/", timeout=2)
    assert (data_dir / "scalebook.duckdb").is_file()


@pytest.mark.integration
def test_two_serve_processes_on_one_postgresql_see_each_others_writes(pg_session_url, tmp_path):
    """Teams outgrow one machine with several stateless API processes on one PostgreSQL (a DuckDB
    file has one owner): a run posted to one is in the other's runs, heatmap and recommend answers
    at once."""
    engine = sa.create_engine(pg_session_url)
    with engine.begin() as conn:
        # every table (runs and what is derived from it in the same transactions: run_configs, ...),
        # as the other tests' fixtures leave them (conftest.db_url)
        conn.execute(sa.text("TRUNCATE " + ", ".join(t.name for t in Base.metadata.sorted_tables)))
    engine.dispose()
    a, b = serve(tmp_path, pg_session_url), serve(tmp_path, pg_session_url)
    try:
        before = httpx.get(f"{b.base}/api/v1/recommend", params=RECOMMEND).json()["candidates"]
        assert httpx.get(f"{b.base}/api/v1/heatmap").json()["cells"] == [] and before == []
        posted = httpx.post(f"{a.base}/api/v1/runs", json=run(run_key="shared"))
        assert posted.status_code == 201
        run_id = posted.json()["id"]
        assert httpx.get(f"{b.base}/api/v1/runs/{run_id}").json()["run_key"] == "shared"
        [cell] = httpx.get(f"{b.base}/api/v1/heatmap").json()["cells"]
        assert cell["best"]["id"] == run_id
        [ran] = httpx.get(f"{b.base}/api/v1/recommend", params=RECOMMEND).json()["measured_on_target"]
        assert ran["run_id"] == run_id
        # a better run posted to b is a's answer at once
        better = httpx.post(f"{b.base}/api/v1/runs", json=run(run_key="better", tokens_per_sec_per_gpu=5000.0))
        assert httpx.get(f"{a.base}/api/v1/heatmap").json()["cells"][0]["best"]["id"] == better.json()["id"]
    finally:
        assert a.stop() == 0 and b.stop() == 0


def test_outside_sql_edits_and_deletes_show_in_the_next_answer(client, database):
    """Nothing is kept between requests: /recommend and the heatmap read the summaries the write paths keep
    in the database (run_configs, run_cells: DESIGN §5), which `scalebook db rebuild-configs` brings up to
    date after outside SQL — then their answers agree, with no restart; a heatmap read over `runs` (a filter
    the summary does not keep) shows the change at once."""
    ids = {k: client.post("/api/v1/runs", json=run(run_key=k, tokens_per_sec_per_gpu=tps,
                                                    started_at="2026-01-02T03:04:05")).json()["id"]
           for k, tps in (("slow", 3000.0), ("fast", 4000.0))}

    def best() -> tuple[int | None, float, int]:
        """(heatmap cell's best run id, the configuration measured on the target: tokens/s and run count)."""
        [cell] = client.get("/api/v1/heatmap").json()["cells"]
        [measured] = client.get("/api/v1/recommend", params=RECOMMEND).json()["measured_on_target"]
        assert measured["run_id"] == cell["best"]["id"]
        return cell["best"]["id"], measured["tokens_per_sec_per_gpu"], measured["n_runs"]

    cell_best, before, n = best()
    assert cell_best == ids["fast"] and n == 2 and before == 4000.0
    def rebuild_configs() -> None:  # what `scalebook db rebuild-configs` does
        with database.session(write=True) as session:
            run_configs.rebuild(session)
            run_cells.rebuild(session)

    with database.engine.begin() as conn:
        conn.execute(sa.text("UPDATE runs SET tokens_per_sec_per_gpu = 9000 WHERE id = :id"), {"id": ids["slow"]})
    [cell] = client.get("/api/v1/heatmap").json()["cells"]
    assert cell["best"]["id"] == ids["fast"]  # run_cells as the write paths left it, until the rebuild
    [cell] = client.get("/api/v1/heatmap", params={"started_after": "2026-01-01T00:00:00"}).json()["cells"]
    assert cell["best"]["id"] == ids["slow"]  # over `runs` (a date filter): at once
    rebuild_configs()
    cell_best, edited, n = best()
    assert cell_best == ids["slow"] and n == 2 and edited > before
    with database.engine.begin() as conn:
        conn.execute(sa.text("DELETE FROM runs WHERE id = :id"), {"id": ids["slow"]})
    rebuild_configs()
    assert best() == (ids["fast"], 4000.0, 1)
    assert client.get("/api/v1/runs").json()["total"] == 1
