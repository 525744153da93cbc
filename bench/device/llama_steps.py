"""A Llama decoder's whole steps timed on a real GPU (PyTorch, CUDA graphs).

Not part of the suite: it needs PyTorch with CUDA, which servelab does not depend on.
gemm_steps.py beside it times a step's weight GEMMs alone; this times everything a
serving engine's step runs on the GPU, for one tensor-parallel shard of the model, with
random bf16 weights:

- the embedding lookup; per layer RMSNorm, the QKV GEMM, rotary embedding, writing the
  step's K and V into the cache, attention (PyTorch's scaled_dot_product_attention held
  to its FlashAttention or memory-efficient kernels, never the O(n^2)-memory one), the O
  GEMM, RMSNorm, gate+up GEMM, SiLU-and-multiply, the down GEMM; the final norm, the LM
  head for the sampled tokens only, and a greedy sample (argmax);
- decode steps: B sequences, each one new token over a context of L tokens (a decode's
  query heads of one KV head go in as that head's rows, as FlashDecoding does);
- prefill steps: one prompt of T tokens from position 0 (causal);
- mixed steps (chunked prefill, as vLLM V1 schedules): B decodes plus one chunk of C
  prompt tokens, the GEMMs over all B + C tokens at once.

Each shape is captured as one CUDA graph (vLLM runs decode that way), so the time is the
GPU's, not Python's. Left out: the all-reduces of tensor parallelism (one GPU), the
engine's CPU work (scheduling, detokenizing) and paged KV blocks (the cache here is one
contiguous [B, kv_heads, L, head_dim] tensor per layer). Writes a JSON of every row and
a CSV in `llm simulate --step-profile`'s columns.

    python bench/device/llama_steps.py --model llama-3.1-8b --tp 1 --out DIR
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import time

import torch
import torch.nn.functional as tnf
from torch.nn.attention import SDPBackend, sdpa_kernel

# config.json of each model (Hugging Face, meta-llama/Llama-3.1-8B and -70B)
MODELS = {
    "llama-3.1-8b": {"layers": 32, "hidden": 4096, "inter": 14336, "heads": 32, "kv_heads": 8,
                         "head_dim": 128, "vocab": 128256},
    "llama-3.1-70b": {"layers": 80, "hidden": 8192, "inter": 28672, "heads": 64, "kv_heads": 8,
                          "head_dim": 128, "vocab": 128256},
}
DT = torch.bfloat16
BACKENDS = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]


class Shard:
    """One tensor-parallel shard's weights and KV cache."""

    def __init__(self, m: dict, tp: int, kv_cap: int, dev: torch.device) -> None:
        self.h = m["hidden"]
        self.hq, self.hk = m["heads"] // tp, max(m["kv_heads"] // tp, 1)
        self.d, self.i = m["head_dim"], m["inter"] // tp
        self.vocab = m["vocab"] // tp
        self.g = self.hq // self.hk

        def w(*shape: int) -> torch.Tensor:
            return torch.randn(*shape, device=dev, dtype=DT) * 0.02

        qkv = (self.hq + 2 * self.hk) * self.d
        self.layers = [{"ln1": torch.ones(self.h, device=dev, dtype=DT),
                        "qkv": w(self.h, qkv), "o": w(self.hq * self.d, self.h),
                        "ln2": torch.ones(self.h, device=dev, dtype=DT),
                        "gu": w(self.h, 2 * self.i), "down": w(self.i, self.h),
                        "k": torch.randn(kv_cap * self.hk * self.d, device=dev, dtype=DT),
                        "v": torch.randn(kv_cap * self.hk * self.d, device=dev, dtype=DT)}
                       for _ in range(m["layers"])]
        self.emb = w(self.vocab, self.h)
        self.norm = torch.ones(self.h, device=dev, dtype=DT)
        self.head = w(self.h, self.vocab)
        self.params = (sum(t.numel() for lw in self.layers for n, t in lw.items()
                           if n not in ("k", "v")) + self.emb.numel() + self.head.numel())
        pos = torch.arange(65536, device=dev, dtype=torch.float32)
        inv = 1.0 / (500000.0 ** (torch.arange(0, self.d, 2, device=dev).float() / self.d))
        ang = pos[:, None] * inv[None, :]
        self.cos, self.sin = ang.cos().to(DT), ang.sin().to(DT)


