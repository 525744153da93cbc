#!/usr/bin/env bash
# Create .venv and install servelab with its dev tools. Idempotent: re-runs only
# when pyproject.toml changed since the last successful install.
set -euo pipefail
cd "$(dirname "$0")/.."

PY="${PYTHON:-python3}"
if ! "$PY" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
    echo "servelab needs Python 3.11 or newer; found: $("$PY" --version 2>&1 || echo none)." >&2
    echo "fix: install Python 3.11+, or point PYTHON at one (PYTHON=python3.12 $0)" >&2
    exit 1
fi
if [ ! -x .venv/bin/python ]; then
    "$PY" -m venv .venv
fi
stamp=.venv/.servelab-installed
want=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
    .venv/bin/python -m pip install --quiet --disable-pip-version-check --upgrade pip
    .venv/bin/python -m pip install --quiet --disable-pip-version-check -e ".[dev]"
    echo "$want" > "$stamp"
fi
# Byte-compile servelab's own sources: an editable install is not compiled by pip, and
# where PYTHONDONTWRITEBYTECODE is set every command would compile them again (about
# 70 ms of each `servelab` start, measured). Quick when nothing changed.
.venv/bin/python -m compileall -q src > /dev/null
