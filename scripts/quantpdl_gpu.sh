#!/usr/bin/env bash
# quantpdl_gpu.sh: the FP8 quantisation pass with programmatic dependent launch only up to head_dim 64 (session 42's
# FA_VARIANTS_FP8_QUANT_PDL_MAX_HEAD_DIM), against the default (PDL at every head_dim), on one H100 or H200
# (~90-200 s cold; limit 300 s).
#
#   source .gpu/env.sh && scripts/quantpdl_gpu.sh  (repository root; writes under $OUT/quantpdl; --help)
#
# Why (bench/NOTES.md "Session 42"): with the non-finite switch on (the default since session 14), the default took
# 1.020 / 1.057x the GPU time of the passes without PDL ("defn") at head_dim 128 / 256 on an H100 (graph replay 1.035
# / 1.081) and 0.960x at 64; without PDL the switch cost nothing (defn / defoffn 0.998-1.010).
# 1. scripts/fp8_quant_bandwidth.py: "def" and "defp64" (PDL up to head_dim 64: its 128 / 256 launches as defn's),
#    default recipe, D 64 / 128 / 256, 10 rotated rounds, --graph and --b2b.
# Pass: every row matched the torch recipe (rc 1 with every row matched is the script's 70 %-of-copy target).
# Prediction: defp64 / def GPU time 0.94-0.99 at D 128 / 256 (queued and graph), 0.99-1.01 at D 64 (the same
#   launches).
# Rule: if defp64 is faster at D 128 and 256 in both timings and equal at 64, FA_VARIANTS_FP8_QUANT_PDL_MAX_HEAD_DIM's
#   default becomes 64 (quant_host.V2_PDL_MAX_HEAD_DIM) after the FP8 GPU tests pass with it (the quantisation pass's
#   tests/test_fp8_quant_kernel.py); else it stays 256 and the figures go to docs/tried.md.
# Session 43 (H100, tree b8148be; bench/h100-2026-12-06-s43/call4): defp64 / def 1.006 / 0.978 / 0.941 at D 64 / 128 /
#   256 (graph 0.999 / 0.968 / 0.927), every row the torch recipe's bit for bit: the prediction held and 64 became
#   the default (4faa758; "def" is now defp64, "defp256" the old default). Session 44 (H100, tree b19cbcf): suite part
#   4 (tests/test_fp8_quant_kernel.py among them) 334 passed with the new default: the rule's last condition, met.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/quantpdl"; gpu_session "$out/logs" "$@"
step bw 300 python3 scripts/fp8_quant_bandwidth.py --pipelines def,defp64 --ab def:defp64 \
  --recipes default --shapes D=64,D=128,D=256 --rounds 10 --graph --b2b --json "$out/bw.json"
echo; stop_clocks; cat "$LOGS/commit.txt"
echo "== bw"; grep -A 4 "^A/B" "$LOGS/bw.log" | grep -E "^A/B|^  D="
grep "^SUMMARY\|^AB" "$LOGS/bw.log"
steps_exit
