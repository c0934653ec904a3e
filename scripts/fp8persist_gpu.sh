#!/usr/bin/env bash
# fp8persist_gpu.sh: issue 10, fa3-fp8 on fa3's persistent grid (session 22: persistent=True, balanced=True), on one
# H200: its GPU tests and a paired A/B against the default grid. ~420-520 s cold (limits 170 + 140 + 230 s).
#
#   source .gpu/env.sh && scripts/fp8persist_gpu.sh          (repository root; writes under $OUT/fp8persist; --help)
#
# Why (bench/NOTES.md, "Session 22 (2026-12-03): fa3-fp8 on the persistent grid; predictions before the run"): at N 4k
# causal fa3-fp8 is 1.08-1.12x bf16 fa3 at D 64 / 128 while non-causal it is 1.12-1.23x: bf16 fa3's causal calls run
# the balanced persistent grid since session 18 (1.04-1.18x its one-CTA-per-tile grid at N 1k-4k), fa3-fp8 refused
# persistent=True. Causal / non-causal TFLOP/s at N 4k D 128: 0.84 fa3-fp8, 0.91 bf16 fa3.
# 0. precompile: scripts/fa3_fp8_speed_ab.py --set fp8persist --phase precompile (new / persist / balanced at D 64,
#    128, 256, both causal modes; bf16 fa3's own config at each A/B shape; the tests' kernels).
# 1. GPU tests: tests/test_fa3_fp8_persistent_gpu.py (62: persist and balanced bit for bit the default grid's O and
#    LSE, and vs the emulation and float64, NaN-poisoned outputs; the default taking the balanced grid).
# 2. scripts/fa3_fp8_speed_ab.py --set fp8persist --protocol paired: N 1k / 2k / 4k / 8k / 16k, causal and not,
#    B*N = 16k, H*D = 2048, beside bf16 fa3 and flash-attn-4; ratios against new with the A/A interval.
# Pass: precompile "0 failed"; "62 passed"; no FAILED line in the A/B. Prediction and flip rule: bench/NOTES.md.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/fp8persist"; gpu_session "$out/logs" "$@"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
SEQLENS="1024 2048 4096 8192 16384"
step precompile 170 python3 scripts/fa3_fp8_speed_ab.py --set fp8persist --phase precompile --seqlens $SEQLENS --jobs 14
step pytest 140 python3 -m pytest -q $(xdist_flag 8) -m gpu -p no:cacheprovider --tb=short -rfE \
  tests/test_fa3_fp8_persistent_gpu.py
step speed_ab 230 python3 scripts/fa3_fp8_speed_ab.py --set fp8persist --phase measure --seqlens $SEQLENS \
  --protocol paired --burst-ms 10 --no-errors --out "$out/ab"
echo; stop_clocks; cat "$LOGS/commit.txt"
grep -E "precompile:|FAILED" "$LOGS/precompile.log" | head -8
expect_passed 62
ab_report "$out/ab" 260
steps_exit
