"""`scalebook predict`: what one configuration will do on its target (POST /api/v1/predict), at 80
columns, or the API's JSON with --json."""

from __future__ import annotations

from typing import Any

import typer

from core.rules import config_label
from service.cli import render
from service.cli.analytics import target_line
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
    console,
    print_json,
    shape_params,
)
from service.cli.render import Col

#: the step-time terms, in the order the bar shows them, and their names there
TERMS = (("compute", "compute"), ("pipeline_bubble", "pipeline bubble"), ("tp_comm", "TP communication"),
         ("dp_comm", "DP/ZeRO communication"), ("other", "other (PP, CP)"))
BAR_WIDTH = 36


def step_bars(breakdown: dict[str, float], width: int = BAR_WIDTH) -> list[str]:
    """One line per step-time term: name, seconds, share, a bar of █ proportional to its share of
    the step (at least one █ for a term above 0.5 % of it)."""
    total = sum(max(0.0, v) for v in breakdown.values()) or 1.0
    lines = []
    for key, name in TERMS:
        v = max(0.0, breakdown.get(key, 0.0))
        n = round(width * v / total)
        bar = "█" * (n if n or v / total < 0.005 else 1)
        lines.append(f"  {name:<22}{render.number(v, 's'):>9} {100 * v / total:4.0f}% {bar}")
    return lines


@app.command()
def predict(
    model: ModelOpt,
    nodes: NodesOpt,
    dp: int = typer.Option(None, "--dp", min=1, help="default: the world size over tp·pp·cp"),
    tp: int = typer.Option(None, "--tp", min=1, help="default 1"),
    pp: int = typer.Option(None, "--pp", min=1, help="default 1"),
    cp: int = typer.Option(None, "--cp", min=1, help="default 1"),
    ep: int = typer.Option(None, "--ep", min=1, help="default 1"),
    zero_stage: int = typer.Option(None, "--zero-stage", min=0, max=3, help="default 0"),
    micro_batch_size: int = typer.Option(None, "--micro-batch-size", "--mbs", min=1, help="default 1"),
    grad_accum_steps: int = typer.Option(None, "--grad-accum-steps", "--gas", min=1,
                                         help="micro-batches per step (or --global-batch-tokens)"),
    global_batch_tokens: GlobalBatchOpt = None,
    recompute: str = typer.Option(None, "--recompute", help="none | selective | full (default none)"),
    gpus_per_node: GpusPerNodeOpt = 8,
    gpu_type: GpuTypeOpt = None,
    seq_len: SeqLenOpt = None,
    framework: FrameworkOpt = None,
    precision: PrecisionOpt = None,
    num_layers: NumLayersOpt = None,
    hidden_size: HiddenSizeOpt = None,
    num_heads: NumHeadsOpt = None,
    num_kv_heads: NumKvHeadsOpt = None,
    ffn_hidden_size: FfnHiddenSizeOpt = None,
    vocab_size: VocabSizeOpt = None,
    gated: GatedOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """What one configuration will do: predicted tokens/s per GPU with its interval, MFU, step time
    and its breakdown, peak memory and whether it fits, the recorded runs it rests on, and the
    measurement when this very configuration ran on the target."""
    body: dict[str, Any] = {"model_params": model, "nodes": nodes, "gpus_per_node": gpus_per_node, "dp": dp, "tp": tp,
                            "pp": pp, "cp": cp, "ep": ep, "zero_stage": zero_stage,
                            "micro_batch_size": micro_batch_size, "grad_accum_steps": grad_accum_steps,
                            "global_batch_tokens": global_batch_tokens, "recompute": recompute, "gpu_type": gpu_type,
                            "seq_len": seq_len, **shape_params(framework, precision, num_layers, hidden_size,
                                                               num_heads, num_kv_heads, ffn_hidden_size, vocab_size,
                                                               gated)}
    answer = call("POST", "/predict", json={k: v for k, v in body.items() if v is not None})
    if as_json:
        print_json(answer)
        return
    render_prediction(answer)


def render_prediction(a: dict[str, Any]) -> None:
    """The /predict answer at 80 columns: target, config, prediction, measurement, memory, the
    step-time bar, the model, the evidence, the notes."""
    p, mem, m = a["predicted"], a["memory"], a["model"]
    lo, hi = p["interval"]
    console.print(f"target: {target_line(a['target'])}")
    console.print(f"config: [bold]{config_label(a['config'])}[/]")
    console.print(f"predicted: [bold]{p['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU[/] [{lo:,.0f}–{hi:,.0f}], "
                  f"MFU {render.pct(p['mfu'])}, step {render.number(p['step_time_s'], 's')}")
    measured = a.get("measured")
    if measured:
        off = measured["tokens_per_sec_per_gpu"] / p["tokens_per_sec_per_gpu"] - 1
        console.print(f"measured on this target: [bold]{measured['tokens_per_sec_per_gpu']:,.0f} tok/s/GPU[/] (run "
                      f"#{measured['run_id']}, {measured['n_runs']} run(s), {measured.get('framework')}, "
                      f"{measured.get('precision')}): {100 * off:+.0f}% vs the prediction")
    else:
        console.print("measured on this target: not run")
    verdict = {True: "fits", False: "does not fit", None: "not decided (GPU memory unknown)"}[a["fits"]]
    usable = mem.get("usable_memory_gib")
    console.print(f"memory: {mem['predicted_peak_memory_gib']:.1f} GiB per GPU"
                  + (f" of {usable:.1f} usable" if usable else "") + f" — [bold]{verdict}[/]"
                  + (f" (p = {mem['p_fits']:.2f})" if a["fits"] is not None and not measured else "")
                  + (f"; recorded OOM #{mem['recorded_oom_run_id']}" if mem.get("recorded_oom_run_id") else ""))
    console.print(f"step time {render.number(p['step_time_s'], 's')}:")
    for line in step_bars(p["breakdown_s"]):
        console.print(line, highlight=False)
    err = m.get("loo_median_rel_err")
    console.print(f"model: {m['status']} on {m['n_runs']} runs of {m['framework']} on {m['gpu_type']}"
                  + (f", held-out error {100 * err:.0f}%" if err is not None else "")
                  + ("; extrapolates: " + "; ".join(m["extrapolation"]) if m.get("extrapolates")
                     else "; interpolates between recorded runs"))
    if a["evidence"]:
        cols = [Col("run", "right"), Col("model", drop=3), Col("nodes", "right"), Col("GPU", drop=2),
                Col("framework", drop=4), Col("config"), Col("tok/s/GPU", "right"), Col("d", "right", drop=1)]
        rows = [[f"#{e['run_id']}", render.size(e["model_size_class"]), str(e["nodes"]), e["gpu_type"] or "—",
                 e["framework"] or "—", config_label(e["config"]), render.number(e["measured_tokens_per_sec_per_gpu"]),
                 f"{e['distance']:.2f}"] for e in a["evidence"]]
        render.table(console, cols, rows, title="evidence: the recorded runs of this layout nearest the target")
    else:
        console.print("evidence: no recorded run of this layout")
    for note in a.get("notes") or []:
        console.print(f"  note: {note}")
