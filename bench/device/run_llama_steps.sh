#!/usr/bin/env bash
# Run THERE (a GPU machine with PyTorch): llama_steps.py for Llama 3.1 8B (tp 1) and for
# one GPU's shard of Llama 3.1 70B at tp 4 and tp 2. Results under $OUT; copy them into
# bench/device/results/. PASS=lean: the fused variant (--lean) for 8B and 70B at tp 2,
# and 8B without attention. PASS=mixed: prompt chunks inside decode steps (8B, 70B tp 4).
# PASS=cudnn: the lean steps with cuDNN's split-KV decode attention (--attn cudnn), and
# attn_decode.py (decode attention alone, kernel by kernel).
#
#   device run:  bash bench/device/run_llama_steps.sh
#   device run:  PASS=lean bash bench/device/run_llama_steps.sh
set -u
export PYTHONUNBUFFERED=1
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/out}; mkdir -p "$OUT"
exec > >(tee "$OUT/log") 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,power.limit --format=csv
python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda)"
steps() { timeout "$1" python3 bench/device/llama_steps.py --out "$OUT" "${@:2}"; }
# a prompt chunk of C tokens inside a step of B decodes (1,024 tokens of context each)
MIXED="mixed:$(python3 -c "print(','.join(f'{b}/1024/{c}' for b in (0, 32, 64, 128, 256)
    for c in (0, 32, 64, 128, 256, 512, 1024) if b or c))")"
if [ "${PASS:-}" = mixed ]; then
    steps 120 --model llama-3.1-8b --lean --grid "$MIXED" --tag mixed
    steps 150 --model llama-3.1-70b --tp 4 --lean --grid "$MIXED" --tag mixed
elif [ "${PASS:-}" = cudnn ]; then
    timeout 300 python3 bench/device/attn_decode.py --out "$OUT"
    steps 100 --model llama-3.1-8b --lean --attn cudnn
    steps 130 --model llama-3.1-70b --tp 4 --lean --attn cudnn
    steps 130 --model llama-3.1-70b --tp 2 --kv-cap 262144 --lean --attn cudnn
elif [ "${PASS:-}" = lean ]; then
    steps 120 --model llama-3.1-8b --lean
    steps 120 --model llama-3.1-8b --lean --no-attention
    steps 150 --model llama-3.1-70b --tp 2 --kv-cap 262144 --lean
else
    steps 200 --model llama-3.1-8b
    steps 150 --model llama-3.1-70b --tp 4
    steps 150 --model llama-3.1-70b --tp 2 --kv-cap 262144
fi
nvidia-smi --query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu --format=csv
