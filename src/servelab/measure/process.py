"""Start a server command as a user would and wait until it answers: `validate --serve`,
the tests and the benches share it."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator

from servelab.errors import StoreError, invalid

MAX_CPU_LIST = 200  # characters of a CPU list such as 0-3,8-11


def parse_cpus(field: str, text: str) -> frozenset[int]:
    """A CPU list as taskset and cpuset take it ("0-3,8,10-11"), checked against the CPUs
    this process may run on, so a pinned run never silently runs elsewhere."""
    allowed = sorted(os.sched_getaffinity(0))
    fix = f"CPUs this process may use, e.g. {allowed[0]}-{allowed[-1]}"
    if not isinstance(text, str) or not 0 < len(text) <= MAX_CPU_LIST:
        raise invalid(field, text, f"a CPU list such as 0-3,8 (at most {MAX_CPU_LIST} "
                      "characters)", fix)
    cpus: set[int] = set()
    for part in text.split(","):
        lo, sep, hi = part.strip().partition("-")
        digits = lo.isascii() and lo.isdigit() and (not sep or (hi.isascii() and hi.isdigit()))
        if not digits or len(part) > 12:  # isdigit alone takes '¹', which int() refuses
            raise invalid(field, text, "a CPU list such as 0-3,8", fix)
        a, b = int(lo), int(hi) if sep else int(lo)
        if a > b or b > allowed[-1]:
            raise invalid(field, text, f"CPUs from {allowed[0]} to {allowed[-1]}, low before "
                          "high", fix)
        cpus.update(range(a, b + 1))
    missing = cpus.difference(allowed)
    if missing:
        raise invalid(field, text, "CPUs this process may run on "
                      f"({len(allowed)} of them)", f"{fix}; not {sorted(missing)[:8]}")
    return frozenset(cpus)


def pin_this_process(cpus: frozenset[int]) -> None:
    """Run every thread of this process, and every one it starts later, on `cpus` alone
    (Linux sets affinity per thread; new threads inherit their creator's)."""
    try:
        tids = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        tids = [0]
    for tid in tids:
        with contextlib.suppress(ProcessLookupError):  # a thread that ended meanwhile
            os.sched_setaffinity(tid, cpus)


# Ports for servers this process starts are drawn below the kernel's ephemeral range
# (32768 and up on Linux), where outgoing connections take their local ports: a port the
# kernel hands out as free (bind to 0) can be taken by any client's connection between
# this check and the server's bind (the likely cause of a gRPC test refused a connection
# while two test workers ran servers and clients at once, 2026-12-05).
SERVER_PORTS = (20_000, 32_000)
PORT_TRIES = 200
# Ports this process has handed out, never handed out twice: a server that takes three
# ports draws them before it binds any, and Triton refuses to start (printing its usage)
# when two of them are the same, which a CI run met once (2026-12-06). Capped: cleared
# once it holds this many.
_HANDED_OUT: set[int] = set()
MAX_HANDED_OUT = 4_000


def free_port() -> int:
    """A port free on every address for a server about to start, drawn at random below
    the ephemeral range (SERVER_PORTS) and not handed out by this process before; one the
    kernel picks if none of PORT_TRIES is."""
    if len(_HANDED_OUT) >= MAX_HANDED_OUT:
        _HANDED_OUT.clear()
    rng = random.Random()
    for _ in range(PORT_TRIES):
        port = rng.randrange(*SERVER_PORTS)
        if port in _HANDED_OUT:
            continue
        with socket.socket() as s:
            try:
                s.bind(("0.0.0.0", port))
            except OSError:
                continue
        _HANDED_OUT.add(port)
        return port
    for _ in range(PORT_TRIES):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            break
    _HANDED_OUT.add(port)
    return port


@contextlib.contextmanager
def server_process(cmd: list[str], ready_url: str, timeout_s: float = 60.0,
                   env: dict[str, str] | None = None, cpus: frozenset[int] | None = None
                   ) -> Iterator[subprocess.Popen[bytes]]:
    """A server command started as a user starts it, yielded once `ready_url` answers 200;
    stopped afterwards with everything it started (SIGTERM to its process group, then
    SIGKILL): a server that runs another server (PyTriton runs tritonserver) leaves
    nothing behind. Its stderr goes to a file (a chatty server never blocks on a full
    pipe) and is in the error if it dies. With `cpus` it runs on those CPUs alone, set
    before it starts so every thread it makes inherits them (as `taskset -c` does)."""
    import httpx

    log = tempfile.TemporaryFile()  # noqa: SIM115 (closed in the finally below)
    pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=log, env=env,
                            start_new_session=True, preexec_fn=pin)
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
                # its first lines and its last: a server that prints its usage after
                # the error (Triton) buries the cause at the top
                said = err if len(err) <= 2000 else f"{err[:800]} [...] {err[-1200:]}"
                raise StoreError(f"{' '.join(cmd[:4])} did not start: {said}")
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
