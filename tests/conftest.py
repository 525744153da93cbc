"""Shared test helpers."""

from __future__ import annotations

import os

import numpy as np
import pytest

from servelab.batching.simulate import Records, simulate_policy
from servelab.scenario import BatchingPolicy

MS = 1_000_000  # ns

# CI replays a fixed set of examples (a failure there must be reproducible from the log);
# local runs explore new ones each time.
from hypothesis import settings  # noqa: E402

settings.register_profile("ci", derandomize=True, print_blob=True)
if os.environ.get("CI") == "true":
    settings.load_profile("ci")


def run_ms(arrivals_ms: list[float], exec_ms: float | list[float], *, instances: int = 1,
           multipliers: list[float] | None = None, **policy: object) -> Records:
    """The batcher on arrivals given in ms; exec_ms per batch (or per batch size 1..mbs)."""
    pol = BatchingPolicy(**policy)  # type: ignore[arg-type]
    table = np.zeros(pol.max_batch_size + 1)
    table[1:] = np.asarray(exec_ms, dtype=np.float64) * MS
    arr = np.rint(np.asarray(arrivals_ms, dtype=np.float64) * MS).astype(np.int64)
    mult = np.ones(len(arr)) if multipliers is None else np.asarray(multipliers, dtype=np.float64)
    return simulate_policy(arr, table, mult, pol, instances)



def load_step(**over: object):  # type: ignore[no-untyped-def]
    """A `load` step with plain figures, `over` changing some (a test's own row)."""
    from servelab.measure.load import LoadStep

    base: dict[str, object] = {
        "offered_per_s": 100.0, "concurrency": None, "requests": 1000, "ok": 1000,
        "errors": 0, "achieved_per_s": 100.0, "mean_ms": 5.5, "p50_ms": 5.0, "p90_ms": 7.0,
        "p95_ms": 8.0, "p99_ms": 9.0, "behind_p99_ms": 0.0, "p50_growth": 1.0,
        "errors_by_reason": {}, "behind_requests": 0, "cpu": {}, "server": {}}
    return LoadStep(**{**base, **over})  # type: ignore[arg-type]


def rate_check(rate: float = 100.0, *, probe_drift: float = 1.0, **measured: object
               ):  # type: ignore[no-untyped-def]
    """One `validate` rate with `measured` as its load step and nothing predicted: what
    notes_for reads."""
    from servelab.measure.validate import Prediction, RateCheck

    return RateCheck(rate, 1000, load_step(**measured), Prediction(0, 0, 0, 0, 0, 0, 0, 0, 0),
                     {}, None, None, probe_drift)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):  # type: ignore[no-untyped-def]
    """In CI (CI=true) a skipped test is a failure: a missing service must be installed.
    A fidelity check the machine was too busy to judge ("host busy") is not one."""
    rep = yield
    if os.environ.get("CI") == "true" and rep.skipped and not hasattr(rep, "wasxfail") \
            and "host busy:" not in str(rep.longrepr):
        rep.outcome = "failed"
        rep.longrepr = f"skipped in CI, where nothing may be skipped: {rep.longrepr}"
    return rep


@pytest.fixture(scope="session")
def redis_url():  # type: ignore[no-untyped-def]
    """A real redis-server on a free loopback port, started for the tests and stopped after."""
    from tests.services import redis_server

    with redis_server() as url:
        if url is None:
            pytest.skip("redis-server is not installed (apt-get install redis-server)")
        yield url


def pytest_runtest_setup(item):  # type: ignore[no-untyped-def]
    """Spark needs a JVM: without Java the Spark tests skip (and fail in CI)."""
    import shutil

    if item.get_closest_marker("spark") is not None and shutil.which("java") is None:
        pytest.skip("Java 17 is not installed (apt-get install openjdk-17-jre-headless)")
