#!/usr/bin/env bash
# twins_gpu.sh: on one H200 (~3 min), the GPU tests whose set-up or checks moved into shared helpers this session
# (tests/helpers.py: padded_kv_cache, assert_attention_ok(seqlens_k=); fa_variants.bench.decode.capture_graph),
# run through scripts/steps.sh's session_setup / step / pack_logs on a real nvidia-smi.
#
#   source .gpu/env.sh; scripts/twins_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 1. tests/test_decode_gpu.py: rows that see no key, CUDA-graph replay (plain, packed, PDL), seqlens_k through
#    the API, split-KV at 3 splits, auto through the public API, split options.
# 2. tests/test_decode_fused_gpu.py: seqlens_k with lengths 0 and 1, CUDA-graph replay, fused vs two kernels,
#    a split count of one, auto's fused kernel; tests/test_fa2_split_gpu.py -k seqlens_k.
# Pass: 0 failed / 0 errors in both; logs.tgz holds commit.txt, gpu.txt (the H200's line) and clocks.csv (SM
# clock samples, one a second), the summary prints gpu.txt and the clock samples' count.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/twins}"; gpu_session "$out/logs" "$@"
PYTEST=(python3 -m pytest -q -n 8 -m gpu -p no:cacheprovider --tb=short -rfEX)
step decode 130 "${PYTEST[@]}" tests/test_decode_gpu.py -k "rows_that_see_no_key or cuda_graph_replay or seqlens_k \
or (split_kv_matches_reference and splits3) or auto_splits_decode or auto_packs_decode or split_options"
step fused 90 "${PYTEST[@]}" tests/test_decode_fused_gpu.py tests/test_fa2_split_gpu.py \
  -k "seqlens_k or cuda_graph_replay or fused_equals or split_count_of_one or auto_uses_the_fused"
pack_logs "$out/logs.tgz"
for s in decode fused; do echo "== $s"; grep -E "^(FAILED|ERROR)|passed|failed" "$LOGS/$s.log" | tail -n 12; done
echo "== gpu.txt"; cat "$LOGS/gpu.txt"; echo "== clocks.csv: $(grep -c MHz "$LOGS/clocks.csv") samples"
steps_exit
