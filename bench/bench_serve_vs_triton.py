"""servelab serve against a real Triton on the same model, side by side.

Two Tritons: PyTriton's (the default; Triton 2.x behind PyTriton's Python proxy), and
with `--server tritonserver` Triton 2.51's own `tritonserver` from the same wheel
(tests/tritonserver.py lays it out), serving a 16-64-4 MLP through its Python backend
(NumPy) while servelab serves the same MLP as ONNX: Triton's own front end, batcher
and statistics, without PyTriton's proxy.

Both serve the same ONNX model (the demo's fraud classifier on its four features,
run by ONNX Runtime on CPU) with the same batching (max_batch_size 32,
max_queue_delay 2,000 us, one instance), and take the same open-loop Poisson load
from the same generator, rate by rate, one server at a time on this machine. The
load's body is the features tensor itself (no online feature join, which Triton
does not do). Prints achieved rate, mean batch and p50/p99 per rate, each server's
saturation (the highest achieved rate), and the ratio.

PyTriton (Triton 2.x bundled) needs its own virtual environment: the first run builds
one in .bench-venv-pytriton (`pip install nvidia-pytriton onnxruntime`), unless
--pytriton-python names a Python that has them.

    python bench/bench_serve_vs_triton.py [--rates 500,1000,1500,2000,3000] [--seconds 6]
                                          [--server pytriton|tritonserver] [--grpc]

`--grpc` (with `--server tritonserver`) sends the same load over the KServe v2 gRPC
service instead (servelab serve --grpc-port against tritonserver's gRPC port): one
grpc.aio channel, each request a ModelInfer call sent at its intended time, latency
from that time.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import resource
import subprocess
import sys
import sysconfig
import tempfile
from pathlib import Path

import httpx
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.services import free_port, process_tree_cpu_s

from servelab.gateway.cli import build_demo
from servelab.measure.loadgen import http_request, poisson_offsets, run_open_loop
from servelab.measure.process import server_process

ROOT = Path(__file__).resolve().parents[1]
PYTRITON_SERVER = r'''
import sys, numpy as np, onnxruntime as ort
from pytriton.decorators import batch
from pytriton.model_config import ModelConfig, Tensor, DynamicBatcher
from pytriton.triton import Triton, TritonConfig
opts = ort.SessionOptions(); opts.intra_op_num_threads = 1; opts.inter_op_num_threads = 1
sess = ort.InferenceSession(sys.argv[1], sess_options=opts, providers=["CPUExecutionProvider"])

@batch
def infer(features):
    return {"probability": sess.run(None, {"features": features.astype(np.float32)})[0]}

port = int(sys.argv[2])
with Triton(config=TritonConfig(http_port=port, grpc_port=port + 1, metrics_port=port + 2)) as t:
    t.bind("fraud", infer, inputs=[Tensor(name="features", dtype=np.float32, shape=(4,))],
           outputs=[Tensor(name="probability", dtype=np.float32, shape=(1,))],
           config=ModelConfig(max_batch_size=32,
                              batcher=DynamicBatcher(max_queue_delay_microseconds=2000)))
    t.serve()
'''


# `--floor`: uvicorn alone (httptools, uvloop, as `servelab serve` runs it) answering
# every request with one fixed v2 answer, no parse, no model: the CPU per request that
# any Python ASGI front end pays here before it does any work.
FLOOR_SERVER = r'''
import sys, uvicorn
ANSWER = (b'{"model_name":"mlp","outputs":[{"name":"y","datatype":"FP32","shape":[1,4],'
          b'"data":[0,0,0,0]}]}')
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    more = True
    while more:
        more = (await receive()).get("more_body", False)
    body = b"" if scope["path"] == "/metrics" else ANSWER
    await send({"type": "http.response.start", "status": 200, "headers": [
        (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning",
            access_log=False, http="httptools", loop="uvloop")
'''


def pytriton_python(given: str | None) -> str:
    if given:
        return given
    venv = ROOT / ".bench-venv-pytriton"
    py = venv / "bin" / "python"
    if not py.exists():
        print("building .bench-venv-pytriton (nvidia-pytriton, onnxruntime)...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "-q", "nvidia-pytriton",
                        "onnxruntime"], check=True)
    return str(py)


def client_cpu_s() -> float:
    """The load generator's CPU seconds (this process alone, not the servers it runs)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def stats(metrics_url: str, model: str = "fraud") -> tuple[float, float]:
    """Inferences and executions from the Prometheus metrics, by Triton's names (both
    servers export them; PyTriton restricts Triton's statistics API to a token)."""
    text = httpx.get(metrics_url).text
    found = {}
    for name in ("nv_inference_count", "nv_inference_exec_count"):
        m = re.search(rf'^{name}\{{[^}}]*model="{model}"[^}}]*\}} (\S+)$', text, re.M)
        found[name] = float(m.group(1)) if m else 0.0
    return found["nv_inference_count"], found["nv_inference_exec_count"]


