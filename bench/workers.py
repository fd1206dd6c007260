"""Throughput of `scalebook serve --workers N` on PostgreSQL (issue 30 item 14).

    PYTHONPATH=$PWD .venv/bin/python bench/workers.py [--runs 20000] [--workers 1 2 4] [--clients 8]

One fresh PostgreSQL database holds ``--runs`` synthetic runs (bench/benchtool.py's generator,
ingested through the API). For each worker count a real ``scalebook serve --workers N
--no-access-log`` serves it on a free loopback port, and ``--clients`` client PROCESSES (not
threads of this one), each with its own keep-alive httpx connection, send for ``--seconds``:

- single POSTs: one new run per request (``Prefer: return=minimal``, as the push client sends);
- heatmap: ``GET /api/v1/heatmap`` (the landing page's call; computed per request, nothing cached).

Printed per worker count: requests/s over the wall time, and the median and p99 latency; plus
one keep-alive client alone (sequential POSTs: the latency the ~40 ms stall of uvicorn#3149 would
show). ``--stock-uvicorn`` adds uvicorn's own ``--workers`` supervisor (``python -m uvicorn
service.api.app:create_app --factory --workers 2``) for that one-client figure: the stall this
project's listener avoids. Figures with the commit and the machine; they go to bench/RESULTS.md.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

from bench import benchtool

REPO = Path(__file__).resolve().parent.parent
POST_HEADERS = {"Content-Type": "application/json", "Prefer": "return=minimal"}


def _start(url: str, workers: int, log: Path, stock: bool = False) -> tuple[subprocess.Popen, str]:
    port = benchtool._free_port()
    env = {k: v for k, v in os.environ.items() if k != "SCALEBOOK_TOKEN"}
    env["SCALEBOOK_DATABASE_URL"] = url
    if stock:
        cmd = [sys.executable, "-m", "uvicorn", "service.api.app:create_app", "--factory", "--port", str(port),
               "--workers", str(workers), "--no-access-log", "--log-level", "warning"]
    else:
        cmd = [sys.executable, "-m", "service.cli", "serve", "--port", str(port), "--workers", str(workers),
               "--no-access-log", "--log-level", "warning"]
    fh = open(log, "wb")  # noqa: SIM115 - the server writes to it until it stops
    proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT, cwd=REPO)
    base = f"http://127.0.0.1:{port}"
    from service.cli.server import wait_for_api

    wait_for_api(base, 120, proc=proc)
    time.sleep(2.0 * workers)  # every worker up (each opens its pool at start-up)
    return proc, base


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _client(base: str, kind: str, seconds: float, tag: str) -> list[float]:
    """One client process: requests of ``kind`` back to back for ``seconds``; latencies in ms."""
    template = {"model_name": "bench-workers", "model_params": 8_030_261_248, "nodes": 2, "gpus_per_node": 8,
                "gpu_type": "H100-SXM-80GB", "seq_len": 4096, "dp": 16, "tp": 1, "pp": 1, "zero_stage": 1,
                "micro_batch_size": 1, "grad_accum_steps": 8, "precision": "bf16", "status": "success",
                "tokens_per_sec_per_gpu": 9000.0, "source": "bench"}
    out: list[float] = []
    with httpx.Client(base_url=base, timeout=60) as client:
        client.get("/api/v1/health")  # connect before the clock starts
        end = time.perf_counter() + seconds
        i = 0
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            if kind == "post":
                body = json.dumps({**template, "run_key": f"{tag}-{os.getpid()}-{i}"})
                r = client.post("/api/v1/runs", content=body, headers=POST_HEADERS)
            else:
                r = client.get("/api/v1/heatmap")
            if r.status_code >= 300:
                raise RuntimeError(f"{kind}: HTTP {r.status_code} {r.text[:300]}")
            out.append(1000 * (time.perf_counter() - t0))
            i += 1
    return out


def measure(base: str, kind: str, clients: int, seconds: float, tag: str) -> dict[str, float]:
    """``clients`` processes for ``seconds``: requests/s, median and p99 latency (ms)."""
    with concurrent.futures.ProcessPoolExecutor(clients) as pool:
        t0 = time.perf_counter()
        futures = [pool.submit(_client, base, kind, seconds, f"{tag}{c}") for c in range(clients)]
        lat = [x for f in futures for x in f.result()]
        wall = time.perf_counter() - t0
    lat.sort()
    return {"req_per_s": len(lat) / wall, "p50_ms": statistics.median(lat),
            "p99_ms": lat[min(len(lat) - 1, int(0.99 * len(lat)))], "requests": len(lat)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=20_000)
    ap.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--stock-uvicorn", action="store_true")
    ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    args = ap.parse_args()

    work = Path(tempfile.mkdtemp(prefix="sb-workers-"))
    url, drop = benchtool._create_database("postgres", args.pg_url, work)
    print(f"commit {benchtool.commit()}; {benchtool.machine()}; load average "
          f"{' '.join(f'{x:.1f}' for x in os.getloadavg())}", flush=True)
    try:
        proc, base = _start(url, 1, work / "load.log")
        try:
            payloads = [json.dumps({"runs": chunk}).encode() for chunk in _chunks(
                list(benchtool.generate_runs(args.runs, seed=7)), 1000)]
            created, wall = benchtool.ingest_batches(base, payloads)
            print(f"loaded {created:,} runs in {wall:.1f} s", flush=True)
        finally:
            _stop(proc)
        rows = []
        variants: list[tuple[str, int, bool]] = [(f"serve --workers {w}", w, False) for w in args.workers]
        if args.stock_uvicorn:
            variants.append(("stock uvicorn --workers 2", 2, True))
        for label, w, stock in variants:
            proc, base = _start(url, w, work / f"serve-{w}-{stock}.log", stock=stock)
            try:
                one = measure(base, "post", 1, args.seconds / 2, f"one{w}{stock}")
                row: dict[str, Any] = {"server": label, "one_client_post_p50_ms": one["p50_ms"]}
                if not stock:
                    post = measure(base, "post", args.clients, args.seconds, f"p{w}")
                    heat = measure(base, "heatmap", args.clients, args.seconds, f"h{w}")
                    row.update(post_req_s=post["req_per_s"], post_p50_ms=post["p50_ms"], post_p99_ms=post["p99_ms"],
                               heatmap_req_s=heat["req_per_s"], heatmap_p50_ms=heat["p50_ms"],
                               heatmap_p99_ms=heat["p99_ms"])
            finally:
                _stop(proc)
            rows.append(row)
            print(json.dumps({k: (round(v, 1) if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
        print(f"\n| server ({args.clients} client processes, {args.seconds:g} s each) | single POST req/s "
              "| p50 / p99 ms | heatmap req/s | p50 / p99 ms | one client, POST p50 ms |")
        print("|---|---:|---:|---:|---:|---:|")
        for r in rows:
            if "post_req_s" in r:
                print(f"| {r['server']} | {r['post_req_s']:,.0f} | {r['post_p50_ms']:.1f} / {r['post_p99_ms']:.1f} | "
                      f"{r['heatmap_req_s']:,.1f} | {r['heatmap_p50_ms']:.0f} / {r['heatmap_p99_ms']:.0f} | "
                      f"{r['one_client_post_p50_ms']:.1f} |")
            else:
                print(f"| {r['server']} | – | – | – | – | {r['one_client_post_p50_ms']:.1f} |")
    finally:
        drop()


def _chunks(items: list[Any], n: int) -> list[list[Any]]:
    return [items[i:i + n] for i in range(0, len(items), n)]


if __name__ == "__main__":
    main()
