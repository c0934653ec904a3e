#!/usr/bin/env bash
# persist_gpu.sh: issue 12, session 6, on one H200: the persistent fa3 grid (Sm90Config.persistent, off by default:
# one CTA per SM walks several query tiles with its pipeline states carried; common.tile_scheduler). <= 150 s.
#
#   source .gpu/env.sh; scripts/persist_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 0. scripts/fa3_speed_ab.py --precompile: old / new / persistent (bf16, D 64/128/256, causal and not; flash-attn-4's
#    kernels too, into its disk cache) and persistent in fp16 (the tests), 12 + 4 processes, into the disk cache.
# 1. GPU tests vs float64: tests/test_fa3_gpu.py -k "persistent or l2_sections or matrix_bf16": the persistent variant
#    at D 64/128/256, bf16 and fp16, causal and not, over odd lengths (1/3/113/1023), Nq != Nk both ways (rows that
#    see no key: O = 0, LSE = -inf), GQA/MQA and grids of 2-7 tiles per SM (NaN-poisoned outputs); its causal order in
#    short L2 sections; and the default kernels' bf16 matrix (their tile order now comes from common.tile_scheduler),
#    with FA_VARIANTS_SPLIT_KV=0 FA_VARIANTS_PACK_GQA=0 so that they run the precompiled unsplit kernels.
# 2. scripts/fa3_speed_ab.py: old, new, persistent beside flash-attn-4; D 64/128/256, N 4k (B*N = 16k, H*D = 2048),
#    causal and not, 6 rounds of the paired protocol, nvidia-smi clocks. 3. the same at N 16k for the time left
#    (D 64 first). A time limit still prints the SUMMARY of the shapes done.
# Pass: (0) "precompiled" lines, no Traceback. (1) 0 failed / 0 errors (a hang shows as the step's timeout, rc 124:
# a pipeline-phase or barrier bug). (2, 3) no "errors:", every row's max diff vs old <= ~4e-3 (persistent computes
# the same maths per tile). Prediction (bench/NOTES.md, "Session 6 (2026-12-01): persistent"): persistent/new 1.02-1.06
# at N 4k (the per-CTA prologue paid once per SM, the next tile's first K/V (and Q at D 64/128) loaded under the
# epilogue), 1.00-1.03 at N 16k, causal at least as much as non-causal; D 256 the least (O reuses Q's buffer, so
# its Q load still waits for the epilogue). Worth a default where persistent/new >= 1.02 on every shape of a
# head dim with new/old as in earlier runs (the A/A reference).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/persist}"; gpu_session "$out/logs" "$@"
AB="--variants old,new,persistent"
FP16="--dtype fp16 --variants persistent --seqlens 4096"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
# 18 bf16 + 6 fp16 + flash-attn-4's kernels, both pools at once (16 processes on 16 cores)
step precompile 45 bash -c "python3 scripts/fa3_speed_ab.py --precompile 12 --precompile-fa4 $AB --seqlens 4096,16384 & a=\$!; \
  python3 scripts/fa3_speed_ab.py --precompile 4 $FP16 & b=\$!; trap 'kill -INT \$a \$b' INT; wait"
NPROC=$(xdist_flag 8)
step pytest 30 env FA_VARIANTS_SPLIT_KV=0 FA_VARIANTS_PACK_GQA=0 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider \
  --tb=short -rfEX tests/test_fa3_gpu.py -k "persistent or l2_sections or matrix_bf16"
step fa3ab 50 python3 scripts/fa3_speed_ab.py $AB --seqlens 4096 --peers flash-attn-4 --out "$out/fa3ab"
step fa3ab16k 22 python3 scripts/fa3_speed_ab.py $AB --seqlens 16384 --peers flash-attn-4 --out "$out/fa3ab16k"
echo "== precompile"; grep -E "^precompiled|Error|Traceback" "$out/logs/precompile.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 15
for ab in fa3ab fa3ab16k; do
  echo "== $ab"; grep -E "errors:|Traceback|Error|INTERRUPTED" "$out/logs/$ab.log" | head -n 5
  grep "^SUMMARY" "$out/logs/$ab.log"
done
steps_exit
