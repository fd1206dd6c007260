"""`scalebook serve`, `scalebook dashboard` and `scalebook up` (API + example data + dashboard)."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import typer

from service.cli.base import app, console, fail
from service.client import api_url
from service.settings import get_settings, is_loopback

REPO_ROOT = Path(__file__).resolve().parents[2]


def example_data_dir() -> Path:
    """The example data shipped with the project (examples/data), or ../shared/data beside it."""
    for candidate in (REPO_ROOT / "examples" / "data", Path.cwd() / "examples" / "data"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("examples/data not found: run from a scalebook checkout")


@app.command()
def serve(
    host: str = typer.Option("127.0.0.1", help="bind address; beyond loopback needs tokens or --insecure"),
    port: int = typer.Option(8000, help="TCP port"),
    insecure: bool = typer.Option(False, "--insecure", help="allow binding beyond loopback without tokens"),
    workers: int = typer.Option(1, "--workers", "-w", min=1, max=64,
                                help="API processes sharing the port (PostgreSQL; a DuckDB file allows one)"),
    access_log: bool = typer.Option(True, "--access-log/--no-access-log", help="log every request"),
    log_level: str = typer.Option("info"),
) -> None:
    """Serve the API: one process, or --workers N processes sharing one port (PostgreSQL only).

    Waits for the database, migrates an embedded DuckDB, refuses a stale PostgreSQL schema.
    --workers N > 1 needs PostgreSQL: one process owns a DuckDB file (refused with exit 2). The
    workers accept on one listening socket created with IPPROTO_TCP, so every accepted connection
    gets TCP_NODELAY (uvicorn's own multi-worker socket loses it: ~40 ms per keep-alive request,
    uvicorn#3149). Past one machine: several such servers behind a load balancer, one PostgreSQL.
    """
    import uvicorn

    from service.api import create_app
    from service.db import Database
    from service.errors import ScalebookError

    settings = get_settings().model_copy(update={"host": host, "insecure": insecure or get_settings().insecure})
    db = Database(settings.url)
    if workers > 1 and db.single_process:
        db.dispose()
        fail(f"--workers {workers}: an embedded DuckDB file ({db.engine.url.database}) is owned by one process, so "
             "it is served by one worker. Serve it with --workers 1, or use PostgreSQL for several workers "
             "(SCALEBOOK_DATABASE_URL=postgresql://user@host/db; `scalebook db upgrade` first)", code=2)
    try:
        db.prepare()
    except ScalebookError as exc:
        fail(exc.message)
    if not is_loopback(host) and not (insecure or settings.insecure):
        from service.auth import active_token_count

        with db.session() as session:
            if active_token_count(session) == 0:
                db.dispose()
                fail(f"refusing to bind {host}: no API tokens exist. Create one with "
                     "`scalebook token create --scope admin`, or pass --insecure")
    console.print(f"scalebook API on http://{host}:{port} (database: "
                  f"{db.engine.url.render_as_string(hide_password=True)}"
                  f"{f', {workers} workers' if workers > 1 else ''}); docs at /docs")
    if workers > 1:
        db.dispose()
        _serve_workers(host, port, workers, settings.insecure, access_log, log_level)
        return
    import gc

    app_ = create_app(db, settings)
    gc.freeze()  # start-up objects leave the GC's generations: fewer, shorter collections per request
    try:
        with _stop_on_signals():
            uvicorn.run(app_, host=host, port=port, workers=1, log_level=log_level, access_log=access_log)
    finally:
        db.dispose()
        gc.unfreeze()  # frozen objects are otherwise never freed: DuckDB's bindings report them as leaks at exit


def listen_socket(host: str, port: int) -> socket.socket:
    """A listening TCP socket on (host, port) created with proto IPPROTO_TCP (inheritable, for the
    workers). asyncio sets TCP_NODELAY on an accepted socket only when it reports IPPROTO_TCP, and
    accepted sockets inherit the listener's proto: uvicorn's Config.bind_socket() leaves it 0, so
    Nagle's algorithm stays on and each keep-alive request waits ~40 ms for the client's delayed
    ACK (uvicorn#3149). Exits with a message when the address is in use."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        fail(f"cannot bind {host}:{port}: {exc.strerror}")
    sock.set_inheritable(True)
    return sock


def _serve_workers(host: str, port: int, workers: int, insecure: bool, access_log: bool, log_level: str) -> None:
    """uvicorn's process supervisor over `listen_socket`: each worker builds the app with
    `create_app()` from the environment (the settings of this command are passed as
    SCALEBOOK_HOST / SCALEBOOK_INSECURE) and opens its own connection pool."""
    import uvicorn
    from uvicorn.supervisors import Multiprocess

    os.environ["SCALEBOOK_HOST"] = host
    if insecure:
        os.environ["SCALEBOOK_INSECURE"] = "true"
    config = uvicorn.Config("service.api.app:create_app", factory=True, host=host, port=port, workers=workers,
                            log_level=log_level, access_log=access_log)
    sock = listen_socket(host, port)
    try:
        Multiprocess(config, sockets=[sock]).run()
    finally:
        sock.close()


class _Stop(Exception):
    """Raised by the SIGTERM/SIGINT handler of `_stop_on_signals`."""


@contextlib.contextmanager
def _stop_on_signals() -> Iterator[None]:
    """SIGTERM and SIGINT (Ctrl-C) end the block quietly: the command then returns (exit 0) after
    its `finally` clauses ran. uvicorn handles both itself while it serves (a graceful shutdown:
    requests in flight are answered) and re-raises the signal once it has stopped; this turns
    that re-raised signal — or one arriving outside uvicorn — into a normal return instead of a
    KeyboardInterrupt traceback or death by SIGTERM (exit -15)."""
    def stop(signum: int, frame: Any) -> None:
        raise _Stop(signal.Signals(signum).name)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    except (_Stop, KeyboardInterrupt):
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _dashboard_cmd(port: int, address: str = "127.0.0.1") -> list[str]:
    script = Path(__file__).resolve().parents[2] / "dashboard" / "app.py"
    return [sys.executable, "-m", "streamlit", "run", str(script), "--server.port", str(port),
            "--server.headless", "true", "--browser.gatherUsageStats", "false", "--server.address", address,
            "--client.toolbarMode", "viewer"]  # no "Deploy" button: the dashboard only views the API's data


@app.command()
def dashboard(port: int = typer.Option(8501, help="dashboard port"),
              address: str = typer.Option("127.0.0.1", help="bind address (0.0.0.0 in a container)")) -> None:
    """Start the Streamlit dashboard against SCALEBOOK_API_URL (it reads only through the API)."""
    env = {**os.environ, "SCALEBOOK_API_URL": api_url()}
    console.print(f"dashboard on http://{address}:{port} reading {api_url()}")
    raise typer.Exit(subprocess.call(_dashboard_cmd(port, address), env=env))


def wait_for_api(url: str, timeout_s: float = 60.0, proc: subprocess.Popen | None = None) -> None:
    """Poll GET {url}/api/v1/health until it answers 200. Raises TimeoutError after `timeout_s`,
    or ChildProcessError as soon as `proc` (the server being waited for) has exited."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise ChildProcessError(f"the API process exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/api/v1/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"API at {url} not healthy after {timeout_s:.0f}s")


@app.command()
def up(
    port: int = typer.Option(8000, help="API port"),
    dashboard_port: int = typer.Option(8501, help="dashboard port"),
    load_examples: bool = typer.Option(True, "--load-examples/--no-examples",
                                       help="import examples/data (idempotent)"),
) -> None:
    """The quick start: API on 127.0.0.1 (embedded DuckDB unless SCALEBOOK_DATABASE_URL is set),
    the real example data imported, and the dashboard. Ctrl-C stops everything.

    The API's and the dashboard's own output (access log, start-up lines) goes to
    $SCALEBOOK_DATA_DIR/logs/api.log and dashboard.log, so this terminal shows the import and
    what is up; `tail -f` those files to follow the requests."""
    from service.cli.imports import import_examples

    url = f"http://127.0.0.1:{port}"
    logs = get_settings().data_dir / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    api_log, dash_log = logs / "api.log", logs / "dashboard.log"
    procs: list[subprocess.Popen] = []
    files: list[Any] = []
    try:
        with _stop_on_signals():
            files.append(open(api_log, "ab"))  # noqa: SIM115 - closed in the finally clause
            procs.append(subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--port", str(port)],
                                          stdout=files[-1], stderr=subprocess.STDOUT,
                                          env={**os.environ, "PYTHONUNBUFFERED": "1"}))  # the log as it happens
            console.print(f"API starting on {url} (log: {api_log})", soft_wrap=True)
            _wait_or_fail(lambda: wait_for_api(url, proc=procs[0]), "the API", api_log)
            os.environ["SCALEBOOK_API_URL"] = url
            if load_examples:
                import_examples(example_data_dir(), url)
            env = {**os.environ, "SCALEBOOK_API_URL": url, "PYTHONUNBUFFERED": "1"}
            files.append(open(dash_log, "ab"))  # noqa: SIM115 - closed in the finally clause
            procs.append(subprocess.Popen(_dashboard_cmd(dashboard_port), env=env, stdout=files[-1],
                                          stderr=subprocess.STDOUT))
            dash = f"http://127.0.0.1:{dashboard_port}"
            _wait_or_fail(lambda: _wait_for_dashboard(dash, procs[1]), "the dashboard", dash_log)
            console.print(f"\n[bold]scalebook is up[/]: dashboard {dash}, API {url} (docs {url}/docs).")
            console.print(f"Logs: {logs} (api.log, dashboard.log). Ctrl-C to stop.", soft_wrap=True)
            while all(p.poll() is None for p in procs):
                time.sleep(0.5)
    finally:
        _stop_children(procs)
        for fh in files:
            fh.close()
    failed = [p for p in procs if p.returncode not in (0, -signal.SIGTERM, -signal.SIGINT)]
    if failed:
        log = api_log if failed[0] is procs[0] else dash_log
        fail(f"a child process exited with {failed[0].returncode}: {failed[0].args!r}; "
             f"its last lines ({log}):\n{_tail(log)}")


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_or_fail(wait: Any, what: str, log: Path) -> None:
    """Run `wait()`; when the process exits or never answers, fail with the end of its log."""
    try:
        wait()
    except (ChildProcessError, TimeoutError) as exc:
        fail(f"{what} did not start ({exc}); the end of {log}:\n{_tail(log)}")


def _wait_for_dashboard(url: str, proc: subprocess.Popen, timeout_s: float = 90.0) -> None:
    """Poll Streamlit's {url}/_stcore/health until "ok"; ChildProcessError when `proc` exits,
    TimeoutError after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ChildProcessError(f"the dashboard exited with {proc.returncode}")
        try:
            if httpx.get(f"{url}/_stcore/health", timeout=2).text.strip() == "ok":
                return
        except httpx.TransportError:
            pass
        time.sleep(0.3)
    raise TimeoutError(f"dashboard at {url} not healthy after {timeout_s:.0f}s")


def _stop_children(procs: list[subprocess.Popen]) -> None:
    """SIGTERM to every child still running (the dashboard first, then the API, so nothing reads a
    stopped API), wait up to 20 s each, then SIGKILL. Signals arriving meanwhile are ignored: the
    children are stopping already."""
    previous = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        for p in reversed(procs):
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
