"""Every dashboard page in a real headless Chromium, on DuckDB and on PostgreSQL: the live API holds
the shipped data (the nanotron sweep and the published tables, parsed by the ingest parsers and
POSTed through the API, as `scalebook up` loads them); a real `streamlit run dashboard/app.py` reads
it. Each page must finish drawing its content (bench/browser.py ``drawn``) and show what it is for;
expected values come from the CSV (csv module), not from the code under test. Every page is drawn
in a 1280×800 window (DuckDB) and a 1600×1200 one (PostgreSQL): at both the heatmap's cell text
fits its cells. The widened heatmap ("All GPUs & lengths") is in the URL and survives a reload,
with no Session State warning in the dashboard's log; /docs draws Swagger UI with no network.
Screenshots land in test-output/pages-<backend>-<width>-<page>.png.
"""

from __future__ import annotations

import csv
import time
from pathlib import Path

import httpx
import pytest
from conftest import playbook_sample, post_records

from bench import browser as bb

pytestmark = [pytest.mark.browser]

REPO = Path(__file__).resolve().parents[2]
OUTPUT = REPO / "test-output"


def csv_rows(data_dir) -> list[dict]:
    with open(data_dir / "nanotron" / "bench_sample.csv", newline="") as fh:
        return list(csv.DictReader(fh))


def best_label(data_dir, nodes: int) -> tuple[str, str]:
    """(parallel dims, rest) of the successful nanotron row with the highest tok/s/gpu at ``nodes``."""
    ok = [r for r in csv_rows(data_dir) if r["status"] == "Success" and int(float(r["nodes"])) == nodes]
    best = max(ok, key=lambda r: float(r["tok/s/gpu"]))
    return (f"DP{best['dp']} TP{best['tp']} PP{best['pp']}",
            f"GAS{int(float(best['batch_accum']))} Z{best['zero_stage']} MBS{best['mbs']}")


@pytest.fixture
def site(live_api, data_dir, tmp_path):
    """The dashboard URL over a live API loaded with the shipped data."""
    if not bb.available():
        pytest.skip("headless Chromium is not installed: run scripts/install_browser.sh")
    from ingest.parsers import table

    records = list(playbook_sample(data_dir).records)
    for path in sorted((data_dir / "published").glob("*.csv")):
        records += table.parse_file(path).records
    with httpx.Client(base_url=live_api, timeout=120) as client:
        stored, _ = post_records(client, records)
    assert stored > 312
    proc = bb.start_dashboard(live_api, bb.free_port(), tmp_path / "streamlit.log")
    port = proc.args[proc.args.index("--server.port") + 1]
    try:
        yield Site(f"http://127.0.0.1:{port}", tmp_path / "streamlit.log")
    finally:
        bb.stop(proc)


class Site(str):
    """The dashboard's URL, with the path of its log."""

    log: Path

    def __new__(cls, url: str, log: Path) -> Site:
        obj = super().__new__(cls, url)
        obj.log = log
        return obj


#: the window each backend's run draws the pages in: every page at both sizes, each backend once
SIZES = {"duckdb": (1280, 800), "postgresql": (1600, 1200)}


@pytest.fixture
def chrome(tmp_path, backend):
    if not bb.available():
        pytest.skip("headless Chromium is not installed: run scripts/install_browser.sh")
    width, height = SIZES[backend]
    driver = bb.chromium(tmp_path / "profile", width=width, height=height)
    try:
        yield driver
    finally:
        driver.quit()


_CELL_TEXT_FITS_JS = """
// widest line of cell text in the heatmap, and the narrowest column (distance between node ticks)
const ticks = [...document.querySelectorAll('.js-plotly-plot .xtick text')].map(t => t.getBoundingClientRect())
    .map(r => r.left + r.width / 2).sort((a, b) => a - b);
let column = Infinity;
for (let i = 1; i < ticks.length; i++) column = Math.min(column, ticks[i] - ticks[i - 1]);
const lines = [...document.querySelectorAll('.js-plotly-plot .hm text tspan, .js-plotly-plot .textpoint text tspan,'
    + ' .js-plotly-plot g.hm text')].map(t => t.getBoundingClientRect().width);
return [Math.max(0, ...lines), column, lines.length];
"""


def body_text(driver) -> str:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.TAG_NAME, "body").text


def shot(driver, backend: str, page: str) -> None:
    OUTPUT.mkdir(exist_ok=True)
    time.sleep(0.5)
    driver.save_screenshot(str(OUTPUT / f"pages-{backend}-{SIZES[backend][0]}-{page or 'heatmap'}.png"))


def chart_lines(driver) -> list[str]:
    from selenium.webdriver.common.by import By

    return [t.text for t in driver.find_elements(By.CSS_SELECTOR, ".js-plotly-plot svg text tspan")] + \
        [t.text for t in driver.find_elements(By.CSS_SELECTOR, ".js-plotly-plot svg text") if t.text]


