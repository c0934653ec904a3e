#!/usr/bin/env bash
# pending7_gpu.sh: what session 7 built and could not run on a GPU (its device time ran out), on one H200. ~3.5 min.
#
#   source .gpu/env.sh && scripts/pending7_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 1. tests/test_decode_fused_gpu.py -k "lengths_0_and_1 or auto_uses or repeated_calls": the 4 tests session 7's GPU
#    suite failed (FA_VARIANTS_FUSED_MERGE on met the new first_row_only default), fixed in f9a6ac9 on the CPU.
# 2. scripts/fp8d128_gpu.sh (issue 10: Sm90Config.q_tail_first with the 192 x 128 lookahead at D128, exp2_emu at
#    D64; its header has the pass rule, the prediction and the flip rule).
# Each script's logs go to $OUT/<name>/ and a tar.gz beside it; the summaries print at the end.
# Pass: (1) 0 failed; (2) as its header says.
set -uo pipefail
source "$(dirname "$0")/steps.sh"; help_from_header "$@"
out="${OUT:-results}/pending7"; session_setup "$out"
step fused 40 python3 -m pytest -q -n 6 -m gpu -p no:cacheprovider --tb=line -rfEX tests/test_decode_fused_gpu.py \
  -k "lengths_0_and_1 or auto_uses or repeated_calls"
for s in fp8d128; do
  mkdir -p "$out/$s"; OUT="$out/$s" bash "$(dirname "$0")/${s}_gpu.sh" > "$out/$s.out" 2>&1
  echo "== $s: rc=$?"
done
stop_clocks
echo "-- fused"; grep -E "^(FAILED|ERROR)|passed|failed|\[100%\]" "$out/fused.log" | tail -n 6
for s in fp8d128; do echo "-- $s"; tail -n 40 "$out/$s.out"; done
