"""How far does one measurement of a rate repeat, here? The ceiling on what any
prediction can show against it (issue 28's `validate --serve demo` and `--url` targets),
and whether a warm-up after the run beside the one before would say more of the run
than the one before alone (as `llm validate` brackets each step with a profile).

One server, warmed 3 s at 300/s: the demo gateway (`validate --serve demo`'s model and
batching; the rates 20%, 50% and 80% of the saturation validate's own search finds), or
with `--triton` the integration test's real Triton (PyTriton's, the `sleep` model, its
trace on as `validate --url --trace-file` runs it; the test's rates 100, 250 and 400/s).
Each rate is measured four times in a row, each on its own Poisson arrivals: a first
warm-up and a second (each half the run's requests, as validate's warm-up), the run,
then a warm-up after it. Held to the run as if each were the prediction, on issue 28's
target (mean batch and p50 within 10%, p99 within 20%; 30% at 80% of saturation with
the gateway):

- **before**: the warm-up just before the run, the one validate takes today;
- **after**: the one just after it;
- **both**: before and after pooled (their latencies together, their requests over their
  batches): what a bracketed warm-up would give;
- **two before**: both warm-ups before the run, pooled: as many requests as "both", all
  before the run (whether "both" gains by its size or by its bracket);
- **run, first half** and **second half**: each half of the run itself (by send time,
  the batch taken as the whole run's) held to the whole run. A half differs from the
  whole by half the difference of the halves, which spreads as much as the whole run's
  own figure spreads about what the server would give on average at that rate: so the
  share of rates a half meets is about the share that a perfect prediction, one that
  knew that average exactly, would meet on that run.

These are measurements only (no simulation): they say how far the measurement repeats,
not how well the model does.

    python bench/validate_repeat.py [--rounds 3] [--duration 10] [--rates R1,R2,R3]
    python bench/validate_repeat.py --triton [--duration 5]
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from tests.services import HostUse  # noqa: E402

from servelab.gateway.demo import VALIDATION_MLP, write_mlp  # noqa: E402
from servelab.measure.load import Target, measure_rate, metadata, parse_url  # noqa: E402
from servelab.measure.loadgen import LoadResult, poisson_offsets  # noqa: E402
from servelab.measure.process import free_port, server_process  # noqa: E402
from servelab.measure.validate import (  # noqa: E402
    WARMUP_MIN,
    WARMUP_SHARE,
    _delta,
    batch_stats,
    random_bodies,
    read_policy,
    saturation,
)

WAYS = ("before", "after", "both", "two before", "run, first half", "run, second half")


class Segment:
    """One measured stretch: its latencies (ms, answered requests) and its batches."""

    def __init__(self, lat_ms: np.ndarray, requests: int, batches: int) -> None:
        self.lat_ms, self.requests, self.batches = lat_ms, requests, batches

    def figures(self) -> tuple[float, float, float]:
        return (self.requests / max(self.batches, 1), float(np.percentile(self.lat_ms, 50)),
                float(np.percentile(self.lat_ms, 99)))

    @staticmethod
    def pooled(a: Segment, b: Segment) -> Segment:
        return Segment(np.concatenate([a.lat_ms, b.lat_ms]), a.requests + b.requests,
                       a.batches + b.batches)


def measure(t: Target, bodies: list[bytes | tuple[bytes, int]], rate: float, n: int,
            seed: int) -> tuple[Segment, LoadResult]:
    before = batch_stats(t)
    got: list[LoadResult] = []
    measure_rate(t, bodies, rate, n, seed, 256, offsets=poisson_offsets(rate, n, seed),
                 on_result=got.append)
    after = batch_stats(t)
    if before is None or after is None:
        sys.exit("the server answered no statistics (did it exit?)")
    d = _delta(before, after)
    rows = sum(k * c for k, (c, _) in d.items())
    res = got[0]
    return Segment(res.latency_ms, rows,
                   sum(c for c, _ in d.values())), res


def halves(res: LoadResult, whole: Segment) -> tuple[Segment, Segment]:
    """The run's halves by intended send time (the batch split by requests)."""
    ok = res.status == 200
    order = np.argsort(res.intended_ns[ok])
    lat = ((res.done_ns[ok] - res.intended_ns[ok]) / 1e6)[order]
    h = lat.size // 2
    per = whole.batches / max(whole.requests, 1)
    return (Segment(lat[:h], h, round(h * per)), Segment(lat[h:], lat.size - h,
                                                            round((lat.size - h) * per)))


