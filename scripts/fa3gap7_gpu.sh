#!/usr/bin/env bash
# fa3gap7_gpu.sh: issue 12, session 7, on one H200: K/V multicast in clusters of two CTAs (Sm90Config.kv_multicast,
# off by default; non-causal only: each CTA loads half of every K and V tile into both CTAs' shared memory). <= 100 s.
#
#   source .gpu/env.sh; scripts/fa3gap7_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 0. scripts/fa3_speed_ab.py --precompile: old / new / mcast, bf16, non-causal, D 64/128/256 (flash-attn-4's kernels
#    too, into its disk cache), and the test-only kernels (mcast fp16 non-causal; mcast bf16 causal at D 128, which
#    compiles without the cluster), 12 + 4 processes, into the disk cache.
# 1. GPU tests vs float64: tests/test_fa3_gpu.py -k kv_multicast: mcast at D 64/128/256, bf16 and fp16, over one query
#    tile (the cluster's second CTA is padding past seqlen_q), odd tile counts (a padding CTA after every head), odd
#    lengths (1/3/113/300/385/1100/1023), Nq != Nk both ways, GQA/MQA, grids of many clusters, NaN-poisoned outputs;
#    and a causal call with the switch on (no cluster).
# 2. scripts/fa3_speed_ab.py (only if some test passed): old, new, mcast beside flash-attn-4, non-causal, D 128 then
#    256 then 64, N 4k and 16k each (B*N = 16k, H*D = 2048), 6 rounds of the paired protocol, nvidia-smi clocks; the
#    time limit may cut the D 64 rows (the SUMMARY of the shapes done is still printed).
# Pass: (0) "precompiled" lines, no Traceback. (1) 0 failed / 0 errors (a hang shows as the step's timeout, rc 124,
# with no "passed": a cluster barrier or ring-release bug; then step 2 is skipped). (2) no "errors:", every row's max
# diff vs old <= ~4e-3 (mcast computes the same maths per tile as new). Prediction (bench/NOTES.md, "Session 7
# (2026-12-01): K/V multicast"): mcast/new 1.01-1.04 at D 128 and 256 (N 4k and 16k), 1.00-1.02 at D 64; mcast/fa4
# at D 128 0.95-0.98 (from new/fa4 0.93-0.95). Worth a non-causal default at a head dim where mcast/new is "faster"
# and >= 1.02 at both N.
set -uo pipefail
source "$(dirname "$0")/steps.sh"; help_from_header "$@"
out="${OUT:-results/fa3gap7}"; session_setup "$out/logs"
AB="--variants old,new,mcast --causal no --head-dims 128,256,64 --seqlens 4096,16384"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
# 9 bf16 + 3 flash-attn-4 + 3 fp16 + 1 causal kernels, both pools at once (16 processes on 16 cores)
step precompile 35 bash -c "python3 scripts/fa3_speed_ab.py --precompile 12 --precompile-fa4 $AB & a=\$!; \
  python3 scripts/fa3_speed_ab.py --precompile 3 --dtype fp16 --variants mcast --causal no & b=\$!; \
  python3 scripts/fa3_speed_ab.py --precompile 1 --variants mcast --causal yes --head-dims 128 --seqlens 4096 & c=\$!; \
  trap 'kill -INT \$a \$b \$c' INT; wait"
NPROC=$(python3 -c "import xdist" 2>/dev/null && echo "-n 8" || echo "")
step pytest 25 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_fa3_gpu.py \
  -k kv_multicast
if grep -qE "[0-9]+ passed" "$LOGS/pytest.log"; then
  step fa3ab 38 python3 scripts/fa3_speed_ab.py $AB --peers flash-attn-4 --out "$out/fa3ab"
else
  echo "== fa3ab: skipped (no GPU test passed)"
fi
echo "== precompile"; grep -E "^precompiled|Error|Traceback" "$out/logs/precompile.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 15
if [[ -f "$out/logs/fa3ab.log" ]]; then
  echo "== fa3ab"; grep -E "errors:|Traceback|Error|INTERRUPTED" "$out/logs/fa3ab.log" | head -n 5
  grep "^SUMMARY" "$out/logs/fa3ab.log"
fi
