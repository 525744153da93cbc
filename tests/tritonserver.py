"""Triton 2.51's own `tritonserver`, started from the nvidia-pytriton wheel in
.venv-pytriton (scripts/test.sh builds it), for conformance tests that hold the gateway
against the real server on the same model repository.

The wheel holds only Triton's Python backend, so a model here is a `model.py` that
runs the same MLP as the gateway's ONNX file (`write_mlp`/`mlp_reference`, weights from
an .npz beside it): answers, batching, statistics and config handling are Triton's own.
How to lay the server out: ../shared/REAL_SERVERS.md."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import numpy as np

from servelab.gateway.demo import mlp_weights, write_mlp
from tests.integration.test_validate_triton import pytriton_python
from tests.services import free_port, server_process

MODEL_PY = '''
import os
import sys

# The stub's interpreter ignores PYTHONPATH and would take the system NumPy (2.x),
# whose arrays reach Triton as empty tensors: take the wheel's venv's (1.x) first.
sys.path.insert(0, os.environ["SERVELAB_TRITON_SITE"])
import numpy as np  # noqa: E402
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def initialize(self, args):
        folder = os.path.join(args["model_repository"], args["model_version"])
        z = np.load(os.path.join(folder, "weights.npz"))
        self.layers = [(z[f"w{i}"], z[f"b{i}"]) for i in range(len(z.files) // 2)]

    def execute(self, requests):
        xs = [pb_utils.get_input_tensor_by_name(r, "x").as_numpy() for r in requests]
        h = np.concatenate(xs)
        for w, b in self.layers[:-1]:
            h = np.maximum(h @ w + b, 0)
        w, b = self.layers[-1]
        y = (h @ w + b).astype(np.float32)
        out, at = [], 0
        for x in xs:
            out.append(pb_utils.InferenceResponse([pb_utils.Tensor("y", y[at:at + len(x)])]))
            at += len(x)
        return out
'''


def write_model(repo: Path, name: str, config: str, version: int = 1) -> None:
    """The 16-in, 4-out MLP of `write_mlp` as a model of both servers' repositories:
    `model.onnx` for the gateway, `model.py` and its weights for Triton's Python backend
    (a repository per server: `repo/onnx` and `repo/python`). `config` is the
    config.pbtxt's text after its name, backend, inputs and outputs."""
    io = ('input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ] '
          'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ]')
    for kind in ("onnx", "python"):
        d = repo / kind / name
        (d / str(version)).mkdir(parents=True, exist_ok=True)
        backend = 'backend: "python"' if kind == "python" else 'platform: "onnxruntime_onnx"'
        (d / "config.pbtxt").write_text(f'name: "{name}" {backend} {io} {config}')
    write_mlp(repo / "onnx" / name / str(version) / "model.onnx")
    py = repo / "python" / name / str(version)
    (py / "model.py").write_text(MODEL_PY)
    weights = mlp_weights(16, 64, 4, 1, 0)
    np.savez(py / "weights.npz", **{f"{k}{i}": a for i, (w, b) in enumerate(weights)
                                    for k, a in (("w", w), ("b", b))})


@contextlib.contextmanager
def tritonserver(repo: Path, work: Path, *args: str) -> Iterator[tuple[str, str, str]]:
    """tritonserver on `repo` (HTTP, gRPC and metrics on free loopback ports), laid out
    in `work`; yields its HTTP, metrics and gRPC addresses, host:port."""
    with tritonserver_process(repo, work, *args) as (_, addresses):
        yield addresses


@contextlib.contextmanager
def tritonserver_process(repo: Path, work: Path, *args: str
                         ) -> Iterator[tuple[subprocess.Popen[bytes], tuple[str, str, str]]]:
    """As `tritonserver`, yielding its process too (the bench reads its CPU time and
    that of the Python backend stubs it starts)."""
    py = pytriton_python()
    assert py is not None, "no .venv-pytriton: bash scripts/test.sh builds it"
    site = Path(subprocess.run([py, "-c", "import pytriton, pathlib; print(pathlib.Path("
                                "pytriton.__file__).parent.parent)"], capture_output=True,
                               text=True, check=True).stdout.strip())
    libdir = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_config_var("
                             "'LIBDIR'))"], capture_output=True, text=True,
                            check=True).stdout.strip()
    src = site / "pytriton" / "tritonserver"
    home = work / "tritonserver"
    if not home.exists():
        for part in ("bin", "backends", "caches"):
            shutil.copytree(src / part, home / part)
        shutil.copy2(src / "python_backend_stubs" / "3.11" / "triton_python_backend_stub",
                     home / "backends" / "python")
    http, grpc, metrics = free_port(), free_port(), free_port()
    # (the whole environment: with only these, the Python stub found no NumPy)
    env = {**os.environ, "LD_LIBRARY_PATH": f"{libdir}:{site / 'nvidia_pytriton.libs'}",
           "PYTHONPATH": str(site), "SERVELAB_TRITON_SITE": str(site)}
    cmd = [str(home / "bin" / "tritonserver"), "--model-repository", str(repo),
           "--backend-directory", str(home / "backends"), "--cache-directory",
           str(home / "caches"), "--http-address", "127.0.0.1", "--http-port", str(http),
           "--grpc-address", "127.0.0.1", "--grpc-port", str(grpc), "--metrics-address",
           "127.0.0.1", "--metrics-port", str(metrics), "--allow-gpu-metrics", "false",
           "--log-error", "true", "--exit-timeout-secs", "2", *args]
    with server_process(cmd, f"http://127.0.0.1:{http}/v2/health/ready", timeout_s=120,
                        env=env) as proc:
        yield proc, (f"127.0.0.1:{http}", f"127.0.0.1:{metrics}", f"127.0.0.1:{grpc}")


SLEEP_PY = '''
import os
import sys
import time

sys.path.insert(0, os.environ["SERVELAB_TRITON_SITE"])  # (as MODEL_PY)
import triton_python_backend_utils as pb_utils  # noqa: E402


class TritonPythonModel:
    def execute(self, requests):
        time.sleep(SLEEP_S)
        return [pb_utils.InferenceResponse([pb_utils.Tensor(
            "y", pb_utils.get_input_tensor_by_name(r, "x").as_numpy())]) for r in requests]
'''


def write_sleep_model(repo: Path, name: str, sleep_ms: float, config: str) -> None:
    """A Python-backend model whose every execution sleeps `sleep_ms` and echoes its
    4-float input: a server of known, steady service time for queueing tests. `config`
    is the config.pbtxt's text after its name, backend, inputs and outputs."""
    d = repo / name
    (d / "1").mkdir(parents=True, exist_ok=True)
    (d / "1" / "model.py").write_text(SLEEP_PY.replace("SLEEP_S", repr(sleep_ms / 1000)))
    (d / "config.pbtxt").write_text(
        f'name: "{name}" backend: "python" '
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 4 ] } ] '
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 4 ] } ] '
        f'instance_group [ {{ count: 1 kind: KIND_CPU }} ] {config}')
