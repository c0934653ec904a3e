#!/usr/bin/env bash
# fp8guard_gpu.sh: issue 10, Fp8Config.huge_guard (session 27, off): the huge-logit check of fa3-fp8 only where a
# score can reach 2^11 in log2 units, on one H200: its GPU tests and a paired A/B against the default. ~300-420 s cold
# (limits 120 + 100 + 200 s).
#
#   source .gpu/env.sh && scripts/fp8guard_gpu.sh          (repository root; writes under $OUT/fp8guard; --help)
#
# Why (bench/NOTES.md, "Session 27"): the exact form for huge logits (a break-it finding: rows of 0 / LSE -inf from
# softmax_scale ~1e8) cost 3-5 % of fa3-fp8's speed at head_dim 64 / 128; huge_guard runs the check only on tiles
# where c_n 2 head_dim 448^2 >= 2^11 (max_score since session 29) or the row max so far is huge, a condition known before S.
# 0. precompile: scripts/fa3_fp8_speed_ab.py --set fp8guard --phase precompile (new / guard at D 64 and 128, both
#    causal modes; bf16 fa3's own config at each A/B shape; the tests' kernels).
# 1. GPU tests: tests/test_fa3_fp8_gpu.py test_huge_logits "guarded" (huge logits, against float64) and
#    tests/test_fa3_fp8_speed_gpu.py "fp8guard" (the guard vs the emulation on odd shapes).
# 2. scripts/fa3_fp8_speed_ab.py --set fp8guard --protocol paired: N 4k / 16k, causal and not, B*N = 16k,
#    H*D = 2048, beside bf16 fa3 and flash-attn-4; ratios against new with the A/A interval.
# Pass: precompile "0 failed"; "24 passed"; no FAILED line in the A/B. Prediction: guard / new 1.02-1.05. Flip rule:
# on by default at 64 and 128 if "faster" or "same" everywhere and the tests pass (bench/NOTES.md).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/fp8guard"; gpu_session "$out/logs" "$@"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
SEQLENS="4096 16384"
step precompile 120 python3 scripts/fa3_fp8_speed_ab.py --set fp8guard --head-dims 64 128 --phase precompile \
  --seqlens $SEQLENS --jobs 14
step pytest 100 python3 -m pytest -q $(xdist_flag 12) -m gpu -p no:cacheprovider -k "guarded or fp8guard" --tb=short -rfE \
  tests/test_fa3_fp8_gpu.py tests/test_fa3_fp8_speed_gpu.py
step speed_ab 200 python3 scripts/fa3_fp8_speed_ab.py --set fp8guard --head-dims 64 128 --phase measure \
  --seqlens $SEQLENS --protocol paired --burst-ms 10 --no-errors --out "$out/ab"
echo; stop_clocks; cat "$LOGS/commit.txt"
grep -E "precompile:|FAILED" "$LOGS/precompile.log" | head -8
expect_passed 24
ab_report "$out/ab"
steps_exit
