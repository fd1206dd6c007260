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
    """"What worked on N nodes for this model?" — nearest recorded configs, adapted to the target."""
    body = fetch("/recommend", as_json, model_params=model, nodes=nodes, gpus_per_node=gpus_per_node,
                         gpu_type=gpu_type, seq_len=seq_len, global_batch_tokens=global_batch_tokens, k=k,
                         metric=metric)
    if body is None:
        return
    t = body["target"]
    console.print(f"target: {t['model_size_class']:g}B on {t['nodes']} × {t['gpus_per_node']} GPUs"
                  f"{' ' + t['gpu_type'] if t.get('gpu_type') else ''}"
                  f"{', seq ' + str(t['seq_len']) if t.get('seq_len') else ''}")
    if not body["candidates"]:
        console.print("no recorded configuration can be adapted to this target")
        return
    table = Table(show_lines=True)
    for col in ("#", "match", "config", "tok/s/GPU", "MFU", "peak GiB", "memory check", "evidence", "why / risk"):
        table.add_column(col)
    for i, c in enumerate(body["candidates"], 1):
        cfg = c["config"]
        m = c["metrics"]
        mem = c.get("memory") or {}
        mem_txt = ("fits" if mem.get("fits") else "does not fit" if mem.get("fits") is False else "n/a")
        if mem.get("predicted_peak_memory_gib") is not None:
            mem_txt += f" ({mem['predicted_peak_memory_gib']:.1f} / {mem.get('gpu_memory_gib') or '?'} GiB)"
        ev = c["evidence"]
        spread = ev.get("spread")
        table.add_row(
            str(i), f"{c['match']}\nd={c['distance']:.2f}", _label(cfg),
            f"{m['tokens_per_sec_per_gpu']:,.0f}" if m.get("tokens_per_sec_per_gpu") is not None else "?",
            f"{100 * m['mfu']:.1f}%" if m.get("mfu") is not None else "?",
            f"{m['peak_memory_gib']:.1f}" if m.get("peak_memory_gib") is not None else "?",
            mem_txt,
            f"{ev['n_runs']} run(s), best #{ev['best_run_id']}"
            + (f"\nrange {spread['min']:,.0f}–{spread['max']:,.0f}" if spread else ""),
            f"{c['why']}\n{c['risk']}")
    console.print(table)
