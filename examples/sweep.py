"""Run a small benchmark sweep of examples/train_tiny.py and record every result, failures included.

    scalebook serve &                      # or any SCALEBOOK_API_URL
    python examples/sweep.py               # micro-batch × grad-accum × recompute, 2 ranks each (CPU ok)

Each configuration runs as its own ``torchrun --standalone --nproc-per-node N examples/train_tiny.py``
subprocess with a run key chosen here. The training script's :class:`ingest.Recorder` pushes the
run from rank 0 (success, or the OOM/failure that ended it). When a subprocess dies before its
recorder could push (killed, timed out, crashed at import), this script pushes a failure record
itself under the same run key, classified from the subprocess output by ``ingest.classify``, so
every configuration of the grid ends up in the database exactly once. Runs go to
SCALEBOOK_API_URL; when the API is down they are spooled for ``scalebook sync``.

The default grid (micro-batch 8 and 32, grad-accum 1 and 2, recompute none and full) with an
emulated 8 MiB device budget shows the usual picture: micro-batch 32 without recompute runs out
of memory, full recompute makes it fit.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from ingest import Client  # noqa: E402

TRAIN = Path(__file__).resolve().parent / "train_tiny.py"


def api_health(url: str) -> str:
    """'ok (<backend>, <n> runs)' or why the API cannot be reached."""
    try:
        with urllib.request.urlopen(f"{url}/api/v1/health", timeout=3) as resp:
            body = json.loads(resp.read())
        return f"ok ({body.get('backend')}, {body.get('runs')} runs)"
    except Exception as exc:  # noqa: BLE001 - only reported
        return f"unreachable ({exc}); runs will be spooled, replay them with `scalebook sync`"


def failure_record(cfg: dict, run_key: str, output: str, returncode: int | None, timed_out: bool) -> dict:
    """A run record for a configuration whose process ended before its recorder pushed."""
    status, error_class, line = "failed", "unknown", None
    if timed_out:
        status, error_class = "timeout", "scheduler_time_limit"
    else:
        try:
            from ingest.classify import classify_text

            found = classify_text(output)
            if found.error_class:
                status, error_class, line = found.status or "failed", found.error_class, found.line
        except ImportError:
            pass
    message = line or (output.strip().splitlines() or [f"exit code {returncode}"])[-1]
    return {"run_key": run_key, "name": cfg["name"], "source": "sweep", "model_name": cfg["model_name"],
            "micro_batch_size": cfg["mbs"], "grad_accum_steps": cfg["gas"], "recompute": cfg["recompute"],
            "seq_len": cfg["seq_len"], "tp": 1, "pp": 1, "world_size": cfg["nproc"], "dp": cfg["nproc"],
            "status": status, "error_class": error_class, "error_message": message[:4000],
            "extra": {"example": "sweep", "returncode": returncode}}


def run_one(cfg: dict, args: argparse.Namespace, workdir: Path) -> dict:
    """Run one configuration; returns {"status", "record", "pushed_by", "seconds"}."""
    run_key = uuid.uuid4().hex
    result_path = workdir / f"{run_key}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(cfg["nproc"]),
           str(TRAIN), "--steps", str(args.steps), "--warmup", str(args.warmup), "--seq-len", str(cfg["seq_len"]),
           "--micro-batch-size", str(cfg["mbs"]), "--grad-accum", str(cfg["gas"]), "--recompute", cfg["recompute"],
           "--tp", "1", "--name", cfg["name"], "--run-key", run_key, "--result-json", str(result_path)]
    if args.memory_budget_mib:
        cmd += ["--memory-budget-mib", str(args.memory_budget_mib)]
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    start = time.monotonic()
    timed_out = False
    with tempfile.TemporaryFile("w+") as log:  # a file, not a pipe: a stray rank cannot block the read
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, text=True)
        try:
            proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            timed_out = True
            proc.terminate()  # torchrun forwards SIGTERM to its ranks and reaps them
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        log.seek(0)
        output = log.read()
    returncode = proc.returncode
    seconds = time.monotonic() - start
    reported = json.loads(result_path.read_text()) if result_path.exists() else {}
    if reported.get("push_status") and reported.get("record"):
        return {"status": reported["record"]["status"], "record": reported["record"], "pushed_by": "recorder",
                "push": reported["push_status"], "seconds": seconds}
    record = failure_record(cfg, run_key, output, returncode, timed_out)
    push = Client().push(record)
    return {"status": record["status"], "record": record, "pushed_by": "sweep", "push": push.status,
            "seconds": seconds}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="ranks per configuration (torchrun --nproc-per-node)")
    p.add_argument("--mbs", type=int, nargs="+", default=[8, 32], help="micro-batch sizes")
    p.add_argument("--gas", type=int, nargs="+", default=[1, 2], help="gradient-accumulation steps")
    p.add_argument("--recompute", nargs="+", default=["none", "full"], choices=["none", "selective", "full"])
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--memory-budget-mib", type=float, default=8.0, help="emulated device memory (0: none)")
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per configuration")
    args = p.parse_args(argv)

    url = Client().url
    print(f"scalebook API {url}: {api_health(url)}")
    grid = [{"nproc": args.nproc, "mbs": m, "gas": g, "recompute": r, "seq_len": args.seq_len,
             "model_name": "tiny-gpt-2L64h", "name": f"sweep tiny mbs{m} gas{g} rc-{r}"}
            for m, g, r in itertools.product(args.mbs, args.gas, args.recompute)]
    counts: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="scalebook-sweep-") as tmp:
        for i, cfg in enumerate(grid, 1):
            out = run_one(cfg, args, Path(tmp))
            rec = out["record"]
            counts[out["status"]] = counts.get(out["status"], 0) + 1
            tput = rec.get("tokens_per_sec_per_gpu")
            detail = f"{tput:9.0f} tok/s/GPU  step {rec.get('step_time_s', 0):.3f}s" if tput else \
                f"{rec.get('error_class')}: {(rec.get('error_message') or '')[:70]}"
            print(f"[{i:2d}/{len(grid)}] mbs={cfg['mbs']:<3d} gas={cfg['gas']} recompute={cfg['recompute']:<9s} "
                  f"{out['status']:<9s} {detail}  ({out['seconds']:.1f}s, {out['push']} by {out['pushed_by']})")
    print("summary: " + ", ".join(f"{n} {s}" for s, n in sorted(counts.items())))
    print(f"see them: curl '{url}/api/v1/runs?model_name=tiny-gpt-2L64h&limit=100'")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
