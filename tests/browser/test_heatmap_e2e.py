"""End to end: the real dashboard (`streamlit run dashboard/app.py`) in headless Chromium against a
live API loaded with the Ultra-Scale Playbook nanotron sample. The expected cell is computed from
the CSV (the successful 1-node row with the highest tok/s/gpu) and must appear both in the chart
(plotly's SVG text) and in the grid-as-text table; a screenshot goes to test-output/heatmap.png;
clicking another cell in the chart opens that cell's runs.

Needs /usr/bin/chromium and /usr/bin/chromedriver (`scripts/install_browser.sh`). Selenium is given
the driver path and SE_OFFLINE=true, so selenium-manager never downloads anything.
"""

from __future__ import annotations

import csv
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from conftest import free_port, playbook_sample, post_records

pytestmark = [pytest.mark.browser]

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
OUTPUT = REPO / "test-output"


def expected_best(data_dir, nodes: int) -> tuple[str, str, str]:
    """(parallel dims, rest of the config, MFU text) of the best successful CSV row at `nodes` nodes."""
    with open(data_dir / "nanotron" / "bench_sample.csv", newline="") as fh:
        rows = [r for r in csv.DictReader(fh) if r["status"] == "Success" and int(float(r["nodes"])) == nodes]
    best = max(rows, key=lambda r: float(r["tok/s/gpu"]))
    return (f"DP{best['dp']} TP{best['tp']} PP{best['pp']}",
            f"GAS{int(float(best['batch_accum']))} Z{best['zero_stage']} MBS{best['mbs']}",
            f"MFU {float(best['mfu']):.1f}%")


@pytest.fixture
def dashboard(live_api, data_dir, tmp_path):
    """`streamlit run dashboard/app.py` on a free port, reading the live API (nanotron sample loaded)."""

    with httpx.Client(base_url=live_api, timeout=60) as client:
        stored, rejected = post_records(client, playbook_sample(data_dir).records)
    assert stored == 312 and not rejected
    port = free_port()
    log = open(tmp_path / "streamlit.log", "w+")
    env = {**os.environ, "SCALEBOOK_API_URL": live_api, "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"}
    env.pop("SCALEBOOK_TOKEN", None)
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(REPO / "dashboard" / "app.py"),
                             "--server.headless", "true", "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--browser.gatherUsageStats", "false"],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/_stcore/health", timeout=2).text.strip() == "ok":
                    break
            except httpx.TransportError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                pytest.fail(f"streamlit did not come up on {url}:\n{log.read()[-3000:]}")
            time.sleep(0.3)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.fixture
def browser(tmp_path, monkeypatch):
    """Headless Chromium through /usr/bin/chromedriver (never downloaded)."""
    if not (CHROMIUM.exists() and CHROMEDRIVER.exists()):
        pytest.skip("headless Chromium is not installed: run scripts/install_browser.sh")
    monkeypatch.setenv("SE_OFFLINE", "true")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--window-size=1600,1500", f"--user-data-dir={tmp_path / 'chromium-profile'}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


def test_heatmap_renders_the_best_config_in_a_real_browser(dashboard, browser, data_dir):
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    dims, rest, mfu = expected_best(data_dir, 1)
    # rank by tokens/s per GPU through the page's shareable link (widgets bound to query parameters)
    browser.get(f"{dashboard}/?hm_metric=tokens%2Fs+per+GPU")

    def chart_lines(driver) -> list[str]:
        """Plotly's SVG text, one entry per line (multi-line cell text is split into <tspan>s), read
        in one script in the page: no element handle to go stale while plotly redraws."""
        return driver.execute_script(
            "const q = s => [...document.querySelectorAll(s)].map(e => e.textContent);"
            "return q('.js-plotly-plot svg text tspan').concat(q('.js-plotly-plot svg text').filter(t => t));")

    def ready(driver) -> bool:
        body = driver.find_element(By.TAG_NAME, "body").text
        return f"{dims} · {rest} · " in body and f" tok/s · {mfu} · " in body and dims in chart_lines(driver)

    try:
        WebDriverWait(browser, 60, poll_frequency=0.5,
                      ignored_exceptions=(StaleElementReferenceException,)).until(ready)
    finally:
        OUTPUT.mkdir(exist_ok=True)
        time.sleep(1.0)  # let plotly finish its transition before the picture
        browser.save_screenshot(str(OUTPUT / "heatmap.png"))

    assert browser.find_elements(By.CSS_SELECTOR, "input[type=radio]")[0].is_selected()  # tokens/s per GPU
    body = browser.find_element(By.TAG_NAME, "body").text
    assert "Best configuration per model size × nodes" in body
    assert "Traceback" not in body and "not reachable" not in body
    lines = chart_lines(browser)
    # the Playbook cell, line by line, in the chart: "DP8 TP1 PP1" / "GAS16 Z0 MBS2" / "40.1k tok/s" / "MFU 39.2%" /
    # "1.3B · 25.1 GiB" (the exact size of the best run kept in its family's cell)
    assert dims in lines and rest in lines and mfu in lines and any(line.endswith(" tok/s") for line in lines)
    assert any(line.startswith("1.3B · ") and line.endswith(" GiB") for line in lines)
    assert {"1", "2", "4", "1–2B"} <= set(lines)  # axes: node counts and the model-size family
    assert (OUTPUT / "heatmap.png").stat().st_size > 10_000

    # clicking a cell in the chart opens its runs (the page starts on the busiest cell, 4 nodes)
    dims2 = expected_best(data_dir, 2)[0]
    target = next(t for t in browser.find_elements(By.CSS_SELECTOR, ".js-plotly-plot svg text tspan")
                  if t.text == dims2)
    plot = browser.find_element(By.CSS_SELECTOR, ".js-plotly-plot .nsewdrag")
    cell, area = target.rect, plot.rect
    ActionChains(browser).move_to_element_with_offset(
        plot, int(cell["x"] + cell["width"] / 2 - area["x"] - area["width"] / 2),
        int(cell["y"] + cell["height"] / 2 - area["y"] - area["height"] / 2)).pause(0.3).click().perform()
    WebDriverWait(browser, 30, poll_frequency=0.5).until(
        lambda d: "run(s) in 1–2B × 2 nodes" in d.find_element(By.TAG_NAME, "body").text)
    assert "hm_cell=" in browser.current_url  # the selected cell is in the shareable link
