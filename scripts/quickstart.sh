#!/usr/bin/env bash
# Quick start: install scalebook into .venv and run the main job — the API on 127.0.0.1:8000
# (embedded DuckDB at ~/.local/share/scalebook/scalebook.duckdb unless SCALEBOOK_DATABASE_URL is
# set), the real example data in examples/data imported through it, and the dashboard on :8501.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e .
exec .venv/bin/scalebook up "$@"
