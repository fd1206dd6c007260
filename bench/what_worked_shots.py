"""Screenshots of "What worked?" and "What if?" for given questions, in headless Chromium.

    python bench/what_worked_shots.py --api http://127.0.0.1:8000 --out dashboard/screenshots \
        NAME='model_params=8B&nodes=8&gpu_type=H100-SXM-80GB' ...

For each NAME=QUERY: starts nothing but the dashboard (bench/browser.start_dashboard, against
--api), opens /what_worked?QUERY, waits until the answer is drawn, saves NAME.png (the top of the
page: the form, the runs measured on the target, the predictions), then presses the "What if?"
panel's button (seeded with the answer's first complete configuration; `--whatif` overrides some
of its fields, e.g. `tp=4,pp=2`) and saves NAME_what_if.png with the panel at the top. 1280 px wide
unless --width.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench import browser as bb  # noqa: E402

#: the What if? panel's number inputs, by the API's field name (their aria-label in the page)
WHATIF_LABELS = {"nodes": "Nodes", "dp": "DP", "tp": "TP", "pp": "PP", "cp": "CP", "ep": "EP",
                 "micro_batch_size": "MBS", "grad_accum_steps": "GAS"}


def _set_whatif(driver, changes: dict[str, str]) -> None:
    """Type new values into the What if? panel's number inputs (the last input with that label)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    for field, value in changes.items():
        label = WHATIF_LABELS[field]
        box = driver.find_elements(By.CSS_SELECTOR, f"input[aria-label='{label}']")[-1]
        box.send_keys(Keys.CONTROL, "a")
        box.send_keys(str(value), Keys.TAB)
        time.sleep(0.3)


def shoot(driver, site: str, name: str, query: str, out: Path, whatif: dict[str, str]) -> None:
    from selenium.webdriver.common.by import By

    driver.get(f"{site}/what_worked?{query}")
    bb.wait_drawn(driver, "Predicted for layouts not run here", "[data-testid='stDataFrame']", timeout_s=300)
    time.sleep(1.0)
    driver.save_screenshot(str(out / f"{name}.png"))
    if whatif:
        _set_whatif(driver, whatif)
    button = next(b for b in driver.find_elements(By.TAG_NAME, "button") if b.text.strip() == "What if?")
    driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", button)
    button.click()
    bb.wait_drawn(driver, "per optimizer step", ".js-plotly-plot", timeout_s=300)
    heading = next(h for h in driver.find_elements(By.TAG_NAME, "h3") if h.text.startswith("What if?"))
    driver.execute_script("arguments[0].scrollIntoView({block: 'start'});", heading)
    time.sleep(1.0)
    driver.save_screenshot(str(out / f"{name}_what_if.png"))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--api", required=True, help="the API the dashboard reads")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=1500)
    ap.add_argument("--whatif", action="append", default=[], help="NAME:field=value,… for that question's panel")
    ap.add_argument("questions", nargs="+", help="NAME=QUERY (the What worked? URL's query string)")
    args = ap.parse_args()
    if not bb.available():
        print("headless Chromium is not installed: run scripts/install_browser.sh", file=sys.stderr)
        return 1
    overrides: dict[str, dict[str, str]] = {}
    for item in args.whatif:
        name, _, fields = item.partition(":")
        overrides[name] = dict(f.split("=", 1) for f in fields.split(",") if f)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        proc = bb.start_dashboard(args.api, bb.free_port(), Path(tmp) / "streamlit.log")
        port = proc.args[proc.args.index("--server.port") + 1]
        driver = bb.chromium(Path(tmp) / "profile", width=args.width, height=args.height)
        try:
            for item in args.questions:
                name, _, query = item.partition("=")
                shoot(driver, f"http://127.0.0.1:{port}", name, query, args.out, overrides.get(name, {}))
                print(f"{name}: {args.out / (name + '.png')}, {args.out / (name + '_what_if.png')}")
        finally:
            driver.quit()
            bb.stop(proc)
    return 0


if __name__ == "__main__":
    sys.exit(main())
