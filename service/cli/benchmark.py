"""`scalebook bench`: realistic synthetic runs, ingested through a real `scalebook serve`, timed.
(The generator also feeds the migration and fuzz tests and the bench/ scripts; nothing here imports bench/.)

Generator. Templates are the real published rows in examples/data (nanotron sweep + published
tables), parsed by the ingest parsers and kept when the server's validation accepts them. Each
synthetic run copies a template (model size and dims, hardware, framework, parallel config, seq
len) and varies it the way sweeps do: node count scaled by 2^k (k in -2..3, DP re-derived from the
world size), throughput jittered (log-normal, σ≈8 %) with a mild weak-scaling loss, peak memory
jittered, and a status drawn from the data's mix (≈82 % success, 10 % OOM, 8 % NCCL errors,
timeouts and other failures, with real error lines from failures/error_lines.csv). Runs are
deterministic for a seed.

Driver (`run_bench`). A fresh database (a DuckDB file in a temp dir, or a new PostgreSQL
database), a `scalebook serve` subprocess on a free loopback port, then, all timed client-side:
- batched ingest: N − S runs in POSTs of 1,000 (two connections), runs/s over the wall time;
- single POSTs: S = min(500, N/2) one-run POSTs, latency p50/p99 in ms;
  both sent as the push client sends them (`Prefer: return=minimal`: the answer carries the ids,
  not the runs echoed back);
- heatmap, recommend ("what worked on 8 nodes for 8B?") and suggest: median of 20 calls, ms; also the
  first call of each after the server started (`*_first_ms`);
- then, after `stored_runs` is read, each query again right after a one-run POST, 10 times
  (`*_after_post_ms`, median). Every call reads `runs` afresh: nothing is kept between requests.
The result is one JSON-able dict with those figures (see `run_bench`).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import csv
import json
import math
import os
import platform
import random
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

BATCH = 1000
REPO_ROOT = Path(__file__).resolve().parents[2]

#: status mix of synthetic runs whose template succeeded (the published data: 84 % success,
#: 10 % OOM, 6 % other failures; NCCL errors and timeouts split out of "other").
STATUS_MIX = (("success", 0.82), ("oom", 0.10), ("nccl_error", 0.035), ("timeout", 0.015), ("failed", 0.03))
ERROR_CLASSES = {
    "oom": ("oom_gpu", "oom_gpu", "oom_gpu", "oom_gpu_nccl_buffer"),
    "nccl_error": ("nccl_network_error", "nccl_remote_error", "nccl_system_error", "nccl_unhandled_cuda_error",
                   "nccl_invalid_usage_or_internal"),
    "timeout": ("collective_timeout", "collective_timeout", "scheduler_time_limit"),
    "failed": ("child_process_failed", "cuda_illegal_memory_access", "gpu_hardware_fault", "rendezvous_failure",
               "scheduler_cancelled", "unknown"),
}
_REPORTED_KEEP = (
    "name", "model_name", "model_params", "num_layers", "hidden_size", "num_heads", "num_kv_heads",
    "ffn_hidden_size", "vocab_size", "seq_len", "gpu_type", "gpus_per_node", "tp", "pp", "cp", "ep", "zero_stage",
    "micro_batch_size", "grad_accum_steps", "recompute", "precision", "framework", "framework_version",
)
_VERSIONS = {"torch_version": ("2.4.1", "2.5.1", "2.6.0", "2.7.1"), "cuda_version": ("12.4", "12.6", "12.8"),
             "nccl_version": ("2.21.5", "2.23.4", "2.26.2")}


class BenchError(Exception):
    """The benchmark could not run (server did not start, database unreachable, ingest refused)."""


def example_data_dir() -> Path:
    """examples/data (service.cli.server.example_data_dir); BenchError when it is not there."""
    from service.cli.server import example_data_dir as examples

    try:
        return examples()
    except FileNotFoundError as exc:
        raise BenchError(str(exc)) from None


# -- generator -------------------------------------------------------------------------------

def load_templates(data_dir: Path | None = None) -> list[dict[str, Any]]:
    """Parsed example rows the server accepts, with `_mfu` (the derived MFU, or None) attached."""
    from ingest.parsers import nanotron, table
    from service.errors import ValidationFailed
    from service.store import validate_records

    data_dir = data_dir or example_data_dir()
    records: list[dict[str, Any]] = []
    for path in sorted((data_dir / "nanotron").glob("*.csv")):
        records += nanotron.parse_file(path, gpu_type=nanotron.PLAYBOOK_GPU_TYPE).records
    for path in sorted((data_dir / "published").glob("*.csv")):
        records += table.parse_file(path).records
    templates = []
    for rec in records:
        if not (rec.get("nodes") and rec.get("gpus_per_node")):
            continue
        try:
            row = validate_records([rec])[0]
        except ValidationFailed:
            continue
        t = {k: rec.get(k) for k in _REPORTED_KEEP}
        t.update(tp=row["tp"], pp=row["pp"], cp=row["cp"], ep=row["ep"], nodes=row["nodes"], status=rec["status"],
                 tokens_per_sec_per_gpu=rec.get("tokens_per_sec_per_gpu"), tflops_per_gpu=rec.get("tflops_per_gpu"),
                 mfu=rec.get("mfu"), hfu=rec.get("hfu"), peak_memory_gib=rec.get("peak_memory_gib"),
                 step_time_s=rec.get("step_time_s"), _mfu=row.get("mfu_derived"))
        templates.append(t)
    if not templates:
        raise BenchError(f"no usable template rows in {data_dir}")
    return templates


def _error_lines(data_dir: Path) -> dict[str, list[str]]:
    lines: dict[str, list[str]] = {}
    path = data_dir / "failures" / "error_lines.csv"
    if path.is_file():
        with open(path, newline="") as fh:
            for row in csv.DictReader(fh):
                lines.setdefault(row.get("failure_class") or "unknown", []).append(row.get("error_line") or "")
    return lines


def generate_runs(n: int, seed: int = 0, *, prefix: str | None = None,
                  templates: list[dict[str, Any]] | None = None) -> Iterator[dict[str, Any]]:
    """Yield `n` valid run records with unique run keys `<prefix>-<i>` (default prefix from seed)."""
    rng = random.Random(seed)
    data_dir = example_data_dir()
    templates = templates or load_templates(data_dir)
    errors = _error_lines(data_dir)
    prefix = prefix or f"bench{seed}"
    statuses = [s for s, _ in STATUS_MIX]
    weights = [w for _, w in STATUS_MIX]
    epoch = datetime(2024, 1, 1)
    span_s = int(timedelta(days=900).total_seconds())
    for i in range(n):
        t = templates[rng.randrange(len(templates))]
        run = {k: t[k] for k in _REPORTED_KEEP if t[k] is not None}
        tp, pp, cp, ep, gpn = t["tp"], t["pp"], t["cp"], t["ep"], t["gpus_per_node"]
        nodes = t["nodes"]
        k = rng.choice((-2, -1, 0, 0, 0, 1, 2, 3))
        cand = max(1, int(nodes * 2.0 ** k))
        world = cand * gpn
        # rescaled only when the layout is known (an unknown degree is NULL: nothing to check against)
        if tp and pp and cp:
            mp = tp * pp * cp
            if world % mp == 0 and (ep is None or ((world // mp) * cp) % ep == 0):
                nodes = cand
        run.update(run_key=f"{prefix}-{i}", source="bench", nodes=nodes,
                   started_at=(epoch + timedelta(seconds=rng.randrange(span_s))).isoformat(),
                   **{f: rng.choice(v) for f, v in _VERSIONS.items()})
        status = t["status"] if t["status"] != "success" else rng.choices(statuses, weights)[0]
        run["status"] = status
        if status == "success":
            factor = math.exp(rng.gauss(0.0, 0.08)) * (t["nodes"] / nodes) ** 0.04
            if t["_mfu"]:
                factor = min(factor, 0.97 / t["_mfu"])
            for f in ("tokens_per_sec_per_gpu", "tflops_per_gpu"):
                if t[f] is not None:
                    run[f] = round(t[f] * factor, 2)
            for f in ("mfu", "hfu"):
                if t[f] is not None:
                    run[f] = round(min(1.0, t[f] * factor), 4)
            if t["step_time_s"] is not None:
                run["step_time_s"] = round(t["step_time_s"] / factor, 4)
            if t["peak_memory_gib"] is not None:
                run["peak_memory_gib"] = round(t["peak_memory_gib"] * math.exp(rng.gauss(0.0, 0.03)), 2)
        else:
            cls = rng.choice(ERROR_CLASSES.get(status, ("unknown",)))
            run["error_class"] = cls
            pool = errors.get(cls)
            if pool:
                run["error_message"] = rng.choice(pool)
            if status == "oom" and t["peak_memory_gib"] is not None:
                run["peak_memory_gib"] = round(t["peak_memory_gib"], 2)
        run["extra"] = {"bench_seed": seed, "tp_mode": rng.choice(("REDUCE_SCATTER", "ALL_REDUCE"))}
        yield run


# -- driver ----------------------------------------------------------------------------------

def commit() -> str:
    """The checked-out commit, short, with "+dirty" when the tree has uncommitted changes (printed
    with every figure); "unknown" outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO_ROOT, capture_output=True,
                              text=True, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain"], cwd=REPO_ROOT, capture_output=True, text=True,
                               check=False).stdout
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    return head + ("+dirty" if dirty.strip() else "")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def machine() -> str:
    """One line describing this machine: CPU model, cores, memory, OS."""
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    mem = ""
    try:
        mem = f", {os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB RAM"
    except (ValueError, OSError):
        pass
    return f"{cpu}, {os.cpu_count()} cores{mem}, {platform.system()} {platform.release()}"


