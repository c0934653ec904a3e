#!/usr/bin/env bash
# session_start.sh: the first call of a session on a two-GPU H200 host (nvidia-h200-x2): where main stands.
#
#   source .gpu/env.sh; scripts/session_start.sh          (repository root; writes under $OUT)
#
# GPU 0: every `gpu and not slow` test, then the decode table (bench --decode --quick).
# GPU 1: the FP8 quantisation pass's bandwidth, the host overhead per call, then Nsight Compute over one
#        fa3 and one flash-attn-4 call (bf16, head_dim 128, N = 4k; issue 12's attribution).
set -uo pipefail
source "$(dirname "$0")/steps.sh"; help_from_header "$@"
out="${OUT:-results/session-start}"; session_setup "$out/logs"
(
  export CUDA_VISIBLE_DEVICES=1
  step quant_bw 90 python3 scripts/fp8_quant_bandwidth.py --json "$out/logs/quant_bw.json"
  step overhead 60 python3 scripts/api_overhead.py --device cuda --backend fa3
  for impl in fa3 flash-attn-4; do
    step "ncu_$impl" 120 ncu --profile-from-start off --set full -f -o "$out/logs/ncu_$impl" \
      python3 scripts/ncu_attribution.py --impl "$impl"
    ncu --import "$out/logs/ncu_$impl.ncu-rep" --page raw --csv > "$out/logs/ncu_$impl.csv" 2>&1
    ncu --import "$out/logs/ncu_$impl.ncu-rep" --page details > "$out/logs/ncu_$impl.txt" 2>&1
  done
) > "$out/logs/gpu1.txt" 2>&1 &
gpu1=$!
(
  export CUDA_VISIBLE_DEVICES=0
  step pytest 240 python3 -m pytest -q -n 8 -m "gpu and not slow" -p no:cacheprovider --tb=line -rf tests
  step decode 150 python3 -m fa_variants.cli bench --decode --quick --no-progress --out "$out/logs/decode"
) > "$out/logs/gpu0.txt" 2>&1
wait $gpu1
cat "$out/logs/gpu0.txt" "$out/logs/gpu1.txt"
pack_logs "$out/logs.tgz"
echo "== pytest"; grep -E "FAILED|ERROR|passed|failed" "$out/logs/pytest.log" | tail -n 40
echo "== quant_bw"; tail -n 15 "$out/logs/quant_bw.log"
echo "== overhead"; tail -n 8 "$out/logs/overhead.log"
echo "== decode"; tail -n 40 "$out/logs/decode.log"
echo "== ncu"; for impl in fa3 flash-attn-4; do tail -n 3 "$out/logs/ncu_$impl.log"; done
