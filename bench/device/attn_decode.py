"""How fast decode attention reads the KV cache on a real GPU, kernel by kernel.

Not part of the suite: it needs PyTorch with CUDA. llama_steps.py found that a whole
step's decode attention (PyTorch's SDPA, the FlashAttention kernel, query heads of one
KV head as that head's rows) read the KV at 0.46-0.62 of an H200's HBM bandwidth, where
the step model charges the weights' 0.83. Is that the kernel or the GPU? Serving engines
run split-KV decode kernels (FlashDecoding: vLLM's FlashAttention with num_splits,
FlashInfer), which spread one sequence's KV over many multiprocessors. This times one
layer's decode attention over B sequences of L tokens each (bf16, Llama 3.1 8B's 32 query
and 8 KV heads of 128) by:

- `sdpa-flash-rows`: SDPA's FlashAttention kernel with the query heads as rows, as
  llama_steps.py runs it;
- `sdpa-flash-gqa` / `sdpa-efficient-gqa` / `sdpa-cudnn-gqa`: SDPA backends with one query
  row per head and `enable_gqa` (or the KV heads repeated where a backend refuses it);
- `flex`: `torch.compile`d flex_attention, which runs a split-KV decoding kernel for short
  queries (FlexDecoding);
- `copy`: a device-to-device copy of the same bytes (the ceiling as this GPU reaches it).

Each is captured as a CUDA graph of `--reps` calls and timed by CUDA events; the KV bytes
read (2 * B * L * 8 * 128 * 2) over the time give the bandwidth. Prints a table and
writes JSON.

    python bench/device/attn_decode.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.nn.functional as tnf
from llama_steps import time_graph  # beside this file
from torch.nn.attention import SDPBackend, sdpa_kernel

DT = torch.bfloat16
HQ, HK, D = 32, 8, 128
G = HQ // HK


def kernels(b: int, ctx: int, dev: torch.device, flex_fn):
    """name -> a zero-argument call over fresh tensors for B sequences of L tokens."""
    k = torch.randn(b, HK, ctx, D, device=dev, dtype=DT)
    v = torch.randn(b, HK, ctx, D, device=dev, dtype=DT)
    q = torch.randn(b, HQ, 1, D, device=dev, dtype=DT)
    q_rows = q.view(b, HK, G, D)  # query head h = kv head h // G, as enable_gqa groups them
    dst = torch.empty(2 * b * HK * ctx * D, device=dev, dtype=DT)
    src = torch.cat([k.view(-1), v.view(-1)])
    out = {}

    def sdpa(backend, gqa: bool):
        def call():
            with sdpa_kernel([backend]):
                if gqa:
                    return tnf.scaled_dot_product_attention(q, k, v, enable_gqa=True)
                return tnf.scaled_dot_product_attention(q, k.repeat_interleave(G, 1),
                                                        v.repeat_interleave(G, 1))
        return call

    def rows():
        with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
            return tnf.scaled_dot_product_attention(q_rows, k, v)

    def reference():
        with sdpa_kernel([SDPBackend.MATH]):
            return tnf.scaled_dot_product_attention(q, k.repeat_interleave(G, 1),
                                                    v.repeat_interleave(G, 1))

    out["reference"] = reference
    out["sdpa-flash-rows"] = rows
    for name, be in (("flash", SDPBackend.FLASH_ATTENTION),
                     ("efficient", SDPBackend.EFFICIENT_ATTENTION),
                     ("cudnn", SDPBackend.CUDNN_ATTENTION)):
        out[f"sdpa-{name}-gqa"] = sdpa(be, True)
    if flex_fn is not None:
        out["flex"] = lambda: flex_fn(q, k, v, enable_gqa=True)
    out["copy"] = lambda: dst.copy_(src)
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--batches", default="1,8,64,256")
    ap.add_argument("--contexts", default="1024,4096")
    ap.add_argument("--max-tokens", type=int, default=524288, help="B * L at most")
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--iters", type=int, default=15)
    ap.add_argument("--peak-tbps", type=float, default=4.8, help="the datasheet's HBM TB/s")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dev = torch.device("cuda")
    print(torch.cuda.get_device_name(), "torch", torch.__version__, flush=True)
    try:
        from torch.nn.attention.flex_attention import flex_attention
        torch._dynamo.config.cache_size_limit = 64  # one compiled kernel a shape
        flex_fn = torch.compile(flex_attention, dynamic=False)
    except Exception as e:  # a PyTorch without it just skips the row
        print(f"flex_attention unavailable: {type(e).__name__}: {e}", flush=True)
        flex_fn = None
    rows = []
    print(f"{'B':>4} {'L':>5} {'MB read':>8}  " + "kernel: ms (fraction of the datasheet's "
          f"{a.peak_tbps} TB/s)", flush=True)
    for ctx in (int(x) for x in a.contexts.split(",")):
        for b in (int(x) for x in a.batches.split(",")):
            if b * ctx > a.max_tokens:
                continue
            nbytes = 2 * b * HK * ctx * D * 2
            cells = []
            calls = kernels(b, ctx, dev, flex_fn)
            ref = calls.pop("reference")().float()
            for name, fn in calls.items():
                if name != "copy":  # every kernel computes the same attention
                    try:
                        o = fn().float().reshape(ref.shape)
                        err = (o - ref).abs().max().item()
                        if err > 0.05:
                            print(f"  {name} B={b} L={ctx}: differs by {err:.3f}", flush=True)
                    except Exception:  # reported when timed below
                        pass
                t0 = time.time()
                try:
                    times = time_graph(fn, a.iters, warmups=3, reps=a.reps)
                    ms = times[len(times) // 2]
                except Exception as e:  # a backend that refuses a shape
                    print(f"  {name} B={b} L={ctx}: {type(e).__name__}: "
                          f"{str(e).splitlines()[0][:120]}", flush=True)
                    continue
                frac = nbytes / (ms * 1e-3) / (a.peak_tbps * 1e12)
                rows.append({"kernel": name, "batch": b, "context": ctx, "bytes": nbytes,
                             "ms": round(ms, 5), "fraction_of_peak": round(frac, 4),
                             "wall_s": round(time.time() - t0, 1)})
                cells.append(f"{name} {ms:.4f} ({frac:.2f})")
            print(f"{b:>4} {ctx:>5} {nbytes / 1e6:>8.1f}  " + "; ".join(cells), flush=True)
            torch.cuda.empty_cache()
    with open(os.path.join(a.out, "attn_decode.json"), "w") as f:
        json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                   "heads": HQ, "kv_heads": HK, "head_dim": D, "reps": a.reps,
                   "iters": a.iters, "peak_tbps": a.peak_tbps, "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