class Server:
    """A `scalebook serve` subprocess on a free loopback port over `url`; a context manager."""

    def __init__(self, url: str, log_path: Path):
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        env = {k: v for k, v in os.environ.items() if k not in ("SCALEBOOK_TOKEN",)}
        env["SCALEBOOK_DATABASE_URL"] = url
        self._log = open(log_path, "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen([sys.executable, "-m", "service.cli", "serve", "--host", "127.0.0.1",
                                      "--port", str(self.port), "--log-level", "warning"],
                                     env=env, stdout=self._log, stderr=subprocess.STDOUT, cwd=str(REPO_ROOT))
        self.log_path = log_path

    def wait(self, timeout_s: float = 120.0) -> None:
        from service.cli.server import wait_for_api

        try:
            wait_for_api(self.base, timeout_s, proc=self.proc)
        except ChildProcessError as exc:
            raise BenchError(f"scalebook serve exited with {self.proc.returncode}: "
                             f"{self.log_path.read_text(errors='replace')[-2000:]}") from exc
        except TimeoutError as exc:
            raise BenchError(f"scalebook serve not healthy after {timeout_s:.0f}s") from exc

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()

    def __enter__(self) -> Server:  # noqa: PYI034
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def _pg_admin_url(pg_url: str) -> str:
    from service.settings import normalise_url

    return normalise_url(pg_url)


