"""A stub Open Inference Protocol v2 server whose answer time is known exactly: every
inference is answered `--delay-ms` after it arrives, except that arrivals in a stall
window (`--stall-at` s after the first inference, for `--stall-ms`) are held until the
window ends. Plain asyncio, no framework, so nothing else adds time. It has model
metadata and health but no statistics or config, as a server that is not Triton may not.

    python tests/stub_v2.py PORT --delay-ms 20 [--stall-at 1.0 --stall-ms 300]

With `--failing`, it plays a Triton whose model fails every request: it has Triton's
config and statistics (each failed request counted as an execution of one, as a
backend that ran and then errored is) and answers every inference 500.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

META = {"name": "stub", "versions": ["1"], "platform": "stub",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1, 4]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1, 1]}]}
ANSWER = {"model_name": "stub", "outputs": [
    {"name": "y", "datatype": "FP32", "shape": [1, 1], "data": [0.0]}]}


def response(code: int, body: dict[str, object]) -> bytes:
    data = json.dumps(body).encode()
    reason = {200: "OK", 404: "Not Found", 500: "Internal Server Error"}[code]
    return (f"HTTP/1.1 {code} {reason}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n\r\n").encode() + data


async def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("port", type=int)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--stall-at", type=float, default=-1.0)
    ap.add_argument("--stall-ms", type=float, default=0.0)
    ap.add_argument("--failing", action="store_true")
    args = ap.parse_args()
    first: list[float] = []
    executions = [0]

    def stats() -> dict[str, object]:
        n, ns = executions[0], int(executions[0] * args.delay_ms * 1e6)
        zero = {"count": 0, "ns": 0}
        return {"model_stats": [{
            "name": "stub", "inference_count": n, "execution_count": n,
            "inference_stats": {"success": zero, "queue": zero, "compute_input": zero,
                                "compute_infer": zero, "compute_output": zero,
                                "fail": {"count": n, "ns": ns}},
            "batch_stats": [{"batch_size": 1, "compute_input": {"count": n, "ns": 0},
                             "compute_infer": {"count": n, "ns": ns},
                             "compute_output": {"count": n, "ns": 0}}] if n else []}]}

    async def hold_until(arrived: float) -> None:
        if first and args.stall_at >= 0:
            start = first[0] + args.stall_at
            end = start + args.stall_ms / 1e3
            if start <= arrived < end:
                await asyncio.sleep(end - arrived)
        await asyncio.sleep(args.delay_ms / 1e3)

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                arrived = time.monotonic()
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                length = 0
                for line in lines[1:]:
                    if line.lower().startswith("content-length:"):
                        length = int(line.split(":", 1)[1])
                if length:
                    await reader.readexactly(length)
                if method == "POST" and path == "/v2/models/stub/infer":
                    if not first:
                        first.append(arrived)
                    await hold_until(arrived)
                    if args.failing:
                        executions[0] += 1
                        out = response(500, {"error": "stub: the model failed"})
                    else:
                        out = response(200, ANSWER)
                elif args.failing and path == "/v2/models/stub/stats":
                    out = response(200, stats())
                elif args.failing and path == "/v2/models/stub/config":
                    out = response(200, {"max_batch_size": 8, "dynamic_batching": {
                        "max_queue_delay_microseconds": 100}, "instance_group": [{"count": 1}]})
                elif path == "/v2/models/stub":
                    out = response(200, META)
                elif path in ("/v2/health/ready", "/v2/health/live"):
                    out = response(200, {})
                else:
                    out = response(404, {"error": f"no route {path}"})
                writer.write(out)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    # Requests on one connection are answered in order (HTTP/1.1), each after its delay;
    # the load generator sends one request per connection at a time.
    server = await asyncio.start_server(one, "127.0.0.1", args.port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    try:
        import uvloop  # the same loop servelab's gateway runs on, when installed

        uvloop.run(main())
    except ImportError:
        asyncio.run(main())
