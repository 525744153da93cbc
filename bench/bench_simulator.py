"""servelab's batcher against an equivalent SimPy model, side by side in one run.

Both get the same arrivals and the same service-time draws; the run checks that
they give the same per-request latencies, then prints simulated requests per
second for each and the ratio: single-threaded (the engine's loop is, and SimPy is).
Then the whole path a user runs, `run_simulate`, which uses a second core (arrivals
drawn ahead of the engine, half the Report's percentiles beside the other half).

    python bench/bench_simulator.py [--requests 200000] [--repeat 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.reference.simpy_triton import simulate_simpy_triton

from servelab.batching.service import build_service_model, exec_table_ns
from servelab.batching.simulate import simulate_policy
from servelab.scenario import load_scenario

CASES = {
    # name: (scenario overrides, description)
    "seed": ({}, "the seed: 2,000 QPS, 2 ms window, batch ~5, 2 GPUs"),
    "no-batching": ({"batching.max_batch_size": 1, "workload.qps": 1500.0,
                     "hardware.num_gpus": 1},
                    "max_batch_size 1, no window: one event per request (worst case)"),
    "busy": ({"workload.qps": 12_000.0, "hardware.num_gpus": 1,
              "batching.preferred_batch_size": [8, 16], "batching.max_queue_size": 64,
              "batching.default_timeout_microseconds": 5000},
             "12,000 QPS on 1 GPU, preferred sizes, bounded queue, timeouts"),
    "fleet": ({"workload.qps": 1_000_000.0, "hardware.num_gpus": 256,
               "batching.instances_per_gpu": 4},
              "1M QPS on 256 GPUs x 4 instances: instance heaps, O(log c) a step"),
}


def inputs(overrides: dict, n: int):  # type: ignore[no-untyped-def]
    s = load_scenario("seed").with_overrides({**overrides, "workload.num_requests": n})
    svc = build_service_model(s.model, s.hardware.spec(), s.batching.max_batch_size)
    rng = np.random.default_rng(7)
    arrivals = np.rint(np.cumsum(rng.exponential(1 / s.workload.qps, n)) * 1e9).astype(np.int64)
    mult = rng.gamma(25.0, 1 / 25.0, n)  # 20% spread per batch
    table = exec_table_ns(svc, s.batching.max_batch_size)
    return s, arrivals, table, mult


def best_of(fn, repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--requests", type=int, default=200_000)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    n = args.requests
    print(f"{'case':<20} {'servelab req/s':>16} {'SimPy req/s':>13} {'ratio':>8}  same latencies")
    ok_all = True
    for name, (base, desc) in CASES.items():
        s, arr, table, mult = inputs(base, n)
        pol = s.batching
        c = s.hardware.num_gpus * pol.instances_per_gpu
        simulate_policy(arr[:100], table, mult[:100], pol, c)  # JIT warm-up (cached on disk)

        def ours(arr=arr, table=table, mult=mult, pol=pol, c=c):  # type: ignore[no-untyped-def]
            return simulate_policy(arr, table, mult, pol, c)

        def theirs(arr=arr, table=table, mult=mult, pol=pol, c=c):  # type: ignore[no-untyped-def]
            return simulate_simpy_triton(arr, table, mult, set(pol.preferred_batch_size),
                                         pol.max_batch_size,
                                         pol.max_queue_delay_microseconds * 1000, c,
                                         pol.max_queue_size,
                                         pol.default_timeout_microseconds * 1000)

        t_ours, _ = best_of(ours, args.repeat)
        t0 = time.perf_counter()
        ref = theirs()
        t_simpy = time.perf_counter() - t0
        r = ours()
        same = (np.array_equal(r.status, ref["status"])
                and np.array_equal(r.end_ns - r.arrival_ns, ref["end_ns"] - r.arrival_ns)
                and np.array_equal(r.start_ns, ref["start_ns"]))
        ok_all &= same
        print(f"{name:<20} {n / t_ours:>16,.0f} {n / t_simpy:>13,.0f} {t_simpy / t_ours:>7.0f}x"
              f"  {'yes' if same else 'NO'}   ({desc})")
    print(f"\n{n:,} requests per case; servelab best of {args.repeat}, SimPy one run; "
          "one core each.")
    # The whole path a user runs: draw arrivals and service times, simulate, build the Report.
    for size in (1_000_000, 200_000):  # the seed at a million requests, and as shipped
        print(whole_path(size))
    print(memory_per_request(5_000_000))  # the most a scenario may ask for
    print(plan_wall_time())
    if not ok_all:
        sys.exit("latencies differ between servelab and SimPy")


MEMORY_PROBE = """
import gc, resource, sys, time
from servelab.api import run_simulate
from servelab.scenario import load_scenario