@contextlib.contextmanager
def a_server(triton: bool, folder: Path) -> Iterator[Target]:
    """The demo gateway, or the test's real Triton with its trace on."""
    if triton:
        from tests.integration.test_validate_triton import (
            SERVER,
            pytriton_env,
            pytriton_python,
        )
        from tests.services import free_port_run

        py = pytriton_python()
        if py is None:
            sys.exit("--triton: no PyTriton venv (scripts/test.sh builds .venv-pytriton)")
        port = free_port_run(3)
        cmd = [py, str(SERVER), str(port), str(folder / "trace.json")]
        env, name = pytriton_env(py), "sleep"
    else:
        model = write_mlp(folder / "mlp.onnx", **VALIDATION_MLP)
        port = free_port()
        cmd = [sys.executable, "-m", "servelab", "serve", "--model", f"mlp={model}",
               "--port", str(port)]
        env, name = None, "mlp"
    url = f"http://127.0.0.1:{port}"
    with server_process(cmd, f"{url}/v2/models/{name}/ready", timeout_s=120, env=env):
        yield parse_url(url, name)


def gateway_rates(t: Target, bodies: list[bytes | tuple[bytes, int]]) -> list[float]:
    """20%, 50% and 80% of the open-loop saturation validate's own search finds."""
    sp = read_policy(t, {"max_batch_size": None, "max_queue_delay_us": None,
                         "instances": None})
    low, _ = measure(t, bodies, 100.0, 300, 5)
    sat, closed, _ = saturation(t, metadata(t), sp, float(np.median(low.lat_ms)))
    print(f"saturation {sat:.0f}/s (closed loop {closed:.0f}/s)", flush=True)
    return [round(sat * share) for share in (0.2, 0.5, 0.8)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--triton", action="store_true")
    ap.add_argument("--rates", default=None, help="(default: see above)")
    ap.add_argument("--duration", type=float, default=None, help="s a run (10; 5 --triton)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args()
    duration = a.duration or (5.0 if a.triton else 10.0)
    met = dict.fromkeys(WAYS, 0)
    judged = 0
    use = HostUse()
    with tempfile.TemporaryDirectory(prefix="servelab-repeat-") as tmp, \
            a_server(a.triton, Path(tmp)) as t:
        bodies = random_bodies(metadata(t), 256, 0)
        measure(t, bodies, 300.0, 900, 1)
        rates = ([float(r) for r in a.rates.split(",")] if a.rates else
                 [100.0, 250.0, 400.0] if a.triton else gateway_rates(t, bodies))
        for rnd in range(a.rounds):
            for i, rate in enumerate(rates):
                n = int(rate * duration)
                m = max(WARMUP_MIN, int(n * WARMUP_SHARE))
                seed = 1000 * rnd + 10 * i
                early, _ = measure(t, bodies, rate, m, seed + 4)
                pre, _ = measure(t, bodies, rate, m, seed + 1)
                run, res = measure(t, bodies, rate, n, seed + 2)
                post, _ = measure(t, bodies, rate, m, seed + 3)
                first, second = halves(res, run)
                p99_bar = 0.30 if i == len(rates) - 1 and not a.triton else 0.20
                truth = run.figures()
                line = [f"round {rnd + 1} {rate:6.0f}/s  run: batch {truth[0]:.2f} "
                        f"p50 {truth[1]:.2f} p99 {truth[2]:.2f} ms"]
                judged += 1
                for way, seg in zip(WAYS, (pre, post, Segment.pooled(pre, post),
                                           Segment.pooled(early, pre), first, second),
                                    strict=True):
                    f = seg.figures()
                    errs = [(p - m_) / m_ for p, m_ in zip(f, truth, strict=True)]
                    ok = (abs(errs[0]) <= 0.10 and abs(errs[1]) <= 0.10
                          and abs(errs[2]) <= p99_bar)
                    met[way] += ok
                    line.append(f"    {way:17s} " + "  ".join(
                        f"{k} {e:+6.1%}" for k, e in zip(("batch", "p50", "p99"), errs,
                                                         strict=True))
                        + ("  met" if ok else ""))
                print("\n".join(line), flush=True)
    steal, others = use.shares()
    print(f"\nrates met, of {judged} (steal {steal:.1%}, other processes {others:.1%}):")
    for way in WAYS:
        print(f"  {way:17s} {met[way]}")


if __name__ == "__main__":
    main()
