#!/usr/bin/env bash
# Install scalebook with its test dependencies into .venv (pinned in pyproject.toml), install what
# the tests need (headless Chromium from Debian's packages), make sure PostgreSQL is up, lint (ruff)
# and type-check (mypy) as configured in pyproject.toml, and run the whole suite: every database
# test runs on DuckDB and on PostgreSQL.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/pip install -q --disable-pip-version-check -e '.[test]'
bash scripts/install_browser.sh
if ! pg_isready -q -h 127.0.0.1 -p 5432; then
  pg_ctlcluster --skip-systemctl-redirect "$(ls /etc/postgresql)" main start || true
  for _ in $(seq 30); do pg_isready -q -h 127.0.0.1 -p 5432 && break; sleep 1; done
fi
.venv/bin/ruff check core service ingest dashboard bench tests migrations
.venv/bin/mypy  # files and options: [tool.mypy] in pyproject.toml (core/, service/, ingest/)
mkdir -p test-output
exec .venv/bin/python -m pytest -n 2 --dist loadfile "$@"
