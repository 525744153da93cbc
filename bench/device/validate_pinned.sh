#!/usr/bin/env bash
# Run THERE (a many-core machine): servelab validate with the server and the load
# generator on separate CPUs, against servelab's gateway and a real Triton (PyTriton's
# bundled server serving tests/triton_sleep_server.py). Results under $OUT.
#
#   bench/device/prepare_wheels.sh            # here, first
#   device run, carry .whl:  bash bench/device/validate_pinned.sh
#
# SCPU / CCPU: the server's and the client's CPUs (0-3 / 8-15); DUR: seconds per rate;
# PARTS: which of triton, gateway0, gateway1 to run; SKIP_INSTALL=1 to use the current
# environment (PY, TPY: the Pythons for servelab and for PyTriton).
# Session 7 found: wheels installed with --target are not seen by Triton's Python stub
# (it does not read PYTHONPATH), so they go into the interpreter's own site-packages;
# tritonserver needs PyTriton's bundled libraries on LD_LIBRARY_PATH.
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
T0=$SECONDS
PY=${PY:-python3}; TPY=${TPY:-$PY}; SCPU=${SCPU:-0-3}; CCPU=${CCPU:-8-15}; DUR=${DUR:-10}
PARTS=${PARTS:-triton gateway0 gateway1}
pin() {  # pin CPUS CMD...: run CMD on the CPUs lo-hi (as taskset -c)
    "$PY" -c "import os, sys
r = sys.argv[1].split('-'); os.sched_setaffinity(0, range(int(r[0]), int(r[-1]) + 1))
os.execvp(sys.argv[2], sys.argv[2:])" "$@"
}
echo "== $(nproc) CPUs, $("$PY" --version), $(command -v "$PY")"
if [ -z "${SKIP_INSTALL:-}" ]; then
    "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        .whl/*.whl 2>&1 | grep -vi warning | tail -3
    export PYTHONPATH=$PWD/src
    "$TPY" -c "import tritonclient.grpc" 2>/dev/null || {
        echo "tritonclient.grpc refuses this protobuf: adding protobuf 6.33.6"
        "$PY" -m pip install -q --no-index --no-deps --no-compile --upgrade .whl/opt/*.whl; }
fi
"$PY" -c "import numpy, numba, onnxruntime as o
print('numpy', numpy.__version__, 'numba', numba.__version__, 'onnxruntime', o.__version__)"

for part in $PARTS; do
    case $part in
    triton)
        echo "== real Triton at $((SECONDS - T0)) s"
        site=$("$TPY" -c "import os, pytriton; print(os.path.dirname(os.path.dirname(pytriton.__file__)))")
        LIB=$("$TPY" -c "import sysconfig; print(sysconfig.get_config_var('LIBDIR'))"):$site/nvidia_pytriton.libs
        PORT=18500
        set -m
        LD_LIBRARY_PATH=$LIB pin "$SCPU" "$TPY" tests/triton_sleep_server.py $PORT \
            > "$OUT/triton_server.log" 2>&1 &
        TPID=$!
        set +m
        for i in $(seq 60); do
            "$PY" -c "import urllib.request as u; u.urlopen('http://127.0.0.1:$PORT/v2/models/sleep/ready', timeout=1)" 2>/dev/null && break
            kill -0 $TPID 2>/dev/null || { echo "Triton exited"; tail -5 "$OUT/triton_server.log"; break; }
            sleep 1
        done
        timeout 300 "$PY" -m servelab validate --url "http://127.0.0.1:$PORT" --model sleep \
            --client-cpus "$CCPU" --duration "$DUR" --json > "$OUT/triton.json" 2> "$OUT/triton.err"
        echo "rc=$?"; tail -3 "$OUT/triton.err"
        kill -TERM -- -$TPID 2>/dev/null; sleep 2; kill -KILL -- -$TPID 2>/dev/null
        ;;
    gateway*)
        seed=${part#gateway}
        echo "== gateway, seed $seed at $((SECONDS - T0)) s"
        timeout 200 "$PY" -m servelab validate --serve demo --server-cpus "$SCPU" \
            --client-cpus "$CCPU" --duration "$DUR" --seed "$seed" --json \
            > "$OUT/gateway_s$seed.json" 2> "$OUT/gateway_s$seed.err"
        echo "rc=$?"; tail -3 "$OUT/gateway_s$seed.err"
        ;;
    esac
done
echo "== done at $((SECONDS - T0)) s"
