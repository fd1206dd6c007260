"""Deleting runs (issue 30 item 13), on both backends: DELETE /api/v1/runs/{id} and POST
/api/v1/runs/delete (ids or a filter, dry run) need an admin token, are kept apart from retire
(a retired run is kept; a deleted one is gone), and `scalebook delete` says how many runs match
and asks before deleting."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from service import auth
from service.cli import app

RUN = {"model_params": 8_000_000_000, "nodes": 1, "gpus_per_node": 8, "dp": 8, "tp": 1, "pp": 1, "seq_len": 4096,
       "status": "success", "tokens_per_sec_per_gpu": 9000.0}


def store(client, n_junk: int = 3, n_keep: int = 2) -> tuple[list[int], list[int]]:
    runs = [{**RUN, "run_key": f"junk-{i}", "model_name": "test-junk"} for i in range(n_junk)]
    runs += [{**RUN, "run_key": f"keep-{i}", "model_name": "llama3-8b"} for i in range(n_keep)]
    body = client.post("/api/v1/runs", json={"runs": runs}).json()
    ids = [r["id"] for r in body["runs"]]
    return ids[:n_junk], ids[n_junk:]


def total(client) -> int:
    return client.get("/api/v1/runs", params={"limit": 1}).json()["total"]


def test_delete_one_run_and_by_filter(client):
    junk, keep = store(client)
    r = client.delete(f"/api/v1/runs/{junk[0]}")
    assert r.status_code == 200, r.text
    assert r.json() == {"matched": 1, "deleted": 1, "dry_run": False, "ids": [junk[0]]}
    assert client.get(f"/api/v1/runs/{junk[0]}").status_code == 404
    gone = client.delete(f"/api/v1/runs/{junk[0]}")
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "not_found"

    # a dry run counts and lists, deletes nothing
    dry = client.post("/api/v1/runs/delete", json={"filter": {"model_name": "test-junk"}, "dry_run": True}).json()
    assert dry == {"matched": 2, "deleted": 0, "dry_run": True, "ids": junk[1:]}
    assert total(client) == 4
    # a retired run is deleted like any other (retire keeps it; delete does not)
    assert client.post("/api/v1/runs/retire", json={"ids": [junk[1]], "reason": "junk"}).status_code == 200
    done = client.post("/api/v1/runs/delete", json={"filter": {"model_name": "test-junk"}}).json()
    assert done == {"matched": 2, "deleted": 2, "dry_run": False, "ids": junk[1:]}
    left = client.get("/api/v1/runs").json()["runs"]
    assert sorted(r["id"] for r in left) == keep
    assert client.post("/api/v1/sql", json={"query": "SELECT count(*) AS n FROM runs"}).json()["rows"] == [[2]]
    # ids and a filter must both hold
    both = client.post("/api/v1/runs/delete", json={"ids": keep, "filter": {"model_name": "test-junk"}}).json()
    assert both["deleted"] == 0 and total(client) == 2


def test_delete_refuses_an_empty_or_unknown_selection(client):
    store(client)
    empty = client.post("/api/v1/runs/delete", json={})
    assert empty.status_code == 400 and "give ids or a non-empty filter" in empty.json()["error"]["message"]
    bad = client.post("/api/v1/runs/delete", json={"filter": {"colour": "red"}})
    assert bad.status_code == 400 and bad.json()["error"]["details"][0]["field"] == "colour"
    assert client.post("/api/v1/runs/delete", json={"ids": [1], "everything": True}).status_code == 422
    assert total(client) == 5


def test_delete_needs_an_admin_token_retire_a_write_token(client, database):
    junk, _ = store(client)  # before any token exists: the API is open
    with database.session(write=True) as session:
        admin = auth.create_token(session, "admin", "admin")[1]
        write = auth.create_token(session, "writer", "write")[1]
    client.app.state.tokens.invalidate()  # "are there tokens?" is cached for a second
    as_writer = {"Authorization": f"Bearer {write}"}
    r = client.delete(f"/api/v1/runs/{junk[0]}", headers=as_writer)
    assert r.status_code == 403 and "admin" in r.json()["error"]["message"]
    assert client.post("/api/v1/runs/delete", json={"ids": junk}, headers=as_writer).status_code == 403
    assert client.delete(f"/api/v1/runs/{junk[0]}").status_code == 401
    assert client.post("/api/v1/runs/retire", json={"ids": junk, "reason": "x"}, headers=as_writer).status_code == 200
    ok = client.delete(f"/api/v1/runs/{junk[0]}", headers={"Authorization": f"Bearer {admin}"})
    assert ok.status_code == 200 and ok.json()["deleted"] == 1


def test_cli_delete_counts_asks_and_deletes(live_api, monkeypatch):
    import httpx

    monkeypatch.setenv("COLUMNS", "80")
    with httpx.Client(base_url=live_api) as client:
        junk, keep = store(client)
    runner = CliRunner()

    usage = runner.invoke(app, ["delete"])
    assert usage.exit_code == 2 and "--id N or --where" in usage.output

    dry = runner.invoke(app, ["delete", "--where", "model_name=test-junk", "--dry-run"])
    assert dry.exit_code == 0 and "3 run(s) match" in dry.output and "nothing deleted" in dry.output

    declined = runner.invoke(app, ["delete", "--where", "model_name=test-junk"], input="n\n")
    assert declined.exit_code == 1
    assert "3 run(s) match: " + ", ".join(f"#{i}" for i in junk) in declined.output
    assert "Delete 3 run(s)? [y/N]" in declined.output and "nothing deleted" in declined.output
    assert "scalebook retire" in declined.output  # the reversible alternative is named
    with httpx.Client(base_url=live_api) as client:
        assert total(client) == 5

    agreed = runner.invoke(app, ["delete", "--where", "model_name=test-junk"], input="y\n")
    assert agreed.exit_code == 0, agreed.output
    assert "deleted 3 run(s): " + ", ".join(f"#{i}" for i in junk) in agreed.output
    assert max(len(line) for line in agreed.output.splitlines()) <= 80

    one = runner.invoke(app, ["delete", "--id", str(keep[0]), "--yes", "--json"])
    assert one.exit_code == 0 and json.loads(one.stdout)["ids"] == [keep[0]]
    nothing = runner.invoke(app, ["delete", "--where", "model_name=test-junk"])
    assert nothing.exit_code == 0 and "0 run(s) match" in nothing.output
    with httpx.Client(base_url=live_api) as client:
        assert [r["id"] for r in client.get("/api/v1/runs").json()["runs"]] == keep[1:]