def test_every_page_draws_its_content(site, chrome, data_dir, backend, live_api):
    from selenium.webdriver.common.by import By

    # landing: the comparable slice is named, families are rows, the cells carry their configurations
    bb.visit(chrome, site, "", timeout_s=120)
    text = body_text(chrome)
    assert "most-recorded comparable slice: H100-SXM-80GB, sequence length 4,096" in text
    dims, rest = best_label(data_dir, 1)
    lines = chart_lines(chrome)
    assert dims in lines and rest in lines and "1–2B" in lines and "7–8B" in lines
    assert "Deploy" not in text and "Traceback" not in text
    widest, column, n_lines = chrome.execute_script(_CELL_TEXT_FITS_JS)
    assert n_lines > 10 and widest <= column, (widest, column)  # no cell text spills into its neighbours
    shot(chrome, backend, "")

    # "All GPUs & lengths": the widened view is in the URL, survives a reload; no Session State warning
    link = next(a for a in chrome.find_elements(By.TAG_NAME, "a") if "All GPUs" in a.text)
    link.click()
    bb.wait_drawn(chrome, "are mixed in these cells", ".js-plotly-plot", timeout_s=120)
    assert "hm_gpu=any" in chrome.current_url and "hm_seq=any" in chrome.current_url
    chrome.refresh()
    bb.wait_drawn(chrome, "are mixed in these cells", ".js-plotly-plot", timeout_s=120)
    assert "hm_gpu=any" in chrome.current_url
    assert "GB300" in " ".join(chart_lines(chrome)) or "GB300" in body_text(chrome)
    assert "Session State" not in site.log.read_text()

    # a shared link restores the metric, the slice and the selected cell
    chrome.get(f"{site}/?hm_metric=MFU&hm_fw=nanotron&hm_cell=1%E2%80%932B+%C3%97+2+nodes")
    bb.wait_drawn(chrome, "run(s) in 1–2B × 2 nodes", ".js-plotly-plot", timeout_s=120)
    assert chrome.find_elements(By.CSS_SELECTOR, "input[type=radio]")[1].is_selected()  # MFU

    bb.visit(chrome, site, "explore", timeout_s=120)
    text = body_text(chrome)
    assert "runs · success" in text and "Selected runs" in text
    assert chrome.find_elements(By.CSS_SELECTOR, ".js-plotly-plot .scatterlayer, .js-plotly-plot canvas")
    shot(chrome, backend, "explore")

    bb.visit(chrome, site, "runs", timeout_s=120)
    text = body_text(chrome)
    assert "runs match" in text and "field(s) differ" in text and "None" not in text
    shot(chrome, backend, "runs")

    bb.visit(chrome, site, "scaling", timeout_s=120)
    bb.wait_drawn(chrome, "GPUs (", ".js-plotly-plot", timeout_s=120)  # the planner's answer for its defaults
    text = body_text(chrome)
    assert "How well the curve fits:" in text and "percentage points" in text
    shot(chrome, backend, "scaling")

    bb.visit(chrome, site, "failures", timeout_s=120)
    assert "Error classes by node count" in body_text(chrome)
    shot(chrome, backend, "failures")

    bb.visit(chrome, site, "sql", timeout_s=120)
    assert "ms round trip" in body_text(chrome)
    shot(chrome, backend, "sql")

    # "What worked?" for 8B on 8 H100 nodes (a link, as the heatmap's cell gives it): first what ran
    # there — the heatmap's 7–8B × 8 cell, NeMo's Nemotron-8B run (the CSV's figure) — then predictions
    bb.visit(chrome, site, "what_worked", query="model_params=8B&nodes=8&gpu_type=H100-SXM-80GB", timeout_s=180)
    bb.wait_drawn(chrome, "Predicted for layouts not run here", "[data-testid='stDataFrame']", timeout_s=180)
    text = body_text(chrome)
    with open(data_dir / "published" / "nemo_24_07_performance_summary.csv", newline="") as fh:
        nemotron = next(r for r in csv.DictReader(fh) if r["model"] == "Nemotron-8B" and r["num_gpus"] == "64")
    assert "Measured on this target" in text and "Traceback" not in text
    assert text.index("Measured on this target") < text.index("Predicted for layouts not run here")
    # the tables are drawn on a canvas; the cell's caption and the record-wins warning are text
    assert "the heatmap's 7–8B row × 8 nodes of H100-SXM-80GB, seq 4096: 1 configuration(s) ran" in text
    assert f"({nemotron['model'][-2:]} · {nemotron['framework']} · {nemotron['precision'].lower()})" in text
    shot(chrome, backend, "what_worked")
    # "What if?": the panel is seeded with a configuration; its answer draws the step time as a bar
    button = next(b for b in chrome.find_elements(By.TAG_NAME, "button") if b.text.strip() == "What if?")
    chrome.execute_script("arguments[0].scrollIntoView({block: 'center'});", button)
    button.click()
    bb.wait_drawn(chrome, "per optimizer step", ".js-plotly-plot", timeout_s=180)
    assert "measured on this target" in body_text(chrome)
    heading = next(h for h in chrome.find_elements(By.TAG_NAME, "h3") if h.text.startswith("What if?"))
    chrome.execute_script("arguments[0].scrollIntoView({block: 'start'});", heading)
    shot(chrome, backend, "what_if")

    # the API's /docs draws Swagger UI from the package's own assets (this machine has no network)
    chrome.get(f"{live_api}/docs")
    bb.wait_drawn(chrome, "/api/v1/runs", ".swagger-ui .opblock", timeout_s=60)
    assert "DELETE" in body_text(chrome)
