"""API tokens (DESIGN §7): the /api/v1/tokens endpoints, enforcement, the CLI, and `serve`'s
refusal to bind beyond loopback without tokens. Endpoint tests run on DuckDB and PostgreSQL."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import create_pg_database, drop_pg_database, free_port

RUN = {"model_params": 1_340_000_000, "nodes": 1, "gpus_per_node": 8, "dp": 8, "seq_len": 4096,
       "gpu_type": "H100-SXM-80GB", "status": "success", "tokens_per_sec_per_gpu": 40000.0}


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def create(client, scope: str, name: str = "t", token: str | None = None) -> dict:
    resp = client.post("/api/v1/tokens", json={"name": name, "scope": scope},
                       headers=bearer(token) if token else {})
    assert resp.status_code == 201, resp.text
    return resp.json()


def test_open_until_first_token_then_enforced(client):
    assert client.get("/api/v1/runs").status_code == 200  # no token exists: open
    admin = create(client, "admin", "root")
    assert admin["token"].startswith("sb_") and admin["scope"] == "admin" and admin["id"] >= 1

    resp = client.get("/api/v1/runs")
    assert resp.status_code == 401
    assert resp.json()["error"]["code"] == "unauthorized"
    assert resp.headers["www-authenticate"] == "Bearer"
    assert client.get("/api/v1/runs", headers=bearer("sb_not-a-token")).status_code == 401
    assert client.get("/api/v1/runs", headers={"Authorization": "Basic abc"}).status_code == 401
    assert client.post("/api/v1/tokens", json={"scope": "admin"}).status_code == 401
    assert client.get("/api/v1/runs", headers=bearer(admin["token"])).status_code == 200


def test_health_stays_open(client):
    create(client, "admin")
    resp = client.get("/api/v1/health")
    assert resp.status_code == 200 and resp.json()["status"] == "ok"


def test_scopes_read_write_admin(client):
    admin = create(client, "admin")["token"]
    read = create(client, "read", token=admin)["token"]
    write = create(client, "write", token=admin)["token"]

    resp = client.post("/api/v1/runs", json=RUN, headers=bearer(read))
    assert resp.status_code == 403
    assert resp.json()["error"]["code"] == "forbidden"
    assert client.get("/api/v1/runs", headers=bearer(read)).status_code == 200
    assert client.get("/api/v1/heatmap", headers=bearer(read)).status_code == 200

    assert client.post("/api/v1/runs", json=RUN, headers=bearer(write)).status_code == 201
    assert client.get("/api/v1/tokens", headers=bearer(write)).status_code == 403
    assert client.post("/api/v1/tokens", json={"scope": "read"}, headers=bearer(read)).status_code == 403
    assert client.post("/api/v1/runs", json={**RUN, "run_key": "a1"}, headers=bearer(admin)).status_code == 201


def test_list_never_shows_secrets(client):
    admin = create(client, "admin", "root")
    create(client, "read", "reader", token=admin["token"])
    resp = client.get("/api/v1/tokens", headers=bearer(admin["token"]))
    assert resp.status_code == 200
    tokens = resp.json()["tokens"]
    assert [t["name"] for t in tokens] == ["root", "reader"]
    text = resp.text
    assert admin["token"] not in text
    for t in tokens:
        assert set(t) == {"id", "name", "scope", "prefix", "created_at", "revoked_at"}
        assert len(t["prefix"]) == 10


def test_revoked_token_gets_401(client):
    admin = create(client, "admin")["token"]
    read = create(client, "read", token=admin)
    assert client.get("/api/v1/runs", headers=bearer(read["token"])).status_code == 200
    resp = client.delete(f"/api/v1/tokens/{read['id']}", headers=bearer(admin))
    assert resp.status_code == 200 and resp.json()["revoked_at"] is not None
    assert client.get("/api/v1/runs", headers=bearer(read["token"])).status_code == 401
    again = client.delete(f"/api/v1/tokens/{read['id']}", headers=bearer(admin))
    assert again.json()["revoked_at"] == resp.json()["revoked_at"]  # idempotent
    assert client.delete("/api/v1/tokens/999999", headers=bearer(admin)).status_code == 404


def test_revoking_last_token_reopens(client):
    admin = create(client, "admin")
    assert client.get("/api/v1/runs").status_code == 401
    assert client.delete(f"/api/v1/tokens/{admin['id']}", headers=bearer(admin["token"])).status_code == 200
    assert client.get("/api/v1/runs").status_code == 200


@pytest.mark.parametrize("body", [{"scope": "root"}, {"name": "x"}, {"scope": "read", "name": ""},
                                  {"scope": "read", "other": 1}, {"scope": "read", "name": "x" * 201}])
def test_bad_create_bodies_are_422(client, body):
    resp = client.post("/api/v1/tokens", json=body)
    assert resp.status_code == 422
    assert resp.json()["error"]["code"] == "validation_error"


# -- CLI --------------------------------------------------------------------------------------

def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALEBOOK_")}
    env.update(COLUMNS="300", **extra)
    return env


def scalebook(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "service.cli", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, check=False)


def test_cli_through_the_api(live_api):
    env = _env(SCALEBOOK_API_URL=live_api)
    made = scalebook("token", "create", "--scope", "admin", "--name", "ops", env=env)
    assert made.returncode == 0, made.stderr
    admin = made.stdout.strip()
    assert admin.startswith("sb_") and "\n" not in admin
    assert "shown once" in made.stderr

    assert scalebook("token", "list", env=env).returncode != 0  # now needs the token
    env["SCALEBOOK_TOKEN"] = admin
    made = scalebook("token", "create", "--scope", "read", "--json", env=env)
    read = json.loads(made.stdout)
    listed = json.loads(scalebook("token", "list", "--json", env=env).stdout)
    assert [t["scope"] for t in listed] == ["admin", "read"]
    assert all("token" not in t for t in listed)

    revoked = scalebook("token", "revoke", str(read["id"]), env=env)
    assert revoked.returncode == 0, revoked.stderr
    assert httpx.get(f"{live_api}/api/v1/runs", headers=bearer(read["token"])).status_code == 401
    missing = scalebook("token", "revoke", "4242", env=env)
    assert missing.returncode == 1 and "404" in missing.stderr


def test_cli_direct_on_duckdb_file(tmp_path):
    env = _env(SCALEBOOK_DATABASE_URL=f"duckdb:///{tmp_path / 'sb.duckdb'}")
    made = scalebook("token", "create", "--scope", "write", "--direct", "--json", env=env)
    assert made.returncode == 0, made.stderr
    token = json.loads(made.stdout)
    listed = json.loads(scalebook("token", "list", "--direct", "--json", env=env).stdout)
    assert listed[0]["id"] == token["id"] and listed[0]["revoked_at"] is None
    assert scalebook("token", "revoke", str(token["id"]), "--direct", env=env).returncode == 0
    listed = json.loads(scalebook("token", "list", "--direct", "--json", env=env).stdout)
    assert listed[0]["revoked_at"] is not None
    assert scalebook("token", "create", "--scope", "root", "--direct", env=env).returncode == 2


def test_cli_direct_on_postgresql(worker_tag):
    name = f"sbtok_{worker_tag}"
    url = create_pg_database(name)
    try:
        env = _env(SCALEBOOK_DATABASE_URL=url)
        assert scalebook("db", "upgrade", env=env).returncode == 0
        made = scalebook("token", "create", "--scope", "read", "--direct", env=env)
        assert made.returncode == 0, made.stderr
        listed = json.loads(scalebook("token", "list", "--direct", "--json", env=env).stdout)
        assert [t["scope"] for t in listed] == ["read"]
    finally:
        drop_pg_database(name)


# -- serve beyond loopback ---------------------------------------------------------------------

def _serve(env: dict[str, str], *flags: str) -> tuple[subprocess.Popen, int]:
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--host", "0.0.0.0", "--port", str(port),
                             "--log-level", "warning", *flags], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    return proc, port


def _wait_healthy(proc: subprocess.Popen, port: int, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/api/v1/health", timeout=1).status_code == 200:
                return True
        except httpx.TransportError:
            time.sleep(0.2)
    return False


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.mark.integration
def test_serve_refuses_public_bind_without_tokens(tmp_path: Path):
    env = _env(SCALEBOOK_DATABASE_URL=f"duckdb:///{tmp_path / 'empty.duckdb'}")
    proc, _ = _serve(env)
    try:
        _, err = proc.communicate(timeout=60)
    finally:
        _stop(proc)
    assert proc.returncode != 0
    assert "refusing to bind 0.0.0.0" in err and "--insecure" in err


@pytest.mark.integration
def test_serve_public_bind_with_insecure_starts(tmp_path: Path):
    env = _env(SCALEBOOK_DATABASE_URL=f"duckdb:///{tmp_path / 'empty.duckdb'}")
    proc, port = _serve(env, "--insecure")
    try:
        assert _wait_healthy(proc, port), proc.stderr.read() if proc.poll() is not None else "not healthy"
    finally:
        _stop(proc)


@pytest.mark.integration
def test_serve_public_bind_with_a_token_starts(tmp_path: Path):
    env = _env(SCALEBOOK_DATABASE_URL=f"duckdb:///{tmp_path / 'sb.duckdb'}")
    made = scalebook("token", "create", "--scope", "admin", "--direct", env=env)
    assert made.returncode == 0, made.stderr
    proc, port = _serve(env)
    try:
        assert _wait_healthy(proc, port)
        assert httpx.get(f"http://127.0.0.1:{port}/api/v1/runs").status_code == 401
        assert httpx.get(f"http://127.0.0.1:{port}/api/v1/runs",
                         headers=bearer(made.stdout.strip())).status_code == 200
    finally:
        _stop(proc)