def status(name):
    for line in open("/proc/self/status"):
        if line.startswith(name + ":"):
            return int(line.split()[1]) * 1024

s = load_scenario("seed")
run_simulate(s.with_overrides({"workload.num_requests": 1000}))  # imports, compiled code
n = int(sys.argv[1])
gc.collect()
try:  # reset the peak to the current RSS (Linux 4.0+), so the peak is this run's own
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    base, how = status("VmRSS"), "peak RSS over RSS before the run"
except OSError:  # no reset: the process's peak so far, which can hide part of the run's
    base, how = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, "ru_maxrss growth"
t = time.perf_counter()
run_simulate(s.with_overrides({"workload.num_requests": n}))
t = time.perf_counter() - t
peak = status("VmHWM")
print(f"{n:,} seed requests through run_simulate: {t:.2f} s ({n / t:,.0f} req/s), "
      f"peak memory {(peak - base) / n:.1f} bytes per request (target <= 40; {how})")
"""


WHOLE_PATH = """
import statistics, sys, time
from servelab.api import run_simulate
from servelab.scenario import load_scenario

n, runs = int(sys.argv[1]), int(sys.argv[2])
s = load_scenario("seed").with_overrides({"workload.num_requests": n})
run_simulate(s)  # imports, compiled code, the aside threads
times = []
for _ in range(runs):
    t0 = time.perf_counter()
    run_simulate(s)
    times.append(time.perf_counter() - t0)
best, med = min(times), statistics.median(times)
print(f"full report path (servelab simulate, {n:,} requests, seed): best {best * 1e3:.2f} ms "
      f"= {n / best:,.0f} req/s, median {med * 1e3:.2f} ms = {n / med:,.0f} req/s (target "
      f"20M; {runs} runs in a fresh process; two threads)")
"""


def whole_path(n: int, runs: int = 15) -> str:
    """`run_simulate` on the seed at n requests, in a fresh process as a user's command
    runs it (not after the SimPy runs' millions of objects, in this one)."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", WHOLE_PATH, str(n), str(runs)],
                         capture_output=True, text=True, check=True)
    return out.stdout.strip()


def memory_per_request(n: int) -> str:
    """The whole path's peak memory per request, by the process's resident set (Numba's
    own allocations included, which tracemalloc does not see), in a fresh process."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", MEMORY_PROBE, str(n)], capture_output=True,
                         text=True, check=True)
    return out.stdout.strip()


def plan_wall_time(runs: int = 5) -> str:
    """`servelab plan --scenario seed` from a fresh process, wall clock, beside the floor
    any such command pays: Python starting and importing NumPy and Numba (median of
    `runs` each, interleaved)."""
    import subprocess

    cmds = {"plan": [sys.executable, "-m", "servelab", "plan", "--scenario", "seed"],
            "floor": [sys.executable, "-c", "import numpy, numba"]}
    times: dict[str, list[float]] = {k: [] for k in cmds}
    for _ in range(runs):
        for k, cmd in cmds.items():
            t0 = time.perf_counter()
            subprocess.run(cmd, capture_output=True, check=True)
            times[k].append(time.perf_counter() - t0)
    plan, floor = (statistics.median(times[k]) for k in cmds)
    return (f"servelab plan --scenario seed: {plan:.2f} s wall (median of {runs}; target < 1 s)"
            f"; python + import numpy, numba alone: {floor:.2f} s; plan / floor = "
            f"{plan / floor:.2f}x")


if __name__ == "__main__":
    main()
