"""`scalebook sql`, `scalebook scaling`, `scalebook plan` and `scalebook regressions`: API clients that
print readable tables, or the API's JSON with --json (sql: --format table|csv|json)."""

from __future__ import annotations

import csv
import json
import sys
from enum import StrEnum

import typer
from rich.table import Table

from service.cli.base import Api, ApiError, app, console, err_console, fail, fetch, print_json
from service.ranking import config_label


class SqlFormat(StrEnum):
    table = "table"
    csv = "csv"
    json = "json"


def _cell(value) -> str:
    if value is None:
        return ""
    if isinstance(value, (dict, list)):
        return json.dumps(value, default=str)
    return str(value)


@app.command()
def sql(
    query: str = typer.Argument(..., help="one read-only SELECT over the runs table"),
    fmt: SqlFormat = typer.Option(SqlFormat.table, "--format", "-f", help="table | csv | json"),
) -> None:
    """Run read-only SQL over the runs (POST /api/v1/sql); the server applies a timeout and a row cap."""
    status, body = Api().post("/sql", {"query": query})
    if status >= 400:
        fail(str(ApiError(status, body)))
    if body.get("truncated"):
        err_console.print(f"[yellow]note:[/] truncated at {body['row_count']:,} rows (SCALEBOOK_SQL_MAX_ROWS)")
    if fmt is SqlFormat.json:
        print_json(body)
    elif fmt is SqlFormat.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(body["columns"])
        writer.writerows([_cell(v) for v in row] for row in body["rows"])
    else:
        table = Table(show_lines=False)
        for col in body["columns"]:
            table.add_column(col)
        for row in body["rows"]:
            table.add_row(*(_cell(v) for v in row))
        console.print(table)
        console.print(f"{body['row_count']:,} row(s) in {body['elapsed_ms']:.1f} ms")


def _num(value, fmt: str = ",.0f") -> str:
    return format(value, fmt) if isinstance(value, (int, float)) else "?"


def _si(n: float) -> str:
    for div, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M")):
        if n >= div:
            return f"{n / div:g}{suffix}"
    return f"{n:,.0f}"


def _config(cfg: dict) -> str:
    """The one config label (service.ranking.config_label): an unknown degree shows as '?'."""
    return config_label(cfg)


