"""`scalebook serve --workers N`: several API processes on one port over PostgreSQL, refused on
DuckDB (one process owns the file), and without the ~40 ms keep-alive stall of uvicorn#3149
(accepted sockets get TCP_NODELAY because the listener is created with IPPROTO_TCP).
Speed is measured in bench/workers.py, not asserted here."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import create_pg_database, drop_pg_database, free_port

from service.cli.server import listen_socket

SCALEBOOK = [sys.executable, "-m", "service.cli"]
RUN = {"model_params": 8_000_000_000, "nodes": 1, "gpus_per_node": 8, "dp": 8, "tp": 1, "pp": 1, "seq_len": 4096}


def test_listener_gives_accepted_connections_tcp_nodelay():
    """What asyncio does with our listener: an accepted connection has Nagle's algorithm off."""
    seen: list[int] = []

    class Report(asyncio.Protocol):
        def connection_made(self, transport):
            sock = transport.get_extra_info("socket")
            seen.append(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))
            transport.close()

    async def accept_one() -> None:
        listener = listen_socket("127.0.0.1", free_port())
        assert listener.proto == socket.IPPROTO_TCP
        server = await asyncio.get_running_loop().create_server(Report, sock=listener)
        _, writer = await asyncio.open_connection(*listener.getsockname())
        for _ in range(100):
            if seen:
                break
            await asyncio.sleep(0.01)
        writer.close()
        server.close()
        await server.wait_closed()

    asyncio.run(accept_one())
    assert seen and seen[0] != 0


def _children(pid: int) -> list[int]:
    """Processes whose parent is ``pid`` (Linux /proc)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


@pytest.mark.integration
def test_workers_serve_postgresql_and_are_refused_on_duckdb(worker_tag, tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SCALEBOOK_")}
    duck = subprocess.run([*SCALEBOOK, "serve", "--workers", "2", "--port", str(free_port())], capture_output=True,
                          text=True, timeout=60, env={**env, "SCALEBOOK_DATA_DIR": str(tmp_path), "COLUMNS": "200"})
    assert duck.returncode == 2
    assert "DuckDB file" in duck.stderr and "--workers 1" in duck.stderr and "PostgreSQL" in duck.stderr

    name = f"sbworkers_{worker_tag}"
    url = create_pg_database(name)
    env["SCALEBOOK_DATABASE_URL"] = url
    port = free_port()
    try:
        assert subprocess.run([*SCALEBOOK, "db", "upgrade"], env=env, capture_output=True, timeout=120).returncode == 0
        proc = subprocess.Popen([*SCALEBOOK, "serve", "--workers", "2", "--port", str(port), "--no-access-log"],
                                env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        try:
            base = f"http://127.0.0.1:{port}/api/v1"
            deadline = time.monotonic() + 90
            while True:
                try:
                    if httpx.get(f"{base}/health", timeout=2).status_code == 200 and len(_children(proc.pid)) >= 2:
                        break
                except httpx.TransportError:
                    pass
                assert proc.poll() is None and time.monotonic() < deadline, proc.stdout.read() if proc.stdout else ""
                time.sleep(0.3)
            workers = [c for c in _children(proc.pid) if b"spawn" in Path(f"/proc/{c}/cmdline").read_bytes()]
            assert len(workers) == 2
            # one keep-alive client: every request answered, whichever worker takes it; the store is shared
            with httpx.Client(base_url=base, timeout=10) as client:
                for i in range(6):
                    r = client.post("/runs", json={**RUN, "run_key": f"w-{i}", "nodes": 1 + i % 2,
                                                   "dp": 8 * (1 + i % 2)})
                    assert r.status_code == 201, r.text
                assert client.get("/runs", params={"limit": 10}).json()["total"] == 6
                cells = client.get("/heatmap").json()["cells"]
                assert sorted(c["nodes"] for c in cells) == [1, 2]
        finally:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        assert proc.returncode == 0
    finally:
        drop_pg_database(name)
