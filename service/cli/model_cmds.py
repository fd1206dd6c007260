"""`scalebook retire` / `unretire` (take runs out of, or back into, every analytic), `scalebook
delete` (runs gone for good, admin token, after a confirmation) and `scalebook suggest` (the
configurations to benchmark next)."""

from __future__ import annotations

import csv
import json
import sys
from collections.abc import Callable
from typing import Any

import typer
from rich.table import Table

from core.rules import config_label
from service.cli import render
from service.cli.base import (
    FfnHiddenSizeOpt,
    FrameworkOpt,
    GatedOpt,
    GlobalBatchOpt,
    GpusPerNodeOpt,
    GpuTypeOpt,
    HiddenSizeOpt,
    JsonOpt,
    ModelOpt,
    NodesOpt,
    NumHeadsOpt,
    NumKvHeadsOpt,
    NumLayersOpt,
    PrecisionOpt,
    SeqLenOpt,
    VocabSizeOpt,
    app,
    call,
    client,
    console,
    err_console,
    fail,
    fetch,
    print_json,
    shape_params,
)
from service.client import ClientError


def _filter(where: list[str] | None) -> dict[str, Any] | None:
    """--where key=value (repeatable; the value is read as JSON when it parses — false, 2, "x" —
    else kept as text): the request's filter, None without --where."""
    if not where:
        return None
    filt: dict[str, Any] = {}
    for item in where:
        key, sep, value = item.partition("=")
        if not sep or not key:
            fail(f"--where {item!r}: expected key=value, e.g. extra.after_pp_fix=false or pp_min=2")
        try:
            filt[key] = json.loads(value)
        except ValueError:
            filt[key] = value
    return filt


def _send(change: Callable[[], Any], as_json: bool) -> None:
    """Run a retire/unretire call of the client; exit 1 with its message when it fails."""
    try:
        answer = change()
    except (ValueError, ClientError) as exc:
        fail(str(exc))
    if as_json:
        print_json(answer)
    else:
        shown = ", ".join(f"#{i}" for i in answer["ids"][:20]) + (" …" if answer["changed"] > 20 else "")
        console.print(f"{answer['changed']} run(s) changed{': ' + shown if answer['changed'] else ''}")


