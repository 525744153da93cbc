#!/usr/bin/env bash
# Set everything up and run the whole suite: lint, types, tests. `.ci/run` calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The browser tests drive Debian's Chromium (Playwright's own browser download does not
# work offline). Install it where we can; elsewhere those tests skip (and fail under CI=true).
if ! command -v chromium >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing Debian's chromium for the browser tests..." >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null
    else
        echo "note: chromium is not installed; the browser tests will skip." \
             "fix: sudo apt-get install chromium" >&2
    fi
fi
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
