"""Headless Chromium for the page-timing bench and the browser tests (selenium, never downloads).

:func:`chromium` opens /usr/bin/chromium through /usr/bin/chromedriver (``scripts/install_browser.sh``
installs both); :func:`start_dashboard` runs ``streamlit run dashboard/app.py`` on a port against an
API URL; :func:`wait_drawn` waits until a page's content is drawn: Streamlit's "running" indicator is
gone, no spinner or skeleton is left, and the page's marker text (and, where given, a plotly chart
or a data grid) is on screen.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")

#: page path → (text that only the drawn page shows, CSS selector that must be present or None)
PAGES: dict[str, tuple[str, str | None]] = {
    "": ("The grid as text", ".js-plotly-plot .hm"),
    "what_worked": ("What worked?", None),
    "explore": ("Parallel coordinates", ".js-plotly-plot"),
    "runs": ("Compare runs", "[data-testid='stDataFrame']"),
    "scaling": ("GPU planner", ".js-plotly-plot"),
    "failures": ("Latest errors", ".js-plotly-plot"),
    "sql": ("round trip", "[data-testid='stDataFrame']"),
}


def available() -> bool:
    return CHROMIUM.exists() and CHROMEDRIVER.exists()


def chromium(profile_dir: Path, width: int = 1600, height: int = 1400) -> Any:
    """A headless Chromium WebDriver (SE_OFFLINE: selenium-manager never downloads a driver)."""
    os.environ["SE_OFFLINE"] = "true"
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--disable-quic",
                "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync",
                "--hide-scrollbars", f"--window-size={width},{height}", f"--user-data-dir={profile_dir}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=options)
    driver.set_page_load_timeout(120)
    return driver


def start_dashboard(api_url: str, port: int, log_path: Path, timeout_s: float = 90) -> subprocess.Popen:
    """``streamlit run dashboard/app.py`` on 127.0.0.1:``port`` reading ``api_url``; waits for health."""
    env = {**os.environ, "SCALEBOOK_API_URL": api_url, "STREAMLIT_BROWSER_GATHER_USAGE_STATS": "false"}
    env.pop("SCALEBOOK_TOKEN", None)
    log = open(log_path, "w+")  # noqa: SIM115 - the server writes to it until stop()
    proc = subprocess.Popen([sys.executable, "-m", "streamlit", "run", str(REPO / "dashboard" / "app.py"),
                             "--server.headless", "true", "--server.port", str(port), "--server.address", "127.0.0.1",
                             "--browser.gatherUsageStats", "false", "--client.toolbarMode", "viewer"],
                            cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/_stcore/health", timeout=2).text.strip() == "ok":
                return proc
        except httpx.TransportError:
            pass
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            log.seek(0)
            raise RuntimeError(f"streamlit did not come up on port {port}:\n{log.read()[-3000:]}")
        time.sleep(0.3)


def stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()


_DRAWN_JS = """
const [marker, selector] = arguments;
const status = document.querySelector("[data-testid='stStatusWidget']");
if (status && status.innerText.trim()) return false;          // "Running…" / "Connecting"
if (document.querySelector("[data-testid='stSpinner'], [data-testid='stSkeleton']")) return false;
if (!document.body || !document.body.innerText.includes(marker)) return false;
return !selector || document.querySelector(selector) !== null;
"""


def drawn(driver: Any, marker: str, selector: str | None) -> bool:
    """True once the page has finished running and shows ``marker`` (and ``selector``): one script
    evaluated in the page, so no element goes stale between checks."""
    return bool(driver.execute_script(_DRAWN_JS, marker, selector))


def wait_drawn(driver: Any, marker: str, selector: str | None, timeout_s: float = 60,
               extra: Callable[[Any], bool] | None = None) -> float:
    """Poll every 50 ms until :func:`drawn` (and ``extra``); returns the seconds waited.
    Raises TimeoutError with the page's text when it never happens."""
    from selenium.webdriver.common.by import By

    start = time.perf_counter()
    while time.perf_counter() - start < timeout_s:
        try:
            if drawn(driver, marker, selector) and (extra is None or extra(driver)):
                return time.perf_counter() - start
        except Exception:  # noqa: BLE001, S110 - the page is reloading under us: try again
            pass
        time.sleep(0.05)
    body = driver.find_element(By.TAG_NAME, "body").text
    raise TimeoutError(f"page not drawn within {timeout_s:.0f} s (marker {marker!r}):\n{body[-2000:]}")


def visit(driver: Any, base_url: str, page: str, query: str = "", timeout_s: float = 60) -> float:
    """Open a page and return the seconds from navigation until its content is drawn."""
    marker, selector = PAGES[page]
    start = time.perf_counter()
    driver.get(f"{base_url}/{page}{('?' + query) if query else ''}")
    wait_drawn(driver, marker, selector, timeout_s)
    return time.perf_counter() - start


_NAVIGATE_JS = """
const [page] = arguments;
const want = '/' + page;
const links = [...document.querySelectorAll("[data-testid='stSidebarNav'] a")];
const link = links.find(a => new URL(a.href).pathname.replace(/\\/$/, '') === want.replace(/\\/$/, '')
                             || (page === '' && new URL(a.href).pathname === '/'));
if (!link) return false;
link.click();
return true;
"""

_NOT_STALE_JS = """
return !document.querySelector("[data-stale='true']");
"""


def navigate(driver: Any, page: str, timeout_s: float = 60) -> float:
    """Open a page through the sidebar's navigation link, as a user does within a session (the
    browser keeps Streamlit's and plotly's JavaScript: no page load), and return the seconds from
    the click until its content is drawn and no element of the previous page is left (stale).
    Raises TimeoutError when it is not; LookupError when the sidebar has no link to ``page``."""
    marker, selector = PAGES[page]
    start = time.perf_counter()
    if not driver.execute_script(_NAVIGATE_JS, page):
        raise LookupError(f"no sidebar link to /{page}")
    time.sleep(0.05)  # the click starts a script run: let the status widget show it
    wait_drawn(driver, marker, selector, timeout_s,
               extra=lambda d: bool(d.execute_script(_NOT_STALE_JS)) and d.current_url.rstrip("/").endswith(page))
    return time.perf_counter() - start


def free_port() -> int:
    """A free loopback TCP port."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
