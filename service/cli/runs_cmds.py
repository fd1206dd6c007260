"""`scalebook runs`: list stored runs (GET /api/v1/runs) as a table fitted to the terminal, or the
API's JSON with --json."""

from __future__ import annotations

import typer

from core.rules import config_label, effective_mfu
from service.cli import render
from service.cli.base import app, console, fetch
from service.cli.render import Col


@app.command("runs")
def runs_list(
    model: str = typer.Option(None, "--model", help="model size, as everywhere else: 8B, 1.34B, 8030261248"),
    model_name: str = typer.Option(None, "--model-name", help="model_name, exactly as stored (llama3-8b)"),
    nodes: int = typer.Option(None, "--nodes"),
    gpu_type: str = typer.Option(None, "--gpu-type"),
    status: str = typer.Option(None, "--status", help="success | oom | nccl_error | timeout | failed"),
    framework: str = typer.Option(None, "--framework"),
    sort: str = typer.Option("-id", "--sort", help="a column, '-' for descending: -id, -tokens_per_sec_per_gpu, …"),
    limit: int = typer.Option(20, "--limit", "-n", min=1, max=1000, help="rows to show (1–1000)"),
    as_json: bool = typer.Option(False, "--json", help="print the API's JSON page"),
) -> None:
    """The newest runs (or filtered, sorted): id, model, nodes × GPU, layout, status, tok/s/GPU,
    MFU, peak memory. Columns that do not fit the terminal are left out and named."""
    body = fetch("/runs", as_json, model_params=model, model_name=model_name, nodes=nodes, gpu_type=gpu_type,
                 status=status, framework=framework, sort=sort, limit=limit)
    if body is None:
        return
    runs = body["runs"]
    if not runs:
        console.print("no runs match: import some (`scalebook import …`) or relax the filters")
        return
    cols = [Col("id", "right"), Col("model"), Col("nodes", "right"), Col("config"), Col("status"),
            Col("tok/s/GPU", "right"), Col("MFU", "right"), Col("GPU", drop=2), Col("peak mem", "right", drop=1),
            Col("seq", "right", drop=3), Col("source", drop=4)]
    rows = [[str(r["id"]), r.get("model_name") or "—", render.number(r.get("nodes")), config_label(r),
             r.get("status") or "—", render.number(r.get("tokens_per_sec_per_gpu")),
             render.pct(effective_mfu(r)),
             r.get("gpu_type") or "—", render.number(r.get("peak_memory_gib"), "GiB", 1),
             render.number(r.get("seq_len")), r.get("source") or "—"] for r in runs]
    render.table(console, cols, rows, title=f"{len(runs)} of {body.get('total', len(runs)):,} run(s), sorted {sort}")
