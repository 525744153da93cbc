#!/usr/bin/env bash
# Set everything up and run the main job: the interactive lab on http://127.0.0.1:8000
# (pass --port N or --host ADDR to change). Nothing to install beyond servelab itself.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/servelab lab "$@"
