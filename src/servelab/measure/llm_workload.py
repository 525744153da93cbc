"""What an LLM load run sends: prompts and output lengths, as `vllm bench serve` draws them.

Three sources, each giving a list of `LlmRequest`:

- **random** (vLLM's `--dataset-name random`): input and output lengths uniform in
  [len × (1 − r), len × (1 + r)] (`--random-range-ratio r`), an optional shared prefix of
  `--random-prefix-len` tokens. servelab cannot load the server's tokenizer (nothing comes
  from a model hub), so a prompt is made of common English words, each one token in the
  usual vocabularies, and the words per token are measured on the server first (a probe's
  `usage.prompt_tokens`); the report gives the lengths the server counted.
- **sharegpt**: a ShareGPT-format JSON file (a list of `{"conversations": [{"from": "human",
  "value": ...}, {"from": "gpt", "value": ...}]}`), the first turn as the prompt and the
  reply's length as the output length, with vLLM's filters (prompt and output at least 4
  tokens, prompt at most 1,024, both at most 2,048).
- **jsonl**: one `{"prompt": "...", "output_tokens": N}` per line.

Prompts are unique per request unless a prefix share is asked for: the first words of every
random prompt spell its index, so no two share more than the asked-for prefix and a server's
prompt cache cannot make a "random" run look fast.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path

import numpy as np

from servelab.errors import InputError, invalid

MAX_PROMPTS = 100_000
MAX_INPUT_TOKENS = 262_144
MAX_OUTPUT_TOKENS = 65_536
MAX_TOTAL_TOKENS = 20_000_000  # prompt tokens a run's random prompts may hold in memory
MAX_FILE_BYTES = 512 * 1024 * 1024  # a dataset file read whole: 512 MiB at most
_INDEX_WORDS = 3  # words spelling a request's index: 342**3 = 40M prompts


@dataclass(frozen=True, slots=True)
class LlmRequest:
    """One request of a run: the prompt text and the output tokens asked for (the prompt's
    tokens are the server's to count: its usage says)."""

    prompt: str
    max_tokens: int
    # llama.cpp's `id_slot`: the slot to run in (validate's profile pins its requests, so
    # it knows which ubatches each step made); None: the server chooses
    id_slot: int | None = None


@cache
def words() -> tuple[str, ...]:
    """The vocabulary prompts are made of (unique, in file order)."""
    text = resources.files("servelab.data").joinpath("words.txt").read_text()
    seen: dict[str, None] = {}
    for line in text.splitlines():
        if not line.startswith("#"):
            for w in line.split():
                seen.setdefault(w, None)
    return tuple(seen)


def _index_words(i: int) -> list[str]:
    vocab = words()
    out = []
    for _ in range(_INDEX_WORDS):
        i, digit = divmod(i, len(vocab))
        out.append(vocab[digit])
    return out


def _check_len(field: str, value: int, low: int, high: int) -> None:
    if not low <= value <= high:
        raise invalid(field, value, f"an integer from {low:,} to {high:,}",
                      f"set {field} within that range")


def check_random(n: int, *, input_len: int, output_len: int, range_ratio: float = 0.0,
                 prefix_len: int = 0, tokens_per_word: float = 1.0, seed: int = 0,
                 first_index: int = 0) -> None:
    """Refuse, with the flag's name, settings `random_requests` cannot honour (cheap: run
    it before touching a server)."""
    _check_len("--num-prompts", n, 1, MAX_PROMPTS)
    _check_len("--random-input-len", input_len, 1, MAX_INPUT_TOKENS)
    _check_len("--random-output-len", output_len, 1, MAX_OUTPUT_TOKENS)
    _check_len("--random-prefix-len", prefix_len, 0, MAX_INPUT_TOKENS)
    _check_len("prompt index", first_index, 0, len(words()) ** _INDEX_WORDS - n)
    if n * (prefix_len + input_len) > MAX_TOTAL_TOKENS:
        raise invalid("--num-prompts × (--random-prefix-len + --random-input-len)",
                      n * (prefix_len + input_len), f"at most {MAX_TOTAL_TOKENS:,} tokens",
                      "send fewer or shorter prompts")
    if not 0 <= seed < 2**32:
        raise invalid("--seed", seed, "an integer from 0 to 2**32 - 1", "e.g. --seed 0")
    if not 0.0 <= range_ratio < 1.0:
        raise invalid("--random-range-ratio", range_ratio, "a number from 0 up to (not "
                      "including) 1", "e.g. --random-range-ratio 0.5 for ±50%")
    if not 0.05 <= tokens_per_word <= 20.0:
        raise invalid("tokens per word", tokens_per_word, "0.05 to 20 (measured by the probe)",
                      "check that the server counts prompt tokens in its usage")


def random_requests(n: int, *, input_len: int, output_len: int, range_ratio: float = 0.0,
                    prefix_len: int = 0, tokens_per_word: float = 1.0,
                    seed: int = 0, first_index: int = 0) -> list[LlmRequest]:
    """`n` prompts of about `input_len` tokens after a shared prefix of `prefix_len`
    tokens, each asking for about `output_len` tokens (vLLM's random dataset). Prompt i
    starts (after the prefix) with words spelling `first_index + i`: give each step of a
    run its own range and no prompt repeats."""
    check_random(n, input_len=input_len, output_len=output_len, range_ratio=range_ratio,
                 prefix_len=prefix_len, tokens_per_word=tokens_per_word, seed=seed,
                 first_index=first_index)
    vocab = np.array(words())
    # The prefix depends on the seed alone (every step of a run shares it); the rest on
    # the seed and the first index (each step draws its own).
    prefix_rng = np.random.default_rng(seed)
    prefix = list(vocab[prefix_rng.integers(0, vocab.size, round(prefix_len / tokens_per_word))])
    rng = np.random.default_rng((seed, first_index))
    lo_in, hi_in = max(1, int(input_len * (1 - range_ratio))), int(input_len * (1 + range_ratio))
    lo_out = max(1, int(output_len * (1 - range_ratio)))
    hi_out = int(output_len * (1 + range_ratio))
    in_lens = rng.integers(lo_in, hi_in + 1, n)
    out_lens = np.minimum(rng.integers(lo_out, hi_out + 1, n), MAX_OUTPUT_TOKENS)
    out = []
    for i in range(n):
        body_words = max(_INDEX_WORDS, round(int(in_lens[i]) / tokens_per_word))
        body = _index_words(first_index + i) + list(vocab[rng.integers(0, vocab.size,
                                                         body_words - _INDEX_WORDS)])
        out.append(LlmRequest(" ".join(prefix + body), int(out_lens[i])))
    return out


def _read_text(path: Path, field: str) -> str:
    try:
        if not path.is_file():  # a folder, a device (/dev/zero never ends), a pipe
            raise invalid(field, str(path), "a regular file", "give a dataset file's path")
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise invalid(field, str(path), f"a file of at most {MAX_FILE_BYTES >> 20} MiB "
                          f"(it has {size >> 20} MiB)", "take a sample of it")
        return path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise invalid(field, str(path), "a readable UTF-8 file",
                      f"check the path ({type(exc).__name__}: {exc})") from exc


def sharegpt_requests(path: Path, n: int, *, tokens_per_word: float = 1.3,
                      output_len: int | None = None, seed: int = 0) -> list[LlmRequest]:
    """`n` requests drawn from a ShareGPT-format file (shuffled by `seed`, as vLLM
    shuffles it), lengths estimated from word counts at `tokens_per_word`."""
    _check_len("--num-prompts", n, 1, MAX_PROMPTS)
    try:
        data = json.loads(_read_text(path, "--dataset-path"))
    except json.JSONDecodeError as exc:
        raise invalid("--dataset-path", str(path), "a ShareGPT JSON list",
                      f"fix the JSON (line {exc.lineno}: {exc.msg})") from exc
    if not isinstance(data, list):
        raise invalid("--dataset-path", str(path), "a JSON list of conversations",
                      "give a ShareGPT-format file")
    order = np.random.default_rng(seed).permutation(len(data))
    out: list[LlmRequest] = []
    for j in order:
        conv = data[int(j)].get("conversations") if isinstance(data[int(j)], dict) else None
        if not (isinstance(conv, list) and len(conv) >= 2
                and all(isinstance(t, dict) and isinstance(t.get("value"), str)
                        for t in conv[:2])):
            continue
        prompt, reply = conv[0]["value"], conv[1]["value"]
        p = round(len(prompt.split()) * tokens_per_word)
        o = output_len or round(len(reply.split()) * tokens_per_word)
        if p < 4 or o < 4 or p > 1024 or p + o > 2048:  # vLLM's ShareGPT filters
            continue
        out.append(LlmRequest(prompt, min(o, MAX_OUTPUT_TOKENS)))
        if len(out) == n:
            break
    if not out:
        raise invalid("--dataset-path", str(path), "conversations whose first two turns have "
                      "a prompt of 4-1,024 tokens and a reply of at least 4",
                      "give a ShareGPT-format file with such conversations")
    return _cycle(out, n)


def jsonl_requests(path: Path, n: int) -> list[LlmRequest]:
    """Requests from a JSONL file of {"prompt": str, "output_tokens": int}, in order (and
    from the start again when it has fewer lines than `n`)."""
    _check_len("--num-prompts", n, 1, MAX_PROMPTS)
    out: list[LlmRequest] = []
    for k, line in enumerate(_read_text(path, "--dataset-path").splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            row = None
        if not (isinstance(row, dict) and isinstance(row.get("prompt"), str)
                and isinstance(row.get("output_tokens"), int)
                and 1 <= row["output_tokens"] <= MAX_OUTPUT_TOKENS):
            raise invalid(f"--dataset-path line {k}", line, '{"prompt": "...", '
                          f'"output_tokens": 1 to {MAX_OUTPUT_TOKENS:,}}}',
                          "fix that line of the JSONL file")
        out.append(LlmRequest(row["prompt"], row["output_tokens"]))
        if len(out) == n:
            break
    if not out:
        raise InputError(f"--dataset-path = {str(path)!r}: expected at least one JSON line; "
                         "fix: give a JSONL file with one request a line")
    return _cycle(out, n)


def _cycle(rows: list[LlmRequest], n: int) -> list[LlmRequest]:
    return [rows[i % len(rows)] for i in range(n)]
