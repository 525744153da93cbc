"""Shared test helpers."""

from __future__ import annotations

import numpy as np

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
