"""Where servelab's gateway's event loop spends a request: its parse side or its answer
side. `validate` splits the front end's fitted cost a request by this share
(measure/validate.py, ANSWER_SHARE): the answer is written when the request's batch
ends, so a loop busy answering hands the batcher more requests at once.

The gateway runs as `servelab serve` (uvloop, the demo model `validate --serve demo`
serves) with the loop's Python work timed by side:

- **parse**: the HTTP protocol's `data_received` (httptools' parse) and each request
  task's first step (the body, the JSON parse, the submit to the batcher, up to the wait
  for its batch);
- **answer**: the batch's delivery to its requests (`AsyncBatcher._deliver`) and each
  request task's later steps (the response built and written).

Times are wall time inside those callbacks (a wait for the GIL inside them counts). The
main thread's CPU time over the same run is printed beside them: what it spends
outside the timed callbacks is uvloop's own (select, socket reads and wake-ups).

    python bench/gateway_loop_split.py [--rates 330,820,1310] [--duration 5]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import types
from collections import defaultdict
from collections.abc import Generator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

CHILD = "SERVELAB_LOOP_SPLIT_OUT"  # set: this process is the timed gateway


def child() -> None:
    """`servelab serve` with the loop's callbacks timed; on SIGUSR1 the totals since the
    last are appended to $SERVELAB_LOOP_SPLIT_OUT as one JSON line."""
    tot: defaultdict[str, int] = defaultdict(int)
    cnt: defaultdict[str, int] = defaultdict(int)
    clock = time.perf_counter_ns

    def rec(side: str, ns: int) -> None:
        tot[side] += ns
        cnt[side] += 1

    @types.coroutine
    def timed(coro: Any) -> Generator[Any, Any, Any]:
        """The request task's coroutine, each of its steps timed: the first (parse side)
        and the later ones (answer side)."""
        step, value, exc = 0, None, None
        while True:
            t = clock()
            try:
                out = coro.send(value) if exc is None else coro.throw(exc)
            except StopIteration as stop:
                rec("task first" if step == 0 else "task later", clock() - t)
                return stop.value
            rec("task first" if step == 0 else "task later", clock() - t)
            step += 1
            try:
                value, exc = (yield out), None
            except BaseException as e:  # handed on to the coroutine, as a task would
                value, exc = None, e

    import uvicorn.protocols.http.httptools_impl as h

    import servelab.gateway.batcher as b

    run_asgi = h.RequestResponseCycle.run_asgi
    h.RequestResponseCycle.run_asgi = lambda self, app: timed(run_asgi(self, app))  # type: ignore[method-assign]

    def wrap(cls: Any, name: str, side: str) -> None:
        inner = getattr(cls, name)

        def call(self: Any, *a: Any) -> Any:
            t = clock()
            try:
                return inner(self, *a)
            finally:
                rec(side, clock() - t)
        setattr(cls, name, call)

    wrap(h.HttpToolsProtocol, "data_received", "data_received")
    wrap(b.AsyncBatcher, "_deliver", "deliver")
    last = {"cpu": time.thread_time_ns(), "wall": clock()}

    def dump(*_: Any) -> None:
        cpu, wall = time.thread_time_ns(), clock()
        with open(os.environ[CHILD], "a") as f:
            f.write(json.dumps({"ns": dict(tot), "count": dict(cnt),
                                "main_cpu_ns": cpu - last["cpu"],
                                "wall_ns": wall - last["wall"]}) + "\n")
        tot.clear()
        cnt.clear()
        last.update(cpu=cpu, wall=wall)

    signal.signal(signal.SIGUSR1, dump)
    from servelab.cli import app
    sys.argv = ["servelab", *sys.argv[1:]]
    app()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="330,820,1310", help="requests/s, comma-separated")
    ap.add_argument("--duration", type=float, default=5.0, help="seconds a rate")
    a = ap.parse_args()
    rates = [float(r) for r in a.rates.split(",")]
    if not rates or not all(1 <= r <= 5000 for r in rates) or not 1 <= a.duration <= 60:
        sys.exit("--rates: 1 to 5000 each; --duration: 1 to 60 s")
    from servelab.gateway.demo import VALIDATION_MLP, write_mlp
    from servelab.measure.process import free_port, server_process

    with tempfile.TemporaryDirectory(prefix="servelab-split-") as tmp:
        model = write_mlp(Path(tmp) / "mlp.onnx", **VALIDATION_MLP)
        out = Path(tmp) / "split.jsonl"
        port = free_port()
        url = f"http://127.0.0.1:{port}"
        load = [sys.executable, "-m", "servelab", "load", "--url", url, "-m", "mlp", "--json"]
        with server_process([sys.executable, __file__, "serve", "--model", f"mlp={model}",
                             "--port", str(port)], f"{url}/v2/health/ready",
                            env={**os.environ, CHILD: str(out)}) as server:
            subprocess.run([*load, "--qps", "300", "--duration", "3"], capture_output=True,
                           check=True)  # warm-up, not counted
            server.send_signal(signal.SIGUSR1)
            time.sleep(0.5)
            for r in rates:
                subprocess.run([*load, "--qps", f"{r:g}", "--duration", f"{a.duration:g}"],
                               capture_output=True, check=True)
                server.send_signal(signal.SIGUSR1)
                time.sleep(0.5)
        lines = [json.loads(x) for x in out.read_text().splitlines()][1:]
    print("rate/s  requests  parse ms  answer ms  answer share  loop CPU ms  loop busy")
    for r, d in zip(rates, lines, strict=False):
        ns, n = d["ns"], max(d["count"].get("task first", 0), 1)
        parse = (ns.get("data_received", 0) + ns.get("task first", 0)) / n / 1e6
        answer = (ns.get("deliver", 0) + ns.get("task later", 0)) / n / 1e6
        print(f"{r:6g}  {n:8d}  {parse:8.3f}  {answer:9.3f}  {answer / (parse + answer):12.2f}"
              f"  {d['main_cpu_ns'] / n / 1e6:11.3f}  {d['main_cpu_ns'] / d['wall_ns']:9.0%}")


if __name__ == "__main__":
    if os.environ.get(CHILD):
        child()
    else:
        main()
