"""`scalebook sweep create | show | list`: sweeps (POST/GET /api/v1/sweeps, issue 29) at 80 columns or
as the API's JSON. The agent that runs a sweep's configurations is `scalebook agent` (ingest/agent.py)."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from service.cli import render
from service.cli.base import (
    FfnHiddenSizeOpt,
    FrameworkOpt,
    GatedOpt,
    HiddenSizeOpt,
    JsonOpt,
    NumHeadsOpt,
    NumKvHeadsOpt,
    NumLayersOpt,
    PrecisionOpt,
    VocabSizeOpt,
    app,
    call,
    console,
    fail,
    fetch,
    print_json,
    shape_params,
)
from service.cli.render import Col

sweep_app = typer.Typer(help="Sweeps: a named search for one target's best configuration (grid or suggest), "
                             "run by `scalebook agent`.", no_args_is_help=True)
app.add_typer(sweep_app, name="sweep")

_INT_FIELDS = ("dp", "tp", "pp", "cp", "ep", "zero_stage", "micro_batch_size")
_GRID_FIELDS = (*_INT_FIELDS, "recompute")


def parse_grid(items: list[str]) -> dict[str, list[Any]]:
    """`--grid tp=1,2 --grid micro_batch_size=1,2,4` -> {"tp": [1, 2], "micro_batch_size": [1, 2, 4]}
    (mbs is accepted for micro_batch_size, zero for zero_stage). Raises typer.BadParameter naming the item."""
    aliases = {"mbs": "micro_batch_size", "zero": "zero_stage", "rc": "recompute"}
    out: dict[str, list[Any]] = {}
    for item in items:
        field, sep, values = item.partition("=")
        field = aliases.get(field.strip(), field.strip())
        if not sep or field not in _GRID_FIELDS or not values.strip():
            raise typer.BadParameter(f"{item!r}: expected FIELD=V1,V2 with FIELD one of {', '.join(_GRID_FIELDS)}",
                                     param_hint="--grid")
        parts = [v.strip() for v in values.split(",") if v.strip()]
        if field in _INT_FIELDS:
            try:
                out[field] = [int(v) for v in parts]
            except ValueError:
                raise typer.BadParameter(f"{item!r}: {field} takes integers", param_hint="--grid") from None
        else:
            out[field] = parts
    return out


@sweep_app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="the sweep's name (letters, digits, . _ -)")],
    model: Annotated[str | None, typer.Option("--model", help="model size: 1.34B, 8B, 8030261248 (or the dims)")]
    = None,
    nodes: Annotated[int, typer.Option("--nodes", min=1)] = 1,
    gpus_per_node: Annotated[int, typer.Option("--gpus-per-node", min=1)] = 8,
    gpu_type: Annotated[str | None, typer.Option("--gpu-type", help="H100, A100-80GB, … (catalog aliases)")] = None,
    seq_len: Annotated[int | None, typer.Option("--seq-len", min=1)] = None,
    global_batch_tokens: Annotated[int | None, typer.Option("--global-batch-tokens", min=1)] = None,
    strategy: Annotated[str, typer.Option("--strategy", help="grid | suggest")] = "suggest",
    grid: Annotated[list[str] | None, typer.Option("--grid", help="FIELD=V1,V2 (repeat): dp tp pp cp ep zero_stage "
                                                   "micro_batch_size recompute")] = None,
    budget: Annotated[int, typer.Option("--budget", min=1, help="configurations to run, at most")] = 10,
    min_ei: Annotated[float | None, typer.Option("--min-expected-improvement", min=0.0, max=0.99,
                                                 help="suggest: stop below this fraction (default 0.01)")] = None,
    model_name: Annotated[str | None, typer.Option("--model-name")] = None,
    framework: FrameworkOpt = None,
    precision: PrecisionOpt = None,
    num_layers: NumLayersOpt = None,
    hidden_size: HiddenSizeOpt = None,
    num_heads: NumHeadsOpt = None,
    num_kv_heads: NumKvHeadsOpt = None,
    ffn_hidden_size: FfnHiddenSizeOpt = None,
    vocab_size: VocabSizeOpt = None,
    gated: GatedOpt = None,
    description: Annotated[str | None, typer.Option("--description")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Create a sweep (idempotent: the same definition again is fine). Then run it with
    `scalebook agent NAME -- COMMAND …` on as many machines as you like."""
    if strategy not in ("grid", "suggest"):
        fail(f"--strategy {strategy!r}: grid or suggest", code=2)
    target = {"model_params": model, "model_name": model_name, "nodes": nodes, "gpus_per_node": gpus_per_node,
              "gpu_type": gpu_type, "seq_len": seq_len, "global_batch_tokens": global_batch_tokens,
              **shape_params(framework, precision, num_layers, hidden_size, num_heads, num_kv_heads, ffn_hidden_size,
                             vocab_size, gated)}
    body = {"name": name, "strategy": strategy, "budget": budget,
            "target": {k: v for k, v in target.items() if v is not None},
            "grid": parse_grid(grid or []) or None, "min_expected_improvement": min_ei, "description": description}
    answer = call("POST", "/sweeps", json={k: v for k, v in body.items() if v is not None})
    if as_json:
        print_json(answer)
        return
    left = f", {answer['left']} configuration(s) in the grid" if answer.get("left") is not None else ""
    console.print(f"sweep {answer['name']}: {answer['strategy']}, budget {answer['budget']}{left}. "
                  f"Run it: scalebook agent {answer['name']} -- COMMAND {{tp}} {{micro_batch_size}} …")


