"""A real Triton (2.x, bundled by PyTriton, on CPU) serving a small model whose time is
a 2 ms sleep plus a small matmul, one instance, max_batch_size 32, 2,000 us delay.
Triton's statistics API is left open (PyTriton restricts it by default), since
`servelab validate` profiles the model from it.

    LD_LIBRARY_PATH=<python libdir> .venv-pytriton/bin/python tests/triton_sleep_server.py PORT
        [TRACE_FILE]

With TRACE_FILE, Triton traces every request at level TIMESTAMPS, writing them to
TRACE_FILE.0, TRACE_FILE.1 ... every 500 requests (a file written only at shutdown is
lost when the server is stopped by a signal), for `servelab replay-trace`.
"""

import sys
import time

import numpy as np
from pytriton.decorators import batch
from pytriton.model_config import DynamicBatcher, ModelConfig, Tensor
from pytriton.triton import Triton, TritonConfig, TritonSecurityConfig

W = np.random.default_rng(0).normal(size=(16, 4)).astype(np.float32)


@batch
def infer(x):  # type: ignore[no-untyped-def]
    time.sleep(0.002)
    return {"y": (x.astype(np.float32) @ W).astype(np.float32)}


def main() -> None:
    port = int(sys.argv[1])
    config = TritonConfig(http_port=port, grpc_port=port + 1, metrics_port=port + 2)
    security = TritonSecurityConfig(
        restricted_endpoints=["shared-memory", "model-repository", "trace", "logging"])
    triton = Triton(config=config, security_config=security)
    if len(sys.argv) > 2:
        # PyTriton's own trace_config accepts only OpenTelemetry mode, so Triton's file
        # trace is passed to tritonserver's command line directly, before it starts
        # (the server config PyTriton 0.7 builds in Triton.__init__).
        triton._triton_server_config["trace-config"] = [
            "level=TIMESTAMPS", "rate=1", "count=-1", "triton,log-frequency=500",
            f"triton,file={sys.argv[2]}"]
    with triton as t:
        t.bind("sleep", infer, inputs=[Tensor(name="x", dtype=np.float32, shape=(16,))],
               outputs=[Tensor(name="y", dtype=np.float32, shape=(4,))],
               config=ModelConfig(max_batch_size=32,
                                  batcher=DynamicBatcher(max_queue_delay_microseconds=2000)))
        t.serve()


if __name__ == "__main__":
    main()
