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
# A real Triton for the validation test: PyTriton bundles Triton's server and runs on
# CPU; it pins its own NumPy, so it lives in a venv of its own (about 25 s to build).
if [ ! -x .venv-pytriton/bin/python ] || ! .venv-pytriton/bin/python -c "import pytriton" \
        2>/dev/null; then
    echo "building .venv-pytriton (nvidia-pytriton) for the real-Triton test..." >&2
    rm -rf .venv-pytriton  # a half-built venv or a link left behind is rebuilt from nothing
    "${PYTHON:-python3}" -m venv .venv-pytriton
    .venv-pytriton/bin/python -m pip install --quiet --disable-pip-version-check \
        nvidia-pytriton || echo "note: nvidia-pytriton did not install; the real-Triton" \
        "test will skip (and fail under CI=true)" >&2
fi
# A real LLM server for the LLM load tests: llama.cpp's llama-server, built once from the
# llama-cpp-python source distribution on PyPI (about 5 minutes on 2 cores), cached in
# ~/.cache/servelab keyed by version. Without cmake/g++ those tests skip (and fail in CI).
if ! command -v cmake >/dev/null 2>&1 || ! command -v g++ >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        apt-get update -qq
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq cmake g++ make >/dev/null
    fi
fi
PYTHON=.venv/bin/python bash scripts/llama_server.sh >/dev/null \
    || echo "note: llama-server did not build; the LLM server tests will skip" \
        "(and fail under CI=true)" >&2
.venv/bin/ruff check .
.venv/bin/mypy
if [ $# -gt 0 ]; then
    exec .venv/bin/python -m pytest "$@"
fi
# The suite in two parts. The tests that time nothing (the simulators, the fits, the
# feature store, the fuzzed CLI) run on both cores at once; then the integration tests,
# which start servers and judge how fast they answer, run one at a time with the machine
# to themselves (their fidelity checks count other processes' CPU as a busy host).
# Both parts run whatever the first gave; the exit status says if either failed.
rc=0
.venv/bin/python -m pytest -n 2 tests/unit tests/validation tests/fuzz \
    tests/integration/test_plain_install.py || rc=$?
.venv/bin/python -m pytest tests/integration \
    --ignore tests/integration/test_plain_install.py || rc=$?
exit $rc
