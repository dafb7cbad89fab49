#!/usr/bin/env bash
# The search behind the CPU defaults (config.PRESETS["cpu"]): train on tiny Shakespeare for a fixed wall-clock
# budget with each candidate setting and print the full validation loss; lines are appended to
# benchmarks/sweep_cpu.log. Candidates come on stdin, one per line, as NAME=VALUE pairs over the defaults:
#   printf 'n-embd=192 n-head=6\nbatch-size=16\n' | bash scripts/sweep_cpu.sh 120
# Run it on an otherwise idle machine: the budget is wall-clock time.
set -uo pipefail
cd "$(dirname "$0")/.."
T=${1:-120}
DATA=${2:-../shared/data/tinyshakespeare.txt}
mkdir -p benchmarks
while read -r settings; do
  args=()
  for s in $settings; do args+=(--set "$s"); done
  python -m chargpt.bench quality --data "$DATA" --max-time "$T" "${args[@]}" 2>/dev/null | tail -1 \
    | tee -a benchmarks/sweep_cpu.log
done
