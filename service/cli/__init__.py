"""The `scalebook` command line (typer). Sub-commands live in modules beside this one, each
registering itself on `app` (or adding a sub-app), so no module grows into a god module."""

from __future__ import annotations

from service.cli.base import app
from service.cli import analysis_cmds, analytics, db, imports, ingest_cmds, ops, runs_cmds, server  # noqa: F401  (register)


def main() -> None:
    """Console-script entry point."""
    app()