def _create_database(backend: str, pg_url: str, workdir: Path) -> tuple[str, Callable[[], None]]:
    """A fresh, migrated database; returns (URL, drop function)."""
    import sqlalchemy as sa

    from service.db import Database

    if backend == "duckdb":
        url = f"duckdb:///{workdir / 'bench.duckdb'}"

        def drop() -> None:
            return None
    else:
        admin_url = _pg_admin_url(pg_url)
        name = f"scalebook_bench_{uuid.uuid4().hex[:8]}"
        admin = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
        try:
            with admin.connect() as conn:
                conn.execute(sa.text(f'CREATE DATABASE "{name}"'))
        except sa.exc.OperationalError as exc:
            raise BenchError(f"cannot create a PostgreSQL database on {pg_url}: {exc.orig}") from exc
        finally:
            admin.dispose()
        url = sa.engine.make_url(admin_url).set(database=name).render_as_string(hide_password=False)

        def drop() -> None:
            eng = sa.create_engine(admin_url, isolation_level="AUTOCOMMIT")
            with eng.connect() as conn:
                conn.execute(sa.text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            eng.dispose()
    db = Database(url)
    db.upgrade()
    db.dispose()
    return url, drop


def _existing_database(url: str) -> tuple[str, Callable[[], None]]:
    """An existing database (`scalebook bench --database`), migrated to head; kept (the drop does nothing)."""
    from service.db import Database
    from service.settings import normalise_url

    url = normalise_url(url)
    db = Database(url)
    try:
        db.upgrade()
    finally:
        db.dispose()
    return url, lambda: None


def _percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    pos = (len(ordered) - 1) * q
    lo, hi = math.floor(pos), math.ceil(pos)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo)


