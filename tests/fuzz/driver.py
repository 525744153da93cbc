"""Runs `servelab` command lines in one long-lived process, as the fuzz tests send them.

A line of JSON in (an argv list), a line of JSON out: the exit code, stdout and stderr
of that one run, how long it took and the process's peak memory so far. Running every
case in one process keeps a few hundred cases fast (no interpreter start, Numba's
compiled engine reused); the parent enforces the time limit by killing this process,
and the data limit below turns a runaway allocation into a MemoryError that the CLI
must report like any other input.
"""

from __future__ import annotations

import contextlib
import io
import json
import resource
import sys
import time

# Any case that tries to hold more than this fails the allocation instead of the machine.
DATA_LIMIT_BYTES = 3 * 1024**3


def _cpu_s() -> float:
    """This process's CPU time and its waited-for children's: what a case cost, which
    other work on the machine does not inflate."""
    own, kids = (resource.getrusage(w) for w in (resource.RUSAGE_SELF,
                                                  resource.RUSAGE_CHILDREN))
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def run_one(argv: list[str]) -> dict[str, object]:
    from servelab.cli import run_cli as main  # the entry point without its quick exit

    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    t0 = time.perf_counter()
    cpu0 = _cpu_s()
    sys.argv = ["servelab", *argv]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main()
        except SystemExit as exc:
            code = exc.code
        except BaseException as exc:
            code = "escaped"
            err.write(f"Traceback (escaped main): {type(exc).__name__}: {exc}\n")
    if code is None:
        code = 0
    return {
        "code": code,
        "stdout": out.getvalue()[-2000:],
        "stderr": err.getvalue()[-4000:],
        "seconds": time.perf_counter() - t0,
        "cpu_seconds": _cpu_s() - cpu0,
        "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss,
    }


def main() -> None:
    _soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
    limit = DATA_LIMIT_BYTES if hard == resource.RLIM_INFINITY else min(hard, DATA_LIMIT_BYTES)
    resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
    real_out = sys.stdout
    # Compile the engines first (Numba; a fresh clone has no cache), so a case's time is
    # the case's own work, not the JIT's.
    for warm in (["simulate", "--num-requests", "200"],
                 ["simulate", "--num-requests", "200", "--scenario", "seed"],
                 ["sweep", "qps", "--values", "1000", "--num-requests", "200"]):
        run_one(warm)
    import numpy as np

    from servelab.drift_kernels import count_numeric  # drift's kernels, both of them

    for n_edges in (3, 40):
        count_numeric(np.linspace(0, 1, 100), np.linspace(0, 1, n_edges))
    real_out.write(json.dumps({"ready": True}) + "\n")
    real_out.flush()
    for line in sys.stdin:
        result = run_one(json.loads(line))
        real_out.write(json.dumps(result) + "\n")
        real_out.flush()


if __name__ == "__main__":
    main()
