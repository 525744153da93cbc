"""servelab's gateway and a real Triton under the same hostile traffic, side by side.

Both serve a model with one FP32 [-1, 16] input: servelab the demo MLP (ONNX Runtime),
Triton 2.51 (from the nvidia-pytriton wheel, tests/triton_sleep_server.py) a 2 ms sleep
plus a matmul. Each server is judged against itself, so the different models do not
matter: small requests at `--rate` alone, then beside hostile clients, for each:

- p99 of the small requests alone and beside `--bodies` 64 MB bodies (Content-Length,
  sent whole unless the server refuses them), and the server's RSS growth;
- the time a new client waits for its first answer with `--half-open` connections
  already open and idle (half silent, half stopped part-way through their headers).

    python bench/bench_gateway_hostile.py [--rate 500] [--seconds 4] [--half-open 2000]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.test_validate_triton import (  # noqa: E402
    SERVER,
    pytriton_env,
    pytriton_python,
)
from tests.services import free_port, free_port_run  # noqa: E402

from servelab.gateway.demo import write_mlp  # noqa: E402
from servelab.measure.loadgen import http_request, poisson_offsets, run_open_loop  # noqa: E402

BODY = (b'{"inputs": [{"name": "x", "datatype": "FP32", "shape": [1, 16], "data": ['
        + b", ".join([b"0.25"] * 16) + b"]}]}")


def tree_rss_mib(pid: int) -> float:
    """RSS of a process and all its descendants (PyTriton runs tritonserver below it)."""
    parent: dict[int, int] = {}
    for e in os.listdir("/proc"):
        if e.isdigit():
            with contextlib.suppress(OSError), open(f"/proc/{e}/stat") as f:
                parent[int(e)] = int(f.read().rsplit(")", 1)[1].split()[1])
    total = 0
    for p in parent:
        q, hops = p, 0
        while q not in (0, 1) and q != pid and hops < 64:
            q, hops = parent.get(q, 0), hops + 1
        if q == pid:
            with contextlib.suppress(OSError), open(f"/proc/{p}/status") as f:
                total += next((int(ln.split()[1]) for ln in f if ln.startswith("VmRSS")), 0)
    return total / 1024


@contextlib.contextmanager
def started(cmd: list[str], ready: str, env: dict[str, str] | None = None
            ) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        for _ in range(1200):
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(ready, timeout=2).status_code == 200:
                    break
            if proc.poll() is not None:
                raise RuntimeError(f"{cmd[:3]} exited with {proc.returncode}")
            time.sleep(0.1)
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, 15)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)


def p99(port: int, model: str, rate: float, seconds: float, seed: int) -> tuple[float, int]:
    reqs = [http_request("127.0.0.1", port, f"/v2/models/{model}/infer", BODY)]
    res = asyncio.run(run_open_loop("127.0.0.1", port, reqs,
                                    poisson_offsets(rate, int(rate * seconds), seed),
                                    max_connections=64))
    s = res.summary()
    return float(s["p99_ms"]), int(s["errors"])


def send_huge(port: int, model: str, size: int = 64 * 1024 * 1024) -> str:
    s = socket.create_connection(("127.0.0.1", port), timeout=60)
    frame = b"[1.0, " * 20_000
    sending = ""
    try:
        s.sendall(f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                  f"Content-Length: {size}\r\n\r\n".encode())
        sent = 0
        while sent < size:
            s.sendall(frame[: size - sent])
            sent += min(len(frame), size - sent)
    except OSError:
        sending = " (refused while sending)"
    try:  # the answer, if the server sent one before it closed
        head = s.recv(40).split(b"\r\n")[0].decode(errors="replace")
        return (head or "closed, no answer") + sending
    except OSError as exc:
        return f"{type(exc).__name__}, no answer" + sending
    finally:
        s.close()


def half_open_wait(port: int, model: str, n: int) -> tuple[float, int]:
    """Seconds a new client waits for its answer with `n` half-open connections, and how
    many of those the server refused to open."""
    socks, refused = [], 0
    try:
        for i in range(n):
            try:
                c = socket.create_connection(("127.0.0.1", port), timeout=5)
            except OSError:
                refused += 1
                continue
            if i % 2:
                c.sendall(f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                          .encode())
            socks.append(c)
        t0 = time.monotonic()
        try:
            r = httpx.post(f"http://127.0.0.1:{port}/v2/models/{model}/infer", content=BODY,
                           timeout=30)
            return (time.monotonic() - t0 if r.status_code == 200 else float("nan")), refused
        except httpx.HTTPError:
            return float("inf"), refused
    finally:
        for c in socks:
            c.close()


def judge(name: str, proc: subprocess.Popen[bytes], port: int, model: str,
          args: argparse.Namespace) -> dict[str, object]:
    p99(port, model, args.rate, 1.0, 0)  # warm up
    alone, _ = p99(port, model, args.rate, args.seconds, 1)
    before = tree_rss_mib(proc.pid)
    answers: list[str] = []
    t = threading.Thread(target=lambda: answers.extend(
        send_huge(port, model) for _ in range(args.bodies)))
    t.start()
    beside, errors = p99(port, model, args.rate, args.seconds, 2)
    t.join()
    grown = tree_rss_mib(proc.pid) - before
    wait, refused = half_open_wait(port, model, args.half_open)
    return {"server": name, "p99 alone ms": alone, "p99 beside 64 MB ms": beside,
            "small errors": errors, "RSS growth MiB": grown,
            "64 MB answers": sorted(set(answers)), "new client s": wait,
            "half-open refused": refused}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=500.0)
    ap.add_argument("--seconds", type=float, default=4.0)
    ap.add_argument("--bodies", type=int, default=4)
    ap.add_argument("--half-open", type=int, default=2000)
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, args.half_open + 512)),
                                                hard))
    rows = []
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        port = free_port()
        model = write_mlp(Path(tmp) / "m.onnx")
        with started([sys.executable, "-m", "servelab", "serve", "--model", f"x16={model}",
                      "--port", str(port)], f"http://127.0.0.1:{port}/v2/health/ready"
                     ) as proc:
            rows.append(judge("servelab", proc, port, "x16", args))
    py = pytriton_python()
    if py is None:
        print("no .venv-pytriton (bash scripts/test.sh builds it): servelab alone")
    else:
        port = free_port_run(3)
        with started([py, str(SERVER), str(port)],
                     f"http://127.0.0.1:{port}/v2/models/sleep/ready",
                     env=pytriton_env(py)) as proc:
            rows.append(judge("Triton 2.51", proc, port, "sleep", args))
    keys = list(rows[0])
    print(" | ".join(keys))
    for r in rows:
        print(" | ".join(f"{r[k]:.2f}" if isinstance(r[k], float) else str(r[k]) for k in keys))
    if len(rows) == 2:
        s, t = rows

        def growth(r: dict[str, object]) -> float:
            return float(r["p99 beside 64 MB ms"]) / max(float(r["p99 alone ms"]), 1e-9)

        def said(r: dict[str, object]) -> str:  # a p99 over failures is no p99
            if r["small errors"]:
                return f"{r['small errors']} small requests failed"
            return f"p99 {growth(r):.2f}x"

        print(f"beside 64 MB bodies: servelab {said(s)}, Triton {said(t)}; a new client "
              f"with {args.half_open} half-open connections: servelab "
              f"{s['new client s']:.3f} s, Triton {t['new client s']:.3f} s")


if __name__ == "__main__":
    main()
