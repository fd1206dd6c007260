"""`scalebook runs` (stored runs as a table fitted to the terminal, or the API's JSON with --json)
and `scalebook export` (every matching run, all pages, as CSV, JSONL or Parquet in the run
record's own columns — what `scalebook import runs` reads back)."""

from __future__ import annotations

import csv
import json
import sys
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any

import typer

from core.rules import config_label, effective_mfu
from service.cli import render
from service.cli.base import app, call, console, err_console, fail, fetch
from service.cli.progress import QUIET, progress
from service.cli.render import Col

# the filters shared by `runs` and `export` (GET /api/v1/runs parameters)
ModelOpt = Annotated[str | None, typer.Option(
    "--model", help="model size, as elsewhere: 8B (its family, 7–8B), 1.34B, 350M, or a family label")]
ModelNameOpt = Annotated[str | None, typer.Option("--model-name", help="model_name, exactly as stored")]
RunNodesOpt = Annotated[int | None, typer.Option("--nodes")]
RunGpuOpt = Annotated[str | None, typer.Option("--gpu-type", help="H100, H100-SXM-80GB, ... (catalog aliases)")]
StatusOpt = Annotated[str | None, typer.Option("--status", help="success | oom | nccl_error | timeout | failed | "
                                                                "running | lost (open runs: a lost one stopped "
                                                                "heartbeating)")]
FrameworkOpt = Annotated[str | None, typer.Option("--framework")]
SourceOpt = Annotated[str | None, typer.Option("--source", help="api, nanotron-csv, published-table, log, ...")]
SweepOpt = Annotated[str | None, typer.Option("--sweep", help="the runs of this sweep (scalebook sweep list)")]
TagOpt = Annotated[str | None, typer.Option("--tag", help="runs carrying this tag")]
RetiredOpt = Annotated[bool | None, typer.Option(
    "--retired/--not-retired", help="only retired runs / only runs not retired (default: both)")]


def run_filters(*, model: str | None = None, model_name: str | None = None, nodes: int | None = None,
                gpu_type: str | None = None, status: str | None = None, framework: str | None = None,
                source: str | None = None, retired: bool | None = None, sweep: str | None = None,
                tag: str | None = None) -> dict[str, Any]:
    """GET /runs query parameters of the shared options (None left out by the client). `model` is a
    size meaning its family (core.families.family_named), checked here: a usage error names it."""
    if model is not None:
        from core.families import family_named

        try:
            family_named(model)
        except ValueError as exc:
            raise typer.BadParameter(str(exc), param_hint="--model") from None
    return {"model_family": model, "model_name": model_name, "nodes": nodes, "gpu_type": gpu_type, "status": status,
            "framework": framework, "source": source, "sweep": sweep, "tag": tag,
            "retired": None if retired is None else str(retired).lower()}


def status_text(run: dict[str, Any]) -> str:
    """The run's status, with "retired" after it when it was retired (its reason is in --json)."""
    status = run.get("status") or "—"
    return f"{status} (retired)" if run.get("retired_at") else status


@app.command("runs")
def runs_list(
    model: ModelOpt = None,
    model_name: ModelNameOpt = None,
    nodes: RunNodesOpt = None,
    gpu_type: RunGpuOpt = None,
    status: StatusOpt = None,
    framework: FrameworkOpt = None,
    source: SourceOpt = None,
    retired: RetiredOpt = None,
    sweep: SweepOpt = None,
    tag: TagOpt = None,
    sort: str = typer.Option("-id", "--sort", help="a column, '-' for descending: -id, -tokens_per_sec_per_gpu, …"),
    limit: int = typer.Option(20, "--limit", "-n", min=1, max=1000, help="rows to show (1–1000)"),
    as_json: bool = typer.Option(False, "--json", help="print the API's JSON page"),
) -> None:
    """The newest runs (or filtered, sorted): id, model, nodes × GPU, layout, status (retired runs
    say so), tok/s/GPU, MFU, peak memory. Columns that do not fit the terminal are left out and
    named. Every matching run, all pages: `scalebook export`."""
    body = fetch("/runs", as_json, **run_filters(model=model, model_name=model_name, nodes=nodes, gpu_type=gpu_type,
                                                 status=status, framework=framework, source=source, retired=retired,
                                                 sweep=sweep, tag=tag),
                 sort=sort, limit=limit)
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
             status_text(r), render.number(r.get("tokens_per_sec_per_gpu")),
             render.pct(effective_mfu(r)),
             r.get("gpu_type") or "—", render.number(r.get("peak_memory_gib"), "GiB", 1),
             render.number(r.get("seq_len")), r.get("source") or "—"] for r in runs]
    total = body.get("total", len(runs))
    render.table(console, cols, rows, title=f"{len(runs)} of {total:,} run(s), sorted {sort}")
    if total > len(runs):
        console.print(f"all {total:,}: `scalebook export` with the same filters (CSV, JSONL or Parquet)")


