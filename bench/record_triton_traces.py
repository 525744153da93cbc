"""Record a real Triton's traces at several rates, for the replay tests' data.

Starts the test's Triton (PyTriton's bundled Triton 2.51 on CPU, `tests/triton_sleep_server.py`:
one instance, max_batch_size 32, a 2,000 us delay, a 2 ms-sleep model) with Triton's own
file trace at level TIMESTAMPS, runs `servelab load` (Poisson, open loop) at each rate on a
fresh server, and writes what the replay needs of each trace: per request, Triton's
QUEUE_START, COMPUTE_START and COMPUTE_END in ns, less the first QUEUE_START, as CSV.

    python bench/record_triton_traces.py OUT_DIR [--rates 200,500,800] [--duration 6]

Needs .venv-pytriton (scripts/test.sh builds it).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.integration.test_validate_triton import (  # noqa: E402
    pytriton_python,
    run_against_triton,
)
from tests.services import HostUse  # noqa: E402

from servelab.trace_file import read_trace  # noqa: E402

HEADER = "queue_start_ns,compute_start_ns,compute_end_ns"


def record(py: str, rate: float, duration: float, out: Path) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        expected = int(rate * duration) // 500

        def written() -> None:
            deadline = time.monotonic() + 30
            while len(list(d.glob("t.json.*"))) < expected and time.monotonic() < deadline:
                time.sleep(0.2)

        use = HostUse()
        done = run_against_triton(py, lambda port: [
            "load", "--url", f"http://127.0.0.1:{port}", "--model", "sleep", "--qps",
            f"{rate:g}", "--duration", f"{duration:g}", "--seed", "0", "--json"],
            str(d / "t.json"), before_stop=written)
        steal, others = use.shares()
        if done.returncode != 0:
            raise SystemExit(done.stderr[-2000:])
        tr = read_trace(sorted(d.glob("t.json.*")))
    t0 = int(tr.queue_ns[0])
    rows = np.stack([tr.queue_ns - t0, tr.start_ns - t0, tr.end_ns - t0], axis=1)
    np.savetxt(out, rows, fmt="%d", delimiter=",", header=HEADER, comments="")
    return f"{rate:g}/s: {len(rows)} requests, steal {steal:.1%}, others {others:.1%}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--rates", default="200,500,800")
    ap.add_argument("--duration", type=float, default=6.0)
    a = ap.parse_args()
    py = pytriton_python()
    if py is None:
        raise SystemExit("no .venv-pytriton; fix: bash scripts/test.sh builds it")
    a.out.mkdir(parents=True, exist_ok=True)
    for rate in (float(r) for r in a.rates.split(",")):
        print(record(py, rate, a.duration, a.out / f"triton_{rate:g}.csv"), flush=True)


if __name__ == "__main__":
    main()