def _counts(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {status}" for status, n in sorted(counts.items())) or "no runs yet"


def _target_text(t: dict[str, Any]) -> str:
    size = render.size(t.get("model_size_class")) if t.get("model_size_class") else "?"
    parts = [f"{size} × {t['nodes']} node(s) × {t['gpus_per_node']} {t.get('gpu_type') or 'GPU'}"]
    if t.get("seq_len"):
        parts.append(f"seq {t['seq_len']:,}")
    if t.get("global_batch_tokens"):
        parts.append(f"batch {t['global_batch_tokens']:,} tokens")
    return ", ".join(parts)


@sweep_app.command("show")
def show(name: Annotated[str, typer.Argument()], as_json: JsonOpt = False) -> None:
    """A sweep's progress: counts by status, the best run so far with its figures, every run with its
    predicted vs measured throughput, and what is left."""
    body = fetch(f"/sweeps/{name}", as_json)
    if body is None:
        return
    console.print(f"sweep {body['name']} ({body['strategy']}): {_target_text(body['target'])}")
    left = f"; {body['left']} grid configuration(s) left" if body.get("left") is not None else ""
    console.print(f"{body['handed_out']} of {body['budget']} handed out ({_counts(body['counts'])}){left}",
                  soft_wrap=True)
    best = body.get("best")
    if best:
        console.print(f"best: run {best['id']} {best['label']}: {render.number(best['tokens_per_sec_per_gpu'])} "
                      f"tok/s/GPU, MFU {render.pct(best.get('mfu'))}, peak "
                      f"{render.number(best.get('peak_memory_gib'), 'GiB', 1)}")
    else:
        console.print("best: none yet (no successful run)")
    if not body["runs"]:
        return
    cols = [Col("#", "right"), Col("run", "right"), Col("config"), Col("status"), Col("tok/s/GPU", "right"),
            Col("predicted", "right", drop=1), Col("MFU", "right", drop=2), Col("peak mem", "right", drop=3),
            Col("try", "right", drop=4)]
    rows = [[str(i), str(r["id"]), r["label"], r["status"] + (f" ({r['error_class']})" if r.get("error_class") else ""),
             render.number(r.get("tokens_per_sec_per_gpu")), render.number(r.get("predicted_tokens_per_sec_per_gpu")),
             render.pct(r.get("mfu")), render.number(r.get("peak_memory_gib"), "GiB", 1), str(r.get("attempt") or "—")]
            for i, r in enumerate(body["runs"], 1)]
    render.table(console, cols, rows, title=f"{len(rows)} run(s) in hand-out order")


@sweep_app.command("list")
def list_(as_json: JsonOpt = False) -> None:
    """Every sweep, newest first: strategy, target, progress, best so far."""
    body = fetch("/sweeps", as_json)
    if body is None:
        return
    if not body["sweeps"]:
        console.print("no sweeps: create one with `scalebook sweep create NAME --model … --nodes …`")
        return
    cols = [Col("name"), Col("strategy"), Col("target"), Col("runs", "right"), Col("best tok/s/GPU", "right"),
            Col("status", drop=1)]
    rows = [[s["name"], s["strategy"], _target_text(s["target"]), f"{s['handed_out']}/{s['budget']}",
             render.number((s.get("best") or {}).get("tokens_per_sec_per_gpu")), _counts(s["counts"])]
            for s in body["sweeps"]]
    render.table(console, cols, rows, title=f"{len(rows)} sweep(s)")