class ExportFormat(StrEnum):
    csv = "csv"
    jsonl = "jsonl"
    parquet = "parquet"


def fetch_all(params: dict[str, Any], *, page_size: int = 1000, quiet: bool = False) -> list[dict[str, Any]]:
    """Every run matching `params`, following GET /runs' cursor (oldest first: ids ascending)."""
    out: list[dict[str, Any]] = []
    cursor = None
    with progress("exporting runs", total=None, quiet=quiet) as bar:
        while True:
            page = call("GET", "/runs", params={k: v for k, v in {**params, "sort": "id", "limit": page_size,
                                                                  "cursor": cursor}.items() if v is not None})
            out.extend(page["runs"])
            bar.update(len(out), total=page.get("total"))
            cursor = page.get("next_cursor")
            if not cursor:
                return out


def _flat(run: dict[str, Any]) -> dict[str, Any]:
    return {k: (json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v) for k, v in run.items()}


@app.command("export")
def export(
    output: Path = typer.Option(None, "--output", "-o", dir_okay=False,
                                help="file to write (default: standard output; Parquet needs a file)"),
    fmt: ExportFormat = typer.Option(None, "--format", "-f",
                                     help="csv | jsonl | parquet (default: the file's suffix, else csv)"),
    model_name: ModelNameOpt = None,
    nodes: RunNodesOpt = None,
    gpu_type: RunGpuOpt = None,
    status: StatusOpt = None,
    framework: FrameworkOpt = None,
    source: SourceOpt = None,
    retired: RetiredOpt = None,
    sweep: SweepOpt = None,
    tag: TagOpt = None,
    model: ModelOpt = None,
    quiet: bool = QUIET,
) -> None:
    """Export every run matching the filters (all pages of GET /api/v1/runs, ids ascending), every
    field in the API's names: CSV (extra as JSON text), JSONL (one run per line) or Parquet.
    `scalebook import runs FILE` reads it back (it stores nothing new: same run_keys)."""
    suffix = output.suffix.lower().lstrip(".") if output is not None else ""
    fmt = fmt or (ExportFormat(suffix) if suffix in ExportFormat.__members__ else ExportFormat.csv)
    if fmt is ExportFormat.parquet and output is None:
        fail("--format parquet writes a binary file: give --output FILE.parquet", code=2)
    runs = fetch_all(run_filters(model=model, model_name=model_name, nodes=nodes, gpu_type=gpu_type, status=status,
                                 framework=framework, source=source, retired=retired, sweep=sweep, tag=tag),
                       quiet=quiet)
    columns: list[str] = []
    for r in runs:
        columns.extend(k for k in r if k not in columns)
    if fmt is ExportFormat.parquet:
        import pandas as pd

        assert output is not None
        pd.DataFrame([_flat(r) for r in runs], columns=columns).to_parquet(output, index=False)
    else:
        fh = open(output, "w", newline="") if output is not None else sys.stdout  # noqa: SIM115
        try:
            if fmt is ExportFormat.csv:
                writer = csv.DictWriter(fh, fieldnames=columns, lineterminator="\n")
                writer.writeheader()
                writer.writerows(_flat(r) for r in runs)
            else:
                for r in runs:
                    fh.write(json.dumps(r, default=str) + "\n")
        finally:
            if output is not None:
                fh.close()
    if output is not None or not quiet:
        err_console.print(f"exported {len(runs):,} run(s) as {fmt.value}" + (f" to {output}" if output else ""),
                          soft_wrap=True)