def run(port: int, rates: list[float], seconds: float, metrics_url: str, pid: int,
        model: str = "fraud", tensor: tuple[str, int] = ("features", 4)
        ) -> list[dict[str, float]]:
    rng = np.random.default_rng(3)
    bodies = [http_request("127.0.0.1", port, f"/v2/models/{model}/infer", json.dumps(
        {"inputs": [{"name": tensor[0], "datatype": "FP32", "shape": [1, tensor[1]],
                     "data": [float(v) for v in rng.uniform(0, 20, tensor[1])]}]}).encode())
        for _ in range(512)]
    asyncio.run(run_open_loop("127.0.0.1", port, bodies, poisson_offsets(200, 400)))  # warm
    rows = []
    for rate in rates:
        i0, e0 = stats(metrics_url, model)
        c0, k0 = process_tree_cpu_s(pid), client_cpu_s()
        res = asyncio.run(run_open_loop("127.0.0.1", port, bodies,
                                        poisson_offsets(rate, int(rate * seconds), seed=7)))
        c1, k1 = process_tree_cpu_s(pid), client_cpu_s()
        i1, e1 = stats(metrics_url, model)
        s = res.summary()
        rows.append({"offered": rate, "achieved": s["achieved_per_s"], "errors": s["errors"],
                     "batch": (i1 - i0) / max(e1 - e0, 1), "p50": s["p50_ms"],
                     "p99": s["p99_ms"], **cpu_per_request(c1 - c0, k1 - k0, s["ok"])})
    return rows


def cpu_per_request(server_s: float, client_s: float, served: float) -> dict[str, float]:
    """The server's CPU time (its process and every one it started) and the load
    generator's per answered request, in µs: unlike the saturation rate, this hardly
    moves with how busy the machine is."""
    n = max(served, 1)
    return {"server_us": server_s / n * 1e6, "client_us": client_s / n * 1e6}