#: one-run POSTs each followed by a timed query (`*_after_post_ms`)
AFTER_POST_CALLS = 10


def _after_post_ms(client: httpx.Client, bodies: list[bytes], path: str, params: dict[str, Any]) -> float:
    """Median ms of GET `path` each right after POSTing one of `bodies` (one run each; not timed)."""
    times = []
    for body in bodies:
        resp = client.post("/api/v1/runs", content=body, headers=_POST_HEADERS)
        if resp.status_code != 201:
            raise BenchError(f"POST before {path} -> HTTP {resp.status_code}: {resp.text[:500]}")
        times.append(_median_ms(client, path, params, 1)[1])
    return statistics.median(times)


def _median_ms(client: httpx.Client, path: str, params: dict[str, Any], calls: int) -> tuple[float, float, Any]:
    """(first call ms, median ms, last body) of `calls` GETs of `path`."""
    times, body = [], None
    for _ in range(calls):
        t0 = time.perf_counter()
        resp = client.get(path, params=params)
        times.append((time.perf_counter() - t0) * 1000)
        if resp.status_code != 200:
            raise BenchError(f"GET {path} -> HTTP {resp.status_code}: {resp.text[:500]}")
        body = resp.json()
    return times[0], statistics.median(times), body


#: what the push client (ingest/client.py) sends: the answer is {ids, created, existing}
_POST_HEADERS = {"content-type": "application/json", "prefer": "return=minimal"}


def _created(body: bytes) -> int:
    """`created` of a batch answer."""
    return int(json.loads(body)["created"])


def ingest_batches(base: str, payloads: list[bytes], concurrency: int = 2,
                   on_batch: Callable[[int], None] = lambda created: None) -> tuple[int, float]:
    """POST pre-encoded batch bodies; returns (runs created, wall seconds). Raises BenchError on
    any non-2xx answer. ``on_batch(created)`` is called after each batch (from worker threads)."""
    headers = _POST_HEADERS

    def worker(chunk: list[bytes]) -> int:
        created = 0
        with httpx.Client(base_url=base, timeout=300) as client:
            for body in chunk:
                resp = client.post("/api/v1/runs", content=body, headers=headers)
                if resp.status_code not in (200, 201):
                    raise BenchError(f"batch POST -> HTTP {resp.status_code}: {resp.text[:500]}")
                created += _created(resp.content)
                on_batch(_created(resp.content))
        return created

    chunks = [payloads[i::concurrency] for i in range(concurrency)]
    t0 = time.perf_counter()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        created = sum(pool.map(worker, chunks))
    return created, time.perf_counter() - t0


def _tracked(items: list[bytes], progress: Callable[..., Any] | None, description: str) -> Iterator[bytes]:
    """`items`, advancing a `progress(description, total)` display after each one when given."""
    if progress is None:
        yield from items
        return
    with progress(description, len(items)) as bar:
        for item in items:
            yield item
            bar.advance(1)


