"""POST /api/v1/sweeps/{name}/next (issue 29): leases handed out by the database — the budget, a grid
exhausted, suggest's expected-improvement stop, a lost lease handed out again exactly once — and many
agents on separate database connections (as separate API processes would be) never given the same
configuration. Both backends, real databases."""

from __future__ import annotations

import threading
from datetime import timedelta

import sqlalchemy as sa

from service import lifecycle
from service import sweep_leases as sl
from service import sweeps as sw
from service.analytics.on_target import config_key
from service.db import Database
from service.tables import Run

TARGET = {"model_params": "1.34B", "nodes": 1, "gpus_per_node": 8, "gpu_type": "H100", "seq_len": 4096,
          "global_batch_tokens": 1048576}
GRID = {"name": "g", "strategy": "grid", "budget": 4, "target": TARGET,
        "grid": {"tp": [1, 2], "micro_batch_size": [1, 2, 4]}}


def _next(client, name="g", agent="test"):
    return client.post(f"/api/v1/sweeps/{name}/next", json={"agent": agent})


def test_grid_leases_open_runs_until_the_budget_is_spent(client):
    assert client.post("/api/v1/sweeps", json=GRID).status_code == 201
    leases = []
    for _ in range(4):
        r = _next(client)
        assert r.status_code == 200, r.text
        leases.append(r.json())
    assert [lease["slot"] for lease in leases] == [1, 2, 3, 4]
    assert len({lease["label"] for lease in leases}) == 4 and leases[0]["run_key"] == "g:1"
    assert leases[0]["config"] == {"dp": 8, "tp": 1, "pp": 1, "cp": 1, "ep": 1, "zero_stage": 0,
                                   "micro_batch_size": 1, "grad_accum_steps": 32, "recompute": "none"}
    run = client.get(f"/api/v1/runs/{leases[0]['run_id']}").json()
    assert run["status"] == "running" and run["sweep"] == "g" and run["gpu_type"] == "H100-SXM-80GB"
    assert run["model_params"] == 1_340_000_000 and run["tp"] == 1 and run["last_heartbeat_at"] and run["started_at"]
    r = _next(client)
    assert r.status_code == 204 and r.headers["Sweep-Done"] == "budget" and "4 of 4" in r.headers["Sweep-Done-Reason"]
    # the job finishes its run with the same run_key: the sweep shows it as the best, measured beside predicted
    done = client.post("/api/v1/runs", json={"run_key": leases[1]["run_key"], "status": "success",
                                             "tokens_per_sec_per_gpu": 12000.0, "peak_memory_gib": 40.0})
    assert done.status_code in (200, 201), done.text
    body = client.get("/api/v1/sweeps/g").json()
    assert body["counts"] == {"running": 3, "success": 1} and body["handed_out"] == 4 and body["left"] == 2
    assert body["best"]["run_key"] == "g:2" and body["best"]["tokens_per_sec_per_gpu"] == 12000.0
    assert [r["attempt"] for r in body["runs"]] == [1, 1, 1, 1]


def test_a_grid_is_exhausted_and_an_unknown_sweep_is_404(client):
    client.post("/api/v1/sweeps", json={**GRID, "budget": 100})
    labels = [_next(client).json()["label"] for _ in range(6)]
    assert len(set(labels)) == 6
    r = _next(client)
    assert r.status_code == 204 and r.headers["Sweep-Done"] == "exhausted"
    assert _next(client, "nope").status_code == 404


def _age(database: Database, run_key: str, seconds: float) -> None:
    """The run's last heartbeat `seconds` ago (what a dead agent leaves behind)."""
    with database.session(write=True) as s:
        s.execute(sa.update(Run).where(Run.run_key == run_key)
                  .values(last_heartbeat_at=lifecycle.utcnow() - timedelta(seconds=seconds)))


