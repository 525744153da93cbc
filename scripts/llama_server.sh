#!/usr/bin/env bash
# Build llama.cpp's `llama-server` once and cache it outside the clone; print its path.
#
# The tests and benches hold servelab's LLM load generator and `validate --api openai` against a
# real third-party server. Debian has no llama.cpp package and nothing can be downloaded but from
# the package registries, so the source comes from the `llama-cpp-python` source distribution on
# PyPI, which vendors llama.cpp. Only the server target is built (static, CPU): about 4-7 minutes
# on 2 cores, once per version. The cache is keyed by that version.
set -euo pipefail
VERSION="${LLAMA_CPP_PYTHON_VERSION:-0.3.36}"
CACHE="${SERVELAB_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/servelab}/llama-server-$VERSION"
BIN="$CACHE/llama-server"
if [ -x "$BIN" ] && "$BIN" --version >/dev/null 2>&1; then
    echo "$BIN"
    exit 0
fi
for tool in cmake g++ make; do
    if ! command -v "$tool" >/dev/null 2>&1; then
        echo "llama_server.sh: $tool is missing; fix: apt-get install cmake g++ make" >&2
        exit 1
    fi
done
PY="${PYTHON:-python3}"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
echo "building llama-server from llama-cpp-python==$VERSION (once; cached in $CACHE)..." >&2
"$PY" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" -d "$work" >&2
tar -xzf "$work"/llama_cpp_python-"$VERSION".tar.gz -C "$work"
src="$work/llama_cpp_python-$VERSION/vendor/llama.cpp"
cmake -S "$src" -B "$work/build" -DCMAKE_BUILD_TYPE=Release -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_SERVER=ON -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF >"$work/cmake.log" 2>&1 \
    || { tail -30 "$work/cmake.log" >&2; exit 1; }
cmake --build "$work/build" --target llama-server -j "$(nproc)" >"$work/build.log" 2>&1 \
    || { tail -30 "$work/build.log" >&2; exit 1; }
mkdir -p "$CACHE"
cp "$work/build/bin/llama-server" "$BIN.tmp"
mv "$BIN.tmp" "$BIN"
echo "$BIN"
