"""`scalebook run ID`: one run — what ran, its status (a live run: running or lost, last heartbeat), its
results — and its step series as sparklines fitted to the terminal (80 columns piped). `scalebook runs
--status running|lost` lists the open runs (runs_cmds.py)."""

from __future__ import annotations

from typing import Any

import typer

from core.rules import config_label, effective_mfu
from service.cli import render
from service.cli.base import app, call, console, print_json

#: the series drawn, with their labels and units
SERIES = (("tokens_per_sec_per_gpu", "tok/s/GPU", ""), ("step_time_s", "step time", "s"), ("loss", "loss", ""),
          ("peak_memory_gib", "peak mem", "GiB"))
_LABEL = 10


def spark_lines(steps: list[dict[str, Any]], width: int) -> list[str]:
    """One line per series the steps carry: "label ▁▂▅█… min–max", at most `width` characters."""
    out = []
    for field, label, unit in SERIES:
        values = [s.get(field) for s in steps]
        known = [v for v in values if v is not None]
        if not known:
            continue
        scale = f" {render.number(min(known), unit)}–{render.number(max(known), unit)}"
        room = max(1, width - _LABEL - 1 - len(scale))
        out.append(f"{label:<{_LABEL}} {render.sparkline(values, room)}{scale}")
    return out


@app.command("run")
def run_show(
    run_id: int = typer.Argument(..., help="the run's id (scalebook runs shows them)"),
    as_json: bool = typer.Option(False, "--json", help="print the run and its steps as the API's JSON"),
) -> None:
    """One run: model, layout, status (a live run: running or lost, and its last heartbeat), results,
    and — for a run that sent steps — its series as sparklines (tokens/s/GPU, step time, loss, peak
    memory; min–max beside each), the warm-up rule, jitter and straggler steps."""
    run = call("GET", f"/runs/{run_id}")
    steps_body = call("GET", f"/runs/{run_id}/steps")
    if as_json:
        print_json({"run": run, "steps": steps_body})
        return
    status = run.get("status")
    console.print(f"#{run['id']} {run.get('name') or run.get('model_name') or run.get('run_key')}")
    console.print(f"  {run.get('model_name') or '—'} ({render.size(run.get('model_size_class'))}), "
                  f"{render.number(run.get('nodes'))} node(s) × {render.number(run.get('gpus_per_node'))} "
                  f"{run.get('gpu_type') or 'GPU'}, {config_label(run)}")
    line = f"  status {status}"
    if run.get("last_heartbeat_at"):
        line += f", last heard from {str(run['last_heartbeat_at'])[:19].replace('T', ' ')} UTC"
    if run.get("error_class"):
        line += f", {run['error_class']}"
    console.print(line)
    console.print(f"  {render.number(run.get('tokens_per_sec_per_gpu'), 'tok/s/GPU')}, "
                  f"MFU {render.pct(effective_mfu(run))}, step {render.number(run.get('step_time_s'), 's')}, "
                  f"peak {render.number(run.get('peak_memory_gib'), 'GiB', 1)}")
    derived = [f for f in (run.get("extra") or {}).get("derived_fields") or []
               if f in ("tokens_per_sec_per_gpu", "step_time_s", "tflops_per_gpu", "peak_memory_gib")]
    if derived:
        console.print(f"  derived from the steady-state steps: {', '.join(derived)}")
    steps = steps_body.get("steps") or []
    if not steps:
        if status in ("running", "lost"):
            console.print("  no steps received yet")
        return
    summary = steps_body["summary"]
    console.print(f"  {summary['steps']} steps ({summary['warmup_steps']} warm-up), "
                  f"jitter {render.pct(summary.get('jitter_step_time'))}, stragglers: "
                  f"{', '.join(map(str, summary['stragglers'])) or 'none'}")
    for text in spark_lines(steps, console.width):
        console.print(text, highlight=False, soft_wrap=True)
