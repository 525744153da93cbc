"""The LLM serving simulator's speed: simulated decode tokens per wall-clock second, for
Llama 3.1 8B on one H100 at a rate that keeps about 100-250 sequences running (the
regime a capacity plan spends its time in). Target: at least 1M decode tokens/s, so a
plan over many replica counts runs in seconds. (No other vLLM-scheduler simulator is
installable here to run beside it; Vidur needs its own profiling data and GPUs.) Beside
it, the same simulation step by step (its decode runs off, as before 2026-12-05), and
the ratio; the two results must be equal.

    python bench/bench_llm.py [--requests 20000] [--rate 40]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from servelab.api import load
from servelab.llm import serving
from servelab.llm.pool import pool_spec
from servelab.llm.serving import Workload, serve_llm


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--rate", type=float, default=40.0)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    s = load("seed", {"llm.model": "llama-3.1-8b", "llm.gpu": "H100-SXM", "llm.num_gpus": 1,
                      "llm.tp": 1, "llm.kv_dtype": "auto", "llm.weight_dtype": "auto"})
    spec = pool_spec(s)
    w = Workload(request_rate=args.rate, num_requests=args.requests, prompt_tokens=512,
                 prompt_tokens_p99=2048, output_tokens=256, output_tokens_p99=1024)
    runs = serving.DECODE_RUN_MIN
    times = {}
    reports = {}
    for label, least in (("decode runs", runs), ("step by step", serving.MAX_STEPS + 1)):
        serving.DECODE_RUN_MIN = least
        best = float("inf")
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            reports[label] = serve_llm(spec, w).to_dict()
            best = min(best, time.perf_counter() - t0)
        times[label] = best
    serving.DECODE_RUN_MIN = runs
    d = reports["decode runs"]
    if d != reports["step by step"]:
        sys.exit("the decode runs changed the result")
    out_tokens = d["requests"]["output_tokens"]
    print(f"{args.requests:,} requests at {args.rate:g}/s: {out_tokens:,} output tokens, mean "
          f"running batch {d['mean_running']:.0f}, TPOT p50 {d['tpot_ms']['p50']:.1f} ms")
    for label, best in times.items():
        print(f"  {label}: best of {args.repeat} {best:.2f} s -> "
              f"{out_tokens / best / 1e6:.2f}M decode tokens/s simulated")
    print(f"decode runs / step by step: {times['step by step'] / times['decode runs']:.1f}x "
          f"faster, equal results (target >= 1M decode tokens/s)")


if __name__ == "__main__":
    main()
