#!/usr/bin/env bash
# Benchmark a real `scalebook serve` at N runs on both backends; one JSON line per backend in
# bench/results/<backend>-<N>.json (see bench/RESULTS.md for the figures and the machine).
#   bench/run.sh [N]            # default 1,000,000 (≈ 5–8 minutes per backend on 2 cores)
# PostgreSQL: a fresh database is created on SCALEBOOK_BENCH_PG_URL (default
# postgresql://postgres@127.0.0.1:5432/postgres) and dropped afterwards.
set -euo pipefail
cd "$(dirname "$0")/.."
N="${1:-1000000}"
PG_URL="${SCALEBOOK_BENCH_PG_URL:-postgresql://postgres@127.0.0.1:5432/postgres}"
mkdir -p bench/results
for backend in duckdb postgres; do
  scalebook bench --runs "$N" --backend "$backend" --pg-url "$PG_URL" | tee "bench/results/$backend-$N.json"
done
