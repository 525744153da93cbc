#!/usr/bin/env bash
# Set everything up and run the whole suite: lint, types, tests. `.ci/run` calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
# The tests use the real parts: Debian's Chromium for the lab (Playwright's own browser
# download does not work offline), a redis-server they start themselves, and Java 17 for
# Spark. Install what is missing where we can (root with apt); elsewhere those tests skip,
# and under CI=true a skip is a failure.
missing=()
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v redis-server >/dev/null 2>&1 || missing+=(redis-server)
command -v java >/dev/null 2>&1 || missing+=(openjdk-17-jre-headless)
if [ ${#missing[@]} -gt 0 ]; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        echo "installing ${missing[*]} for the tests..." >&2
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
    else
        echo "note: ${missing[*]} not installed; the tests that need them will skip." \
             "fix: sudo apt-get install ${missing[*]}" >&2
    fi
fi
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
