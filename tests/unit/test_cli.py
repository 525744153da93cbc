"""The CLI as a user runs it: a subprocess, JSON on stdout, one-line errors."""

from __future__ import annotations

import csv
import json
import subprocess
import sys


def run(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "servelab", *args], capture_output=True,
                          text=True, cwd=cwd, timeout=300, check=False)


def test_plan_seed_json_is_only_json():
    p = run("plan", "--scenario", "seed", "--num-requests", "30000", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    assert d["plan"]["num_gpus"] >= 1
    assert d["seed_comparison"]


def test_plan_seed_table():
    p = run("plan", "--scenario", "seed", "--num-requests", "30000")
    assert p.returncode == 0, p.stderr
    for text in ("latency budget", "closed-form first estimate", "stated vs servelab",
                 "KV per token"):
        assert text in p.stdout


def test_simulate_flags_override(tmp_path):
    p = run("simulate", "--qps", "500", "--max-batch-size", "4", "--num-gpus", "3",
            "--max-queue-delay-us", "0", "--num-requests", "5000", "--json")
    d = json.loads(p.stdout)
    assert d["scenario"]["workload"]["qps"] == 500.0
    assert d["gpu"]["num_gpus"] == 3
    assert max(int(b) for b in d["batching"]["batch_size_histogram"]) <= 4


def test_user_mistakes_are_one_line_without_traceback(tmp_path):
    for args, needle in [
        (("simulate", "--qps", "-5"), "--qps ([workload] qps) = -5.0"),
        (("simulate", "--gpu", "H1OO"), "[hardware] gpu) = 'H1OO'"),
        (("simulate", "--gpu", "H1OO"), "did you mean 'H100'?"),
        (("simulate", "--scenario", str(tmp_path / "none.toml")), "no such file"),
        (("sweep", "qsp", "--values", "1,2"), "did you mean 'qps'?"),
        (("sweep", "qps"), "--start/--stop"),
    ]:
        p = run(*args)
        assert p.returncode == 1, (args, p.stdout, p.stderr)
        assert "Traceback" not in p.stderr
        lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1, (args, p.stderr)
        assert needle in lines[0], (args, p.stderr)


def test_typer_usage_errors_exit_2_without_traceback():
    p = run("simulate", "--qps", "fast")
    assert p.returncode == 2
    assert "--qps" in p.stderr
    assert "Traceback" not in p.stderr


def test_sweep_table_csv_and_json(tmp_path):
    out = tmp_path / "sweep.csv"
    p = run("sweep", "max_queue_delay_us", "--values", "0,1000,2000", "--csv", str(out),
            "--num-requests", "20000", "--json")
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert [r["max_queue_delay_us"] for r in rows] == [0, 1000, 2000]
    # A wider window gives bigger batches at the same load.
    assert rows[0]["mean_batch_size"] < rows[1]["mean_batch_size"] < rows[2]["mean_batch_size"]
    with out.open() as fh:
        assert len(list(csv.DictReader(fh))) == 3
    p = run("sweep", "qps", "--start", "1000", "--stop", "4000", "--steps", "4",
            "--num-requests", "10000")
    assert p.returncode == 0
    assert "sweep qps" in p.stdout


def test_kv_json_keys():
    p = run("kv", "--model", "llama-3.1-8b", "--gpu", "H100-SXM", "--num-gpus", "1",
            "--kv-dtype", "fp8", "--context", "8192", "--sessions", "10", "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    for section, key in [("kv", "bytes_per_token"), ("kv", "bytes_per_token_per_gpu"),
                         ("kv", "bytes_per_session"), ("kv", "num_blocks"),
                         ("kv", "max_sessions"), ("memory", "weights_bytes"),
                         ("memory", "kv_pool_bytes")]:
        assert d[section][key] is not None
    assert d["kv"]["bytes_per_token"] == 2 * 32 * 8 * 128 * 1
    assert d["kv"]["longest_context_tokens"] > 8192


def test_kv_table_and_mistakes():
    p = run("kv")
    assert p.returncode == 0, p.stderr
    assert "each GPU's memory" in p.stdout
    for args, needle in [(("kv", "--model", "lama-3.1-8b"), "did you mean 'llama-3.1-8b'?"),
                         (("kv", "--num-gpus", "3", "--tp", "2"),
                          "--num-gpus ([llm] num_gpus) = 3: expected a multiple of [llm] tp"),
                         (("kv", "--kv-dtype", "fp7"), "--kv-dtype ([llm] kv_dtype) = 'fp7'")]:
        p = run(*args)
        assert p.returncode == 1, (args, p.stderr)
        assert needle in p.stderr
        assert "Traceback" not in p.stderr


def test_kv_paging_json():
    p = run("kv", "paging", "--requests", "300", "--max-len", "2048", "--prefix-tokens", "128",
            "--json")
    assert p.returncode == 0, p.stderr
    d = json.loads(p.stdout)
    names = [r["strategy"] for r in d["results"]]
    assert names == ["contiguous_max", "contiguous_pow2", "contiguous_oracle", "paged",
                     "paged_prefix"]
    assert all(r["completed"] + r["rejected_too_long"] + r["running_at_end"]
               + r["waiting_at_end"] == 300 for r in d["results"])


def test_figures_that_do_not_exist_are_null_not_a_crash():
    # A timeout shorter than the batch window on an idle GPU: every request times out,
    # so there is no p50 to report. JSON says null; nothing breaks.
    p = run("sweep", "qps", "--values", "100", "--timeout-us", "100", "--max-queue-delay-us",
            "2000", "--num-requests", "500", "--json")
    assert p.returncode == 0, p.stderr
    row = json.loads(p.stdout)[0]
    assert row["timed_out"] == 500
    assert row["p50_ms"] is None
    p = run("simulate", "--timeout-us", "100", "--max-queue-delay-us", "2000",
            "--num-requests", "500")
    assert p.returncode == 0, p.stderr
    assert "500 timed out" in p.stdout


def test_lab_port_in_use_is_one_line():
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        p = run("lab", "--port", str(port))
    assert p.returncode == 1
    assert "Traceback" not in p.stderr
    assert f"--port = {port}: cannot listen" in p.stderr


def test_llm_simulate_takes_vllms_spellings():
    """vLLM's flag names (engine and `vllm bench serve`) give the same run as servelab's."""
    ours = run("llm", "simulate", "--tp", "2", "--kv-dtype", "fp8", "--rate", "4",
               "--num-requests", "150", "--no-prefix-caching", "--chunked-prefill", "--json")
    vllm = run("llm", "simulate", "--tensor-parallel-size", "2", "--kv-cache-dtype", "fp8",
               "--request-rate", "4", "--num-prompts", "150", "--no-enable-prefix-caching",
               "--enable-chunked-prefill", "--json")
    assert ours.returncode == 0, ours.stderr
    assert vllm.returncode == 0, vllm.stderr
    assert json.loads(ours.stdout) == json.loads(vllm.stdout)
    assert json.loads(vllm.stdout)["tp"] == 2


def test_llm_simulate_takes_pipeline_parallel_stages():
    """vLLM's --pipeline-parallel-size (or --pp): one replica of tp x pp GPUs, each stage
    holding its share of the layers, so the pool a replica holds grows with the stages."""
    two = run("llm", "simulate", "--tensor-parallel-size", "4", "--pipeline-parallel-size",
              "2", "--gpu", "A100-40GB", "--model", "llama-3.1-70b", "--num-prompts", "60",
              "--json")
    assert two.returncode == 0, two.stderr
    d = json.loads(two.stdout)
    assert (d["tp"], d["pp"], d["replicas"]) == (4, 2, 1)
    assert any("pipeline parallel: 2 stages of 4 GPUs" in n for n in d["notes"])
    assert d["requests"]["served"] == 60
    short = run("llm", "simulate", "--tp", "4", "--pp", "2", "--gpu", "A100-40GB",
                "--model", "llama-3.1-70b", "--num-prompts", "60", "--json")
    assert json.loads(short.stdout) == d
    bad = run("llm", "simulate", "--pp", "2", "--scheduler", "prefill-first")
    assert bad.returncode == 1
    assert "Traceback" not in bad.stderr
    assert "--pipeline-parallel-size = 2: expected 1 with the prefill-first" in bad.stderr
    for flags in (("--pp", "2"), ("--num-scheduler-steps", "2")):
        bad = run("llm", "simulate", "--scheduler", "sglang", *flags)
        assert bad.returncode == 1
        assert "Traceback" not in bad.stderr
        assert "--scheduler = 'sglang': expected prompts alone" in bad.stderr, bad.stderr
