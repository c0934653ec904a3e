#!/usr/bin/env bash
# protocol_gpu.sh: the paired A/B protocol (fa_variants.bench.paired) vs the rounds protocol, one H200. <= 4 min.
#
#   source .gpu/env.sh; scripts/protocol_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# Shapes: bf16, N 16k (B 1), non-causal, D 128 (H 16) and D 256 (H 8); entries old and new (D 128: different
# configs; D 256: the same config, i.e. an A/A pair) beside flash-attn-4.
# 0. scripts/fa3_speed_ab.py --precompile: the 4 kernels of ours and flash-attn-4's 2 (its disk cache), 6 processes.
# 1. scripts/fa3_speed_ab.py --protocol rounds,paired x 3 (one process; per shape the two protocols alternate,
#    three times): rounds = the protocol before (do_bench medians, 6 rotated rounds); paired = the new default
#    (6 rounds x 4 cycles of 20 ms CUDA-graph bursts, ABC CBA, A/A control, NVML clock per burst).
# 2. the paired protocol with more samples (8 rounds x 8 cycles of 25 ms bursts), once.
# Pass: (a) every paired row's A/A band (largest distance of its interval's ends from 1) is <= 0.010;
# (b) D 256 new/old is reported "same A/A" (timed once); (c) over the 3 repeats, the paired protocol's range of
# new/old and of new/fa4 (PROTOCOL lines) is <= 0.010 on both shapes and smaller than the rounds protocol's;
# (d) the D 128 new/old verdict is the same in all 3 paired repeats and in step 2; (e) the report lines show
# "graph x N" for every entry (else the eager fallback's reason) and a clock in MHz (not nan).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/protocol}"; gpu_session "$out/logs" "$@"
SHAPES="--head-dims 128,256 --seqlens 16384 --causal no --variants old,new --peers flash-attn-4"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
step precompile 90 python3 scripts/fa3_speed_ab.py --precompile 6 --precompile-fa4 $SHAPES
step ab 100 python3 scripts/fa3_speed_ab.py $SHAPES --protocol rounds,paired,rounds,paired,rounds,paired \
  --out "$out/ab"
step long 45 python3 scripts/fa3_speed_ab.py $SHAPES --protocol paired --rounds 8 --cycles 8 --burst-ms 25 \
  --out "$out/long"
echo "== precompile"; grep -E "^precompiled|Error|Traceback" "$out/logs/precompile.log"
for s in ab long; do
  echo "== $s"; grep -E "errors:|Traceback|Error|INTERRUPTED" "$out/logs/$s.log" | head -n 5
  grep -E "^    (A/A|new/|  )" "$out/logs/$s.log" | head -n 40
  grep -E "^(SUMMARY|PROTOCOL)" "$out/logs/$s.log"
done
steps_exit
