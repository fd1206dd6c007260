"""The heatmap and its slices read from `run_cells` (the per-group summary the database keeps in every
write's transaction) give the very cells and slices the queries over `runs` give: the same counts, the same
best run with the same columns — on both backends, for the filters it serves, and again after retiring,
un-retiring and deleting runs (the writes that refresh the summary)."""

from __future__ import annotations

import pytest
from conftest import playbook_sample, post_records

from service.analytics import heatmap as hm
from service.cli import benchmark as benchtool

FILTERS = [
    {},
    {"gpu_type": "H100"},  # an alias: the catalog name is what both read
    {"gpu_type": "H100-SXM-80GB", "seq_len": 4096},
    {"framework": "nanotron"},
    {"precision": "bf16", "seq_len": 4096},
    {"gpu_type": "A100-SXM-80GB"},
]

#: crafted rows on one cell (8 nodes of a 7B model): three tied on tokens/s (and so on the MFU derived from it),
#: decided by the lower id; a success without tokens/s; a retired faster run; a running run faster still; an
#: OOM and a crash
_BASE = {"model_params": 7_000_000_000, "nodes": 8, "gpus_per_node": 8, "dp": 64, "gpu_type": "H100-SXM-80GB",
         "seq_len": 4096, "precision": "bf16", "framework": "megatron-lm", "micro_batch_size": 1}
CRAFTED = [
    {**_BASE, "run_key": "tie-first", "status": "success", "tokens_per_sec_per_gpu": 9000.0},
    {**_BASE, "run_key": "tie-second", "status": "success", "tokens_per_sec_per_gpu": 9000.0, "tp": 2, "dp": 32},
    {**_BASE, "run_key": "tie-third", "status": "success", "tokens_per_sec_per_gpu": 9000.0, "pp": 2, "dp": 32},
    {**_BASE, "run_key": "no-metric", "status": "success", "zero_stage": 1},
    {**_BASE, "run_key": "retired-fast", "status": "success", "tokens_per_sec_per_gpu": 12000.0, "zero_stage": 2},
    {**_BASE, "run_key": "running-fast", "status": "running", "tokens_per_sec_per_gpu": 15000.0, "zero_stage": 3},
    {**_BASE, "run_key": "oom", "status": "oom", "micro_batch_size": 8},
    {**_BASE, "run_key": "crash", "status": "failed", "micro_batch_size": 4},
]


def _both(client, monkeypatch) -> None:
    """Every FILTERS heatmap, and its slices (all sizes and one), from the summary equal those over `runs`."""
    def answers(f: hm.HeatmapFilters) -> tuple:
        with client.app.state.db.session() as session:
            return hm.heatmap(session, f), hm.slices(session, f), hm.slices(session, f, 1.3, most="nodes")

    for filters in FILTERS:
        f = hm.HeatmapFilters(**filters)
        assert f.summary_conditions() is not None, filters
        summary = answers(f)
        with monkeypatch.context() as m:
            m.setattr(hm.HeatmapFilters, "summary_conditions", lambda self: None)
            over_runs = answers(f)
        assert summary == over_runs, filters
        assert summary[0] or filters.get("gpu_type") == "A100-SXM-80GB", filters


def test_heatmap_from_the_summary_equals_the_heatmap_over_runs(client, data_dir, monkeypatch):
    records = list(playbook_sample(data_dir).records) + list(benchtool.generate_runs(600, 7, prefix="mix"))
    stored, _ = post_records(client, records + CRAFTED)
    assert stored > 800
    r = client.post("/api/v1/runs/retire", json={"filter": {"run_key": "retired-fast"}, "reason": "test"})
    assert r.json()["changed"] == 1
    _both(client, monkeypatch)

    assert _crafted_cell(client)["best"]["run_key"] == "tie-first"  # of the three at 9,000 tok/s, the lower id
    assert _crafted_cell(client)["n_oom"] >= 1 and _crafted_cell(client)["n_failed"] >= 1

    # the writes that refresh the summary: un-retire, retire a whole node count, delete, finish a running run
    client.post("/api/v1/runs/unretire", json={"filter": {"run_key": "retired-fast"}})
    client.post("/api/v1/runs/retire", json={"filter": {"nodes": 2}, "reason": "test: bad cluster"})
    victim = client.get("/api/v1/runs", params={"run_key": "tie-first"}).json()["runs"][0]["id"]
    assert client.delete(f"/api/v1/runs/{victim}").status_code == 200
    _both(client, monkeypatch)
    assert _crafted_cell(client)["best"]["run_key"] == "retired-fast"  # back, and faster than the rest


def _crafted_cell(client) -> dict:
    return next(c for c in client.get("/api/v1/heatmap", params={"gpu_type": "H100"}).json()["cells"]
                if c["nodes"] == 8 and c["best"] and c["best"]["model_params"] == 7_000_000_000
                and c["best"]["framework"] == "megatron-lm")


@pytest.mark.parametrize("filters", [{"global_batch_tokens": 1_048_576}, {"sweep": "s1"},
                                     {"started_after": "2024-01-01T00:00:00"}])
def test_filters_the_summary_does_not_group_by_read_runs(filters):
    """A filter on a column run_cells does not keep (global batch, sweep, dates) answers over `runs`."""
    assert hm.HeatmapFilters(**filters).summary_conditions() is None
