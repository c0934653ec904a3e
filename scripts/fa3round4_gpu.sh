#!/usr/bin/env bash
# fa3round4_gpu.sh: issue 12, round 4 on one H200: the new Sm90Config switches' GPU tests, then the fa3 A/B. ~4-5 min.
#
#   source .gpu/env.sh; scripts/fa3round4_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 1. tests/test_fa3_gpu.py -k round4 (-n 8): the round-4 variants of scripts/fa3_speed_ab.py (pairs-256, fa4-256,
#    n176, stages3 at D 64/128, k-first) vs float64, causal and not, odd lengths, Nq != Nk, GQA, rows that see no
#    key, fp16 for the pair conversion (the default kernels' SASS is unchanged by this round: checked on the CPU).
#    The compiles land in the disk cache, so step 2 reuses them.
# 2. scripts/fa3_speed_ab.py --peers flash-attn-4,cudnn (round 4 default: old, new + the variants above beside
#    flash-attn-4 and SDPA's cuDNN; D 64/128/256, N 4k/16k, causal and not, 6 rotated rounds, nvidia-smi clocks).
# Pass: (1) 0 failed / 0 errors. (2) every row's max diff vs
# old <= ~4e-3 (bf16 rounding of another reduction order; round 3: <= 2e-3), no "errors:"; the SUMMARY lines (tail) give per shape
# new/old new/fa4 new/cudnn (the cuDNN column is no longer nan) and x/new x/fa4 per variant: a variant is worth a
# default if x/new >= 1.02 on every shape of its head dim (bench/NOTES.md, "Issue 12, round 4").
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/fa3round4}"; gpu_session "$out/logs" "$@"
step pytest_round4 110 python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider --tb=short -rfEX \
  tests/test_fa3_gpu.py -k round4
step fa3ab 210 python3 scripts/fa3_speed_ab.py --peers flash-attn-4,cudnn --out "$out/fa3ab"
echo "== pytest_round4"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest_round4.log" | tail -n 15
echo "== fa3ab"; grep -E "errors:|Traceback|Error" "$out/logs/fa3ab.log" | head -n 5; grep "^SUMMARY" "$out/logs/fa3ab.log"
steps_exit
