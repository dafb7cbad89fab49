#!/usr/bin/env bash
# One check of chargpt on a CUDA GPU, run once: under 8 minutes on one H100/H200 (the parts' limits add up to 440 s).
# Each part runs in its own process under its own time limit and adds one JSON line to $OUT/gpu_check_report.jsonl
# (its log: $OUT/gpu_check_<part>.log); a part that overruns is stopped (SIGTERM, SIGKILL 5 s later) and reported
# as timed out, and the rest go on.
#   preflight     30 s  torch sees a GPU; the packages; tiny Shakespeare present and checksum-verified (no download)
#   cuda_tests    60 s  tests/test_cuda.py on the GPU
#   recipe       165 s  nanoGPT's shakespeare-char recipe (6 x 384, context 256, dropout 0.2, no bias, 5,000 steps of
#                       batch 64, AdamW, cosine, evaluated every 250 steps, the last tenth validating), compiled; it
#                       must reach a full validation loss (the whole tenth, float32) of at most 1.47. Reported: wall
#                       time, ms/step and MFU (without evaluation and compilation), peak memory, graphs compiled
#   exact_resume  55 s  compiled + Muon + --grad-accum 2 + dropout: N steps, then --resume to 2N, against 2N in one
#                       go (bitwise, or as close as two runs of the same seed, which it also reports)
#   fp16          30 s  float16 with the loss scaler and Muon for 300 steps: the loss falls, stays finite; host syncs
#   fused_loss    25 s  the fused head + loss against the full logits at 2,000 and 10,000 characters (agreement, ms,
#                       peak memory): the GPU's threshold for chargpt.model.loss.FUSED_MIN_VOCAB, from measurement
#   ddp           40 s  DDP over NCCL in one process, compiled: one graph (plain DDP's pieces counted beside it)
#   decode        35 s  batch-1 decoding of the recipe's model in float32, bf16 and the compiled step; bf16 must not
#                       be slower than float32
#   nanogpt      150 s  only with --nanogpt PATH (a nanoGPT checkout): its train.py's ms/step on the same recipe
# Then a summary table; the exit status is 0 only if every part passed.
#
# Usage: bash scripts/gpu_check.sh [--dry-run] [--nanogpt PATH] [CORPUS]
#   CORPUS       tiny Shakespeare (default data/tinyshakespeare.txt: `python -m chargpt data get tinyshakespeare`
#                on a machine with network, then carry it over); nothing is downloaded
#   --dry-run    every part on the CPU at toy sizes, with torch.compile's eager backend: checks the script itself
#                (parsing, report) in about a minute, anywhere (tests/test_gpu_paths.py runs it); no part is
#                stopped at its limit, which a busy CPU may pass (the report still shows each part's time and limit)
# Installs nothing: it runs the repository in place with the machine's torch and packages (PYTHONPATH=.).
# $OUT (default /tmp/chargpt-gpu-check) receives the report, the logs and, under work/, the runs.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
DRY="" NANOGPT="" DATA=data/tinyshakespeare.txt
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=--dry-run ;;
    --nanogpt) NANOGPT=${2:?--nanogpt needs the path of a nanoGPT checkout}; shift ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    -*) echo "error: unknown option $1 (see --help)" >&2; exit 2 ;;
    *) DATA=$1 ;;
  esac
  shift
done
OUT=${OUT:-/tmp/chargpt-gpu-check}
WORK="$OUT/work" REPORT="$OUT/gpu_check_report.jsonl"
rm -rf "$WORK" && mkdir -p "$WORK" || exit 1
: > "$REPORT"
export CHARGPT_CACHE_DIR="$WORK/cache"
status=0

# part NAME LIMIT: run it under its limit, its output shown and logged; then its line of the report. A dry run's
# verdict is what its parts check, not how fast a CPU shared with other work ran them: there timeout's 0 (none).
part() {
  local name=$1 limit=$2 start rc enforced=$2
  [ -n "$DRY" ] && enforced=0
  echo "== $name (limit $limit s${DRY:+, not enforced in a dry run})"
  start=$(date +%s.%N)
  timeout --kill-after=5 "$enforced" python3 scripts/gpu_check.py "$name" --work "$WORK" --data "$DATA" \
    ${NANOGPT:+--nanogpt "$NANOGPT"} $DRY 2>&1 | tee "$OUT/gpu_check_$name.log"
  rc=${PIPESTATUS[0]}
  python3 scripts/gpu_check.py ended "$name" --work "$WORK" --report "$REPORT" --rc "$rc" --limit "$limit" \
    --started "$start" $DRY || status=1
}

part preflight 30
if [ $status -ne 0 ]; then
  python3 scripts/gpu_check.py summary "$REPORT"
  exit 1
fi
part cuda_tests 60
part recipe 165
part exact_resume 55
part fp16 30
part fused_loss 25
part ddp 40
part decode 35
[ -n "$NANOGPT" ] && part nanogpt 150
echo "== summary"
python3 scripts/gpu_check.py summary "$REPORT" || status=1
exit $status