@app.command()
def scaling(
    model: str = typer.Option(..., "--model", help="model size: 8B, 1.34B, 8e9"),
    gpu_type: str = typer.Option(None, "--gpu-type"),
    seq_len: int = typer.Option(None, "--seq-len"),
    metric: str = typer.Option("tokens_per_sec_per_gpu", help="tokens_per_sec_per_gpu | mfu"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Best run per node count for a model size, scaling efficiency and the Amdahl's-law fit."""
    body = fetch("/scaling", as_json, model_params=model, gpu_type=gpu_type, seq_len=seq_len, metric=metric)
    if body is None:
        return
    table = Table(title=f"{body['model_size_class']:g}B on {body.get('gpu_type') or '?'}"
                        f"{', seq ' + str(body['seq_len']) if body.get('seq_len') else ''}")
    for col in ("nodes", "GPUs", "tok/s/GPU", "aggregate tok/s", "speedup", "efficiency", "MFU", "config", "run"):
        table.add_column(col)
    for p in body["points"]:
        table.add_row(str(p["nodes"]), str(p["world_size"]), _num(p["tokens_per_sec_per_gpu"]),
                      _num(p["aggregate_tokens_per_sec"]), _num(p.get("speedup"), ".2f") + "×",
                      _num(100 * p["efficiency"] if p.get("efficiency") is not None else None, ".1f") + "%",
                      _num(100 * p["mfu"] if p.get("mfu") is not None else None, ".1f") + "%",
                      _config(p["config"]), f"#{p['best_run_id']}")
    console.print(table)
    fit = body.get("amdahl")
    if fit:
        err = fit.get("serial_fraction_stderr")
        console.print(f"Amdahl: serial fraction {100 * fit['serial_fraction']:.2f}%"
                      + (f" ± {100 * err:.2f}%" if err is not None else "")
                      + (f", R² {fit['r2']:.4f}" if fit.get("r2") is not None else "")
                      + (f"; speedup ≤ {fit['max_speedup']:,.1f}× the {fit['base_nodes']}-node throughput"
                         if fit.get("max_speedup") else "")
                      + (f"; efficiency falls below 50% at ~{fit['nodes_at_50pct_efficiency']:,.1f} nodes"
                         if fit.get("nodes_at_50pct_efficiency") else ""))
    else:
        console.print(f"no Amdahl fit: {body.get('amdahl_reason')}")
    for note in body.get("notes") or []:
        console.print(f"[yellow]note:[/] {note}")


@app.command()
def plan(
    model: str = typer.Option(..., "--model", help="model size: 3B, 8e9"),
    tokens: str = typer.Option(..., "--tokens", help="training tokens: 11T, 1e12, 500B"),
    days: float = typer.Option(..., "--days", help="wall-clock days"),
    gpu_type: str = typer.Option(None, "--gpu-type"),
    mfu: float = typer.Option(None, "--mfu", help="fraction, e.g. 0.30 (default: the throughput model's prediction)"),
    peak_tflops: float = typer.Option(None, "--peak-tflops", help="dense TFLOP/s per GPU (default: catalog)"),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """GPUs needed: GPUs = 6·N·tokens / (peak · MFU · time), with the MFU of the nearest recorded run."""
    body = fetch("/plan", as_json, model_params=model, tokens=tokens, days=days, gpu_type=gpu_type, mfu=mfu,
                         peak_tflops=peak_tflops, gpus_per_node=gpus_per_node)
    if body is None:
        return
    console.print(f"[bold]{body['gpus']:,} GPUs[/] ({body['nodes']:,} nodes × {body['gpus_per_node']}) for "
                  f"{body['model_params'] / 1e9:g}B params on {_si(body['tokens'])} tokens in {body['days']:g} days")
    console.print(f"  MFU {100 * body['mfu']:.1f}% — {body['mfu_source']}")
    console.print(f"  peak {body['peak_tflops']:,.0f} TFLOP/s — {body['peak_source']}")
    console.print(f"  {body['total_flops']:.3g} FLOPs; {body['gpus_exact']:,.1f} GPUs exactly; "
                  f"{body['gpu_hours']:,.0f} GPU-hours booked")
    eff = body.get("efficiency")
    if eff:
        console.print(f"  predicted efficiency at {body['nodes']} nodes: {100 * eff['predicted_efficiency']:.0f}% "
                      f"({eff['source']}); with that loss: "
                      + (f"{eff['gpus_with_scaling_loss']:,} GPUs ({eff['nodes_with_scaling_loss']:,} nodes)"
                         if eff.get("gpus_with_scaling_loss") else "not reachable"))
    for note in body.get("notes") or []:
        console.print(f"[yellow]note:[/] {note}")


@app.command()
def regressions(
    metric: str = typer.Option("tokens_per_sec_per_gpu", help="tokens_per_sec_per_gpu | mfu | tflops_per_gpu"),
    threshold: float = typer.Option(3.5, help="flag when robust z < -threshold"),
    min_history: int = typer.Option(3, "--min-history"),
    since: str = typer.Option(None, "--since", help="ISO date/time: only judge runs started since"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Runs far below the history of their fingerprint (same config, hardware and versions)."""
    body = fetch("/regressions", as_json, metric=metric, threshold=threshold, min_history=min_history, since=since)
    if body is None:
        return
    console.print(f"{body['runs_checked']:,} run(s) of {body['fingerprints_checked']:,} fingerprint(s) checked; "
                  f"{len(body['flags'])} flagged")
    if not body["flags"]:
        return
    table = Table(show_lines=True)
    for col in ("run", "started", body["metric"], "median · MAD (n)", "z · drop", "what"):
        table.add_column(col, overflow="fold")
    for f in body["flags"]:
        c = f["config"]
        table.add_row(f"#{f['run_id']}", str(f.get("started_at") or "?"), _num(f["value"], ",.4g"),
                      f"{_num(f['baseline_median'], ',.4g')} · {_num(f['mad'], ',.3g')} ({f['n_history']})",
                      (_num(f["z"], ".1f") if f["z"] is not None else "MAD=0") + f" · -{_num(f['drop_pct'], '.1f')}%",
                      f"{c.get('model_name') or '?'} × {c.get('nodes')} nodes {c.get('gpu_type') or ''} "
                      f"{_config(c)} fp {f['fingerprint']}")
    console.print(table)
