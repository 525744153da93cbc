"""Does a prompt's prefill on llama-server take longer after the server sat idle?

    python bench/bench_llama_prefill_idle.py [--repeats 8]

`llm validate` profiles prefill with prompts sent back to back, while a load at 30% of
saturation sends most prompts to a server that sat idle for a while; on the AMD VM
(2026-12-04) a 129-token prompt that reached an idle server took 3-18% longer by the
server's own clock than the profile fitted minutes before. This sends prompts of each
length, one at a time, each after an idle gap (the gaps interleaved, so a drift of the
machine's speed falls on all of them alike), and prints the server's `timings.prompt_ms`
for each gap. The server is the validate test's (tests/llm_server.py: 4 slots, one
thread on CPU 1); the client runs on CPU 0. Not in the suite: it measures speed.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.llm_server import on_mid_llama_server  # noqa: E402

from servelab.measure.llm_workload import random_requests  # noqa: E402

GAPS_S = (0.0, 0.05, 0.2, 0.5, 1.0, 2.0)
LENGTHS = (64, 129, 192)


async def prompt_ms(s: aiohttp.ClientSession, url: str, prompt: str, slot: int | None) -> float:
    body = {"prompt": prompt, "n_predict": 1, "cache_prompt": False}
    if slot is not None:
        body["id_slot"] = slot
    async with s.post(url + "/completion", json=body) as r:
        r.raise_for_status()
        return float((await r.json())["timings"]["prompt_ms"])


async def run(url: str, repeats: int, pin: bool) -> dict[tuple[int, float], list[float]]:
    out: dict[tuple[int, float], list[float]] = {}
    index = 2_000_000
    async with aiohttp.ClientSession() as s:
        for rep in range(repeats):
            for length in LENGTHS:
                for gap in GAPS_S if rep % 2 == 0 else GAPS_S[::-1]:
                    (r,) = random_requests(1, input_len=length, output_len=1, seed=rep,
                                           first_index=index)
                    index += 1
                    await asyncio.sleep(gap)
                    ms = await prompt_ms(s, url, r.prompt, 0 if pin else None)
                    out.setdefault((length, gap), []).append(ms)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--no-pin", action="store_true", help="let the server choose the slot")
    args = ap.parse_args()
    res = on_mid_llama_server(lambda url: run(url, args.repeats, not args.no_pin))
    print("| prompt tokens | " + " | ".join(f"idle {g:g} s" for g in GAPS_S) + " |")
    print("|---|" + "---|" * len(GAPS_S))
    for length in LENGTHS:
        cells = []
        for g in GAPS_S:
            ms = sorted(res[(length, g)])
            cells.append(f"{statistics.median(ms):.1f} ({ms[0]:.0f}-{ms[-1]:.0f})")
        print(f"| {length} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
