#!/usr/bin/env bash
# Set everything up and run the main job. Until the lab lands (issue 4), that is the
# planner on the seed scenario, with the seed dashboard's figures held against servelab's.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/servelab plan --scenario seed "$@"
