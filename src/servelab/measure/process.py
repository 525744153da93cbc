"""Start a server command as a user would and wait until it answers: `validate --serve`,
the tests and the benches share it."""

from __future__ import annotations

import contextlib
import socket
import subprocess
import time
from collections.abc import Iterator

from servelab.errors import StoreError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server_process(cmd: list[str], ready_url: str, timeout_s: float = 60.0
                   ) -> Iterator[subprocess.Popen[bytes]]:
    """A server command started as a user starts it, yielded once `ready_url` answers 200;
    stopped (SIGTERM, then kill) afterwards. Its stderr is in the error if it dies."""
    import httpx

    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(ready_url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                err = proc.stderr.read().decode() if proc.stderr and proc.poll() is not None \
                    else ""
                raise StoreError(f"{' '.join(cmd[:4])} did not start: {err[-2000:]}")
            time.sleep(0.2)
        yield proc
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)
        if proc.stderr is not None:
            proc.stderr.close()
