"""`scalebook heatmap` and `scalebook recommend`: readable tables (service/cli/render.py), or JSON with --json."""

from __future__ import annotations

import textwrap

import typer
from rich.table import Table

from core.families import group_cells
from core.rules import config_label as _label
from core.rules import effective_mfu as _mfu
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
    console,
    fetch,
    shape_params,
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
    """The cells of one family: a row label ("7-8B", "30–34B MoE (A3B)") or a size ("8B", "1.3",
    "350M"), which means the family it falls in (core.families.family_named), dense and MoE rows
    both — as --model means a size elsewhere."""
    from core.families import MOE_MARK, family_named

    wanted = model.replace("-", "–").lower()
    try:
        fam: str | None = family_named(model).label.lower()
    except ValueError:
        fam = None
    def base(c: dict) -> str:  # the row label without its MoE mark: "30–34B MoE (A3B)" → "30–34b"
        return str(c["family"]).partition(MOE_MARK)[0].lower()

    return [c for c in cells if c["family"].lower() == wanted or base(c) in (wanted, fam)]


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
        cells = [{**c, "family": render.size(c["model_size_class"]) + (" MoE" if c.get("moe") else ""),
                  "sizes": [c["model_size_class"]]}
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
    framework: FrameworkOpt = None,
    precision: PrecisionOpt = None,
    num_layers: NumLayersOpt = None,
    hidden_size: HiddenSizeOpt = None,
    num_heads: NumHeadsOpt = None,
    num_kv_heads: NumKvHeadsOpt = None,
    ffn_hidden_size: FfnHiddenSizeOpt = None,
    vocab_size: VocabSizeOpt = None,
    gated: GatedOpt = None,
    k: int = typer.Option(5, "-k", help="how many runs measured on the target, and how many predictions"),
    metric: str = typer.Option("tokens_per_sec_per_gpu", help="tokens_per_sec_per_gpu | mfu"),
    as_json: JsonOpt = False,
) -> None:
    """"What worked on N nodes for this model?" — first the runs measured on the target (the
    heatmap's cell: every framework and precision), then predictions for the layouts not run there,
    ranked by the throughput model for the target, with the evidence they rest on."""
    body = fetch("/recommend", as_json, model_params=model, nodes=nodes, gpus_per_node=gpus_per_node,
                 gpu_type=gpu_type, seq_len=seq_len, global_batch_tokens=global_batch_tokens, k=k, metric=metric,
                 **shape_params(framework, precision, num_layers, hidden_size, num_heads, num_kv_heads,
                                ffn_hidden_size, vocab_size, gated))
    if body is None:
        return
    render_recommendation(body)


def target_line(t: dict) -> str:
    """'8.86B on 8 × 8 H100-SXM-80GB, seq 4,096, batch 1,048,576 tokens, nanotron, bf16'."""
    size = render.size(t.get("model_size_class"))
    if t.get("model_params"):
        n = t["model_params"] / 1e9
        size = f"{n:.3g}B" if n >= 1 else f"{n * 1000:.3g}M"
    batch = f", batch {t['global_batch_tokens']:,} tokens" if t.get("global_batch_tokens") else ""
    return (f"{size} on {t['nodes']} × {t['gpus_per_node']} {t['gpu_type']}, seq {t['seq_len']:,}{batch}"
            + "".join(f", {t[f]}" for f in ("framework", "precision") if t.get(f)))


def _wrap_label(cfg: dict) -> str:
    """'DP32 TP2 PP1\nGAS8 Z1 MBS4' — the config label on two lines (the parallel degrees, then the batch)."""
    label = _label(cfg)
    cut = label.find(" GAS")
    return label if cut < 0 else label[:cut] + "\n" + label[cut + 1:]


def render_measured(body: dict) -> None:
    """The runs measured on the target, best first, each labelled (exact size · framework · precision)."""
    cell, runs = body.get("cell") or {}, body.get("measured_on_target") or []
    if not cell:
        console.print("[bold]measured on this target:[/] nothing")
        return
    console.print(f"[bold]measured on this target[/] ({cell['size']}): {cell['n_configurations']} configuration(s) "
                  f"ran, {cell['n_oom']} OOM and {cell['n_failed']} other failed run(s)")
    if not runs:
        other = cell.get("success_at_other_seq_len") or {}
        console.print("  none at this sequence length" + (
            " (successful runs at seq " + ", ".join(f"{k}: {v}" for k, v in other.items()) + "; pass --seq-len)"
            if other else ""))
        return
    cols = [Col("run", "right"), Col("model"), Col("config"), Col("tok/s/GPU", "right"), Col("MFU", "right", drop=2),
            Col("memory model", drop=1)]
    rows, disagree, undecided = [], False, False
    for r in runs:
        mem = r.get("memory") or {}
        verdict = "not checked"
        if mem:
            disagree = disagree or bool(mem.get("disagrees"))
            verdict = (f"{'no' if mem.get('disagrees') else 'fits'} "
                       f"{mem['predicted_peak_memory_gib']:.0f} GiB{'!' if mem.get('disagrees') else ''}")
            if mem.get("fits_with"):
                undecided = True
                short = mem["fits_with"].replace("ZeRO-", "Z").replace(" recompute", "").replace("selective", "sel")
                verdict = f"fits w/ {short}?"
        size_precision = r["label"].split(" · ")[0] + " · " + (r.get("precision") or "precision?")
        model = size_precision + "\n" + textwrap.fill(r.get("framework") or "framework?", 16)
        rows.append([f"#{r['run_id']}", model, _wrap_label(r["config"]), render.number(r.get("tokens_per_sec_per_gpu")),
                     render.pct(r.get("mfu")), verdict])
    render.table(console, cols, rows)
    if disagree:
        console.print("  !: the memory model says it does not fit, yet it ran: the record wins (see the notes)")
    if undecided:
        console.print("  ?: fits only with a ZeRO stage (Z1) or recompute (sel, full) the run does not record "
                      "(see the notes)")
    shown = len(runs)
    if cell.get("n_configurations", 0) > shown:
        console.print(f"  ({cell['n_configurations'] - shown} more: -k, or `scalebook heatmap` and the dashboard's "
                      "cell drill-down)")


def render_recommendation(body: dict) -> None:
    """The /recommend answer at 80 columns: what was measured on the target, then the predictions
    for the layouts not run there (prediction first, evidence beside it), then the notes."""
    t, m = body["target"], body["model"]
    console.print(f"target: {target_line(t)}")
    render_measured(body)
    err, slow = m.get("loo_median_rel_err"), m.get("n_not_competitive")
    console.print("[bold]predicted for layouts not run here[/] — model: "
                  f"{m['status']} on {m['n_runs']} runs of {m['framework']} on {m['gpu_type']}"
                  + (f", held-out error {100 * err:.0f}%" if err is not None else "")
                  + (f" ({slow} slow configurations not fitted)" if slow else ""))
    if not body["candidates"]:
        console.print("  no layout not run here is predicted to fit this target")
    else:
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
        for line in render.extrapolation_lines(body["candidates"]):
            console.print(line)
    for note in body.get("notes", []):
        console.print(f"  note: {note}")

