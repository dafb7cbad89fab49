#!/usr/bin/env bash
# One-shot check on a CUDA machine (about 6-8 minutes on one H200):
#   1. the test suite, 2. the speed benchmark, 3. the standard tiny-Shakespeare run: 6 layers x 384, context
#   256, dropout 0.2, 5,000 steps of 64 x 256 characters, printing val loss and wall time (target: val loss
#   <= 1.47 in under 2 minutes on one H200).
# Usage: bash scripts/gpu_check.sh [path/to/tinyshakespeare.txt]
# Installs nothing: it runs the repository in place with the machine's own torch, numpy, click, tqdm,
# safetensors and pytest (PYTHONPATH=.), so it also works on a machine without network access.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
DATA=${1:-../shared/data/tinyshakespeare.txt}
RUN=${RUN_DIR:-/tmp/chargpt-gpu-check}
LOG=${OUT:-/tmp}/gpu_check.log
status=0

python3 - <<'PY' || exit 1
import torch
assert torch.cuda.is_available(), "no CUDA device visible to torch"
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, bf16: {torch.cuda.is_bf16_supported()}")
for mod in ("numpy", "click", "tqdm", "safetensors", "pytest"):
    __import__(mod)
PY

echo "== 1. tests"
timeout 240 python3 -m pytest -q -x -p no:cacheprovider tests || status=1

echo "== 2. benchmark"
timeout 120 python3 -m chargpt.bench --only peak train decode || status=1

echo "== 3. tiny Shakespeare, 5000 steps of 64 x 256"
rm -rf "$RUN"
start=$(date +%s)
timeout 300 python3 train.py --data "$DATA" --out-dir "$RUN" --device cuda --n-layer 6 --n-head 6 --n-embd 384 \
    --block-size 256 --dropout 0.2 --batch-size 64 --max-iters 5000 --learning-rate 1e-3 --min-lr 1e-4 \
    --warmup-iters 100 --eval-interval 500 --eval-iters 50 --compile --sample-chars 300 2>&1 | tee "$LOG" \
    || status=1
echo "wall time: $(( $(date +%s) - start )) s (including torch.compile)"
python3 - "$RUN" <<'PY' || status=1
import json, sys
rows = [json.loads(l) for l in open(f"{sys.argv[1]}/metrics.jsonl")]
best = min(r["val_loss"] for r in rows)
print(f"final val loss {rows[-1]['val_loss']:.4f}, best {best:.4f}, training time {rows[-1]['elapsed_s']:.0f} s")
PY
exit $status
