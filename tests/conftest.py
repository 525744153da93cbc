"""Shared test helpers."""

from __future__ import annotations

import os

import numpy as np
import pytest

from servelab.batching.simulate import Records, simulate_policy
from servelab.scenario import BatchingPolicy

MS = 1_000_000  # ns


def run_ms(arrivals_ms: list[float], exec_ms: float | list[float], *, instances: int = 1,
           multipliers: list[float] | None = None, **policy: object) -> Records:
    """The batcher on arrivals given in ms; exec_ms per batch (or per batch size 1..mbs)."""
    pol = BatchingPolicy(**policy)  # type: ignore[arg-type]
    table = np.zeros(pol.max_batch_size + 1)
    table[1:] = np.asarray(exec_ms, dtype=np.float64) * MS
    arr = np.rint(np.asarray(arrivals_ms, dtype=np.float64) * MS).astype(np.int64)
    mult = np.ones(len(arr)) if multipliers is None else np.asarray(multipliers, dtype=np.float64)
    return simulate_policy(arr, table, mult, pol, instances)



@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    """In CI (CI=true) a skipped test is a failure: a missing service must be installed."""
    rep = yield
    if os.environ.get("CI") == "true" and rep.skipped and not hasattr(rep, "wasxfail"):
        rep.outcome = "failed"
        rep.longrepr = f"skipped in CI, where nothing may be skipped: {rep.longrepr}"
    return rep


@pytest.fixture(scope="session")
def redis_url():  # type: ignore[no-untyped-def]
    """A real redis-server on a free loopback port, started for the tests and stopped after."""
    import shutil
    import socket
    import subprocess
    import tempfile
    import time

    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
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
