#!/usr/bin/env bash
# Install headless Chromium and its WebDriver for the browser tests (tests/browser, `pytest -m browser`).
#
# Idempotent and quiet: does nothing when /usr/bin/chromium and /usr/bin/chromedriver both exist;
# otherwise installs the Debian packages `chromium` and `chromium-driver` with apt-get (needs root,
# or sudo when available). Selenium is pointed at /usr/bin/chromedriver by the tests, so
# selenium-manager never downloads a browser or driver (the tests also set SE_OFFLINE=true).
set -euo pipefail

CHROMIUM=/usr/bin/chromium
DRIVER=/usr/bin/chromedriver

if [[ -x "$CHROMIUM" && -x "$DRIVER" ]]; then
    exit 0
fi

SUDO=""
if [[ "$(id -u)" -ne 0 ]]; then
    if command -v sudo >/dev/null 2>&1; then
        SUDO="sudo"
    else
        echo "install_browser.sh: need root (or sudo) to apt-get install chromium chromium-driver" >&2
        exit 1
    fi
fi

export DEBIAN_FRONTEND=noninteractive
log="$(mktemp -t install_browser.XXXXXX.log)"
trap 'rm -f "$log"' EXIT
if ! { $SUDO apt-get update -qq && $SUDO apt-get install -y -qq --no-install-recommends chromium chromium-driver; } \
        >"$log" 2>&1; then
    cat "$log" >&2
    echo "install_browser.sh: apt-get failed (output above)" >&2
    exit 1
fi

for bin in "$CHROMIUM" "$DRIVER"; do
    if [[ ! -x "$bin" ]]; then
        echo "install_browser.sh: $bin still missing after apt-get install" >&2
        exit 1
    fi
done
echo "chromium: $("$CHROMIUM" --version 2>/dev/null || echo '?'); chromedriver: $("$DRIVER" --version 2>/dev/null | head -1)"
