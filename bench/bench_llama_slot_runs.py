"""How fast llama-server's decode step runs against *which* slots are decoding, not only
how many: each set of slots below decodes 64 tokens at once (requests pinned with
`id_slot`), and the server's own `timings.predicted_per_token_ms` is the step time.

    python bench/bench_llama_slot_runs.py [--repeats 3]

The server is the llama-server validate test's (tests/llm_server.py: 4 slots, `-c 4096`,
one thread on CPU 1, a random-weight F16 llama of 104 MB); the client runs on CPU 0.
Not in the suite: it measures speed, which depends on how busy the machine is.

Why: under load `llm validate` saw three streams' decode steps run 16-20% slower than
the profile measured three streams at once. Here
(2026-12-04, the 2-core VM, two runs of three repeats) three streams on slots 0, 1, 3 or
0, 2, 3 stepped in 16.5-20.3 ms, on 0, 1, 2 or 1, 2, 3 in 12.3-14.9; two streams on slots
0, 2 or 0, 3 in 7.9-12.9 ms, on 0, 1 in 11.5-14.8 (about two one-stream steps, 4.6-5.3 ms
each). With a KV stream per
slot (llama.cpp's default, not `--kv-unified`) a batch is cut into ubatches of
consecutive slots, and each ubatch reads every weight once. On the day's later VM (an
AVX-512/AMX Xeon, `--repeats 2`): 0, 1, 3 or 0, 2, 3 13.5-14.0 ms, 0, 1, 2 or 1, 2, 3
8.3-8.8; 0, 2 or 0, 3 12.3-13.3, 0, 1 7.3-7.7; one slot 5.8-6.4. The simulator prices
each ubatch as a pass (llm/llama_cpp.py).
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import statistics
import sys
from pathlib import Path

import aiohttp

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.llm_server import on_mid_llama_server  # noqa: E402

from servelab.measure.llm_workload import random_requests  # noqa: E402

SETS = ((0,), (3,), (0, 1), (0, 2), (0, 3), (0, 1, 2), (1, 2, 3), (0, 1, 3), (0, 2, 3),
        (0, 1, 2, 3))
TOKENS = 64


async def decode_ms(s: aiohttp.ClientSession, url: str, prompt: str, slot: int) -> float:
    async with s.post(url + "/completion", json={
            "prompt": prompt, "n_predict": TOKENS, "id_slot": slot, "ignore_eos": True,
            "cache_prompt": False}) as r:
        r.raise_for_status()
        return float((await r.json())["timings"]["predicted_per_token_ms"])


async def run(url: str, repeats: int) -> dict[tuple[int, ...], list[float]]:
    out: dict[tuple[int, ...], list[float]] = {s: [] for s in SETS}
    index = 1000
    async with aiohttp.ClientSession() as s:
        for rep in range(repeats):
            for slots in SETS:
                reqs = random_requests(len(slots), input_len=32, output_len=TOKENS,
                                       seed=rep, first_index=index)
                index += len(slots)
                ms = await asyncio.gather(*(decode_ms(s, url, r.prompt, slot)
                                            for r, slot in zip(reqs, slots, strict=True)))
                out[slots].append(statistics.median(ms))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    res = on_mid_llama_server(lambda url: run(url, args.repeats))
    print("| slots decoding | consecutive runs | step ms (each repeat) |")
    print("|---|---|---|")
    for slots, ms in res.items():
        runs = 1 + sum(b - a > 1 for a, b in itertools.pairwise(slots))
        print(f"| {', '.join(map(str, slots))} | {runs} | "
              f"{' / '.join(f'{m:.1f}' for m in ms)} |")


if __name__ == "__main__":
    main()
