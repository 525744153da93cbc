"""The seed table: KV figures worked out by hand, stated figures flagged where wrong."""

from __future__ import annotations

from servelab.api import run_plan
from servelab.llm.kv import bytes_per_token
from servelab.llm.models import get_model
from servelab.scenario import load_scenario
from servelab.seed import seed_comparison


def test_llama3_70b_kv_bytes_by_hand():
    per_token = 2 * 80 * 8 * 128 * 2  # K and V, layers, KV heads, head dim, FP16 bytes
    assert per_token == 327_680
    assert bytes_per_token(get_model("llama-3-70b"), "fp16") == per_token
    assert per_token * 4096 == 1_342_177_280


def test_seed_table_rows():
    s = load_scenario("seed").with_overrides({"workload.num_requests": 50_000})
    rows = {r.figure: r for r in seed_comparison(s, run_plan(s))}
    kv = rows["KV per token"]
    assert "327,680 bytes" in kv.servelab
    assert "0.3125 MiB" in kv.servelab
    assert not kv.agrees
    assert "1,342,177,280 bytes" in rows["KV per 4,096-token session"].servelab
    assert rows["KV headroom"].agrees
    assert rows["max sessions"].servelab == str(int(90e9 // 1_342_177_280)) == "67"
    batch = rows["assembled batch (rows)"]
    assert not batch.agrees
    assert abs(float(batch.servelab.split()[0]) - 5.0) < 0.1
    assert not rows["$ per 1M inferences"].agrees
    assert all(r.reason for r in rows.values())
    vllm = rows["max sessions, vLLM's accounting"]
    assert not vllm.agrees
    assert "BF16 weights" in vllm.servelab
