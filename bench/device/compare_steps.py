"""servelab's step model beside whole steps measured on a real GPU (llama_steps.py's output).

Runs anywhere (no GPU): reads bench/device/results/steps/*.json and prints, for each
measured step, the roofline `llm simulate` uses (StepModel.roofline with the fitted
constants, on the catalog's H200) and its error, split into the GPU side alone (the
larger of compute and memory) and the whole step (plus the per-step and per-sequence
engine costs the fit carries). The all-reduces are left out of the model: the
measurement ran one GPU's shard. Then fits `--step-profile`'s linear form
(ProfileStepModel) to each file's rows and prints its largest error on them.

    python bench/device/compare_steps.py [--rows]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from servelab.catalog import get_gpu
from servelab.llm.kv import PoolSpec
from servelab.llm.models import get_model
from servelab.llm.serving import ProfileStepModel, StepModel

RESULTS = Path(__file__).resolve().parent / "results" / "steps"


def roofline(model: str, tp: int) -> StepModel:
    return StepModel.roofline(PoolSpec(model=get_model(model), gpu=get_gpu("H200"), tp=tp))


def model_ms(m: StepModel, row: dict) -> tuple[float, float]:
    """(the GPU side, the whole step less its all-reduces) in ms."""
    seqs = row["decode_seqs"] + (1 if row["prefill_tokens"] else 0)
    whole = m.step_s(row["tokens"], row["attn_context"], row["kv_tokens_read"],
                     row["decode_seqs"], seqs) - m.allreduce_s(row["tokens"])
    return (whole - m.overhead_s - seqs * m.per_seq_s) * 1e3, whole * 1e3


def compare(path: Path) -> dict:
    d = json.loads(path.read_text())
    m = roofline(d["model"], d["tp"])
    out = {"file": path.name, "gpu": d["gpu"], "by_kind": {}, "rows": []}
    for row in d["rows"]:
        gpu, whole = model_ms(m, row)
        meas = row["median_ms"]
        out["rows"].append({**{k: row[k] for k in ("kind", "decode_seqs", "context",
                                                   "prefill_tokens")},
                            "measured_ms": meas, "gpu_side_ms": gpu, "model_ms": whole,
                            "gpu_side_err": gpu / meas - 1, "model_err": whole / meas - 1})
    for kind in ("decode", "prefill", "mixed"):
        errs = [r for r in out["rows"] if r["kind"] == kind]
        if errs:
            g = np.array([r["gpu_side_err"] for r in errs])
            w = np.array([r["model_err"] for r in errs])
            out["by_kind"][kind] = {"n": len(errs), "gpu_side": (g.min(), g.max()),
                                    "model": (w.min(), w.max())}
    # the CSV beside it, read as `llm simulate --step-profile` reads it
    out["profile"] = ProfileStepModel.from_csv(str(path.with_suffix(".csv")))
    return out


def attention_share(with_attn: Path, without: Path) -> None:
    """Each row's attention time (the difference) and the KV bytes it read a second."""
    a, b = (json.loads(p.read_text()) for p in (with_attn, without))
    kv_bytes = roofline(a["model"], a["tp"]).kv_bytes_per_token
    for r, s in zip(a["rows"], b["rows"], strict=True):
        ms = r["median_ms"] - s["median_ms"]
        read = r["kv_tokens_read"] * kv_bytes / (ms / 1e3) / 1e12 if ms > 0 else 0.0
        print(f"    {r['kind']:8s} B={r['decode_seqs']:4d} L={r['context']:5d} "
              f"C={r['prefill_tokens']:5d}: attention {ms:7.2f} ms of {r['median_ms']:7.2f}"
              + (f", KV read at {read:.2f} TB/s" if r["kv_tokens_read"] else ""))


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", action="store_true", help="print every row")
    a = ap.parse_args()
    files = sorted(RESULTS.glob("*.json"))
    if not files:
        print(f"no results under {RESULTS}: run llama_steps.py on a GPU first", file=sys.stderr)
        return 1
    for f in files:
        if not json.loads(f.read_text()).get("attention", True):
            with_attn = f.with_name(f.name.replace("-noattn", ""))
            print(f"== {f.name}: attention left out; its share, beside {with_attn.name}:")
            attention_share(with_attn, f)
            continue
        c = compare(f)
        print(f"== {c['file']} ({c['gpu']})")
        for kind, k in c["by_kind"].items():
            print(f"  {kind:8s} {k['n']:2d} rows: GPU side {k['gpu_side'][0]:+.0%} to "
                  f"{k['gpu_side'][1]:+.0%}, whole model step {k['model'][0]:+.0%} to "
                  f"{k['model'][1]:+.0%}")
        p = c["profile"]
        print(f"  --step-profile fit: base {p.base_ms:.2f} ms, {p.per_prefill_token_ms * 1e3:.2f} "
              f"us a prefill token, {p.per_decode_seq_ms * 1e3:.1f} us a decode, "
              f"{p.per_kv_token_ms * 1e6:.1f} ns a KV token; largest error "
              f"{p.max_abs_error_pct:.0f}%")
        if a.rows:
            for r in c["rows"]:
                print(f"    {r['kind']:8s} B={r['decode_seqs']:4d} L={r['context']:5d} "
                      f"C={r['prefill_tokens']:5d}: {r['measured_ms']:8.2f} ms; model "
                      f"{r['model_ms']:8.2f} ({r['model_err']:+.0%}), GPU side "
                      f"{r['gpu_side_ms']:8.2f} ({r['gpu_side_err']:+.0%})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