def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(DT) * w


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [N, heads, d]; cos/sin [N, d/2]."""
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)


def rms_lean(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return tnf.rms_norm(x, (x.shape[-1],), w, 1e-5)


def rope_lean(x: torch.Tensor, f: torch.Tensor) -> torch.Tensor:
    """x [N, heads, d]; f [N, 1, d/2] complex: the interleaved (Meta's) convention."""
    n, h, d = x.shape
    xc = torch.view_as_complex(x.float().contiguous().reshape(n, h, d // 2, 2))
    return torch.view_as_real(xc * f).reshape(n, h, d).to(DT)


def make_step(s: Shard, b: int, ctx: int, c: int, gqa: bool, lean: bool = False,
              attention: bool = True, attn: str = "flash"):
    """A step of b decodes over ctx tokens of context plus one prompt chunk of c tokens.
    lean: PyTorch's fused RMSNorm, rotary embedding as one complex multiply, residuals
    added in the GEMMs' epilogue (fewer kernels a layer, as an engine's fused ones);
    attention False leaves out the KV writes and attention (their time is the difference)."""
    dev = s.emb.device
    n = b + c
    ids = torch.randint(0, s.vocab, (n,), device=dev)
    pos = torch.cat((torch.full((b,), max(ctx - 1, 0), device=dev, dtype=torch.long),
                     torch.arange(c, device=dev, dtype=torch.long)))
    cos, sin = s.cos[pos], s.sin[pos]
    fc = torch.complex(cos.float(), sin.float())[:, None, :]  # rope_lean's rotation
    norm = rms_lean if lean else rms
    qd, kd = s.hq * s.d, s.hk * s.d
    # the prompt chunk's K and V land here (vLLM writes them into its paged cache)
    pk = torch.empty(1, s.hk, max(c, 1), s.d, device=dev, dtype=DT)
    pv = torch.empty_like(pk)
    sampled = list(range(b)) + ([n - 1] if c else [])
    rows = torch.tensor(sampled, device=dev, dtype=torch.long)

    def step() -> torch.Tensor:
        x = s.emb[ids]
        for lw in s.layers:
            y = norm(x, lw["ln1"])
            qkv = y @ lw["qkv"]
            if lean:
                q = rope_lean(qkv[:, :qd].view(n, s.hq, s.d), fc)
                k = rope_lean(qkv[:, qd:qd + kd].view(n, s.hk, s.d), fc)
            else:
                q = rope(qkv[:, :qd].view(n, s.hq, s.d), cos, sin)
                k = rope(qkv[:, qd:qd + kd].view(n, s.hk, s.d), cos, sin)
            v = qkv[:, qd + kd:].view(n, s.hk, s.d)
            outs = [q.reshape(n, qd)] if not attention else []
            if b and attention:
                kc = lw["k"][:b * s.hk * ctx * s.d].view(b, s.hk, ctx, s.d)
                vc = lw["v"][:b * s.hk * ctx * s.d].view(b, s.hk, ctx, s.d)
                kc[:, :, ctx - 1, :] = k[:b]
                vc[:, :, ctx - 1, :] = v[:b]
                if attn == "cudnn":  # one query row a head, the KV heads grouped
                    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                        o = tnf.scaled_dot_product_attention(q[:b].unsqueeze(2), kc, vc,
                                                             enable_gqa=True)
                else:
                    qg = q[:b].view(b, s.hk, s.g, s.d)
                    with sdpa_kernel(BACKENDS):
                        o = tnf.scaled_dot_product_attention(qg, kc, vc)
                outs.append(o.reshape(b, qd))
            if c and attention:
                pk.copy_(k[b:].transpose(0, 1).unsqueeze(0))
                pv.copy_(v[b:].transpose(0, 1).unsqueeze(0))
                qp = q[b:].transpose(0, 1).unsqueeze(0)
                with sdpa_kernel(BACKENDS):
                    if gqa:
                        o = tnf.scaled_dot_product_attention(qp, pk, pv, is_causal=True,
                                                           enable_gqa=True)
                    else:
                        o = tnf.scaled_dot_product_attention(
                            qp, pk.repeat_interleave(s.g, dim=1),
                            pv.repeat_interleave(s.g, dim=1), is_causal=True)
                outs.append(o[0].transpose(0, 1).reshape(c, qd))
            a = outs[0] if len(outs) == 1 else torch.cat(outs)
            x = torch.addmm(x, a, lw["o"]) if lean else x + a @ lw["o"]
            y = norm(x, lw["ln2"])
            gu = y @ lw["gu"]
            act = tnf.silu(gu[:, :s.i]) * gu[:, s.i:]
            x = torch.addmm(x, act, lw["down"]) if lean else x + act @ lw["down"]
        logits = norm(x[rows], s.norm) @ s.head
        return logits.float().argmax(-1)

    return step


def time_graph(step, iters: int, warmups: int = 2, reps: int = 1) -> list[float]:
    """`step` run eagerly `warmups` times on a side stream, captured `reps` times over as one
    CUDA graph and replayed `iters` times, each timed by CUDA events: the sorted times of
    one `step`, in ms (a graph of several calls spreads the launch of a short kernel)."""
    st = torch.cuda.Stream()
    st.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(st):
        for _ in range(warmups):
            step()
    torch.cuda.current_stream().wait_stream(st)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        for _ in range(reps):
            step()
    for _ in range(3):
        g.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(iters):
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        g.replay()
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) / reps)
    del g
    return sorted(times)


def shapes(grid: str, kv_cap: int) -> list[tuple[str, int, int, int]]:
    """(kind, decodes, context, chunk) rows of the grid, within the KV cache."""
    out = []
    for part in grid.split(";"):
        kind, spec = part.split(":")
        if kind == "decode":
            bs, ls = spec.split("x")
            for ctx in (int(v) for v in ls.split(",")):
                for b in (int(v) for v in bs.split(",")):
                    if b * ctx <= kv_cap:
                        out.append(("decode", b, ctx, 0))
        elif kind == "prefill":
            out += [("prefill", 0, 0, int(t)) for t in spec.split(",")]
        elif kind == "mixed":
            for item in spec.split(","):
                b, ctx, c = (int(v) for v in item.split("/"))
                if b * ctx <= kv_cap:
                    out.append(("mixed", b, ctx, c))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", choices=sorted(MODELS), required=True)
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--kv-cap", type=int, default=524288, help="KV cache tokens held")
    ap.add_argument("--grid", default="decode:1,8,32,64,128,256,512x256,1024,4096;"
                    "prefill:128,512,1024,2048,4096,8192;"
                    "mixed:64/1024/256,64/1024/512,64/1024/2048,256/1024/512")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--lean", action="store_true", help="fewer, fused kernels a layer")
    ap.add_argument("--no-attention", action="store_true",
                    help="leave out the KV writes and attention")
    ap.add_argument("--attn", choices=["flash", "cudnn"], default="flash",
                    help="decode attention: SDPA's FlashAttention kernel with the query heads "
                    "as rows, or cuDNN's (split-KV; read the KV at 0.84-0.92 of HBM in "
                    "attn_decode.py on an H200 where flash read it at 0.49-0.53)")
    ap.add_argument("--tag", default="", help="added to the output files' names")
    ap.add_argument("--out", required=True)
    a = ap.parse_args()
    t0 = time.time()
    dev = torch.device("cuda")
    m = MODELS[a.model]
    s = Shard(m, a.tp, a.kv_cap, dev)
    torch.cuda.synchronize()
    print(f"{a.model} tp {a.tp}: {s.params / 1e9:.2f}B parameters a GPU, KV cache "
          f"{a.kv_cap} tokens, built in {time.time() - t0:.1f} s, "
          f"{torch.cuda.memory_allocated() / 2**30:.1f} GiB", flush=True)
    gqa = True
    try:  # does this PyTorch's flash kernel take grouped KV heads as they are?
        with sdpa_kernel(BACKENDS):
            q = torch.randn(1, 8, 64, 128, device=dev, dtype=DT)
            kv = torch.randn(1, 2, 64, 128, device=dev, dtype=DT)
            tnf.scaled_dot_product_attention(q, kv, kv, is_causal=True, enable_gqa=True)
    except Exception as e:
        print(f"enable_gqa refused ({type(e).__name__}: {e}); repeating KV heads", flush=True)
        gqa = False
    rows = []
    name = (f"{a.model}-tp{a.tp}" + ("-lean" if a.lean else "")
            + ("-noattn" if a.no_attention else "")
            + ("-cudnn" if a.attn == "cudnn" else "") + (f"-{a.tag}" if a.tag else ""))
    for kind, b, ctx, c in shapes(a.grid, a.kv_cap):
        try:
            times = time_graph(make_step(s, b, ctx, c, gqa, a.lean, not a.no_attention,
                                         a.attn), a.iters)
        except Exception as e:
            print(f"{kind} b={b} ctx={ctx} c={c}: FAILED {type(e).__name__}: {e}", flush=True)
            torch.cuda.empty_cache()
            continue
        row = {"kind": kind, "decode_seqs": b, "context": ctx, "prefill_tokens": c,
               "tokens": b + c, "kv_tokens_read": b * ctx,
               "attn_context": b * ctx + c * (c + 1) / 2,
               "median_ms": times[len(times) // 2], "min_ms": times[0],
               "max_ms": times[-1]}
        rows.append(row)
        print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
        # rewritten after every row: a run cut short by its timeout keeps what it measured
        with open(os.path.join(a.out, name + ".json"), "w") as f:
            json.dump({"gpu": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "model": a.model, "tp": a.tp, "shape": m,
                       "params_per_gpu": s.params, "kv_cap": a.kv_cap,
                       "enable_gqa": gqa, "lean": a.lean,
                       "attention": not a.no_attention, "attn": a.attn, "iters": a.iters,
                       "rows": rows},
                      f, indent=1)
    with open(os.path.join(a.out, name + ".csv"), "w", newline="") as f:
        wr = csv.writer(f)
        wr.writerow(["prefill_tokens", "decode_seqs", "kv_tokens_read", "step_ms"])
        for r in rows:
            wr.writerow([r["prefill_tokens"], r["decode_seqs"], r["kv_tokens_read"],
                         round(r["median_ms"], 4)])
    print(f"done in {time.time() - t0:.1f} s", flush=True)


if __name__ == "__main__":
    main()
