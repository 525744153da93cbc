"""PSI over 10M rows x 20 features against a 1M-row reference: servelab.drift beside a
plain-NumPy PSI (np.quantile edges, np.searchsorted, np.bincount: what one writes first),
same data, same bins, in one run. Prints seconds, values per second and the ratio, and
checks both give the same PSI. In memory: reading Parquet is not part of the timing.

    python bench/bench_drift.py [--rows 10000000] [--features 20] [--reference 1000000]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.reference.psi_numpy import psi_numeric

from servelab import drift


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--features", type=int, default=20)
    ap.add_argument("--reference", type=int, default=1_000_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    print(f"generating {args.rows:,} x {args.features} current and {args.reference:,} x "
          f"{args.features} reference values (float64, 1% missing)...", flush=True)
    ref = [rng.normal(size=args.reference) for _ in range(args.features)]
    cur = [rng.normal(0.02 * j, 1.0, size=args.rows) for j in range(args.features)]
    for c in cur:
        c[rng.random(c.size) < 0.01] = np.nan
    # compile once, outside the timing (a fresh clone has no Numba cache)
    drift.feature_drift("warm", ref[0][:1000], cur[0][:1000])

    def ours() -> list[float]:
        return [drift.feature_drift(f"f{j}", ref[j], cur[j]).psi for j in range(args.features)]

    def numpy_only() -> list[float]:
        return [psi_numeric(ref[j], cur[j], drift.DEFAULT_BINS, drift.DEFAULT_EPSILON)
                for j in range(args.features)]

    times: dict[str, list[float]] = {"servelab": [], "numpy": []}
    results = {}
    for _ in range(args.repeat):
        for name, fn in (("servelab", ours), ("numpy", numpy_only)):
            t0 = time.perf_counter()
            results[name] = fn()
            times[name].append(time.perf_counter() - t0)
    assert np.allclose(results["servelab"], results["numpy"], rtol=1e-9), "PSI differs"
    values = (args.rows + args.reference) * args.features
    best = {k: min(v) for k, v in times.items()}
    for name in ("servelab", "numpy"):
        print(f"{name:9} best {best[name]:.3f} s of {args.repeat} "
              f"(all: {', '.join(f'{t:.3f}' for t in times[name])}), "
              f"{values / best[name] / 1e6:.0f}M values/s")
    print(f"ratio: servelab is {best['numpy'] / best['servelab']:.1f}x the plain-NumPy PSI; "
          f"same PSI on all {args.features} features")


if __name__ == "__main__":
    main()
