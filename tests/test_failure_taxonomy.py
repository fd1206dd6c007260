"""Issue 27's failure classes through the whole stack, on DuckDB and PostgreSQL: a diverged run, a
refused layout, a lost node and a host OOM kill are stored with their class, counted by the heatmap
(``oom_host`` as an OOM, the others as failed runs), filtered by ``GET /runs?error_class=`` and shown
by the Failures page's tables; a real diverged log imports as ``failed`` + ``divergence``."""

from __future__ import annotations

from pathlib import Path

from core.record import ERROR_CLASS_STATUS, ERROR_CLASSES, STATUSES
from dashboard.logic.failures import class_by_nodes, latest_errors
from ingest.parsers.logs import parse_log

LOGS = Path(__file__).resolve().parent / "data" / "logs"
NEW = {  # class -> (status, a real line of the class; sources in tests/data/failures/labelled_lines.csv)
    "divergence": ("failed", "Exception: Current loss scale already at minimum - cannot decrease scale anymore. "
                             "Exiting run."),
    "invalid_config": ("failed", "AssertionError: 96 is not divisible by 64"),
    "node_failure": ("failed", "srun: error: Node failure on gpu-st-p4d-24xlarge-12"),
    "oom_host": ("oom", "slurmstepd: error: Detected 1 oom_kill event in StepId=11300781.0. Some of the step "
                        "tasks have been OOM Killed."),
}


def test_every_class_has_a_status_in_the_vocabulary():
    assert set(NEW) <= set(ERROR_CLASSES)
    assert all(ERROR_CLASS_STATUS[c] in STATUSES for c in ERROR_CLASSES)
    assert all(ERROR_CLASS_STATUS[c] == status for c, (status, _) in NEW.items())


def test_new_classes_are_stored_counted_and_shown(client):
    runs = [{"model_params": 13_000_000_000, "nodes": 4, "gpus_per_node": 8, "tp": 8, "pp": 1, "cp": 1,
             "status": status, "error_class": cls, "error_message": line, "run_key": f"issue27-{cls}"}
            for cls, (status, line) in NEW.items()]
    assert client.post("/api/v1/runs", json={"runs": runs}).status_code == 201
    cell = next(c for c in client.get("/api/v1/heatmap").json()["cells"]
                if c["model_size_class"] == 13 and c["nodes"] == 4)
    assert (cell["n_success"], cell["n_oom"], cell["n_failed"]) == (0, 1, 3)
    for cls in NEW:
        body = client.get("/api/v1/runs", params={"error_class": cls}).json()
        assert [r["error_class"] for r in body["runs"]] == [cls]
    stored = client.get("/api/v1/runs", params={"nodes": 4}).json()["runs"]
    table = class_by_nodes(stored)
    assert set(table.columns) == set(NEW) and table.loc[4].sum() == 4
    assert set(latest_errors(stored)["error_class"]) == set(NEW)


def test_a_diverged_log_is_imported_as_failed_divergence(client):
    """bigscience-workshop/Megatron-DeepSpeed#396: grad norm NaN up to the last logged step."""
    record = parse_log((LOGS / "megatron_deepspeed_grad_norm_nan.log").read_text(), world_size=8,
                       model_params=1_300_000_000, run_key="issue27-nan-log")
    assert (record["status"], record["error_class"]) == ("failed", "divergence")
    assert client.post("/api/v1/runs", json=record).status_code == 201
    stored = client.get("/api/v1/runs", params={"error_class": "divergence"}).json()["runs"]
    assert stored[0]["status"] == "failed" and stored[0]["extra"]["non_finite_steps"] == 3
