"""Start the real services tests and benches need, on free loopback ports."""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator

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



# A measured run is judged on a machine whose hypervisor left its CPUs alone: session 7
# measured steal up to 15% of the CPUs' time on this kind of machine, with profiles up to
# 65% slow and 20-60 ms stalls in p99, where quiet sessions held every tolerance.
QUIET_STEAL = 0.03
ATTEMPTS = 3


def steal_of(report: dict) -> float:
    """The largest share of CPU time the hypervisor took in any phase of a validate run
    (the profile and each rate)."""
    phases = [report["profile"].get("host_cpu_steal")] + [
        r["measured"].get("host_cpu_steal") for r in report["rates"]]
    return max((x for x in phases if x is not None), default=0.0)


def judged_on_quiet_runs(run: Callable[[int], dict], misses: Callable[[dict], list[str]]
                         ) -> None:
    """Run `run(attempt)` (a validate report, its other checks asserted inside) up to
    ATTEMPTS times, each on a fresh server, until one has no `misses`. Fails if none
    had none and any of them was quiet (steal at most QUIET_STEAL); if every run was
    noisy, says that the prediction was not judged."""
    tried: list[tuple[float, list[str]]] = []
    for attempt in range(ATTEMPTS):
        report = run(attempt)
        tried.append((steal_of(report), misses(report)))
        print(f"run {attempt + 1}: steal {tried[-1][0]:.1%}, misses {tried[-1][1]}")
        if not tried[-1][1]:
            return
    quiet = [t for t in tried if t[0] <= QUIET_STEAL]
    assert not quiet, f"runs with the CPUs quiet missed: {quiet} (all runs: {tried})"
    print(f"not judged: the hypervisor took {min(t[0] for t in tried):.0%} or more of the "
          f"CPUs' time in every run: {tried}")
