#!/usr/bin/env bash
# recheck_gpu.sh: what landed after session 6's last GPU run (tree ac4e906), on one H200. <= 3 min.
#
#   source .gpu/env.sh && scripts/recheck_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 1. GPU tests of the tables fixed on the CPU after that run's suite (f1e5e77): tests/test_fa3_fp8_kernel.py -k d256
#    (the head_dim 256 variants on the serial schedule beside the lookahead default), tests/test_fa2_gpu.py -k d256
#    (the D256 switch test: s2 selected, split-KV off; the s1 default), tests/test_fa3_fp8_lookahead_gpu.py, and the
#    decode defaults (tests/test_decode_gpu.py -k "defaults or wide or dual") after the env-parser change (common/env.py).
# 2. scripts/api_overhead.py --device cuda --backend fa3,fa2 --phases --rounds 9, alone on the machine: session 6
#    measured fa3 24.5 us and fa2 41.6 us per call right after a suite cut off by its time limit (session 5: 20.4 /
#    20.2); the CPU-stubbed path was no slower, so the prediction is fa3 and fa2 back at 20-25 us.
# Pass: (1) 0 failed / 0 errors; (2) both SUMMARY lines "meets 25 us".
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/recheck}"; gpu_session "$out/logs" "$@"
NPROC=$(xdist_flag 8)
step overhead 45 python3 scripts/api_overhead.py --device cuda --backend fa3,fa2 --phases --rounds 9
step pytest 110 python3 -m pytest -q $NPROC -m "gpu and not slow" -p no:cacheprovider --tb=short -rfEX \
  tests/test_fa3_fp8_kernel.py tests/test_fa2_gpu.py tests/test_fa3_fp8_lookahead_gpu.py tests/test_decode_gpu.py \
  -k "d256 or lookahead or defaults or wide or dual"
echo "== overhead"; grep -E "host \(enqueue\)|SUMMARY|Error" "$out/logs/overhead.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 12
steps_exit
