"""Page timing in a real browser: how long each dashboard page takes until its content is drawn.

    PYTHONPATH=$PWD .venv/bin/python bench/page_timing.py [--runs 100000] [--backend duckdb|postgresql]
        [--visits 3] [--screenshots DIR]

What it does: a fresh database (a DuckDB file in a temp dir, or a new PostgreSQL database), a real
`scalebook serve`, the shipped example data imported exactly as `scalebook up` does (the same
importers), then, with --runs N, N - (shipped runs) synthetic runs from the bench generator (the
templates are the shipped runs, so the shapes are real). A real `streamlit run dashboard/app.py` and
headless Chromium (bench/browser.py) then open every page ``--visits`` times, each in a NEW browser
page load; "drawn" = the page's marker text and main element are on screen and Streamlit is no
longer running the script (bench/browser.py ``drawn``). Each of those visits is a full page load (a
new Streamlit session, the JavaScript parsed again). The first visit of the first page also pays
Streamlit's start (imports, first script run); "first" is each page's first visit, "reload" the
median of its later full loads. Then, in one session, every page is reached ``--visits`` times
through the sidebar's link, as a user moves between pages ("in-app": bench/browser.py ``navigate``,
drawn and nothing of the previous page left).

Targets (issue 18): ≤ 2 s per page at 100,000 runs after the first visit, ≤ 4 s first visit.
Prints one line per page and the commit hash, the machine and its load average: these figures
depend on the machine; compare figures taken on one machine only.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import browser  # noqa: E402 -- needs the sys.path insert above
from service.cli.benchmark import Server, _create_database, commit, generate_runs, ingest_batches  # noqa: E402

#: a page not drawn within this many seconds is reported as such (inf) and the bench goes on
TIMEOUT_S = 120


def load_shipped(base: str) -> int:
    """Import examples/data as `scalebook up` does; returns the runs stored."""
    from service.cli.imports import import_examples
    from service.cli.server import example_data_dir

    os.environ.setdefault("SCALEBOOK_DATA_DIR", tempfile.mkdtemp(prefix="scalebook-timing-"))
    summaries = import_examples(example_data_dir(), base)
    return sum(s.stored for s in summaries) if summaries and hasattr(summaries[0], "stored") else -1


def add_synthetic(base: str, n: int, batch: int = 1000) -> int:
    """POST ``n`` generated runs in batches of ``batch``; returns the runs created."""
    if n <= 0:
        return 0
    payloads, chunk = [], []
    for run in generate_runs(n, seed=18, prefix="timing"):
        chunk.append(run)
        if len(chunk) == batch:
            payloads.append(json.dumps({"runs": chunk}).encode())
            chunk = []
    if chunk:
        payloads.append(json.dumps({"runs": chunk}).encode())
    created, _ = ingest_batches(base, payloads, concurrency=2)
    return created


def total_runs(base: str) -> int:
    import httpx

    return int(httpx.get(f"{base}/api/v1/health", timeout=30).json().get("runs", 0))


def measure(base: str, visits: int, workdir: Path, shots: Path | None) -> dict[str, dict[str, list[float]]]:
    """Seconds until drawn, per page: {"load": [full page loads, a fresh navigation each; the first
    is the "first visit"], "nav": [in-app visits through the sidebar link, after every page was
    loaded once]}. The Streamlit server is started once, so the first load of the first page
    includes its start."""
    port = browser.free_port()
    proc = browser.start_dashboard(base, port, workdir / "streamlit.log")
    url = f"http://127.0.0.1:{port}"
    times: dict[str, dict[str, list[float]]] = {p: {"load": [], "nav": []} for p in browser.PAGES}
    driver = browser.chromium(workdir / "profile", height=2000)

    def timed(fn: Any, *args: Any) -> float:
        try:
            return float(fn(*args, timeout_s=TIMEOUT_S))
        except TimeoutError:  # reported as "not drawn within TIMEOUT_S"; the other pages go on
            return float("inf")

    try:
        for visit in range(visits):
            for page in browser.PAGES:
                driver.get("about:blank")
                times[page]["load"].append(timed(browser.visit, driver, url, page))
                if shots is not None and visit == visits - 1:
                    time.sleep(1.0)
                    driver.save_screenshot(str(shots / f"{page or 'heatmap'}.png"))
        # within one session: every page reached through the sidebar, `visits` rounds
        driver.get("about:blank")
        timed(browser.visit, driver, url, "")
        pages = list(browser.PAGES)
        for _ in range(visits):
            for page in pages[1:] + pages[:1]:
                times[page]["nav"].append(timed(browser.navigate, driver, page))
    finally:
        driver.quit()
        browser.stop(proc)
    return times


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=0, help="total runs to reach with synthetic ones (0: shipped only)")
    ap.add_argument("--backend", choices=("duckdb", "postgresql"), default="duckdb")
    ap.add_argument("--pg-url", default="postgresql://postgres@127.0.0.1:5432/postgres")
    ap.add_argument("--visits", type=int, default=3)
    ap.add_argument("--screenshots", type=Path, default=None, help="save each page's last visit as DIR/<page>.png")
    args = ap.parse_args()
    if not browser.available():
        print("headless Chromium is not installed: run scripts/install_browser.sh", file=sys.stderr)
        return 1
    with tempfile.TemporaryDirectory(prefix="scalebook-timing-") as tmp:
        workdir = Path(tmp)
        os.environ["SCALEBOOK_DATA_DIR"] = str(workdir / "data")
        url, cleanup = _create_database(args.backend, args.pg_url, workdir)
        try:
            with Server(url, workdir / "api.log") as server:
                server.wait()
                load_shipped(server.base)
                shipped = total_runs(server.base)
                t0 = time.perf_counter()
                added = add_synthetic(server.base, args.runs - shipped) if args.runs > shipped else 0
                load_s = time.perf_counter() - t0
                n = total_runs(server.base)
                if args.screenshots:
                    args.screenshots.mkdir(parents=True, exist_ok=True)
                times = measure(server.base, args.visits, workdir, args.screenshots)
        finally:
            cleanup()
    load = os.getloadavg()
    print(f"page timing · commit {commit()} · {args.backend} · {n:,} runs ({shipped:,} shipped + {added:,} "
          f"generated in {load_s:.0f} s) · {os.cpu_count()} CPUs, load average {load[0]:.1f} {load[1]:.1f} "
          f"{load[2]:.1f} · {args.visits} visits per page")
    print(f"{'page':<14}{'first s':>9}{'reload s (median)':>19}{'in-app s (median)':>19}{'in-app max':>12}")
    worst_first = worst_reload = worst_nav = 0.0
    for page, ts in times.items():
        first, reloads, navs = ts["load"][0], ts["load"][1:] or ts["load"], ts["nav"] or [float("nan")]
        worst_first, worst_reload = max(worst_first, first), max(worst_reload, max(reloads))
        worst_nav = max(worst_nav, max(navs))
        print(f"{page or 'heatmap':<14}{first:>9.2f}{statistics.median(reloads):>19.2f}"
              f"{statistics.median(navs):>19.2f}{max(navs):>12.2f}".replace("inf", f">{TIMEOUT_S}"))
    print(f"worst first visit {worst_first:.2f} s (target ≤ 4 s); worst later visit: in the session (sidebar) "
          f"{worst_nav:.2f} s, as a full page reload {worst_reload:.2f} s (target ≤ 2 s)".replace(
              "inf", f">{TIMEOUT_S}"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
