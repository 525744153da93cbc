"""A transformer step's matrix multiplies, timed on a real GPU (PyTorch, CUDA graphs).

Not part of the suite: it needs PyTorch with CUDA, which servelab does not depend on. It
times, for a model's shapes, one step's weight GEMMs (per layer QKV, O, gate+up, down;
then the LM head) over T tokens, with random bf16 weights, each T captured as one CUDA
graph (as vLLM runs decode), so the time is the GPU's, not Python's. Attention over the
context, all-reduce and sampling are left out: this checks the roofline's two sides, the
weights read once per step (small T) and 2 x parameters FLOPs per token (large T).

    python bench/device/gemm_steps.py --layers 32 --hidden 4096 --inter 14336 \
        --heads 32 --kv-heads 8 --head-dim 128 --vocab 128256 --tp 1 --out steps.json
"""

from __future__ import annotations

import argparse
import json

import torch
from llama_steps import time_graph  # beside this file


def main() -> None:
    ap = argparse.ArgumentParser()
    for name in ("layers", "hidden", "inter", "heads", "kv_heads", "head_dim", "vocab"):
        ap.add_argument("--" + name.replace("_", "-"), type=int, required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--tokens", default="1,8,32,128,512,2048,8192")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    dev = torch.device("cuda")
    dt = torch.bfloat16
    h, tp = a.hidden, a.tp
    qkv = (a.heads + 2 * a.kv_heads) * a.head_dim // tp
    o_in = a.heads * a.head_dim // tp
    inter = a.inter // tp
    layers = []
    for _ in range(a.layers):
        layers.append((torch.randn(h, qkv, device=dev, dtype=dt) * 0.01,
                       torch.randn(o_in, h, device=dev, dtype=dt) * 0.01,
                       torch.randn(h, 2 * inter, device=dev, dtype=dt) * 0.01,
                       torch.randn(inter, h, device=dev, dtype=dt) * 0.01))
    head = torch.randn(h, a.vocab // tp, device=dev, dtype=dt) * 0.01
    params = sum(w.numel() for ws in layers for w in ws) + head.numel()
    rows = []
    for t in (int(x) for x in a.tokens.split(",")):
        x = torch.randn(t, h, device=dev, dtype=dt)

        def step(x: torch.Tensor = x) -> torch.Tensor:
            y = x
            for w_qkv, w_o, w_gu, w_d in layers:
                q = y @ w_qkv
                y = y + q[:, :o_in] @ w_o
                g = y @ w_gu
                y = y + (g[:, :inter] * g[:, inter:]) @ w_d
            return y @ head

        times = time_graph(step, a.iters, warmups=3)
        ms = times[len(times) // 2]
        rows.append({"tokens": t, "median_ms": ms, "min_ms": times[0],
                     "tflops": 2 * params * t / (ms / 1e3) / 1e12,
                     "weight_tbps": params * 2 / (ms / 1e3) / 1e12})
        print(rows[-1], flush=True)
    out = {"gpu": torch.cuda.get_device_name(), "torch": torch.__version__, "tp": tp,
           "params_per_gpu": params, "shapes": vars(a), "rows": rows}
    with open(a.out, "w") as f:
        json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
