"""A real llama.cpp `llama-server` for the tests and benches: its binary (built once by
scripts/llama_server.sh, cached outside the clone) serving a small random-weight llama model
written here with the `gguf` package. Nothing is downloaded.

The vocabulary is SentencePiece-style: control tokens, the 256 byte tokens, and every prefix
of "▁" + word for servelab's prompt words (data/words.txt), so a prompt of those words is one
token a word (each word merges up through its prefixes) and any other text still tokenizes
(byte fallback). The output rows of control and byte tokens are zero, so greedy decoding
never picks them against the words' random logits: every streamed chunk is one word token.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from servelab.measure.llm_workload import words
from servelab.measure.process import free_port, server_process

T = TypeVar("T")

ROOT = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class TinyLlama:
    """A llama shape. The defaults are the fast one (about 3.4M parameters, F32)."""

    n_embd: int = 256
    n_layer: int = 4
    n_head: int = 4
    n_head_kv: int = 4
    n_ff: int = 688
    n_ctx: int = 4096
    f16: bool = False


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Pieces, scores and token types (1 normal, 2 unknown, 3 control, 6 byte)."""
    pieces = ["<unk>", "<s>", "</s>"]
    types = [2, 3, 3]
    pieces += [f"<0x{b:02X}>" for b in range(256)]
    types += [6] * 256
    seen = set(pieces)
    for w in words():
        full = "\u2581" + w
        for k in range(2, len(full) + 1):
            p = full[:k]
            if p not in seen:
                seen.add(p)
                pieces.append(p)
                types.append(1)
    for ch in "\u2581\n":
        if ch not in seen:
            seen.add(ch)
            pieces.append(ch)
            types.append(1)
    # SentencePiece merges the highest-scored pair first: longer pieces score higher, so a
    # word merges up through its prefixes to the whole word.
    scores = [0.0 if t != 1 else float(len(p)) for p, t in zip(pieces, types, strict=True)]
    return pieces, scores, types


def write_gguf(path: Path, shape: TinyLlama = TinyLlama(), seed: int = 0) -> Path:
    """Write a random-weight llama GGUF at `path` (seconds, even for ~100M parameters)."""
    import gguf

    pieces, scores, types = vocabulary()
    n_vocab = len(pieces)
    head_dim = shape.n_embd // shape.n_head
    rng = np.random.default_rng(seed)
    dt = np.float16 if shape.f16 else np.float32

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols), dtype=np.float32) / np.sqrt(cols)).astype(dt)

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_name("servelab-tiny-llama")
    w.add_context_length(shape.n_ctx)
    w.add_embedding_length(shape.n_embd)
    w.add_block_count(shape.n_layer)
    w.add_feed_forward_length(shape.n_ff)
    w.add_head_count(shape.n_head)
    w.add_head_count_kv(shape.n_head_kv)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if shape.f16 else gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(pieces)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_tensor("token_embd.weight", mat(n_vocab, shape.n_embd))
    out = mat(n_vocab, shape.n_embd)
    out[np.array(types) != 1] = 0  # never sampled: control and byte tokens
    w.add_tensor("output.weight", out)
    w.add_tensor("output_norm.weight", np.ones(shape.n_embd, np.float32))
    kv = shape.n_head_kv * head_dim
    for i in range(shape.n_layer):
        b = f"blk.{i}."
        w.add_tensor(b + "attn_norm.weight", np.ones(shape.n_embd, np.float32))
        w.add_tensor(b + "attn_q.weight", mat(shape.n_embd, shape.n_embd))
        w.add_tensor(b + "attn_k.weight", mat(kv, shape.n_embd))
        w.add_tensor(b + "attn_v.weight", mat(kv, shape.n_embd))
        w.add_tensor(b + "attn_output.weight", mat(shape.n_embd, shape.n_embd))
        w.add_tensor(b + "ffn_norm.weight", np.ones(shape.n_embd, np.float32))
        w.add_tensor(b + "ffn_gate.weight", mat(shape.n_ff, shape.n_embd))
        w.add_tensor(b + "ffn_up.weight", mat(shape.n_ff, shape.n_embd))
        w.add_tensor(b + "ffn_down.weight", mat(shape.n_embd, shape.n_ff))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def llama_server_binary() -> str | None:
    """The cached llama-server, built now if missing (minutes, once); None if it can't be."""
    try:
        done = subprocess.run(["bash", str(ROOT / "scripts" / "llama_server.sh")],
                              capture_output=True, text=True, timeout=1800, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    path = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    return path if done.returncode == 0 and os.access(path, os.X_OK) else None


@contextlib.contextmanager
def llama_server(binary: str, model: Path, *, slots: int = 4, ctx: int = 8192,
                 threads: int = 2, extra: tuple[str, ...] = (),
                 cpus: frozenset[int] | None = None) -> Iterator[str]:
    """llama-server on a free loopback port with continuous batching over `slots` slots
    and its /metrics on (pinned to `cpus` if given); yields the base URL once /health
    answers 200."""
    port = free_port()
    cmd = [binary, "-m", str(model), "--host", "127.0.0.1", "--port", str(port),
           "-np", str(slots), "-c", str(ctx), "-t", str(threads), "--metrics",
           "--no-webui", *extra]
    with server_process(cmd, f"http://127.0.0.1:{port}/health", timeout_s=120, cpus=cpus):
        yield f"http://127.0.0.1:{port}"


# A memory-bound server in miniature: F16, 768 wide, 8 layers, about 100 MB
MID = TinyLlama(n_embd=768, n_layer=8, n_head=12, n_head_kv=4, n_ff=2048, f16=True)


@contextlib.contextmanager
def mid_llama_server(binary: str, folder: Path, extra: tuple[str, ...] = (),
                     shape: TinyLlama = MID) -> Iterator[str]:
    """The validate test's and benches' server: MID (or another `shape`) written into
    `folder`, 4 slots of 1,024 tokens, one thread on CPU 1 (where there is more than one
    CPU), so the client keeps CPU 0 to itself, and any `extra` flags; yields the base
    URL."""
    model = write_gguf(folder / "mid.gguf", shape)
    cpus = frozenset({1}) if len(os.sched_getaffinity(0)) > 1 else None
    with llama_server(binary, model, slots=4, ctx=4096, threads=1, cpus=cpus,
                      extra=extra) as url:
        yield url


def on_mid_llama_server(run: Callable[[str], Awaitable[T]]) -> T:
    """A bench's `run(url)` against a fresh `mid_llama_server`, the client pinned to CPU 0;
    exits with the fix when llama-server is not built."""
    binary = llama_server_binary()
    if binary is None:
        sys.exit("llama-server is not built: run scripts/llama_server.sh (cmake, g++)")
    with (tempfile.TemporaryDirectory(prefix="servelab-bench-") as tmp,
          mid_llama_server(binary, Path(tmp)) as url):
        os.sched_setaffinity(0, {0})
        return asyncio.run(run(url))


def validate_report(done: subprocess.CompletedProcess[str], run: int, out: Path | None,
                    stem: str) -> dict[str, Any]:
    """The report of a bench's `servelab llm validate --json` run (exit 1, a figure
    missed, is still one; any other exit ends the bench), kept as `out/stem-run.json`
    when `out` is given."""
    if done.returncode not in (0, 1):
        sys.exit(f"run {run}: {done.stderr.strip()[-500:]}")
    report: dict[str, Any] = json.loads(done.stdout)
    if out is not None:
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{stem}-{run}.json").write_text(done.stdout)
    return report
