"""Start a server command as a user would and wait until it answers: `validate --serve`,
the tests and the benches share it."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

from servelab.errors import StoreError


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.contextmanager
def server_process(cmd: list[str], ready_url: str, timeout_s: float = 60.0,
                   env: dict[str, str] | None = None) -> Iterator[subprocess.Popen[bytes]]:
    """A server command started as a user starts it, yielded once `ready_url` answers 200;
    stopped afterwards with everything it started (SIGTERM to its process group, then
    SIGKILL): a server that runs another server (PyTriton runs tritonserver) leaves
    nothing behind. Its stderr goes to a file (a chatty server never blocks on a full
    pipe) and is in the error if it dies."""
    import httpx

    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below)
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                if httpx.get(ready_url, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                log.seek(0)
                err = log.read().decode(errors="replace")
                raise StoreError(f"{' '.join(cmd[:4])} did not start: {err[-2000:]}")
            time.sleep(0.2)
        yield proc
    finally:
        _stop_group(proc)
        log.close()


def _stop_group(proc: subprocess.Popen[bytes]) -> None:
    def signal_group(sig: int) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)

    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
    try:
        os.killpg(proc.pid, 0)  # anything it started still running?
    except (ProcessLookupError, PermissionError):
        return
    signal_group(signal.SIGTERM)
    time.sleep(0.2)
    signal_group(signal.SIGKILL)