def run_grpc(addr: str, rates: list[float], seconds: float, metrics_url: str, pid: int,
             model: str, tensor: tuple[str, int]) -> list[dict[str, float]]:
    """As `run`, over gRPC: ModelInfer calls on one channel, each sent at its intended
    time from a Poisson schedule; latency from that time."""
    import grpc
    from tritonclient.grpc import service_pb2, service_pb2_grpc

    rng = np.random.default_rng(3)
    reqs = []
    for _ in range(512):
        r = service_pb2.ModelInferRequest(model_name=model)
        r.inputs.add(name=tensor[0], datatype="FP32", shape=[1, tensor[1]])
        r.raw_input_contents.append(rng.uniform(0, 20, tensor[1]).astype(np.float32).tobytes())
        reqs.append(r)

    async def load(rate: float, n: int) -> tuple[np.ndarray, np.ndarray, int]:
        offsets = poisson_offsets(rate, n, seed=7)
        lat = np.full(n, np.nan)
        errors = 0
        async with grpc.aio.insecure_channel(addr) as ch:
            stub = service_pb2_grpc.GRPCInferenceServiceStub(ch)
            loop = asyncio.get_running_loop()
            t0 = loop.time() + 0.05

            async def one(i: int) -> None:
                nonlocal errors
                intended = t0 + offsets[i]
                await asyncio.sleep(max(0.0, intended - loop.time()))
                try:
                    await stub.ModelInfer(reqs[i % len(reqs)], timeout=30)
                    lat[i] = loop.time() - intended
                except grpc.aio.AioRpcError:
                    errors += 1

            await asyncio.gather(*(one(i) for i in range(n)))
            span = loop.time() - t0
        return lat, np.array([span]), errors

    asyncio.run(load(200, 400))  # warm-up
    rows = []
    for rate in rates:
        i0, e0 = stats(metrics_url, model)
        c0, k0 = process_tree_cpu_s(pid), client_cpu_s()
        lat, span, errors = asyncio.run(load(rate, int(rate * seconds)))
        c1, k1 = process_tree_cpu_s(pid), client_cpu_s()
        i1, e1 = stats(metrics_url, model)
        ok = lat[~np.isnan(lat)] * 1e3
        rows.append({"offered": rate, "achieved": ok.size / float(span[0]), "errors": errors,
                     "batch": (i1 - i0) / max(e1 - e0, 1),
                     "p50": float(np.percentile(ok, 50)) if ok.size else float("nan"),
                     "p99": float(np.percentile(ok, 99)) if ok.size else float("nan"),
                     **cpu_per_request(c1 - c0, k1 - k0, ok.size)})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rates", default="500,1000,1500,2000,3000")
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--pytriton-python", default=None)
    ap.add_argument("--server", choices=("pytriton", "tritonserver"), default="pytriton")
    ap.add_argument("--grpc", action="store_true",
                    help="with --server tritonserver: the load over gRPC")
    ap.add_argument("--floor", action="store_true",
                    help="with --server tritonserver over HTTP: also bare uvicorn answering "
                    "a fixed body, the front end's own CPU per request")
    args = ap.parse_args()
    rates = [float(r) for r in args.rates.split(",")]
    if args.server == "tritonserver":
        report(against_tritonserver(rates, args.seconds, args.grpc,
                                    args.floor and not args.grpc),
               "tritonserver" + (" (gRPC)" if args.grpc else ""))
        return
    work = Path(tempfile.mkdtemp(prefix="servelab-vs-triton-"))
    _, _, model = build_demo(work / "repo")
    py = pytriton_python(args.pytriton_python)
    server = work / "pytriton_server.py"
    server.write_text(PYTRITON_SERVER)
    libdir = subprocess.run([py, "-c", "import sysconfig; print(sysconfig.get_config_var("
                             "'LIBDIR'))"], capture_output=True, text=True, check=True
                            ).stdout.strip() or sysconfig.get_config_var("LIBDIR")
    results = {}
    port = free_port()
    with server_process([sys.executable, "-m", "servelab", "serve", "--model",
                         f"fraud={model}", "--port", str(port)],
                        f"http://127.0.0.1:{port}/v2/health/ready") as proc:
        results["servelab"] = run(port, rates, args.seconds,
                                  f"http://127.0.0.1:{port}/metrics", proc.pid)
    port = free_port()
    env = {**os.environ, "LD_LIBRARY_PATH": libdir}
    with server_process([py, str(server), str(model), str(port)],
                        f"http://127.0.0.1:{port}/v2/health/ready", timeout_s=120,
                        env=env) as proc:
        results["triton"] = run(port, rates, args.seconds,
                                f"http://127.0.0.1:{port + 2}/metrics", proc.pid)
    report(results, "Triton (PyTriton)")


