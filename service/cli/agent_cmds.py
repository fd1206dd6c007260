"""`scalebook agent NAME [--hang-after S] [--max-runs N] -- COMMAND …`: run a sweep's configurations
(ingest/agent.py, standard library only; `python -m ingest.agent` is the same without the CLI)."""

from __future__ import annotations

from typing import Annotated

import typer

from service.cli.base import app, fail


@app.command("agent")
def agent(
    sweep: Annotated[str, typer.Argument(help="the sweep's name (scalebook sweep create)")],
    command: Annotated[list[str] | None, typer.Argument(
        help="after --: the command, with {dp} {tp} {pp} {cp} {ep} {zero_stage} {micro_batch_size} "
             "{grad_accum_steps} {recompute} {nodes} {gpus_per_node} {seq_len} filled per run")] = None,
    hang_after: Annotated[float | None, typer.Option("--hang-after", min=1.0, help="kill a job's process group "
                                                     "after this many seconds without output or heartbeat")] = None,
    max_runs: Annotated[int | None, typer.Option("--max-runs", min=1, help="stop after this many runs")] = None,
    log_dir: Annotated[str, typer.Option("--log-dir", help="captured logs: DIR/SWEEP/RUN_KEY.log")]
    = "scalebook-agent-logs",
    api_wait: Annotated[float, typer.Option("--api-wait", min=0.0, help="seconds to wait out the API being away")]
    = 600.0,
) -> None:
    """Run a sweep: ask for the next configuration (a lease: its run is opened as running), run COMMAND
    with it (env SCALEBOOK_RUN_KEY, SCALEBOOK_SWEEP, SCALEBOOK_CONFIG), capture its log, heartbeat,
    kill it when it hangs (recorded as timeout), and finish the run from what the job pushed or from its
    log; until the sweep is done. Run as many agents, on as many machines, as you like. Ctrl-C stops
    the current job and leaves its lease to expire."""
    from ingest.agent import run_agent

    if not command:
        fail("no command: scalebook agent NAME -- COMMAND ARGS…", code=2)
    raise typer.Exit(run_agent(sweep, list(command), hang_after_s=hang_after, max_runs=max_runs, log_dir=log_dir,
                               api_wait_s=api_wait))
