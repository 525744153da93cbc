"""Does the gateway's speed drift from batch to batch, and does drawing its batch times
in runs predict a run's tail better? The evidence behind validate's series
(`stall_fit.speed_series`, `[model] multiplier_block`; issue 28).

Each rate is one traced run of `servelab serve` (the demo model `validate --serve demo`
serves; `gateway_tail_split.traced_run`). It prints, for each batch's time over its
size's mean (stalls at their usual time), the autocorrelation at several lags and the
spread of its 200 ms means beside what independent batches would give. It then reads
the run's first half as a warm-up (each size's time without its stalls, plus its
turnaround; the stalls; the series) and predicts the second half on its own send times
(the simulated event loop with `--cost-ms`, `--turn-ms`, `--answer-ms`, validate's
"front end" line), four ways: each size's mean, the series drawn one by one, and in runs
of 20 and of 100 batches. Queue + compute, measured beside each, the mean of four draws.

    python bench/gateway_speed_series.py [--rates 800,1150] [--duration 14]
        [--cost-ms 0.357 --answer-ms 0.238 --turn-ms 0.029]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "bench"))

from gateway_tail_split import traced_run  # noqa: E402
from servelab.batching.answering import answering_run  # noqa: E402
from servelab.batching.service import draw_multipliers  # noqa: E402
from servelab.batching.stalls import Stalls  # noqa: E402
from servelab.gateway.demo import VALIDATION_MLP, write_mlp  # noqa: E402
from servelab.measure.replay import batches_of, measured_batches  # noqa: E402
from servelab.measure.stall_fit import fit_stalls, speed_series  # noqa: E402
from servelab.scenario import BatchingPolicy, Variability  # noqa: E402
from servelab.trace_file import TraceRequests  # noqa: E402

POLICY = BatchingPolicy(max_batch_size=32, max_queue_delay_microseconds=2000)  # the demo's
LAGS = (1, 2, 5, 10, 20, 50, 100)
WINDOW_NS = 200_000_000
MARGIN_NS = 200_000_000  # the predicted half starts this long after the warm-up's end
DRAWS = 4


def drift(start_ns: np.ndarray, end_ns: np.ndarray) -> str:
    series = speed_series(start_ns, end_ns, clean=True)
    x = series - series.mean()
    acf = [float(np.corrcoef(x[:-lag], x[lag:])[0, 1]) for lag in LAGS]
    b_start = batches_of(start_ns, end_ns)[0]
    window = (b_start - b_start[0]) // WINDOW_NS
    counts = np.bincount(window)
    full = np.flatnonzero(counts >= 10)
    means = np.array([series[window == w].mean() for w in full])
    independent = series.std() / np.sqrt(counts[full].mean())
    return (f"cv {series.std():.3f}; autocorrelation at lags {', '.join(map(str, LAGS))}: "
            + " ".join(f"{a:+.2f}" for a in acf)
            + f"\n    200 ms means: sd {means.std():.3f} (independent batches "
              f"{independent:.3f}), {means.min():.2f}-{means.max():.2f}")


def one_rate(model: Path, rate: float, a: argparse.Namespace, folder: Path) -> None:
    res, tr = traced_run(model, rate, a.duration, a.seed, folder)
    keep = tr.queue_ns >= res.t0_ns  # the run's requests (the warm-up's came before t0)
    queued, start, end = tr.queue_ns[keep], tr.start_ns[keep], tr.end_ns[keep]
    print(f"{rate:.0f}/s: {drift(start, end)}")
    mid = res.t0_ns + int(a.duration * 5e8)
    first = queued < mid
    warm = TraceRequests(tr.model, queued[first], start[first], end[first], 0)
    mb = measured_batches(warm, POLICY.max_batch_size,
                          POLICY.max_queue_delay_microseconds * 1000)
    stalls = fit_stalls(warm.start_ns, warm.end_ns)
    assert stalls is not None
    table = mb.table_ns.copy()
    for k, (count, ns) in stalls.clean.items():
        table[k] = ns / count + mb.turnaround_ns[k]
    series = speed_series(warm.start_ns, warm.end_ns, clean=True)
    sent_at = np.maximum(res.sent_ns, res.intended_ns)[res.status == 200] + res.t0_ns
    sent = np.sort(sent_at[sent_at >= mid + MARGIN_NS]) - mid
    later = queued >= mid + MARGIN_NS
    measured = (end[later] - queued[later]) / 1e6
    print("    second half, queue + compute (ms)   p50    p90    p99   mean batch")
    print(f"    {'measured':32s}" + "".join(f"{np.percentile(measured, p):7.2f}"
                                            for p in (50, 90, 99))
          + f"   {later.sum() / np.unique(start[later]).size:6.2f}")
    costs = (round(a.cost_ms * 1e6), round(a.turn_ms * 1e6), round(a.answer_ms * 1e6))
    for name, block in (("each size's mean", 0), ("drawn one by one", 1),
                        ("drawn in runs of 20", 20), ("drawn in runs of 100", 100)):
        figures = []
        for draw in range(DRAWS):
            rng = np.random.default_rng(draw)
            mult = (np.ones(1) if not block else draw_multipliers(
                Variability.EMPIRICAL, 0.0, sent.size + 1, rng, tuple(series), block))
            whole = Stalls(stalls.per_s, stalls.lengths_ms, np.random.default_rng(100 + draw))
            (_, batch, size, _, b_end, _), at_batcher, _ = answering_run(
                whole.to_server(sent), *costs, table, mult, POLICY, 1)
            done = batch >= 0
            took = (whole.to_real(b_end[batch[done]]) - whole.to_real(at_batcher[done])) / 1e6
            figures.append([*np.percentile(took, (50, 90, 99)), float(np.mean(size))])
        print(f"    {name:32s}" + "".join(f"{v:7.2f}" for v in np.mean(figures, axis=0)[:3])
              + f"   {np.mean(figures, axis=0)[3]:6.2f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="800,1150", help="requests/s, comma-separated")
    ap.add_argument("--duration", type=float, default=14.0, help="seconds a rate")
    ap.add_argument("--seed", type=int, default=5, help="the runs' arrivals")
    ap.add_argument("--cost-ms", type=float, default=0.357, help="the loop's parse a request")
    ap.add_argument("--answer-ms", type=float, default=0.238, help="its answer a request")
    ap.add_argument("--turn-ms", type=float, default=0.029, help="its cost a turn")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="servelab-bench-") as tmp:
        model = write_mlp(Path(tmp) / "mlp.onnx", **VALIDATION_MLP)
        for rate in (float(r) for r in a.rates.split(",")):
            one_rate(model, rate, a, Path(tmp))


if __name__ == "__main__":
    main()
