"""`scalebook sql`, `scalebook scaling`, `scalebook plan` and `scalebook regressions`: API clients that
print readable tables, or the API's JSON with --json (sql: --format table|csv|json)."""

from __future__ import annotations

import csv
import json
import sys
from enum import StrEnum
from typing import Any

import typer

from core.rules import config_label
from service.cli import render
from service.cli.base import (
    FfnHiddenSizeOpt,
    FrameworkOpt,
    GatedOpt,
    HiddenSizeOpt,
    NumHeadsOpt,
    NumKvHeadsOpt,
    NumLayersOpt,
    PrecisionOpt,
    VocabSizeOpt,
    app,
    call,
    console,
    err_console,
    fetch,
    print_json,
    shape_params,
)
from service.cli.render import Col


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
    body = call("POST", "/sql", json={"query": query})
    if body.get("truncated"):
        err_console.print(f"[yellow]note:[/] truncated at {body['row_count']:,} rows (SCALEBOOK_SQL_MAX_ROWS)")
    if fmt is SqlFormat.json:
        print_json(body)
    elif fmt is SqlFormat.csv:
        writer = csv.writer(sys.stdout, lineterminator="\n")
        writer.writerow(body["columns"])
        writer.writerows([_cell(v) for v in row] for row in body["rows"])
    else:
        # every column may be left out but the first, rightmost first (SQL has no notion of importance)
        cols = [Col(c, drop=i) for i, c in enumerate(body["columns"])]
        rows = [[render.value(c, v) for c, v in zip(body["columns"], row)] for row in body["rows"]]
        for i, c in enumerate(body["columns"]):
            if rows and all(isinstance(row[i], (int, float)) and not isinstance(row[i], bool)
                            for row in body["rows"] if row[i] is not None):
                cols[i] = Col(c, "right", drop=i)
        render.table(console, cols, rows, more_hint="--format csv or --format json")
        console.print(f"{body['row_count']:,} row(s) in {body['elapsed_ms']:.1f} ms")


_si = render.si


def _list_sizes(gpu_type: str | None, seq_len: int | None) -> None:
    """`scaling` without --model: the model sizes that have runs, with their node counts."""
    body = fetch("/heatmap", False, gpu_type=gpu_type, seq_len=seq_len)
    assert body is not None
    by_size: dict[float, dict[str, Any]] = {}
    for c in body["cells"]:
        if c.get("model_size_class") is None:
            continue
        entry = by_size.setdefault(c["model_size_class"], {"nodes": set(), "runs": 0})
        entry["runs"] += c["n_success"] + c["n_oom"] + c["n_failed"]
        if c.get("best"):
            entry["nodes"].add(c["nodes"])
    if not by_size:
        console.print("no runs yet: import some (`scalebook import …`)")
        return
    rows = [[render.size(s), f"{len(e['nodes'])}", ", ".join(str(n) for n in sorted(e["nodes"])) or "—",
             render.number(e["runs"])]
            for s, e in sorted(by_size.items(), key=lambda kv: (-len(kv[1]["nodes"]), kv[0]))]
    render.table(console, [Col("--model"), Col("node counts", "right"), Col("nodes with a success"),
                           Col("runs", "right", drop=1)], rows,
                 title="model sizes with runs (most node counts first); pick one with --model")




