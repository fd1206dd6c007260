"""`scalebook heatmap` and `scalebook recommend`: readable tables (service/cli/render.py), or JSON with --json."""

from __future__ import annotations

import typer
from rich.table import Table

from core.families import group_cells
from core.rules import config_label as _label
from core.rules import effective_mfu as _mfu
from service.cli import render
from service.cli.base import (
    GlobalBatchOpt,
    GpusPerNodeOpt,
    GpuTypeOpt,
    JsonOpt,
    ModelOpt,
    NodesOpt,
    SeqLenOpt,
    app,
    console,
    fetch,
)
from service.cli.render import Col


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
    """Best config per model-size family × node count (core/families.py: a fixed log grid;
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
    model: ModelOpt,
    nodes: NodesOpt,
    gpus_per_node: GpusPerNodeOpt = 8,
    gpu_type: GpuTypeOpt = None,
    seq_len: SeqLenOpt = None,
    global_batch_tokens: GlobalBatchOpt = None,
    k: int = typer.Option(5, "-k", help="how many candidates"),
    metric: str = typer.Option("tokens_per_sec_per_gpu", help="tokens_per_sec_per_gpu | mfu"),
    as_json: JsonOpt = False,
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
    err, slow = m.get("loo_median_rel_err"), m.get("n_not_competitive")
    console.print(f"model: {m['status']} on {m['n_runs']} runs of {m['framework']} on {m['gpu_type']}"
                  + (f", held-out error {100 * err:.0f}%" if err is not None else "")
                  + (f" ({slow} slow configurations not fitted)" if slow else ""))
    for note in body.get("notes", []):
        console.print(f"  note: {note}")
    if not body["candidates"]:
        console.print("no configuration is predicted to fit this target")
        return
    table = Table(show_lines=True)
    for col, max_width in (("#", None), ("config", 22), ("predicted tok/s/GPU", 16),
                           ("MFU", None), ("mem GiB", None), ("evidence", 24)):
        table.add_column(col, max_width=max_width)
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
        table.add_row(str(i), _label(c["config"]), pred, f"{100 * p['mfu']:.1f}%", f"{p['peak_memory_gib']:.0f}",
                      "\n".join(ev) or "–")
    console.print(table)
