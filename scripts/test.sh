#!/usr/bin/env bash
# Set everything up and run the whole suite: lint, types, tests. `.ci/run` calls this.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/ruff check .
.venv/bin/mypy
.venv/bin/python -m pytest "$@"