def test_a_lost_lease_is_handed_out_again_once(client, database):
    client.post("/api/v1/sweeps", json={**GRID, "budget": 2})
    first = _next(client).json()
    _age(database, first["run_key"], 3600)  # its agent died: the run reads lost
    again = _next(client).json()
    assert again["label"] == first["label"] and again["attempt"] == 2 and again["slot"] == 1
    assert again["run_key"] == "g:1.2"
    _age(database, again["run_key"], 3600)  # lost a second time: not handed out a third
    other = _next(client).json()
    assert other["label"] != first["label"] and other["attempt"] == 1 and other["slot"] == 2
    assert _next(client).status_code == 204
    body = client.get("/api/v1/sweeps/g").json()
    assert body["counts"] == {"lost": 2, "running": 1} and body["handed_out"] == 2


def test_suggest_sweeps_hand_out_expected_improvement_and_stop_below_the_threshold(nanotron_client):
    client = nanotron_client
    base = {"strategy": "suggest", "budget": 3, "target": {**TARGET, "framework": "nanotron"}}
    assert client.post("/api/v1/sweeps", json={**base, "name": "s0", "min_expected_improvement": 0}).status_code == 201
    lease = _next(client, "s0").json()
    assert lease["expected_improvement"] >= 0 and lease["predicted"]["tokens_per_sec_per_gpu"] > 0
    ran = {config_key(r) for r in client.get("/api/v1/runs", params={"nodes": 1, "model_params": "1.34B",
                                                                      "limit": 1000}).json()["runs"]
           if r["status"] != "running"}
    assert ran and config_key(lease["config"]) not in ran  # a configuration not run on the target
    r = client.post("/api/v1/sweeps", json={**base, "name": "s1", "min_expected_improvement": 0.9})
    assert r.status_code == 201
    r = _next(client, "s1")
    assert r.status_code == 204 and r.headers["Sweep-Done"] == "converged", r.text
    assert "Jones et al. 1998" in r.headers["Sweep-Done-Reason"]


def test_agents_on_separate_connections_never_share_a_configuration(db_url):
    """Eight agents, each with its own Database (engine, pool, transactions) — as eight API processes
    on one PostgreSQL would be — take leases until the sweep is done: every configuration goes to one."""
    setup = Database(db_url)
    with setup.session(write=True) as s:
        sw.create(s, "race", "grid", TARGET, 5, {"tp": [1, 2], "micro_batch_size": [1, 2, 4],
                                                  "recompute": ["none", "full"]})
    setup.dispose()
    got: list[tuple[str, int]] = []
    errors: list[BaseException] = []
    lock = threading.Lock()

    def agent(i: int) -> None:
        db = Database(db_url)
        try:
            while True:
                with db.session(write=True) as s:
                    out = sl.next_lease(s, sw.get(s, "race"), now=lifecycle.utcnow(), lost_after_s=300.0,
                                        agent=f"agent-{i}")
                if isinstance(out, sl.Done):
                    return
                with lock:
                    got.append((out["label"], out["slot"]))
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)
        finally:
            db.dispose()

    threads = [threading.Thread(target=agent, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert errors == []
    assert len(got) == 5 and len({label for label, _ in got}) == 5 and sorted(s for _, s in got) == [1, 2, 3, 4, 5]


def test_a_grid_lease_carries_the_models_prediction_when_runs_are_recorded(nanotron_client):
    client = nanotron_client
    r = client.post("/api/v1/sweeps", json={**GRID, "target": {**TARGET, "framework": "nanotron"}})
    assert r.status_code == 201, r.text
    lease = _next(client).json()
    predicted = lease["predicted"]
    assert predicted["tokens_per_sec_per_gpu"] > 0 and predicted["interval"][0] < predicted["tokens_per_sec_per_gpu"]
    row = client.get("/api/v1/sweeps/g").json()["runs"][0]
    assert row["predicted_tokens_per_sec_per_gpu"] == predicted["tokens_per_sec_per_gpu"]