def against_tritonserver(rates: list[float], seconds: float, grpc: bool = False,
                         floor: bool = False) -> dict[str, list[dict[str, float]]]:
    """The MLP on both: servelab on the ONNX file, tritonserver on its Python backend;
    over HTTP, or with `grpc` over each server's gRPC port; with `floor`, bare uvicorn
    (FLOOR_SERVER) as well."""
    from tests.tritonserver import tritonserver_process, write_model

    work = Path(tempfile.mkdtemp(prefix="servelab-vs-tritonserver-"))
    write_model(work / "repo", "mlp", "max_batch_size: 32 dynamic_batching { "
                "max_queue_delay_microseconds: 2000 }")
    results = {}
    port, grpc_port = free_port(), free_port()
    with server_process([sys.executable, "-m", "servelab", "serve", "--model-repository",
                         str(work / "repo" / "onnx"), "--port", str(port), "--grpc-port",
                         str(grpc_port)], f"http://127.0.0.1:{port}/v2/health/ready") as proc:
        metrics = f"http://127.0.0.1:{port}/metrics"
        results["servelab"] = (
            run_grpc(f"127.0.0.1:{grpc_port}", rates, seconds, metrics, proc.pid, "mlp",
                     ("x", 16)) if grpc else
            run(port, rates, seconds, metrics, proc.pid, "mlp", ("x", 16)))
    with tritonserver_process(work / "repo" / "python", work) as (proc, addresses):
        http, metrics_addr, grpc_addr = addresses
        metrics = f"http://{metrics_addr}/metrics"
        results["triton"] = (
            run_grpc(grpc_addr, rates, seconds, metrics, proc.pid, "mlp", ("x", 16)) if grpc
            else run(int(http.rsplit(":", 1)[1]), rates, seconds, metrics, proc.pid, "mlp",
                     ("x", 16)))
    if floor:
        server = work / "floor_server.py"
        server.write_text(FLOOR_SERVER)
        port = free_port()
        with server_process([sys.executable, str(server), str(port)],
                            f"http://127.0.0.1:{port}/metrics") as proc:
            results["uvicorn"] = run(port, rates, seconds, f"http://127.0.0.1:{port}/metrics",
                                     proc.pid, "mlp", ("x", 16))
    return results


def report(results: dict[str, list[dict[str, float]]], other: str) -> None:
    print(f"{'server':<9} {'offered':>8} {'achieved':>9} {'err':>5} {'batch':>6} "
          f"{'p50 ms':>8} {'p99 ms':>9} {'server us/req':>14} {'client us/req':>14}")
    for name, rows in results.items():
        for r in rows:
            print(f"{name:<9} {r['offered']:>8.0f} {r['achieved']:>9.0f} {r['errors']:>5.0f} "
                  f"{r['batch']:>6.2f} {r['p50']:>8.2f} {r['p99']:>9.2f} "
                  f"{r['server_us']:>14.0f} {r['client_us']:>14.0f}")
    if "uvicorn" in results:
        floor = {r["offered"]: r["server_us"] for r in results["uvicorn"]}
        print("\nbare uvicorn's CPU per request (a fixed answer, no work): "
              + ", ".join(f"{us:.0f} us at {rate:.0f}/s" for rate, us in floor.items()))
    sat = {k: max(r["achieved"] for r in v) for k, v in results.items()}
    print(f"\nsaturation (highest achieved rate): servelab {sat['servelab']:.0f}/s, "
          f"{other} {sat['triton']:.0f}/s, ratio {sat['servelab'] / sat['triton']:.2f}")
    ok = {k: max([r["achieved"] for r in v if r["p99"] < 50 and r["errors"] == 0] or [0.0])
          for k, v in results.items()}
    print(f"highest achieved rate with p99 < 50 ms and no errors: servelab "
          f"{ok['servelab']:.0f}/s, {other} {ok['triton']:.0f}/s, ratio "
          f"{ok['servelab'] / max(ok['triton'], 1):.2f}")
    # CPU per request at the highest rate both kept up with (achieved within 5%)
    both = [(a, b) for a, b in zip(results["servelab"], results["triton"], strict=True)
            if min(a["achieved"], b["achieved"]) >= 0.95 * a["offered"]]
    if both:
        a, b = both[-1]
        print(f"server CPU per request at {a['offered']:.0f}/s: servelab {a['server_us']:.0f} "
              f"us, {other} {b['server_us']:.0f} us, ratio "
              f"{a['server_us'] / max(b['server_us'], 1e-9):.2f}")


if __name__ == "__main__":
    main()
