"""`scalebook heatmap` and `scalebook recommend`: readable tables (service/cli/render.py), or JSON with --json."""

from __future__ import annotations

import typer
from rich.table import Table

from service.cli import render
from service.cli.base import app, console, fetch
from service.cli.render import Col
from service.families import group_cells


def _label(best: dict) -> str:
    parts = [f"DP{best['dp']}", f"TP{best['tp']}", f"PP{best['pp']}"]
    if (best.get("cp") or 1) > 1:
        parts.append(f"CP{best['cp']}")
    if (best.get("ep") or 1) > 1:
        parts.append(f"EP{best['ep']}")
    parts += [f"GAS{best.get('grad_accum_steps') or '?'}",
              f"Z{best['zero_stage'] if best.get('zero_stage') is not None else '?'}",
              f"MBS{best.get('micro_batch_size') or '?'}"]
    return " ".join(parts)


def _mfu(run: dict) -> float | None:
    return run.get("mfu_derived") if run.get("mfu_derived") is not None else run.get("mfu")


@app.command()
def heatmap(
    metric: str = typer.Option("tokens_per_sec_per_gpu", help="rank by tokens_per_sec_per_gpu (default) | mfu"),
    gpu_type: str = typer.Option(None), seq_len: int = typer.Option(None),
    global_batch_tokens: int = typer.Option(None), framework: str = typer.Option(None),
    precision: str = typer.Option(None),
    model: str = typer.Option(None, "--model", help="only this model family or size, e.g. 7-8B, 1.3 or 8B"),
    max_nodes: int = typer.Option(None, "--max-nodes", help="only node counts up to this"),
    exact: bool = typer.Option(False, "--exact-sizes", help="one row per size class instead of per family"),
    as_json: bool = typer.Option(False, "--json", help="print the API's JSON (per size class, unchanged)"),
) -> None:
    """Best config per model-size family × node count (service/families.py: a fixed log grid;
    the best run by tokens/s per GPU, then MFU, then the lower id). One row per cell."""
    body = fetch("/heatmap", as_json, metric=metric, gpu_type=gpu_type, seq_len=seq_len,
                         global_batch_tokens=global_batch_tokens, framework=framework, precision=precision)
    if body is None:
        return
    cells = body["cells"]
    if exact:
        cells = [{**c, "family": render.size(c["model_size_class"]), "sizes": [c["model_size_class"]]}
                 for c in cells if c.get("model_size_class") is not None]
    else:
        cells = group_cells(cells, metric)
    if model:
        wanted = model.replace("-", "–").lower()
        try:
            size = float(model.rstrip("bB"))
        except ValueError:
            size = None
        cells = [c for c in cells if c["family"].lower() == wanted
                 or (size is not None and any(abs(s - size) < 1e-9 for s in c["sizes"]))]
    if max_nodes:
        cells = [c for c in cells if c["nodes"] <= max_nodes]
    if not cells:
        console.print("no runs match: import some (`scalebook import …`) or relax the filters")
        return
    cols = [Col("model"), Col("nodes", "right"), Col("best config"), Col("tok/s/GPU", "right"),
            Col("MFU", "right"), Col("size", drop=3), Col("peak mem", "right", drop=2),
            Col("ok/OOM/fail", "right", drop=1), Col("run", "right", drop=4)]
    rows = []
    for c in cells:
        b = c["best"] or {}
        rows.append([c["family"], str(c["nodes"]), _label(b) if b else "no success",
                     render.number(b.get("tokens_per_sec_per_gpu")) if b else "—", render.pct(_mfu(b)) if b else "—",
                     render.size(b.get("model_size_class")) if b else ", ".join(render.size(s) for s in c["sizes"]),
                     render.number(b.get("peak_memory_gib"), "GiB", 1) if b else "—",
                     f"{c['n_success']}/{c['n_oom']}/{c['n_failed']}", f"#{b['id']}" if b else "—"])
    ranked = "tokens/s per GPU" if metric == "tokens_per_sec_per_gpu" else metric
    render.table(console, cols, rows, title=f"best run per model family × nodes (ranked by {ranked})")


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
            str(i), f"{c['match']}\nd={c['distance']:.2f}", _label(cfg) + (f" RC:{cfg['recompute']}" if cfg.get('recompute') not in (None, 'none') else ""),
            f"{m['tokens_per_sec_per_gpu']:,.0f}" if m.get("tokens_per_sec_per_gpu") is not None else "?",
            f"{100 * m['mfu']:.1f}%" if m.get("mfu") is not None else "?",
            f"{m['peak_memory_gib']:.1f}" if m.get("peak_memory_gib") is not None else "?",
            mem_txt,
            f"{ev['n_runs']} run(s), best #{ev['best_run_id']}"
            + (f"\nrange {spread['min']:,.0f}–{spread['max']:,.0f}" if spread else ""),
            f"{c['why']}\n{c['risk']}")
    console.print(table)