@app.command()
def scaling(
    model: str = typer.Option(None, "--model", help="model size: 8B, 1.34B, 8e9 (left out: list the sizes)"),
    gpu_type: str = typer.Option(None, "--gpu-type"),
    seq_len: int = typer.Option(None, "--seq-len"),
    metric: str = typer.Option("tokens_per_sec_per_gpu", help="tokens_per_sec_per_gpu | mfu"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Best run per node count for a model size, scaling efficiency and the Amdahl's-law fit
    (without --model: the model sizes that have runs)."""
    if model is None:
        if as_json:
            body = fetch("/heatmap", False, gpu_type=gpu_type, seq_len=seq_len)
            assert body is not None
            print_json(sorted({c["model_size_class"] for c in body["cells"] if c.get("model_size_class")}))
            return
        _list_sizes(gpu_type, seq_len)
        return
    body = fetch("/scaling", as_json, model_params=model, gpu_type=gpu_type, seq_len=seq_len, metric=metric)
    if body is None:
        return
    fit = body.get("amdahl") or {}
    s = fit.get("serial_fraction")
    base = fit.get("base_nodes") or (body["points"][0]["nodes"] if body["points"] else 1)
    cols = [Col("nodes", "right"), Col("GPUs", "right", drop=3), Col("tok/s/GPU", "right"),
            Col("aggregate tok/s", "right", drop=2), Col("efficiency", "right"), Col("Amdahl", "right", drop=1),
            Col("MFU", "right", drop=4), Col("config", drop=5), Col("run", "right", drop=6)]
    rows = []
    for p in body["points"]:
        fit_eff = None
        if s is not None:
            rel = p["nodes"] / base
            fit_eff = 1.0 / (s + (1 - s) / rel) / rel
        rows.append([str(p["nodes"]), render.number(p["world_size"]), render.number(p["tokens_per_sec_per_gpu"]),
                     render.number(p["aggregate_tokens_per_sec"]), render.pct(p.get("efficiency")),
                     render.pct(fit_eff), render.pct(p.get("mfu")), config_label(p["config"]),
                     f"#{p['best_run_id']}"])
    render.table(console, cols, rows,
                 title=f"{render.size(body['model_size_class'])} on {body.get('gpu_type') or 'any GPU'}"
                       f"{', seq ' + format(body['seq_len'], ',') if body.get('seq_len') else ''}")
    if s is not None:
        err = fit.get("serial_fraction_stderr")
        misses = [abs(100 * (1.0 / (s + (1 - s) / (p["nodes"] / base)) / (p["nodes"] / base) - p["efficiency"]))
                  for p in body["points"] if p.get("efficiency") is not None]
        console.print(f"Amdahl: serial fraction {render.pct(s, 2)}"
                      + (f" ± {render.pct(err, 2)}" if err is not None else "")
                      + (f"; speedup ≤ {render.number(fit['max_speedup'])}× the {base}-node throughput"
                         if fit.get("max_speedup") else "")
                      + (f"; efficiency falls below 50% at ~{render.number(fit['nodes_at_50pct_efficiency'])} nodes"
                         if fit.get("nodes_at_50pct_efficiency") else ""))
        if misses:
            console.print(f"fit vs measured efficiency: largest miss {max(misses):.1f} percentage points, "
                          f"mean {sum(misses) / len(misses):.1f} (column Amdahl vs efficiency)")
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
    framework: FrameworkOpt = None,
    precision: PrecisionOpt = None,
    num_layers: NumLayersOpt = None,
    hidden_size: HiddenSizeOpt = None,
    num_heads: NumHeadsOpt = None,
    num_kv_heads: NumKvHeadsOpt = None,
    ffn_hidden_size: FfnHiddenSizeOpt = None,
    vocab_size: VocabSizeOpt = None,
    gated: GatedOpt = None,
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """GPUs needed: GPUs = FLOPs per token × tokens / (peak · MFU · time), booked in whole nodes.

    With --mfu: 6·N FLOPs per token (Kaplan et al. 2020, C ≈ 6·N·D). Without it the MFU is the
    throughput model's prediction for the target, which counts 6·N + 12·L·h·s FLOPs per token
    (PaLM, appendix B): GPUs = tokens / (predicted tokens/s/GPU · time). The GPU-hours are those of
    every booked GPU (nodes × GPUs per node × 24 × days)."""
    body = fetch("/plan", as_json, model_params=model, tokens=tokens, days=days, gpu_type=gpu_type, mfu=mfu,
                 peak_tflops=peak_tflops, gpus_per_node=gpus_per_node,
                 **shape_params(framework, precision, num_layers, hidden_size, num_heads, num_kv_heads,
                                ffn_hidden_size, vocab_size, gated))
    if body is None:
        return
    booked = body.get("gpus_booked") or body["nodes"] * body["gpus_per_node"]
    console.print(f"[bold]{booked:,} GPUs[/] ({body['nodes']:,} nodes × {body['gpus_per_node']}) for "
                  f"{body['model_params'] / 1e9:g}B params on {_si(body['tokens'])} tokens in {body['days']:g} days")
    console.print(f"  {body['gpus']:,} GPUs' worth of compute ({body['gpus_exact']:,.1f} exactly) at "
                  f"MFU {100 * body['mfu']:.1f}% of {body['peak_tflops']:,.0f} TFLOP/s per GPU")
    console.print(f"  MFU: {body['mfu_source']}")
    console.print(f"  peak: {body['peak_source']}")
    formula = body.get("flops_formula", "6·N")
    console.print(f"  {render.power_of_ten(body['total_flops'])} training FLOPs ({formula} per token × tokens); "
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
    metric_header = {"tokens_per_sec_per_gpu": "tok/s/GPU", "mfu": "MFU", "tflops_per_gpu": "TFLOP/s"}.get(
        body["metric"], body["metric"])
    cols = [Col("run", "right"), Col("started", drop=2), Col(metric_header, "right"),
            Col("median · MAD (n)", "right", drop=1), Col("z · drop", "right"), Col("what")]
    rows = []
    for f in body["flags"]:
        c = f["config"]
        rows.append([f"#{f['run_id']}", str(f.get("started_at") or "—")[:19], render.number(f["value"]),
                     f"{render.number(f['baseline_median'])} · {render.number(f['mad'])} ({f['n_history']})",
                     (render.number(f["z"], digits=1) if f["z"] is not None else "MAD=0")
                     + f" · -{render.number(f['drop_pct'], digits=1)}%",
                     f"{c.get('model_name') or '?'} × {c.get('nodes')} nodes {c.get('gpu_type') or ''} "
                     f"{config_label(c)} fp {f['fingerprint']}"])
    render.table(console, cols, rows, lines=True)
