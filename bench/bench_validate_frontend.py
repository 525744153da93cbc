"""`validate --serve demo` with and without the gateway's front end in the simulator.

Each run is one `validate --serve demo` (servelab's gateway, its fitted front end: one
event loop, a cost per request held to what the profile's closed loops passed and the
rest of the low-load cost per turn). On the very measurement of each rate the
prediction is made again without the front end (the measured time outside as a delay),
with one first-come-first-served worker, with the event loop and no cost per turn, and
with the event loop at the whole low-load cost a request, side by side on the same
data. Prints the errors of mean batch, p50 and p99 per rate and run, and a summary line
per variant: the largest |error| of each figure over the runs.

    python bench/bench_validate_frontend.py [--runs 3] [--duration 5]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servelab.measure.loadgen import poisson_offsets
from servelab.measure.validate import (
    Profile,
    ValidationSpec,
    compare,
    predict,
    run_validation,
)
from servelab.scenario import Scenario

FIGURES = ("mean_batch", "p50_ms", "p99_ms")


def variants(fit: Scenario, prof: Profile) -> dict[str, Scenario]:
    """The fitted scenario (an event loop: a cost per request, held to what the profile's
    closed loops passed, and the rest of the low-load cost per turn), and on the same
    measurement: no station; one FIFO worker; the event loop with no cost per turn (the
    held cost alone); and the event loop at the whole low-load cost a request."""
    outside = [round(max(float(x), 0.001), 4) for x in prof.outside_ms]
    low = prof.handling_ms or 0.0
    less_cpu = [round(max(float(x) - prof.frontend_cpu_ms, 0.001), 4) for x in prof.outside_ms]
    return {
        "event loop (fitted)": fit,
        "no front end": fit.with_overrides({"latency.frontend_workers": 0,
                                            "latency.frontend_event_loop": False,
                                            "latency.frontend_turn_ms": 0.0,
                                            "latency.network_samples_ms": outside}),
        "1 FIFO worker": fit.with_overrides({"latency.frontend_event_loop": False,
                                             "latency.frontend_turn_ms": 0.0,
                                             "latency.network_samples_ms": less_cpu}),
        "event loop, no turn cost": fit.with_overrides({"latency.frontend_turn_ms": 0.0,
                                                        "latency.network_samples_ms": less_cpu}),
        "event loop, low-load cost a request": fit.with_overrides({
            "latency.frontend_cpu_ms": round(max(low, 1e-6), 6),
            "latency.frontend_turn_ms": 0.0,
            "latency.network_samples_ms": [round(max(float(x) - low, 0.001), 4)
                                           for x in prof.outside_ms]}),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--duration", type=float, default=5.0)
    a = ap.parse_args()
    worst: dict[str, dict[str, float]] = {}
    for run in range(a.runs):
        # the profile's prediction, as the variants below remake it (not a warm-up's)
        spec = ValidationSpec(serve="demo", duration_s=a.duration, seed=run,
                              calibrate_at_rate=False)
        rep = run_validation(spec, say=lambda m: print(m, file=sys.stderr))
        prof = rep.profile
        print(f"run {run + 1} (seed {run}): saturation {rep.saturation_per_s:.0f}/s, closed "
              f"loop {rep.closed_loop_per_s:.0f}/s, front end {prof.frontend_cpu_ms:.3f} ms "
              f"a request and {prof.frontend_turn_ms:.3f} ms a turn (low-load cost "
              f"{prof.handling_ms or 0:.3f} ms), steal while profiling "
              f"{prof.host_cpu_steal or 0:.1%}")
        for k, r in enumerate(rep.rates):
            m = r.measured
            print(f"  {r.rate_per_s:g}/s: measured batch {m.server.get('mean_batch'):.2f}, "
                  f"p50 {m.p50_ms:.2f} ms, p99 {m.p99_ms:.2f} ms; probe x{r.probe_drift:.2f}")
            offsets = poisson_offsets(r.rate_per_s, r.requests, spec.seed + k)
            for name, s in variants(rep.fit, prof).items():
                c = compare(m, predict(s, offsets, spec.seed + k))
                errs = {f: c[f].error for f in FIGURES}
                if name == "event loop (fitted)":  # validate's own prediction, remade
                    assert errs == {f: r.compare[f].error for f in FIGURES}, (errs, r.compare)
                w = worst.setdefault(name, dict.fromkeys(FIGURES, 0.0))
                for f, e in errs.items():
                    w[f] = max(w[f], abs(e) if e is not None else float("inf"))
                print(f"    {name:20s} batch {errs['mean_batch']:+6.1%}  p50 "
                      f"{errs['p50_ms']:+6.1%}  p99 {errs['p99_ms']:+6.1%}")
    print("largest |error| over every rate and run:")
    for name, w in worst.items():
        print(f"  {name:20s} batch {w['mean_batch']:.1%}  p50 {w['p50_ms']:.1%}  "
              f"p99 {w['p99_ms']:.1%}")


if __name__ == "__main__":
    main()
