#!/usr/bin/env bash
# polybf16_gpu.sh: issue 12, Sm90Config.exp2_poly in bf16 fa3: every k-th exponential of a row by a polynomial on the FMA
# pipe instead of MUFU.EX2, on one H100 or H200: a paired A/B at head_dim 64 and 128 beside flash-attn-4 and cuDNN (its
# GPU tests run in fp8poly_gpu.sh). ~250-350 s cold (limits 90 + 240 s).
#
#   source .gpu/env.sh && scripts/polybf16_gpu.sh         (repository root; writes under $OUT/polybf16; --help)
#
# Why (bench/NOTES.md, "Session 38 ... exp2_poly"): at bf16 head_dim 64 the MUFU takes as long per score as the tensor
# cores (16 exponentials vs 4096 / (4 x 64) scores per SM and clock), where fa3 / flash-attn-4 is 0.93-0.94; at 128
# half as long. Session 38 (H100) timed fa3-fp8's k 3 / 4: slower (0.88-0.96x), as the issue-slot model says (each
# exponential moved costs 8 more instructions; a sub-partition issues one a clock). That model, from the loop's SASS
# (bf16 D 64: 404 instructions and 66 MUFU.EX2 a warp and K/V tile, 3 warps a sub-partition, tensor 1536 clocks):
# k 8 / 12 reach the tensor bound, 1536 against the default's 1584 clocks (1.03x); k 3 1695 (0.93x).
# 0. precompile: scripts/fa3_speed_ab.py --precompile for old / new / poly8 / poly12 (64) at the A/B's shapes, with
#    flash-attn-4's kernels (its disk cache on).
# 1. scripts/fa3_speed_ab.py, paired, 6 rounds: old / new / poly8 / poly12 (64) beside flash-attn-4 and cuDNN at D 64
#    and 128, N 4k / 16k, causal and not.
# Pass: precompile without error; no ERR in the A/B. Prediction: poly8 or poly12 / new 1.00-1.03 at 64; poly8 / new
# 0.98-1.00 at 128 (the tensor cores bound there).
# Flip rule: exp2_poly into fa3's DEFAULT_CONFIGS at a head_dim if its best k is "faster" at >= 2 shapes and "same" or
# "faster" at the rest, and fp8poly_gpu.sh's bf16 tests passed on the same tree.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/polybf16"; gpu_session "$out/logs" "$@"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
SHAPES=64:4096:full,64:4096:causal,64:16384:full,64:16384:causal,128:4096:full,128:4096:causal,128:16384:full,128:16384:causal
VARIANTS=old,new,poly8,poly12
step precompile 90 python3 scripts/fa3_speed_ab.py --precompile 8 --precompile-fa4 --variants $VARIANTS \
  --shapes "$SHAPES"
step speed_ab 240 python3 scripts/fa3_speed_ab.py --variants $VARIANTS --shapes "$SHAPES" \
  --peers flash-attn-4,sdpa-cudnn --burst-ms 10 --out "$out/ab"
echo; stop_clocks; cat "$LOGS/commit.txt"
echo "== speed_ab"; grep -E "ERR|A/A|/new|^D ?[0-9]" "$LOGS/speed_ab.log" | head -n 80
cat "$out/ab/summary.md" 2>/dev/null | head -n 60
steps_exit