def run_bench(n: int, backend: str = "duckdb", *, keep: bool = False,
              pg_url: str = "postgresql://postgres@127.0.0.1:5432/postgres", seed: int = 0,
              single_posts: int = 500, query_calls: int = 20, concurrency: int = 2,
              log: Callable[[str], None] = lambda msg: None,
              progress: Callable[..., Any] | None = None, database: str | None = None) -> dict[str, Any]:
    """Run the benchmark; returns the result dict (times in ms, rates in runs/s).

    Keys: backend, stored_runs, ingest_batch_runs_per_s, ingest_single_post_p50_ms,
    ingest_single_post_p99_ms, heatmap_ms, recommend_ms, plus heatmap_first_ms,
    recommend_first_ms, heatmap_after_post_ms, recommend_after_post_ms, suggest_ms, suggest_first_ms,
    suggest_after_post_ms (see the module
    docstring), runs, machine, database (when kept), generate_s, heatmap_cells,
    recommend_candidates. `stored_runs` is read before the after-post calls, which store
    3 × AFTER_POST_CALLS more runs. Raises BenchError. ``progress(description, total)``, when
    given, makes a context manager with ``advance(n)`` (service.cli.progress) for the ingest phases.

    `database`: the URL of an existing database to time instead (migrated to head first, kept; e.g.
    one grown to 10^6 runs by bench/grow.py): no batched ingest (`ingest_batch_runs_per_s` None), the
    single POSTs and the after-POST runs get fresh run_keys, and `n` is ignored.
    """
    workdir = Path(tempfile.mkdtemp(prefix="scalebook-bench-"))
    if database is not None:
        url, drop = _existing_database(database)
        n, seed = single_posts, seed if seed else int(time.time())
    else:
        url, drop = _create_database(backend, pg_url, workdir)
    n_single = min(single_posts, n // 2) if database is None else n
    n_batched = n - n_single
    try:
        t0 = time.perf_counter()
        payloads, singles, interleaved = _generate(n, n_batched, seed, fresh=database is None)
        generate_s = time.perf_counter() - t0
        log(f"generated {n} runs in {generate_s:.1f}s; starting scalebook serve on {backend}")
        with Server(url, workdir / "serve.log") as server:
            server.wait()
            with progress("batched ingest", n_batched) if progress else contextlib.nullcontext() as bar:
                on_batch = bar.advance if bar is not None else (lambda created: None)
                created, wall = ingest_batches(server.base, payloads, concurrency, on_batch) if payloads else (0, 0.0)
            del payloads
            rate = created / wall if wall else 0.0
            log(f"batched ingest: {created} runs in {wall:.1f}s = {rate:,.0f} runs/s")
            if backend == "postgres":
                _vacuum_analyze(url)
            with httpx.Client(base_url=server.base, timeout=120) as client:
                lat = _single_posts(client, singles, progress, log)
                timed = _queries(client, interleaved, query_calls, log)
        return {
            "backend": backend,
            "stored_runs": timed.pop("stored_runs"),
            "ingest_batch_runs_per_s": round(rate, 1) if database is None else None,
            "ingest_single_post_p50_ms": round(_percentile(lat, 0.5), 3) if lat else None,
            "ingest_single_post_p99_ms": round(_percentile(lat, 0.99), 3) if lat else None,
            **{k: round(v, 3) for k, v in timed.items() if k.endswith("_ms")},
            "runs": n,
            "batched_runs": n_batched,
            "single_posts": n_single,
            "heatmap_cells": timed["heatmap_cells"],
            "recommend_target": timed["recommend_target"],
            "recommend_candidates": timed["recommend_candidates"],
            "generate_s": round(generate_s, 1),
            "machine": machine(),
            "database": url if keep or database is not None else None,
        }
    finally:
        if not keep:
            drop()
            shutil.rmtree(workdir, ignore_errors=True)


def _generate(n: int, n_batched: int, seed: int, *, fresh: bool) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """The request bodies: `n_batched` runs in batches of BATCH, the rest of the `n` as single POSTs,
    and 3 × AFTER_POST_CALLS single runs for the after-POST timings. Run keys carry the seed in a
    fresh database, a random tag in an existing one."""
    templates = load_templates()
    runs = generate_runs(n, seed, templates=templates, prefix=f"bench{seed}" if fresh else
                         f"bench-{uuid.uuid4().hex[:8]}")
    payloads = []
    for start in range(0, n_batched, BATCH):
        batch = [next(runs) for _ in range(min(BATCH, n_batched - start))]
        payloads.append(json.dumps({"runs": batch}).encode())
    singles = [json.dumps(r).encode() for r in runs]
    after = f"bench{seed}-after" if fresh else f"bench-{uuid.uuid4().hex[:8]}-after"
    interleaved = [json.dumps(r).encode() for r in generate_runs(3 * AFTER_POST_CALLS, seed + 1, prefix=after,
                                                                 templates=templates)]
    return payloads, singles, interleaved


def _single_posts(client: httpx.Client, singles: list[bytes], progress: Callable[..., Any] | None,
                  log: Callable[[str], None]) -> list[float]:
    """POST each single run; their latencies (ms). BenchError on an answer other than 201."""
    lat = []
    for body in _tracked(singles, progress, "single POSTs"):
        t1 = time.perf_counter()
        resp = client.post("/api/v1/runs", content=body, headers=_POST_HEADERS)
        lat.append((time.perf_counter() - t1) * 1000)
        if resp.status_code != 201:
            raise BenchError(f"single POST -> HTTP {resp.status_code}: {resp.text[:500]}")
    log(f"single POST: p50 {_percentile(lat, 0.5):.2f} ms, p99 {_percentile(lat, 0.99):.2f} ms")
    return lat


def _queries(client: httpx.Client, interleaved: list[bytes], query_calls: int,
             log: Callable[[str], None]) -> dict[str, Any]:
    """The heatmap, recommend and suggest timings (median and first call, then right after a one-run
    POST), the stored runs before the after-POST calls, and what the answers held."""
    heat_first, heat_ms, heat = _median_ms(client, "/api/v1/heatmap", {}, query_calls)
    target = {"model_params": "8B", "nodes": 8, "gpus_per_node": 8}
    rec_first, rec_ms, rec = _median_ms(client, "/api/v1/recommend", target, query_calls)
    sug_first, sug_ms, _ = _median_ms(client, "/api/v1/suggest", target, query_calls)
    log(f"heatmap {heat_ms:.1f} ms ({len(heat['cells'])} cells; first call {heat_first:.1f}); "
        f"recommend {rec_ms:.1f} ms (first call {rec_first:.1f}); "
        f"suggest {sug_ms:.1f} ms (first call {sug_first:.1f})")
    stored = client.get("/api/v1/health").json()["runs"]
    n_after = AFTER_POST_CALLS
    heat_after = _after_post_ms(client, interleaved[:n_after], "/api/v1/heatmap", {})
    rec_after = _after_post_ms(client, interleaved[n_after:2 * n_after], "/api/v1/recommend", target)
    sug_after = _after_post_ms(client, interleaved[2 * n_after:], "/api/v1/suggest", target)
    log(f"right after a one-run POST: heatmap {heat_after:.1f} ms, recommend {rec_after:.1f} ms, "
        f"suggest {sug_after:.1f} ms")
    # (the result's key order: run_bench's)
    return {"stored_runs": stored, "heatmap_ms": heat_ms, "recommend_ms": rec_ms, "heatmap_first_ms": heat_first,
            "recommend_first_ms": rec_first, "heatmap_after_post_ms": heat_after,
            "recommend_after_post_ms": rec_after, "suggest_ms": sug_ms, "suggest_first_ms": sug_first,
            "suggest_after_post_ms": sug_after, "heatmap_cells": len(heat["cells"]), "recommend_target": target,
            "recommend_candidates": len(rec["candidates"])}


def _vacuum_analyze(url: str) -> None:
    """VACUUM ANALYZE runs after the bulk load: the steady state autovacuum reaches by itself
    (visibility map set for index-only scans, fresh planner statistics)."""
    import sqlalchemy as sa

    eng = sa.create_engine(url, isolation_level="AUTOCOMMIT")
    with eng.connect() as conn:
        conn.execute(sa.text("VACUUM ANALYZE runs"))
    eng.dispose()