@app.command()
def retire(
    reason: str = typer.Option(..., "--reason", help="why (kept with the runs)"),
    ids: list[int] = typer.Option(None, "--id", help="a run id (repeatable)"),
    where: list[str] = typer.Option(None, "--where", help="filter key=value (repeatable): a run column, "
                                    "<int column>_min/_max, or extra.<key>; e.g. extra.after_pp_fix=false"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Retire runs: kept and queryable, but left out of every analytic (heatmap, recommend,
    suggest, scaling, plan, regressions, the throughput model's fit)."""
    _send(lambda: client().retire(reason, ids, _filter(where)), as_json)


@app.command()
def unretire(
    ids: list[int] = typer.Option(None, "--id", help="a run id (repeatable)"),
    where: list[str] = typer.Option(None, "--where", help="filter key=value (repeatable), as for retire"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Bring retired runs back into the analytics."""
    _send(lambda: client().unretire(ids, _filter(where)), as_json)


def _ids_text(ids: list[int], shown: int = 20) -> str:
    return ", ".join(f"#{i}" for i in ids[:shown]) + (f" … ({len(ids) - shown:,} more)" if len(ids) > shown else "")


@app.command()
def delete(
    ids: list[int] = typer.Option(None, "--id", help="a run id (repeatable)"),
    where: list[str] = typer.Option(None, "--where", help="filter key=value (repeatable), as for retire; "
                                    "e.g. model_name=test-junk or source=api"),
    yes: bool = typer.Option(False, "--yes", "-y", help="do not ask for confirmation"),
    dry_run: bool = typer.Option(False, "--dry-run", help="only count and list the runs that would go"),
    as_json: bool = typer.Option(False, "--json", help="print the API's answer"),
) -> None:
    """Delete runs for good (needs an admin token): they leave every answer and SQL, and cannot be
    brought back. Says how many runs match and asks before deleting (--yes skips the question).
    To keep runs but leave them out of the analytics, use `scalebook retire` instead."""
    selection: dict[str, Any] = {k: v for k, v in (("ids", ids or None), ("filter", _filter(where))) if v}
    if not selection:
        fail("say which runs: --id N or --where key=value (deleting every run is not possible)", code=2)
    preview = call("POST", "/runs/delete", json={**selection, "dry_run": True})
    matched: list[int] = preview["ids"]
    if dry_run or not matched:
        if as_json:
            print_json(preview)
        else:
            console.print(f"{len(matched):,} run(s) match" + (f": {_ids_text(matched)}" if matched else "")
                          + ("; nothing deleted (--dry-run)" if matched else ""))
        return
    if not yes:
        err_console.print(f"{len(matched):,} run(s) match: {_ids_text(matched)}\nThey will be deleted for good "
                          "(`scalebook retire` keeps runs but leaves them out of the analytics).")
        if not typer.confirm(f"Delete {len(matched):,} run(s)?", default=False, err=True):
            err_console.print("nothing deleted")
            raise typer.Exit(1)
    # exactly the runs the user was shown (and that still match): nothing stored meanwhile goes
    answer = call("POST", "/runs/delete", json={**selection, "ids": matched})
    if as_json:
        print_json(answer)
    else:
        console.print(f"deleted {answer['deleted']:,} run(s): {_ids_text(answer['ids'])}")


@app.command()
def suggest(
    model: ModelOpt,
    nodes: NodesOpt,
    gpus_per_node: GpusPerNodeOpt = 8,
    gpu_type: GpuTypeOpt = None,
    seq_len: SeqLenOpt = None,
    global_batch_tokens: GlobalBatchOpt = None,
    framework: FrameworkOpt = None,
    precision: PrecisionOpt = None,
    num_layers: NumLayersOpt = None,
    hidden_size: HiddenSizeOpt = None,
    num_heads: NumHeadsOpt = None,
    num_kv_heads: NumKvHeadsOpt = None,
    ffn_hidden_size: FfnHiddenSizeOpt = None,
    vocab_size: VocabSizeOpt = None,
    gated: GatedOpt = None,
    n: int = typer.Option(5, "-n", help="how many configurations"),
    as_json: JsonOpt = False,
    fmt: str = typer.Option("table", "--format", help="table | csv (one config per line, for a sweep launcher)"),
) -> None:
    """The configurations worth benchmarking next for a target (expected improvement over the
    best recorded run under the throughput model)."""
    if fmt not in ("table", "csv"):
        fail(f"--format {fmt!r}: table or csv")
    body = fetch("/suggest", as_json, model_params=model, nodes=nodes, gpus_per_node=gpus_per_node,
                 gpu_type=gpu_type, seq_len=seq_len, global_batch_tokens=global_batch_tokens, n=n,
                 **shape_params(framework, precision, num_layers, hidden_size, num_heads, num_kv_heads,
                                ffn_hidden_size, vocab_size, gated))
    if body is None:
        return
    if fmt == "csv":
        write_csv(body)
        return
    t, best = body["target"], body["best_recorded"]
    console.print(f"target: {t['model_size_class']:g}B on {t['nodes']} × {t['gpus_per_node']} {t['gpu_type']}, "
                  f"seq {t['seq_len']}, batch {t['global_batch_tokens']:,} tokens")
    console.print(f"best recorded: {best['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU (run #{best['id']})" if best
                  else "best recorded: none on this target yet")
    if not body["suggestions"]:
        console.print("nothing to suggest: " + "; ".join(body.get("notes") or []))
        return
    table = Table(show_lines=True)
    for col, max_width in (("#", None), ("config", 22), ("predicted tok/s/GPU", 16),
                           ("EI", None), ("mem GiB", None), ("1σ", None), ("", None)):
        table.add_column(col, max_width=max_width)
    for i, s in enumerate(body["suggestions"], 1):
        p = s["predicted"]
        lo, hi = p["interval"]
        table.add_row(str(i), config_label(s["config"]), f"{p['tokens_per_sec_per_gpu']:,.0f}\n[{lo:,.0f}–{hi:,.0f}]",
                      f"{100 * s['expected_improvement']:.1f}%", f"{p['peak_memory_gib']:.0f}",
                      f"±{100 * s['uncertainty_rel']:.0f}%", "new" if s["exploration"] else "")
    console.print(table)
    for line in render.extrapolation_lines(body["suggestions"]):
        console.print(line)
    console.print("EI: expected improvement over the best recorded run (or the best prediction when none is "
                  "recorded); 1σ: the prediction's uncertainty; new: a layout not yet run near this target "
                  "(exploration). Each suggestion's reasons: --json.")


_CSV_FIELDS = ("dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size", "grad_accum_steps", "recompute")


def write_csv(body: dict[str, Any]) -> None:
    """One suggested config per row (the run-record field names), with its prediction."""
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["rank", *_CSV_FIELDS, "predicted_tokens_per_sec_per_gpu", "predicted_mfu",
                  "predicted_peak_memory_gib", "expected_improvement"])
    for i, s in enumerate(body["suggestions"], 1):
        p = s["predicted"]
        out.writerow([i, *(s["config"][f] for f in _CSV_FIELDS), f"{p['tokens_per_sec_per_gpu']:.1f}",
                      f"{p['mfu']:.4f}", f"{p['peak_memory_gib']:.2f}", f"{s['expected_improvement']:.4f}"])
