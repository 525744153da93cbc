#!/usr/bin/env bash
# Run HERE (a machine with PyPI) before a device session: the wheels that
# validate_pinned.sh installs on the device machine, which reaches no index and has
# Python 3.12 with NumPy, Numba, ONNX Runtime, PyArrow, Typer, Rich, grpcio and
# prometheus-client already (KINDS.md). Saved in .whl/ (add "/.whl/" to
# .git/info/exclude; carry it with the run). About 51 MB: PyTriton's wheel is trimmed
# to the Python 3.12 stub (the others, and the bundled libpython3.13 only the 3.13 stub
# needs, are 16 MB), so the tree stays under the 64 MiB a run may carry.
set -euo pipefail
cd "$(dirname "$0")/../.."
mkdir -p .whl .whl/opt /tmp/servelab-wheels
get() {
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
        --implementation cp --platform manylinux_2_35_x86_64 --platform manylinux_2_28_x86_64 \
        --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
        --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d "$@"
}
# servelab's own (the gateway, validate) beyond what the device has; FastAPI 0.165
# imports opentelemetry-api
for p in fastapi==0.165.0 starlette==1.10.0 pydantic==2.14.4 pydantic-core==2.50.5 \
         annotated-types==0.8.0 typing-inspection==0.4.5 typing_extensions==4.16.0 \
         opentelemetry-api==1.45.2 uvicorn==0.54.0 httptools==0.9.0 tomli-w==1.2.0; do
    get .whl "$p"
done
# PyTriton 0.7.0 (Triton 2.51) and what it imports at run time
for p in pyzmq==27.3.0 sh==2.4.0 typing-inspect==0.9.0 mypy-extensions==1.2.0 \
         wrapt==2.5.2 tritonclient==2.73.0 python-rapidjson==1.25 geventhttpclient==2.6.1 \
         gevent==26.9.0 greenlet==3.3.2 zope.interface==8.7 zope.event==6.2 brotli==1.2.1; do
    get .whl "$p"
done
get .whl/opt protobuf==6.33.6  # only if the device's protobuf refuses tritonclient's
get /tmp/servelab-wheels nvidia-pytriton==0.7.0
python3 - <<'PY'
import glob, re, zipfile
src = glob.glob("/tmp/servelab-wheels/nvidia_pytriton-0.7.0-*.whl")[0]
drop = re.compile(r"python_backend_stubs/3\.(8|9|10|11|13)/|libpython3-[0-9a-f]+\.13\.so")
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(".whl/" + src.rsplit("/", 1)[1], "w",
                                                 zipfile.ZIP_DEFLATED) as zo:
    for info in zi.infolist():
        if drop.search(info.filename):
            continue
        data = zi.read(info)
        if info.filename.endswith("RECORD"):
            data = b"\n".join(x for x in data.split(b"\n") if not drop.search(x.decode()))
        zo.writestr(info, data)
PY
du -sh .whl
