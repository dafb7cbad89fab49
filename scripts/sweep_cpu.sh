#!/usr/bin/env bash
# The searches behind the CPU defaults (config.PRESETS["cpu"]): train on tiny Shakespeare for a fixed wall-clock
# budget with each candidate setting and print the full validation loss as a Markdown table, added to
# benchmarks/RESULTS.md under this machine's kind. Candidates come on stdin, one per line, as NAME=VALUE pairs over
# the cpu preset (--preset auto, the default, sizes its own model: `python -m chargpt.bench quality` without
# --set preset=cpu compares against that); the first row is always the cpu preset itself:
#   printf 'n-embd=192 n-head=6\nbatch-size=16\n' | bash scripts/sweep_cpu.sh 120
#   bash scripts/sweep_cpu.sh 120 < scripts/search_muon.txt
# Run it on an otherwise idle machine: the budget is wall-clock time. (Same as python -m chargpt.bench quality
# --candidates FILE.)
set -euo pipefail
cd "$(dirname "$0")/.."
T=${1:-120}
DATA=${2:-data/tinyshakespeare.txt}
[ -f "$DATA" ] || python -m chargpt data get tinyshakespeare
# --val-split tail: the last 10% validates, as in tiny Shakespeare's published numbers (and RESULTS.md's)
python -m chargpt.bench quality --data "$DATA" --max-time "$T" --set preset=cpu --set val-split=tail \
    --candidates /dev/stdin --write
