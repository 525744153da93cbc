"""servelab's LLM load generator beside a `vllm bench serve`-style client, on a mock
server whose timing is known, side by side in one run.

The mock (tests/mock_openai.py, its own process) streams 32 tokens per request, the first
`TTFT_MS` after it reads the request, then one every `ITL_MS`, and logs the monotonic ns at
which it wrote each chunk: the truth. Both clients get the same Poisson schedule. For each
request the true TTFT is the first write less the request's *intended* send time (what a
user of the service would wait), and the true ITLs are the gaps between writes. A client's
error is its reported figure less the truth; at each stream rate the bench prints the p99
of |error| for TTFT and ITL, and the highest rate at which a client keeps both within 1 ms.

The vLLM-style client is vLLM's benchmark loop as written in `vllm/benchmarks/serve.py`
and `lib/endpoint_request_func.py` (vLLM itself does not install on this machine's Python
without its CPU build): gaps drawn up front, `asyncio.sleep` until each, one task per
request, aiohttp streaming, `time.perf_counter()` at the start of the request function and
at each chunk, TTFT and ITL from those.

    python bench/bench_llm_loadgen.py [--rates 10,20,40,80,160] [--requests 200]
        [--guidellm /path/to/venv/bin/guidellm]

GuideLLM (`pip install guidellm` in a venv of its own: it brings torch) is run too when
`--guidellm` names its executable, on the same mock in chat mode, with a word-level
tokenizer written here (its synthetic data needs one and nothing comes from a hub). Its
per-request records carry no intended send time and its ITL is a per-request mean, so it
is compared on aggregates: its TTFT p50/p99 against the mock's own receipt-to-first-write
p50/p99, and its ITL p50/p99 against the mock's per-gap p50/p99.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from servelab.measure.llm_load import Endpoint, LoadPlan, new_session, run_step  # noqa: E402
from servelab.measure.llm_workload import random_requests  # noqa: E402
from servelab.measure.openai_stream import request_body  # noqa: E402
from servelab.measure.process import free_port, server_process  # noqa: E402

TTFT_MS, ITL_MS, TOKENS = 20.0, 5.0, 32


async def vllm_style(url: str, prompts: list[str], offsets_s: np.ndarray, clock: list[int]
                     ) -> dict[str, tuple[float, list[float], float]]:
    """vLLM's loop: returns prompt -> (ttft_s, itls_s, start perf_counter); `clock` gets
    time.monotonic_ns() at the instant its schedule starts (instrumentation only)."""
    results: dict[str, tuple[float, list[float], float]] = {}
    conn = aiohttp.TCPConnector(limit=0, force_close=True)
    async with aiohttp.ClientSession(connector=conn, trust_env=True,
                                     timeout=aiohttp.ClientTimeout(total=6 * 3600)) as session:
        async def one(prompt: str) -> None:
            body = json.loads(request_body(chat=False, model="mock", prompt=prompt,
                                           max_tokens=TOKENS, ignore_eos=True))
            ttft, itl = 0.0, []
            st = time.perf_counter()
            most_recent = st
            async with session.post(url, json=body) as response:
                async for chunk_bytes in response.content:
                    chunk_bytes = chunk_bytes.strip()
                    if not chunk_bytes:
                        continue
                    chunk = chunk_bytes.decode("utf-8").removeprefix("data: ")
                    if chunk == "[DONE]":
                        continue
                    data = json.loads(chunk)
                    if data.get("choices"):
                        timestamp = time.perf_counter()
                        if not ttft:
                            ttft = timestamp - st
                        else:
                            itl.append(timestamp - most_recent)
                        most_recent = timestamp
            results[prompt] = (ttft, itl, st)

        start = time.time()
        clock.append(time.monotonic_ns())
        tasks = []
        for prompt, delay in zip(prompts, offsets_s, strict=True):
            sleep = start + delay - time.time()
            if sleep > 0:
                await asyncio.sleep(sleep)
            tasks.append(asyncio.create_task(one(prompt)))
        await asyncio.gather(*tasks)
    return results


def errors_ms(truth: dict[str, dict], intended_abs: dict[str, int],
              measured: dict[str, tuple[float, list[float]]]) -> tuple[float, float, int]:
    """p99 |TTFT error|, p99 |ITL error| (ms) and how many requests completed."""
    e_ttft, e_itl = [], []
    for prompt, (ttft_s, itls_s) in measured.items():
        row = truth.get(prompt)
        if row is None or len(row["chunk_ns"]) != TOKENS or len(itls_s) != TOKENS - 1:
            continue
        w = np.array(row["chunk_ns"], np.int64)
        e_ttft.append(ttft_s * 1e3 - (w[0] - intended_abs[prompt]) / 1e6)
        e_itl += list(np.array(itls_s) * 1e3 - np.diff(w) / 1e6)
    if not e_ttft:
        return float("inf"), float("inf"), 0
    return (float(np.percentile(np.abs(e_ttft), 99)), float(np.percentile(np.abs(e_itl), 99)),
            len(e_ttft))


TOKENIZER = """
import sys
from tokenizers import Tokenizer, models, pre_tokenizers, decoders
from transformers import PreTrainedTokenizerFast
words = open(sys.argv[1]).read().split()
vocab = {"<unk>": 0, "<s>": 1, "</s>": 2}
for w in words:
    vocab.setdefault(w, len(vocab))
