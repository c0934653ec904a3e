#!/usr/bin/env bash
# quantqncu_gpu.sh: issue 10's quantisation pass, session 21, on one H200 (~60-90 s after a cold start; limits 45 +
# 75 s): why Q's pass at head_dim 128 moves its bytes slower than K's wide pass (37-40 us against 32 us; bench/NOTES.md,
# "Session 21 (2026-12-03): Q's pass wide at head_dim 128, again"), read by Nsight Compute.
#
#   source .gpu/env.sh && scripts/quantqncu_gpu.sh          (repository root; writes under $OUT/quantqncu; --help)
#
# 0. precompile: scripts/quant_precompile.py --set quantsamp --unique (holds every pass profiled here).
# 1. ncu (SpeedOfLight, MemoryWorkloadAnalysis, LaunchStats, Occupancy, WarpStateStats, InstructionStats) of the
#    second call of scripts/quant_ncu.py --pipelines def,defw128,def --recipes default,default,no-smooth at head_dim
#    128: 9 QuantPass launches (V + K sums, K, Q; then the same with Q's pass wide; then the unsmoothed recipe: V, K
#    and Q without the LSE shift). Stalls by scripts/ncu_stalls.py, then the details' key lines.
# Pass: 9 kernels in the report. A diagnostic: no flip follows from it.
# Prediction (before the run): under ncu (serialised, ~1.5 GHz) K's wide pass ~41 us at ~42 % DRAM, Q's narrow
# ~45 us, Q's wide ~44 us; unsmoothed Q (no shift, no mean staged) 5-8 us faster than the default's Q, i.e. the shift
# and its staged mean are the difference (hypothesis H1); if unsmoothed Q is within 2 us of the default's, the
# difference is the 128-row block's fixed costs per byte (barriers, block max, the staged store; H2), visible as a
# larger barrier stall per issue in Q than in K.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results}/quantqncu"; gpu_session "$out/logs" "$@"
step precompile 45 python3 scripts/quant_precompile.py --set quantsamp --unique --jobs 14
rep="$out/quantqncu"
step ncu 75 ncu --kernel-name regex:QuantPass --launch-skip 9 --launch-count 9 --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy --section WarpStateStats \
  --section InstructionStats -f -o "$rep" \
  python3 scripts/quant_ncu.py --pipelines def,defw128,def --recipes default,default,no-smooth --head-dim 128
if [[ -f $rep.ncu-rep ]]; then
  ncu --import "$rep.ncu-rep" --page raw --csv > "$out/ncu_raw.csv" 2>/dev/null
  ncu --import "$rep.ncu-rep" --page details > "$out/ncu_details.txt" 2>/dev/null
  n=$(python3 scripts/ncu_stalls.py "$out/ncu_raw.csv" | grep -c "^  kernel ")
  (( n == 9 )) || step_failed ncu "$n kernels in the report, not 9"
else
  step_failed ncu "no report"
fi
echo; stop_clocks; cat "$LOGS/commit.txt"
grep -E "precompile:|FAILED" "$LOGS/precompile.log" | head -4
if [[ -s $out/ncu_raw.csv ]]; then
  echo "-- ncu (D 128; def, defw128, def no-smooth: V (+ K sums), K, Q each)"
  python3 scripts/ncu_stalls.py "$out/ncu_raw.csv" | head -30
  keys="Duration|DRAM Throughput|Issue Slots Busy|Registers Per Thread|Achieved Occupancy|Executed Instructions"
  keys+="|Local Memory Spilling Requests|Block Limit Registers|Block Limit Shared Mem|Threads"
  grep -E "^  [A-Za-z]|  ($keys) " "$out/ncu_details.txt" | grep -vE "^  (Section|---)" | head -120
fi
steps_exit
