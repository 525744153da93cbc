"""Fuzz the command line as a careless or hostile user would: generated flags and values,
scenario files, config.json files and byte-level junk, plus the issue's named cases.

Every case must end with exit 0 (it ran), 1 (a mistake, one line) or 2 (a flag Typer
could not parse, one line) — never a traceback, never exit 3 (servelab's own bug) —
within a few seconds and a bounded amount of memory. The cases run in one long-lived
driver process (tests/fuzz/driver.py) so a few hundred of them take seconds.
"""

from __future__ import annotations

import json
import math
import os
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import tomli_w
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

ROOT = Path(__file__).resolve().parents[2]
CASE_SECONDS = 5.0  # "a few seconds" of CPU: the work caps keep cases near 1 s
HANG_SECONDS = 60.0
MAX_RSS_KIB = 2_500 * 1024  # the driver's peak memory over every case run so far
MAX_MESSAGE = 500

FUZZ = settings(max_examples=int(os.environ.get("SERVELAB_FUZZ_EXAMPLES", "80")),
                deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                      HealthCheck.too_slow])


class Driver:
    """One `python tests/fuzz/driver.py` process; restarted after a hang."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen[str] | None = None

    def _start(self) -> subprocess.Popen[str]:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
        proc = subprocess.Popen([sys.executable, str(ROOT / "tests/fuzz/driver.py")],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env=env, cwd=ROOT)
        assert proc.stdout is not None
        sel = selectors.DefaultSelector()
        sel.register(proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout=300)  # the driver compiles the engines first
        sel.close()
        if not ready or json.loads(proc.stdout.readline() or "{}").get("ready") is not True:
            proc.kill()
            pytest.fail("the fuzz driver did not start (engine warm-up)")
        return proc

    def run(self, argv: list[str]) -> dict[str, Any]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = self._start()
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(argv) + "\n")
        self.proc.stdin.flush()
        sel = selectors.DefaultSelector()
        sel.register(self.proc.stdout, selectors.EVENT_READ)
        ready = sel.select(timeout=CASE_SECONDS * 4)
        sel.close()
        if not ready:
            self.close()
            pytest.fail(f"servelab {' '.join(argv)[:300]} did not finish in "
                        f"{CASE_SECONDS * 4:.0f} s (a hang)")
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            self.close()
            pytest.fail(f"servelab {' '.join(argv)[:300]} killed the process (exit {code}); "
                        "a crash or the memory limit")
        result: dict[str, Any] = json.loads(line)
        return result

    def close(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            for pipe in (self.proc.stdin, self.proc.stdout):
                if pipe is not None:
                    pipe.close()
            self.proc = None


@pytest.fixture(scope="module")
def cli():  # type: ignore[no-untyped-def]
    d = Driver()
    yield d
    d.close()


def check(argv: list[str], r: dict[str, Any], *, slow_ok: bool = False) -> None:
    """The contract every command line keeps, whatever it was given."""
    shown = " ".join(argv)[:300]
    err = r["stderr"]
    assert "Traceback" not in err, (shown, err)
    assert r["code"] in (0, 1, 2), (shown, r["code"], err)
    if r["code"] in (1, 2):
        lines = [ln for ln in err.splitlines() if ln.strip()]
        assert len(lines) == 1, (shown, err)
        assert lines[0].startswith("error: "), (shown, err)
        assert len(lines[0]) < MAX_MESSAGE, (shown, len(lines[0]))
    if not slow_ok:  # CPU time: a busy machine does not fail it; a hang still does
        assert r["cpu_seconds"] < CASE_SECONDS, (shown, r["cpu_seconds"])
        assert r["seconds"] < HANG_SECONDS, (shown, r["seconds"])
    assert r["max_rss_kib"] < MAX_RSS_KIB, (shown, r["max_rss_kib"])


# ---------------------------------------------------------------------------
# Values a user (or a script gone wrong) types.

NASTY_NUMBERS = ["0", "-0", "-1", "1", "2", "1e-300", "1e-9", "1e308", "1e999", "nan", "inf",
                 "-inf", "99999999999999999999", "9223372036854775808", "0.5", "3.7", "",
                 "abc", "0x10", "1_000", " 5", "1,2", "٣"]
text_values = st.one_of(st.sampled_from(NASTY_NUMBERS), st.text(max_size=30),
                        st.integers(-(10**30), 10**30).map(str),
                        st.floats(allow_nan=True, allow_infinity=True).map(repr))

# Each command's flags. --num-requests is kept to what runs fast unless refused: the fuzz
# is about bad input, not about big legitimate runs.
COMMON = ["--qps", "--max-queue-delay-us", "--max-batch-size", "--preferred-batch-size",
          "--max-queue-size", "--timeout-us", "--instances-per-gpu", "--gpu", "--num-gpus",
          "--price", "--seed", "--slo-ms", "--frontend-workers", "--frontend-cpu-ms",
          "--frontend-turn-ms", "--frontend-answer-ms", "--stalls-per-s", "--stall-ms"]
KV = ["--model", "--kv-dtype", "--weight-dtype", "--context", "--gpu", "--num-gpus", "--tp",
      "--gpu-memory-utilization", "--block-size"]
COMMANDS: dict[tuple[str, ...], list[str]] = {
    ("simulate",): COMMON,
    ("plan",): COMMON,
    ("sweep", "qps"): [*COMMON, "--start", "--stop", "--steps", "--values"],
    ("sweep", "max_queue_delay_us"): ["--values", "--steps", "--start", "--stop"],
    ("kv",): [*KV, "--sessions", "--memory-gib", "--weights-gib", "--activation-gib",
              "--non-torch-gib", "--cudagraph-gib"],
    ("kv", "paging"): [*KV, "--qps", "--iteration-ms", "--pool-tokens", "--max-len",
                       "--prefix-tokens", "--lengths", "--seed"],
    ("load",): ["--qps", "--rates", "--duration", "--num-requests", "--connections",
                "--model", "--url", "--seed", "--concurrency", "--arrival", "--trace",
                "--stability-percentage", "--max-trials", "--percentile"],
    ("llm", "simulate"): ["--rate", "--max-num-seqs", "--max-num-batched-tokens", "--tp",
                          "--replicas", "--prefix-tokens", "--prefix-hit-share",
                          "--compute-efficiency", "--memory-efficiency",
                          "--kv-memory-efficiency", "--overhead-ms",
                          "--model", "--kv-dtype", "--block-size", "--arrival", "--seed",
                          "--gpu-memory-utilization", "--step-profile",
                          "--max-concurrency", "--lengths", "--num-gpu-blocks-override",
                          "--scheduler", "--prefill-first-overhead-ms", "--per-seq-ms",
                          "--overlap", "--allreduce-latency-us",
                          "--nccl-allreduce-latency-us", "--frontend-ms", "--intake-ms",
                          "--burstiness", "--goodput", "--quantization",
                          "--max-model-len", "--num-scheduler-steps"],
    # --url is not fuzzed (a load generator goes where it is told: loopback only here)
    ("llm", "load"): ["--request-rate", "--burstiness", "--max-concurrency", "--num-prompts",
                      "--dataset-name", "--dataset-path", "--random-input-len",
                      "--random-output-len", "--random-range-ratio", "--random-prefix-len",
                      "--goodput", "--metric-percentiles", "--request-timeout", "--seed",
                      "--endpoint", "--trace", "--sharegpt-output-len", "--model"],
    ("llm", "validate"): ["--rule", "--max-num-seqs", "--context-per-seq",
                          "--max-num-batched-tokens", "--random-input-len",
                          "--random-output-len", "--num-prompts", "--shares", "--seed",
                          "--endpoint", "--model"],
    ("llm", "plan"): ["--rate", "--max-num-seqs", "--tp", "--ttft-p99-ms", "--tpot-p99-ms",
                      "--max-replicas", "--model", "--seed"],
    ("serve",): ["--model", "--max-batch-size", "--max-queue-delay-us", "--instances",
                  "--preferred-batch-size", "--timeout-us", "--max-queue-size", "--missing",
                  "--drift-window", "--drift-interval", "--port", "--store",
                  "--feature-service", "--max-connections", "--header-timeout-s",
                  "--body-timeout-s", "--max-inflight-mb", "--metrics-port",
                  "--summary-latencies"],
    ("features", "train"): ["--service", "--labels", "--label", "--out", "--engine"],
    ("features", "skew"): ["--service", "--log", "--engine"],
    ("drift",): ["--features", "--timestamp", "--window", "--bins", "--epsilon", "--warn",
                 "--alert", "--fail-on"],
    ("validate",): ["--rates", "--duration", "--max-batch-size", "--max-queue-delay-us",
                    "--instances", "--model", "--url", "--seed", "--out", "--batcher-first",
                    "--server-cpus", "--client-cpus", "--no-calibrate", "--frontend-workers",
                    "--no-calibrate-at-rate",
                    "--frontend-cpu-ms", "--frontend-answer-share", "--stalls",
                    "--no-stalls", "--stability-percentage", "--max-trials",
                    "--percentile", "--frontend-at-rate", "--no-frontend-at-rate",
                    "--trace-file", "--handoff", "--no-handoff", "--series", "--no-series"],
    # (no output paths here: a generated one would be written; the named cases hold them)
    ("llm", "fit"): ["--max-evals", "--tp", "--gpu-memory-utilization",
                     "--block-size", "--max-num-seqs", "--max-num-batched-tokens",
                     "--scheduler", "--model", "--gpu"],
    ("lab",): ["--port", "--data-dir", "--allow-host"],
    ("features", "bench"): ["--reads", "--view", "--store"],
    ("features", "parity"): ["--at", "--sample", "--store"],
    ("features", "get-online"): ["--at", "--store"],
    ("features", "materialize"): ["--start", "--end", "--views", "--store"],
    ("replay-trace",): ["--max-batch-size", "--max-queue-delay-us", "--instances",
                        "--preferred-batch-size", "--model", "--scenario-out"],
}
SMALL = {("simulate",): ["--num-requests", "3000"], ("plan",): ["--num-requests", "3000"],
         ("sweep", "qps"): ["--num-requests", "2000"],
         ("sweep", "max_queue_delay_us"): ["--num-requests", "2000"],
         ("kv",): [], ("kv", "paging"): ["--requests", "60"],
         # port 9 on loopback: nothing listens, so a valid command line is refused at once
         ("load",): ["--url", "http://127.0.0.1:9", "--model", "m"],
         ("validate",): ["--url", "http://127.0.0.1:9", "--model", "m"],
         # a trace that does not exist: the policy is checked before it is read
         ("replay-trace",): ["/nonexistent-servelab-trace.json"],
         # sides that do not exist: the settings are checked before any file is read
         ("drift",): ["--reference", "/nonexistent-ref.parquet", "--current",
                      "/nonexistent-cur.parquet"],
         # an address this machine does not have: a valid command line stops at the bind
         ("serve",): ["--host", "192.0.2.1"],
         ("features", "train"): ["--repo", "/nonexistent-servelab-repo"],
         ("features", "bench"): ["--repo", "/nonexistent-servelab-repo"],
         ("features", "parity"): ["--repo", "/nonexistent-servelab-repo"],
         ("features", "get-online"): ["--repo", "/nonexistent-servelab-repo", "-f", "v:x",
                                      "--entity", "user_id=1"],
         ("features", "materialize"): ["--repo", "/nonexistent-servelab-repo"],
         # a results file that does not exist: the flags are checked before it is read
         ("llm", "fit"): ["/nonexistent-servelab-result.json"],
         # an address this machine does not have: a valid command line stops at the bind
         ("lab",): ["--host", "192.0.2.1"],
         ("features", "skew"): ["--repo", "/nonexistent-servelab-repo"],
         # lengths stay small here (a long legitimate run is not the fuzz's business)
         ("llm", "simulate"): ["--num-requests", "20", "--prompt-tokens", "64",
                               "--output-tokens", "16"],
         # port 9 on loopback: nothing listens, so a valid command line is refused at once
         ("llm", "load"): ["--url", "http://127.0.0.1:9"],
         ("llm", "validate"): ["--url", "http://127.0.0.1:9"],
         ("llm", "plan"): ["--num-requests", "20", "--prompt-tokens", "64",
                           "--output-tokens", "16", "--max-replicas", "8"]}

# A flag whose good values text seldom hits: those as well, so each engine meets the
# other flags' bad values (llama.cpp's rule among them)
FLAG_VALUES = {"--scheduler": st.one_of(st.sampled_from(["v1", "prefill-first", "sglang",
                                                        "llama.cpp"]),
                                        text_values)}


@st.composite
def argv_sets(draw: st.DrawFn) -> list[str]:
    cmd = draw(st.sampled_from(sorted(COMMANDS)))
    flags = draw(st.lists(st.sampled_from(COMMANDS[cmd]), min_size=1, max_size=4))
    argv = [*cmd]
    for f in flags:
        argv += [f, draw(FLAG_VALUES.get(f, text_values))]
    if cmd[0] == "sweep" and "--values" not in flags and "--start" not in flags:
        argv += ["--values", draw(st.sampled_from(["1,2", "nan", "", "5", "1e9,1e-9"]))]
    if draw(st.booleans()):
        argv.append("--json")
    return argv + SMALL[cmd]


@FUZZ
@given(argv=argv_sets())
def test_generated_command_lines(cli, argv):  # type: ignore[no-untyped-def]
    check(argv, cli.run(argv))


# ---------------------------------------------------------------------------
# Scenario files: sections and keys with wrong types, ranges and shapes.

SCENARIO_KEYS = {
    "workload": ["qps", "arrival", "cv", "trace_csv", "arrivals_s", "num_requests", "seed"],
    "batching": ["max_batch_size", "max_queue_delay_microseconds", "preferred_batch_size",
                 "max_queue_size", "default_timeout_microseconds", "instances_per_gpu",
                 "batcher_first", "lost_wakeup"],
    "hardware": ["gpu", "num_gpus", "price_per_gpu_hour", "hbm_bandwidth_tbps"],
    "model": ["kind", "latency_ms", "base_ms", "per_row_ms", "points", "csv", "variability",
              "cv", "flops_per_row", "efficiency", "precision"],
    "latency": ["feature_fetch_ms", "feature_fetch_p99_ms", "network_ms", "p99_slo_ms",
                "stalls_per_s", "stall_ms", "stall_samples_ms"],
    "plan": ["max_busy_fraction", "max_gpus"],
    "llm": ["model", "config", "kv_dtype", "context_tokens", "tp", "num_gpus", "block_size",
            "request_rate", "max_concurrency", "lengths_csv", "num_requests",
            "prompt_tokens_p99",
            "enable_chunked_prefill",
            "prefix_hit_share", "step_profile_csv", "tpot_p99_slo_ms",
            "num_gpu_blocks_override", "max_model_len", "num_scheduler_steps", "pp",
            "pp_hop_ms", "compute_ramp_tokens", "intake_per_token_us"],
    "nope": ["x"],
}
toml_scalars = st.one_of(
    st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=True, allow_infinity=True),
    st.booleans(), st.text(max_size=20),
    st.sampled_from(["poisson", "gamma", "trace", "profile", "affine", "constant", "roofline",
                     "exponential", "H100", "llama-3.1-8b", "/etc/passwd", "../../x.csv"]),
    st.sampled_from([0, 1, 2, 8, 32, 1000, 1e-300, 1e300, 5_000_001, 100_001]))
toml_values = st.recursive(toml_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=8)


@st.composite
def scenario_docs(draw: st.DrawFn) -> dict[str, Any]:
    doc: dict[str, Any] = {}
    for section in draw(st.lists(st.sampled_from(sorted(SCENARIO_KEYS)), max_size=3,
                                 unique=True)):
        keys = draw(st.lists(st.sampled_from(SCENARIO_KEYS[section]), min_size=1,
                             max_size=3, unique=True))
        doc[section] = {k: draw(toml_values) for k in keys}
    return doc


@FUZZ
@given(doc=scenario_docs(), command=st.sampled_from(["simulate", "plan"]))
def test_generated_scenario_files(cli, tmp_path_factory, doc, command):  # type: ignore[no-untyped-def]
    path = tmp_path_factory.mktemp("scn") / "s.toml"
    try:
        path.write_text(tomli_w.dumps(doc))
    except (TypeError, ValueError):  # tomli_w cannot write some values (NaN keys etc.)
        return
    argv = [command, "--scenario", str(path), "--num-requests", "2000"]
    check(argv, cli.run(argv))


# ---------------------------------------------------------------------------
# config.json files for `kv --model`.

CONFIG_KEYS = ["num_hidden_layers", "num_attention_heads", "num_key_value_heads", "hidden_size",
               "head_dim", "intermediate_size", "vocab_size", "max_position_embeddings",
               "sliding_window", "layer_types", "kv_lora_rank", "qk_rope_head_dim",
               "torch_dtype", "num_parameters", "quantization_config", "use_sliding_window"]
json_scalars = st.one_of(
    st.integers(-(10**20), 10**20), st.floats(allow_nan=False), st.booleans(), st.none(),
    st.text(max_size=12), st.sampled_from([1, 2, 8, 32, 64, 128, 4096, 200_000_000, -100]))
json_values = st.recursive(json_scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=5), st.dictionaries(st.text(max_size=8), inner, max_size=3)),
    max_leaves=10)
VALID_BASE = {"num_hidden_layers": 4, "num_attention_heads": 8, "hidden_size": 512}


@FUZZ
@given(extra=st.dictionaries(st.sampled_from(CONFIG_KEYS), json_values, max_size=5),
       base=st.booleans(), flags=st.sampled_from([[], ["--tp", "2"], ["--kv-dtype", "fp8"]]))
def test_generated_config_json(cli, tmp_path_factory, extra, base, flags):  # type: ignore[no-untyped-def]
    cfg = {**(VALID_BASE if base else {}), **extra}
    path = tmp_path_factory.mktemp("cfg") / "config.json"
    path.write_text(json.dumps(cfg))
    argv = ["kv", "--model", str(path), *flags, "--json"]
    r = cli.run(argv)
    check(argv, r)
    if r["code"] == 0:  # whatever was accepted gives figures JSON can carry
        out = json.loads(r["stdout"]) if r["stdout"].strip().startswith("{") else None
        if out is not None:
            assert all(math.isfinite(v) for v in out["kv"].values()
                       if isinstance(v, float)), out["kv"]


# ---------------------------------------------------------------------------
# Files that are not what they claim: bytes, folders, devices, long names.

JUNK_FILES = {
    "latin1.toml": b'name = "caf\xe9"\n',
    "binary.toml": bytes(range(256)),
    "nul.toml": b"name = \"a\x00b\"\n",
    "deep.toml": b"a = " + b"[" * 3000 + b"]" * 3000 + b"\n",
    "bom.toml": b"\xef\xbb\xbfname = \"x\"\n",
    "latin1.json": b'{"num_hidden_layers": 2, "name": "caf\xe9"}',
    "deep.json": b"[" * 100_000 + b"]" * 100_000,
    "list.json": b"[1, 2, 3]",
    "null_layers.json": b'{"num_hidden_layers": null, "num_attention_heads": 8, '
                        b'"hidden_size": 64}',
    "huge_int.json": b'{"num_hidden_layers": 1' + b"0" * 5000 + b', "num_attention_heads": 1,'
                     b' "hidden_size": 8}',
    "layers.json": b'{"num_hidden_layers": 200000000, "num_attention_heads": 8, '
                   b'"hidden_size": 512}',
    "sliding.json": b'{"num_hidden_layers": 2, "num_attention_heads": 8, "hidden_size": 512,'
                    b' "sliding_window": -100}',
    "trace.csv": b"arrival_s\n0.1\n\xff\xfe\n",
    "lengths.csv": b"prompt_tokens,output_tokens\n10,\n",
}


@pytest.fixture(scope="module")
def junk(tmp_path_factory):  # type: ignore[no-untyped-def]
    d = tmp_path_factory.mktemp("junk")
    for name, data in JUNK_FILES.items():
        (d / name).write_bytes(data)
    (d / "folder.toml").mkdir()
    (d / "trace.toml").write_text('[workload]\narrival = "trace"\ntrace_csv = "trace.csv"\n')
    (d / "pref.toml").write_text("[batching]\npreferred_batch_size = ["
                                 + ",".join(["1"] * 600_000) + "]\n")
    (d / "gamma.toml").write_text('[workload]\narrival = "gamma"\ncv = 1e-300\n')
    (d / "slow.toml").write_text('[model]\nkind = "affine"\nbase_ms = 1e13\nper_row_ms = 0\n')
    return d


def named_cases(j: Path) -> list[list[str]]:
    long = "x" * 5000
    long_path = "/tmp/" + "y" * 300
    deep_path = "/tmp/" + "d/" * 3000 + "x"
    return [
        # URLs the standard library's parser refuses (issue 27)
        *(["load", "--url", url, "--model", "m", "--qps", "5"] for url in (
            "http://[::1", "http://127.0.0.1:99999", "http://127.0.0.1:x/", "http://:80",
            "http://a b:80", "http://127.0.0.1:0", "ftp://127.0.0.1:9", "\x00")),
        ["validate", "--url", "http://[::1", "--model", "m"],
        ["llm", "load", "--url", "http://127.0.0.1:99999"],
        ["llm", "validate", "--url", "http://[::1"],
        # output paths too long, under a file, or in a folder that cannot be written
        *([*cmd, path] for path in (long_path, deep_path, "/dev/null/x", "/proc/x/y")
          for cmd in (["validate", "--url", "http://127.0.0.1:9", "--model", "m", "--out"],
                      ["llm", "validate", "--url", "http://127.0.0.1:9", "--out"],
                      ["llm", "load", "--url", "http://127.0.0.1:9", "--out"],
                      ["llm", "simulate", "--num-requests", "20", "--save-result"],
                      ["load", "--url", "http://127.0.0.1:9", "--model", "m", "--qps", "5",
                       "--csv"],
                      ["serve", "--model", "m=/nonexistent.onnx", "--log-dir"])),
        ["serve", "--model", f"m={long_path}.onnx"],
        ["drift", "--reference", long_path, "--current", long_path],
        ["lab", "--data-dir", deep_path],
        # a rate whose arrivals outrun the clock's resolution
        ["llm", "simulate", "--rate", "1e-300", "--num-requests", "20"],
        ["llm", "plan", "--rate", "1e-300", "--num-requests", "20"],
        ["simulate", "--timeout-us", "10000000000000000"],
        ["sweep", "max_batch_size", "--values", "nan"],
        ["sweep", "qps", "--values", ""],
        ["sweep", "qps", "--start", "1", "--stop", "2", "--steps", "1000000000"],
        ["simulate", "--qps", "1e-9"],
        ["simulate", "--scenario", str(j / "gamma.toml")],
        ["plan", "--scenario", str(j / "slow.toml")],
        ["simulate", "--scenario", "/dev/zero"],
        ["simulate", "--scenario", str(j / "pref.toml")],
        ["simulate", "--scenario", str(j / "trace.toml")],
        ["simulate", "--scenario", str(j / "folder.toml")],
        ["simulate", "--scenario", long],
        ["kv", "paging", "--requests", "100000000"],
        ["kv", "paging", "--pool-tokens", "1000000000000"],
        ["kv", "paging", "--max-len", "0"],
        ["kv", "paging", "--lengths", str(j / "lengths.csv"), "--requests", "10"],
        ["kv", "--sessions", "0"],
        ["kv", "--memory-gib", "nan"],
        ["kv", "--memory-gib", "-5"],
        ["kv", "--weights-gib", "-1"],
        ["kv", "--model", long + ".json"],
        *(["simulate", "--scenario", str(j / name)] for name in JUNK_FILES if
          name.endswith(".toml")),
        *(["kv", "--model", str(j / name)] for name in JUNK_FILES if name.endswith(".json")),
        ["features", "bench", "--repo", str(j), "--view", "nope"],
        ["features", "parity", "--repo", str(j), "--sample", "-5"],
        ["features", "init", str(j / "latin1.toml")],
        ["features", "historical", "-f", "v:x", "--entities", str(j / "binary.toml"),
         "--repo", str(j)],
    ]


def test_named_cases_from_the_issue(cli, junk):  # type: ignore[no-untyped-def]
    for argv in named_cases(junk):
        r = cli.run(argv)
        check(argv, r)
        assert r["code"] == 1, (argv, r["stderr"])  # every one is a mistake to report


def test_degenerate_inputs_give_honest_answers(cli, tmp_path):  # type: ignore[no-untyped-def]
    """Not mistakes, but edges where a figure used to mislead: one request cannot show
    a queue that grows; integers past 2^53 are compared, not refused."""
    r = cli.run(["simulate", "--num-requests", "1"])
    check([], r)
    assert r["code"] == 0
    assert "too few to tell" in r["stdout"]
    assert "cannot keep up" not in r["stdout"]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"a": pa.array([2**63 + 5, 1, 2] * 50, pa.uint64()),
                             "b": pa.array([1, 2, 3] * 50, pa.decimal128(38, 0))}),
                   tmp_path / "ref.parquet")
    pq.write_table(pa.table({"a": pa.array([1, 2, 3] * 50, pa.uint64()),
                             "b": pa.array([10**37, 2, 3] * 50, pa.decimal128(38, 0))}),
                   tmp_path / "cur.parquet")
    r = cli.run(["drift", "--reference", str(tmp_path / "ref.parquet"), "--current",
                 str(tmp_path / "cur.parquet"), "--json"])
    check([], r)
    assert r["code"] == 0, r["stderr"]
    assert '"psi"' in r["stdout"]  # the driver keeps only the output's tail


HOSTILE_MODES = ("notjson", "endless", "huge", "garbage200", "badmeta", "deepjson")


@pytest.fixture(scope="module")
def hostile_servers():  # type: ignore[no-untyped-def]
    """One misbehaving server per mode (tests/hostile_server.py), on loopback."""
    from tests.browser_support import free_port as port_for

    procs, urls = [], {}
    try:
        for mode in HOSTILE_MODES:
            port = port_for()
            procs.append(subprocess.Popen(
                [sys.executable, str(Path(__file__).parents[1] / "hostile_server.py"),
                 str(port), "--mode", mode], stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True))
            urls[mode] = f"http://127.0.0.1:{port}"
        for url in urls.values():  # listening before any case runs
            host, port = url.rsplit(":", 1)
            for _ in range(100):
                try:
                    socket.create_connection((host[7:], int(port)), timeout=0.2).close()
                    break
                except OSError:
                    time.sleep(0.05)
        yield urls
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_hostile_servers_cost_the_clients_a_clear_line(cli, hostile_servers):  # type: ignore[no-untyped-def]
    """A server that answers HTML, streams forever, promises 10 GB, answers 200 with
    garbage, lies in its metadata or nests JSON 100,000 deep: every client command says
    so in one line (or counts the garbage as errors), within its time and memory."""
    for mode, url in hostile_servers.items():
        for argv in (["load", "--url", url, "--model", "m", "--qps", "50", "--num-requests",
                      "20", "--json"],
                     ["validate", "--url", url, "--model", "m", "--rates", "10",
                      "--duration", "1"],
                     ["llm", "load", "--url", url, "--num-prompts", "3"]):
            r = cli.run(argv)
            check(argv, r, slow_ok=mode == "huge")  # its answer trickles: a 10 s timeout
            assert r["seconds"] < 15, (mode, argv, r["seconds"])
            if mode == "garbage200" and argv[0] == "load":
                assert r["code"] == 0, r["stderr"]
                [row] = json.loads(r["stdout"])
                assert row["ok"] == 0
                assert row["errors_by_reason"] == {"HTTP 200 without a v2 answer": 20}
            else:
                assert r["code"] == 1, (mode, argv, r["stderr"])


def test_mistakes_say_field_value_and_fix(cli, junk):  # type: ignore[no-untyped-def]
    expect = {
        ("simulate", "--qps", "1e-9"): "[workload] qps",
        ("kv", "--memory-gib", "-5"): "--memory-gib = -5.0",
        ("kv", "--sessions", "0"): "--sessions = 0",
        ("kv", "paging", "--max-len", "0"): "--max-len = 0",
        ("sweep", "qps", "--values", ""): "--values",
    }
    for argv, needle in expect.items():
        err = cli.run(list(argv))["stderr"]
        assert needle in err, (argv, err)
        assert "fix:" in err, (argv, err)
        assert "expected" in err, (argv, err)


def test_features_mistakes_on_a_real_repo(cli, tmp_path):  # type: ignore[no-untyped-def]
    repo = tmp_path / "repo"
    assert cli.run(["features", "init", str(repo), "--users", "20", "--merchants", "5",
                    "--days", "3", "--labels", "50"])["code"] == 0
    cases = [
        (["features", "init", str(repo)], "features init"),
        (["features", "bench", "--repo", str(repo), "--view", "nope"], "--view = 'nope'"),
        (["features", "parity", "--repo", str(repo), "--sample", "-5"], "--sample = -5"),
        (["features", "historical", "--repo", str(repo), "-f", "service:fraud_model_v1",
          "--entities", str(repo / "data" / "labels.parquet"), "--out",
          "/nonexistent_dir/x.parquet"], "--out"),
        (["features", "init", str(repo / "feature_repo.toml")], "features init"),
    ]
    (tmp_path / "empty.parquet").write_bytes(b"")
    cases.append((["features", "historical", "--repo", str(repo), "-f",
                   "service:fraud_model_v1", "--entities", str(tmp_path / "empty.parquet")],
                  "--entities"))
    for argv, needle in cases:
        r = cli.run(argv)
        check(argv, r)
        assert r["code"] == 1, (argv, r["stderr"])
        assert needle in r["stderr"], (argv, r["stderr"])


def test_kv_tensor_parallel_alone_is_one_group(cli):  # type: ignore[no-untyped-def]
    r = cli.run(["kv", "--model", "llama-3.1-70b", "--tp", "8", "--json"])
    check([], r)
    d = json.loads(r["stdout"])
    assert d["deployment"]["num_gpus"] == 8
    assert d["deployment"]["tp"] == 8


def test_auto_weight_dtype_follows_a_quantized_checkpoint(cli):  # type: ignore[no-untyped-def]
    r = cli.run(["kv", "--model", "DeepSeek-V3", "--tp", "8", "--gpu", "H200", "--json"])
    check([], r)
    d = json.loads(r["stdout"])
    assert d["deployment"]["weight_dtype"] == "fp8"
    assert d["memory"]["weights_bytes"] == pytest.approx(671e9)  # one byte per parameter
    assert d["kv"]["max_sessions"] > 0
    assert d["fits"]
    forced = json.loads(cli.run(["kv", "--model", "DeepSeek-V3", "--tp", "8", "--gpu", "H200",
                                 "--weight-dtype", "bf16", "--json"])["stdout"])
    assert forced["memory"]["weights_bytes"] == pytest.approx(1342e9)
    assert forced["kv"]["max_sessions"] == 0


@st.composite
def llm_load_lines(draw: st.DrawFn) -> list[str]:
    cmd = draw(st.sampled_from([("llm", "load"), ("llm", "validate")]))
    argv = [*cmd]
    for f in draw(st.lists(st.sampled_from(COMMANDS[cmd]), min_size=1, max_size=5)):
        argv += [f, draw(st.one_of(text_values, st.sampled_from(
            ["inf", "1,2,inf", "ttft:5", "tpot:0", "sharegpt", "jsonl", "/etc/hostname",
             "/v1/chat/completions", "/dev/zero", "90,99"])))]
    return argv + SMALL[cmd]


@FUZZ
@given(argv=llm_load_lines())
def test_llm_load_command_lines(cli, argv):  # type: ignore[no-untyped-def]
    check(argv, cli.run(argv))
