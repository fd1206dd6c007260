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


def pick_slice(gpu_type: str | None, seq_len: int | None, params: dict) -> tuple[str | None, int | None, str]:
    """The comparable slice the heatmap shows when the user named at most one of GPU type and
    sequence length: the most-recorded (GET /heatmap/slices, core.rules.slice_key most="runs") among
    those matching what was named. Returns (gpu_type, seq_len, a line saying which and how to widen)."""
    body = fetch("/heatmap/slices", False, gpu_type=gpu_type, seq_len=seq_len, **params)
    assert body is not None
    found = body["slices"]
    if not found:
        return gpu_type, seq_len, ""
    top = found[0]
    return top["gpu_type"], top["seq_len"], (
        f"slice: {top['gpu_type']}, sequence length {top['seq_len']:,} ({top['runs']:,} runs, the most-recorded of "
        f"{len(found)} GPU type × sequence length slices), so every cell compares like with like; "
        "--all-slices mixes them, --gpu-type / --seq-len choose")


def family_filter(cells: list[dict], model: str) -> list[dict]:
    """The cells of one family: a family label ("7-8B", "7–8B") or a size ("8B", "1.3", "350M"), which
    means the family it falls in (core.families.family_of) — as --model means a size elsewhere."""
    from core.families import family_of
    from core.record import parse_param_count

    wanted = model.replace("-", "–").lower()
    try:
        fam = family_of(parse_param_count(model) / 1e9).label.lower()
    except ValueError:
        fam = None
    return [c for c in cells if c["family"].lower() == wanted
            or (fam is not None and (c["family"].lower() == fam or c["family"].lower().startswith(f"moe {fam} ")))]


@app.command()
def heatmap(
    metric: str = typer.Option("tokens_per_sec_per_gpu", help="rank by tokens_per_sec_per_gpu (default) | mfu"),
    gpu_type: str | None = typer.Option(None, help="one GPU type (default: the most-recorded slice's)"),
    seq_len: int | None = typer.Option(None, help="one sequence length (default: the most-recorded slice's)"),
    all_slices: bool = typer.Option(False, "--all-slices", help="every GPU type and sequence length, mixed"),
    global_batch_tokens: int = typer.Option(None), framework: str = typer.Option(None),
    precision: str = typer.Option(None),
    model: str = typer.Option(None, "--model", help="one family, by label or size: 7-8B, 8B, 1.3B, 350M"),
    max_nodes: int = typer.Option(None, "--max-nodes", help="only node counts up to this"),
    exact: bool = typer.Option(False, "--exact-sizes", help="one row per size class instead of per family"),
    as_json: bool = typer.Option(False, "--json", help="print the API's JSON (per size class, unchanged)"),
) -> None:
    """Best config per model-size family × node count (core/families.py: a fixed log grid;
    the best run by tokens/s per GPU, then MFU, then the lower id). One row per cell.

    Like the dashboard, it shows one comparable slice — one GPU type and one sequence length, the
    most-recorded unless --gpu-type / --seq-len say — and names it; --all-slices mixes them (then
    the table has GPU and sequence-length columns)."""
    params = {"global_batch_tokens": global_batch_tokens, "framework": framework, "precision": precision}
    said = ""
    if not all_slices and not (gpu_type and seq_len):
        gpu_type, seq_len, said = pick_slice(gpu_type, seq_len, params)
    body = fetch("/heatmap", as_json, metric=metric, gpu_type=gpu_type, seq_len=seq_len, **params)
    if body is None:
        return
    cells = body["cells"]
    if exact:
        cells = [{**c, "family": render.size(c["model_size_class"]), "sizes": [c["model_size_class"]]}
                 for c in cells if c.get("model_size_class") is not None]
    else:
        cells = group_cells(cells, metric)
    if model:
        cells = family_filter(cells, model)
    if max_nodes:
        cells = [c for c in cells if c["nodes"] <= max_nodes]
    if said:
        console.print(said)
    elif all_slices:
        console.print("every GPU type and sequence length mixed: a cell's best run may be on other hardware or "
                      "sequences than its neighbours' (GPU and seq columns)")
    if not cells:
        console.print("no runs match: import some (`scalebook import …`) or relax the filters")
        return
    cols = [Col("model"), Col("nodes", "right"), Col("best config"), Col("tok/s/GPU", "right"),
            Col("MFU", "right"), Col("size", drop=3), Col("peak mem", "right", drop=2),
            Col("ok/OOM/fail", "right", drop=1), Col("run", "right", drop=4)]
    if all_slices:
        cols[5:5] = [Col("GPU", drop=5), Col("seq", "right", drop=6)]
    rows = []
    for c in cells:
        b = c["best"] or {}
        row = [c["family"], str(c["nodes"]), _label(b) if b else "no success",
               render.number(b.get("tokens_per_sec_per_gpu")) if b else "—", render.pct(_mfu(b)) if b else "—",
               render.size(b.get("model_size_class")) if b else ", ".join(render.size(s) for s in c["sizes"]),
               render.number(b.get("peak_memory_gib"), "GiB", 1) if b else "—",
               f"{c['n_success']}/{c['n_oom']}/{c['n_failed']}", f"#{b['id']}" if b else "—"]
        if all_slices:
            row[5:5] = [b.get("gpu_type") or "—", render.number(b.get("seq_len"))]
        rows.append(row)
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
