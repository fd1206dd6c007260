"""`scalebook heatmap` and `scalebook recommend`: readable tables, or JSON with --json."""

from __future__ import annotations

import typer
from rich.table import Table

from service.cli.base import app, console, fetch
from service.ranking import config_label as _label
from service.ranking import effective_mfu as _mfu


@app.command()
def heatmap(
    metric: str = typer.Option("tokens_per_sec_per_gpu", help="tokens_per_sec_per_gpu | mfu"),
    gpu_type: str = typer.Option(None), seq_len: int = typer.Option(None),
    global_batch_tokens: int = typer.Option(None), framework: str = typer.Option(None),
    precision: str = typer.Option(None),
    model: str = typer.Option(None, "--model", help="only this model size class, e.g. 1.3 or 8B"),
    max_nodes: int = typer.Option(None, "--max-nodes", help="only node counts up to this"),
    layout: str = typer.Option("auto", help="grid | list | auto (grid when it fits the terminal)"),
    as_json: bool = typer.Option(False, "--json", help="print the API's JSON"),
) -> None:
    """Best config per model size class (rows, billions) × node count (columns)."""
    body = fetch("/heatmap", as_json, metric=metric, gpu_type=gpu_type, seq_len=seq_len,
                         global_batch_tokens=global_batch_tokens, framework=framework, precision=precision)
    if body is None:
        return
    cells = body["cells"]
    if model:
        size = float(model.rstrip("bB"))
        cells = [c for c in cells if abs(c["model_size_class"] - size) < 1e-9]
    if max_nodes:
        cells = [c for c in cells if c["nodes"] <= max_nodes]
    if not cells:
        console.print("no runs match: import some (`scalebook import …`) or relax the filters")
        return
    sizes = sorted({c["model_size_class"] for c in cells})
    nodes = sorted({c["nodes"] for c in cells})
    grid = {(c["model_size_class"], c["nodes"]): c for c in cells}
    if layout == "list" or (layout == "auto" and 8 + 24 * len(nodes) > console.width):
        table = Table(title=f"best {metric} per model size × nodes")
        for col in ("model", "nodes", "best config", "MFU", "tok/s/GPU", "peak GiB", "ok/OOM/failed", "run"):
            table.add_column(col)
        for c in cells:
            b = c["best"] or {}
            mfu = _mfu(b) if b else None
            tps = b.get("tokens_per_sec_per_gpu")
            table.add_row(f"{c['model_size_class']:g}B", str(c["nodes"]),
                          _label(b) if b else "[red]no success[/]",
                          f"{100 * mfu:.1f}%" if mfu is not None else "",
                          f"{tps:,.0f}" if tps is not None else "",
                          f"{b['peak_memory_gib']:.1f}" if b.get("peak_memory_gib") is not None else "",
                          f"{c['n_success']}/{c['n_oom']}/{c['n_failed']}", str(b.get("id", "")))
        console.print(table)
        return
    table = Table(title=f"best {metric} per model size × nodes", show_lines=True)
    table.add_column("model")
    for n in nodes:
        table.add_column(f"{n} node{'s' if n > 1 else ''}")
    for size in sizes:
        row = [f"{size:g}B"]
        for n in nodes:
            c = grid.get((size, n))
            if c is None:
                row.append("")
            elif c["best"] is None:
                row.append(f"[red]no success[/]\nOOM {c['n_oom']} · failed {c['n_failed']}")
            else:
                b = c["best"]
                mfu = _mfu(b)
                tps = b.get("tokens_per_sec_per_gpu")
                mem = b.get("peak_memory_gib")
                row.append(f"{_label(b)}\n"
                           f"{'MFU %.1f%%' % (100 * mfu) if mfu is not None else 'MFU ?'}"
                           f"{f' · {mem:.1f} GiB' if mem is not None else ''}\n"
                           f"{f'{round(tps):,} tok/s/GPU' if tps is not None else ''}\n"
                           f"ok {c['n_success']} · OOM {c['n_oom']} · failed {c['n_failed']}")
        table.add_row(*row)
    console.print(table)


def _short(cfg: dict) -> str:
    """A config in a few characters: DP64 TP1 PP1 Z1 MBS2 GAS2 (+ CP/recompute when used)."""
    text = _label(cfg)
    if cfg.get("recompute") not in (None, "none"):
        text += f" RC:{cfg['recompute']}"
    return text


@app.command()
def recommend(
    model: str = typer.Option(..., "--model", help="model size: 8B, 1.34B, 8e9"),
    nodes: int = typer.Option(..., "--nodes"),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node"),
    gpu_type: str = typer.Option(None, "--gpu-type"),
    seq_len: int = typer.Option(None, "--seq-len"),
    global_batch_tokens: int = typer.Option(None, "--global-batch-tokens"),
    k: int = typer.Option(5, "-k", help="how many candidates"),
    metric: str = typer.Option("tokens_per_sec_per_gpu", help="tokens_per_sec_per_gpu | mfu"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """"What worked on N nodes for this model?" — configurations ranked by the throughput model's
    prediction for the target; the evidence (recorded runs) beside it."""
    body = fetch("/recommend", as_json, model_params=model, nodes=nodes, gpus_per_node=gpus_per_node,
                 gpu_type=gpu_type, seq_len=seq_len, global_batch_tokens=global_batch_tokens, k=k, metric=metric)
    if body is None:
        return
    render_recommendation(body)


def render_recommendation(body: dict) -> None:
    """The /recommend answer as an 80-column table: prediction first, evidence beside it."""
    t, m = body["target"], body["model"]
    console.print(f"target: {t['model_size_class']:g}B on {t['nodes']} × {t['gpus_per_node']} {t['gpu_type']}, "
                  f"seq {t['seq_len']}, batch {t['global_batch_tokens']:,} tokens")
    err = m.get("loo_median_rel_err")
    console.print(f"model: {m['status']} on {m['n_runs']} runs of {m['framework']} on {m['gpu_type']}"
                  + (f", held-out error {100 * err:.0f}%" if err is not None else ""))
    for note in body.get("notes", []):
        console.print(f"  note: {note}")
    if not body["candidates"]:
        console.print("no configuration is predicted to fit this target")
        return
    table = Table(show_lines=True)
    for col, kw in (("#", {}), ("config", {"max_width": 22}), ("predicted tok/s/GPU", {"max_width": 16}),
                    ("MFU", {}), ("mem GiB", {}), ("evidence", {"max_width": 24})):
        table.add_column(col, **kw)
    for i, c in enumerate(body["candidates"], 1):
        p = c["predicted"]
        lo, hi = p["interval"]
        pred = f"{p['tokens_per_sec_per_gpu']:,.0f}\n[{lo:,.0f}–{hi:,.0f}]"
        if c.get("measured"):
            pred += f"\nmeasured {c['measured']['tokens_per_sec_per_gpu']:,.0f}"
        ev = []
        for e in c["evidence"][:2]:
            where = f"{e['model_size_class']:g}B×{e['nodes']}n"
            if e["gpu_type"] != t["gpu_type"]:
                where += f" {e['gpu_type']}"
            ev.append(f"#{e['run_id']} {where} d={e['distance']:.2f}")
        table.add_row(str(i), _short(c["config"]), pred, f"{100 * p['mfu']:.1f}%", f"{p['peak_memory_gib']:.0f}",
                      "\n".join(ev) or "–")
    console.print(table)
