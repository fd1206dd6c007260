"""The `scalebook` command line (typer). Sub-commands live in modules beside this one, each
registering itself on `app` (or adding a sub-app), so no module grows into a god module."""

from __future__ import annotations

from service.cli import (  # noqa: F401  (register the commands)
    agent_cmds,
    analysis_cmds,
    analytics,
    db,
    imports,
    ingest_cmds,
    live_cmds,
    model_cmds,
    ops,
    predict_cmds,
    runs_cmds,
    server,
    sweep_cmds,
)
from service.cli.base import app, reflow_help

reflow_help(app)


def main() -> None:
    """Console-script entry point."""
    app()