tok = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.Whitespace()
tok.decoder = decoders.WordPiece()
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                        eos_token="</s>").save_pretrained(sys.argv[2])
"""


def guidellm_rows(exe: str, rates: list[float], requests: int) -> None:
    """GuideLLM on the mock at each rate: its aggregates beside the mock's truth."""
    import subprocess
    import tempfile

    from servelab.measure.llm_workload import words

    work = Path(tempfile.mkdtemp(prefix="servelab-guidellm-"))
    (work / "words.txt").write_text("\n".join(words()))
    py = str(Path(exe).parent / "python")
    subprocess.run([py, "-c", TOKENIZER, str(work / "words.txt"), str(work / "tok")],
                   check=True, capture_output=True)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    print("GuideLLM (chat, aggregates in ms: its TTFT p50/p99 vs the mock's receipt-to-first-"
          "write; its ITL p50/p99, a per-request mean, vs the mock's per-gap)")
    for rate in rates:
        port = free_port()
        log = work / f"mock-{rate:g}.jsonl"
        cmd = [sys.executable, "-m", "tests.mock_openai", "--port", str(port), "--ttft-ms",
               str(TTFT_MS), "--itl-ms", str(ITL_MS), "--log", str(log)]
        with server_process(cmd, f"http://127.0.0.1:{port}/health", env=env):
            out = work / f"gl-{rate:g}.json"
            subprocess.run([exe, "run", "--backend",
                            f"kind=openai_http,target=http://127.0.0.1:{port}",
                            "--profile", f"kind=poisson,rate={rate:g}", "--data",
                            f"kind=synthetic_text,prompt_tokens=8,output_tokens={TOKENS}",
                            "--tokenizer", f"kind=huggingface_auto,model={work / 'tok'}",
                            "--constraint", f"kind=max_requests,count={requests}",
                            "--output", f"kind=json,path={out}", "--disable-console"],
                           check=True, capture_output=True, timeout=600)
        m = json.loads(out.read_text())["benchmarks"][0]["metrics"]
        ttft = m["time_to_first_token_ms"]["successful"]
        itl = m["inter_token_latency_ms"]["successful"]
        rows = [json.loads(x) for x in log.read_text().splitlines()]
        true_ttft = np.array([(r["chunk_ns"][0] - r["start_ns"]) / 1e6 for r in rows
                              if r["chunk_ns"]])
        true_itl = np.concatenate([np.diff(r["chunk_ns"]) / 1e6 for r in rows])
        print(f"{rate:6.0f}/s  TTFT {ttft['median']:.2f}/{ttft['percentiles']['p99']:.2f} vs "
              f"{np.median(true_ttft):.2f}/{np.percentile(true_ttft, 99):.2f}  ITL "
              f"{itl['median']:.2f}/{itl['percentiles']['p99']:.2f} vs "
              f"{np.median(true_itl):.2f}/{np.percentile(true_itl, 99):.2f}  "
              f"({ttft['count']} of {requests})", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rates", default="10,20,40,80,120,160")
    ap.add_argument("--requests", type=int, default=200)
    ap.add_argument("--guidellm", default="", help="GuideLLM's executable, to run it too")
    args = ap.parse_args()
    rates = [float(x) for x in args.rates.split(",")]
    port = free_port()
    log = Path(f"/tmp/servelab-bench-mock-{os.getpid()}.jsonl")
    cmd = [sys.executable, "-m", "tests.mock_openai", "--port", str(port), "--ttft-ms",
           str(TTFT_MS), "--itl-ms", str(ITL_MS), "--log", str(log)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    base = f"http://127.0.0.1:{port}"
    held = {"servelab": 0.0, "vllm-style": 0.0}
    print(f"mock: TTFT {TTFT_MS} ms, ITL {ITL_MS} ms, {TOKENS} tokens; {args.requests} "
          "requests a rate; p99 |error| in ms (TTFT, ITL)")
    with server_process(cmd, base + "/health", env=env):
        first = 0
        for rate in rates:
            line = [f"{rate:6.0f}/s"]
            for name in ("servelab", "vllm-style"):
                reqs = random_requests(args.requests, input_len=8, output_len=TOKENS,
                                       first_index=first)
                first += args.requests
                offsets = LoadPlan(rate=rate).offsets_s(args.requests, seed=first)
                log.write_text("")
                if name == "servelab":
                    async def go(reqs=reqs, rate=rate, seed=first):  # type: ignore[no-untyped-def]
                        async with new_session(10_000) as s:
                            return await run_step(s, Endpoint(base, "/v1/completions", "mock"),
                                                  reqs, LoadPlan(rate=rate), seed=seed,
                                                  timeout_s=60, ignore_eos=True)
                    rec = asyncio.run(go())
                    measured = {}
                    intended = {}
                    for i, r in enumerate(reqs):
                        if not rec.errors[i]:
                            c = rec.chunk_ns[i]
                            measured[r.prompt] = ((c[0] - rec.intended_ns[i]) / 1e9,
                                                  list(np.diff(c) / 1e9))
                        intended[r.prompt] = int(rec.t0_ns + rec.intended_ns[i])
                else:
                    clock: list[int] = []
                    res = asyncio.run(vllm_style(base + "/v1/completions",
                                                 [r.prompt for r in reqs], offsets, clock))
                    intended = {r.prompt: int(clock[0] + o * 1e9)
                                for r, o in zip(reqs, offsets, strict=True)}
                    measured = {p: (v[0], v[1]) for p, v in res.items()}
                time.sleep(0.3)  # the mock's log is flushed per request
                truth = {row["prompt"]: row for row in map(json.loads,
                                                           log.read_text().splitlines())}
                e_t, e_i, n = errors_ms(truth, intended, measured)
                ok = e_t <= 1.0 and e_i <= 1.0
                if ok:
                    held[name] = max(held[name], rate)
                line.append(f"{name} {e_t:7.2f} {e_i:6.2f} ({n}){' ok' if ok else '   '}")
            print("  ".join(line), flush=True)
    log.unlink(missing_ok=True)
    if args.guidellm:
        guidellm_rows(args.guidellm, rates, args.requests)
    other = held["vllm-style"]
    if other:
        print(f"highest rate within 1 ms: servelab {held['servelab']:g}/s, vllm-style "
              f"{other:g}/s; ratio {held['servelab'] / other:.2f}x")
    else:  # it missed even at the lowest rate: the ratio is at least servelab's / that rate
        print(f"highest rate within 1 ms: servelab {held['servelab']:g}/s; vllm-style missed "
              f"at every rate down to {rates[0]:g}/s; ratio >= "
              f"{held['servelab'] / rates[0]:.0f}x")


if __name__ == "__main__":
    main()
