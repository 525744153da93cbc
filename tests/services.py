"""Start the real services tests and benches need, on free loopback ports."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

from servelab.measure.process import free_port, server_process

__all__ = ["free_port", "free_port_run", "redis_server", "server_process"]


def free_port_run(count: int) -> int:
    """The first of `count` consecutive ports free on every address, below the kernel's
    ephemeral range (32768 and up), so a client's outgoing connection cannot take one of
    them between this check and the server's bind (Triton binds HTTP, GRPC and metrics on
    0.0.0.0, at port, port + 1 and port + 2)."""
    import random

    rng = random.Random()
    for _ in range(200):
        base = rng.randrange(20_000, 32_000 - count)
        socks = []
        try:
            for k in range(count):
                s = socket.socket()
                socks.append(s)
                s.bind(("0.0.0.0", base + k))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no run of {count} free ports between 20000 and 32000")


@contextlib.contextmanager
def redis_server() -> Iterator[str | None]:
    """A throwaway redis-server (no persistence); yields its URL, or None if not installed."""
    exe = shutil.which("redis-server")
    if exe is None:
        yield None
        return
    port = free_port()
    workdir = tempfile.mkdtemp(prefix="servelab-redis-")
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "",
                             "--appendonly", "no", "--dir", workdir],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("redis-server did not start") from None
                time.sleep(0.05)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        shutil.rmtree(workdir, ignore_errors=True)

