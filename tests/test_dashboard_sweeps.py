"""The dashboard's Sweeps page (issue 29) against a live API: a grid sweep with leases handed out and
runs finished — progress, best so far, the curve, the runs with predicted vs measured."""

from __future__ import annotations

from pathlib import Path

import httpx
import pytest
import streamlit as st
from streamlit.testing.v1 import AppTest

from dashboard.logic import sweeps as sv

APP = str(Path(__file__).resolve().parent.parent / "dashboard" / "app.py")
GRID = {"name": "page", "strategy": "grid", "budget": 3,
        "target": {"model_params": "1.34B", "nodes": 1, "gpus_per_node": 8, "gpu_type": "H100", "seq_len": 4096,
                   "global_batch_tokens": 1048576}, "grid": {"micro_batch_size": [1, 2, 4]}}


@pytest.fixture(autouse=True)
def fresh_cache():
    st.cache_data.clear()
    yield
    st.cache_data.clear()


def test_sweeps_page_shows_progress_best_and_runs(live_api):
    with httpx.Client(base_url=live_api, timeout=60) as api:
        assert api.post("/api/v1/sweeps", json=GRID).status_code == 201
        leases = [api.post("/api/v1/sweeps/page/next", json={}).json() for _ in range(3)]
        for lease, (status, tps) in zip(leases[:2], [("success", 30000.0), ("oom", None)]):
            r = api.post("/api/v1/runs", json={"run_key": lease["run_key"], "status": status,
                                               "tokens_per_sec_per_gpu": tps})
            assert r.status_code in (200, 201), r.text
        sweep = api.get("/api/v1/sweeps/page").json()
    frame = sv.runs_frame(sweep)
    assert list(frame["status"]) == ["success", "oom", "running"] and frame["tok/s/GPU"].iloc[0] == 30000.0
    assert "3 of 3 configurations handed out (1 oom, 1 running, 1 success)" in sv.progress_text(sweep)
    at = AppTest.from_file(APP, default_timeout=60)
    at.run()
    at.switch_page("app_pages/sweeps.py").run()
    assert not at.exception, [e.value for e in at.exception]
    text = "\n".join(str(e.value) for kind in ("markdown", "caption", "title", "subheader") for e in getattr(at, kind))
    assert "1.3B × 1 node × 8 H100-SXM-80GB" in text and "3 of 3 configurations handed out" in text
    assert [m.value for m in at.metric][:1] == ["30,000"]
    [table] = [d.value for d in at.dataframe]
    assert list(table["status"]) == ["success", "oom", "running"] and list(table["tok/s/GPU"])[:2] == ["30,000", "—"]
