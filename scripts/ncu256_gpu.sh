#!/usr/bin/env bash
# ncu256_gpu.sh: session 12, on one H200: where the fa3-fp8 two-level default loses its flat ~5.5 % per tile at head_dim
# 256 (Nsight Compute, per-SASS-line warp stall sampling of the ping-pong turn). No kernel change; <= 100 s cold. Plan
# and outcomes -> meaning: bench/NOTES.md "Session 11 (2026-12-02): fa3-fp8 head_dim 256 turn under ncu; plan for the
# next run" (the question: "... fa3-fp8 two-level schedule at head_dim 256; predictions before the run").
#
#   source .gpu/env.sh; scripts/ncu256_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# Configs (scripts/fa3_fp8_speed_ab.py SETS["fp8turn"] at head_dim 256, by name):
#   new                    the default: two-level, S in two halves, fused_promote, bounded_units (4 P V slices, the
#                          three DEPBAR.LE 1 links inside the turn)
#   single_overlap_noskip  one running accumulator, intra-warpgroup overlap, one chain, skip_unit_rescale=False
#                          (timed 1.055-1.058x new in session 11 call E)
# 0. precompile: both kernels (non-causal) into the disk cache, one process each (scripts/ncu_attribution.py
#    --precompile); ncu's version and metric list beside.
# 1. two ncu runs (one report each: the two kernels' names are the same), scripts/ncu_attribution.py --impl
#    fa3-fp8:new,fa3-fp8:single_overlap_noskip --profile <one of them> --head-dim 256 --seqlen 16384 --causal no
#    (B 1, H 8, e4m3 inputs quantised once before any call: the A/B's; each config called twice, the third call of the
#    profiled one inside a profiler range, the other's outside: --profile-from-start off, --kernel-name
#    regex:fa_variants, --launch-count 1): sections SpeedOfLight, ComputeWorkloadAnalysis (tensor pipe), SchedulerStats,
#    WarpStateStats, SourceCounters (PC sampling, --warp-sampling-interval 7 in both), LaunchStats, Occupancy,
#    InstructionStats, the tensor pipe's metrics where `ncu --query-metrics` lists them; --import-source no; ncu locks
#    the clocks to base. A run that leaves no report (an option this ncu refused) is run again with the sections only.
# 2. pages (details, raw CSV, SASS source CSV; without --print-source too when it has no Address header), then
#    scripts/ncu_compare.py new vs noskip (--ref-*, --labels new,noskip): summary, WarpStateStats, top 15 lines, classes,
#    mnemonics, reasons, hot / warm / cold, and the turn tables (each DEPBAR of the turn on its own row; turn / waits /
#    BAR.SYNC / rest side by side); diffs are new minus noskip in % of noskip's warp time -> $out/ncu256_compare.md.
# Pass: "precompiled 2 of 2"; both "profiled fa3-fp8:..." lines; "O difference rel-L2" <= 1.2e-2 in both runs (2x the
# kernel-vs-emulation bound); ncu_compare exit 0 (both kernels in the summary and with source samples); a turn table
# for both (no "(turn: no hot" line). The reports ($out/logs/new.ncu-rep, noskip.ncu-rep) open in the Nsight Compute GUI.
# Prediction (bench/NOTES.md): elapsed cycles new / noskip 1.04-1.07; tensor pipe busy cycles 0.99-1.03 (active %
# 0.94-0.97); instructions 1.05-1.09; source diff: the turn (after BAR.SYNC .. BAR.ARV) +7..+14, outside it -2..-7,
# the in-turn DEPBAR lines of new >= 40 % of the total diff.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/ncu256}"; gpu_session "$out/logs" "$@"
IMPL=(--impl fa3-fp8:new,fa3-fp8:single_overlap_noskip --head-dim 256 --seqlen 16384 --causal no)
{ ncu --version > "$LOGS/ncu_version.txt" 2>&1
  { ncu --query-metrics --chip gh100 || ncu --query-metrics; } > "$LOGS/ncu_metrics.txt" 2>&1; } &
step precompile 40 python3 scripts/ncu_attribution.py "${IMPL[@]}" --precompile
wait
METRICS=$(for m in sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed \
    sm__pipe_tensor_op_gmma_cycles_active.avg sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active \
    sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active smsp__inst_issued.sum; do
  grep -qE "^${m%%.*}[[:space:]]" "$LOGS/ncu_metrics.txt" && printf '%s,' "$m"; done)
METRICS=${METRICS%,}
SECTIONS=(--section SpeedOfLight --section ComputeWorkloadAnalysis --section SchedulerStats --section WarpStateStats
          --section SourceCounters --section LaunchStats --section Occupancy --section InstructionStats)
OPTS=(--warp-sampling-interval 7 ${METRICS:+--metrics "$METRICS"})
run_ncu() {  # run_ncu NAME LIMIT VARIANT [ncu options]: one report of VARIANT's kernel
  local name=$1 limit=$2 variant=$3; shift 3
  step "$name" "$limit" ncu --profile-from-start off --kernel-name regex:fa_variants --launch-count 1 \
    --import-source no "${SECTIONS[@]}" "$@" -f -o "$LOGS/$name" \
    python3 scripts/ncu_attribution.py "${IMPL[@]}" --profile "fa3-fp8:$variant"
}
pages() {  # pages REP: details / raw / source pages, in parallel, bounded (file names hold fa_variants: ncu_compare)
  local rep=$1
  timeout -s INT 20 ncu --import "$rep.ncu-rep" --page details > "$rep.txt" 2>&1 &
  timeout -s INT 20 ncu --import "$rep.ncu-rep" --page raw --csv > "$rep.csv" 2>&1 &
  timeout -s INT 20 ncu --import "$rep.ncu-rep" --page source --csv --print-source sass \
    > "${rep}_source_fa_variants.csv" 2>&1 &
  wait
  grep -qE '^"?(# )?Address"?,' "${rep}_source_fa_variants.csv" ||  # none: what this ncu gives without --print-source
    timeout -s INT 15 ncu --import "$rep.ncu-rep" --page source --csv > "${rep}_plain_fa_variants.csv" 2>&1
}
profile() {  # profile NAME VARIANT: the report (once more with the sections only if none), its pages, the O check
  local name=$1 variant=$2 rep="$LOGS/$1" limit rel
  limit=$((95 - SECONDS - 12)); ((limit > 30)) && limit=30; ((limit < 12)) && limit=12
  run_ncu "$name" "$limit" "$variant" ${OPTS[@]+"${OPTS[@]}"}
  if [[ ! -f $rep.ncu-rep ]] && (( SECONDS <= 60 )); then  # an option this ncu refused: its defaults, both runs
    mv "$LOGS/$name.log" "$LOGS/${name}_first.log"; OPTS=(); run_ncu "$name" 25 "$variant"
  fi
  if [[ ! -f $rep.ncu-rep ]]; then step_failed "${name}_report" missing; return 1; fi
  pages "$rep"
  rel=$(sed -n 's/^O difference rel-L2 between .*: //p' "$LOGS/$name.log")
  awk -v d="${rel:-nan}" 'BEGIN { exit !(d + 0 == d && d <= 1.2e-2) }' || step_failed "${name}_O_difference" "${rel:-none}"
}
profile new new
profile noskip single_overlap_noskip
sources() { shopt -s nullglob; local f=("$LOGS/$1"_source_*.csv "$LOGS/$1"_plain_*.csv); shopt -u nullglob; echo "${f[@]}"; }
if [[ -f $LOGS/new.txt && -f $LOGS/noskip.txt ]]; then
  # shellcheck disable=SC2046  # the page lists: file names without spaces
  step compare 15 python3 scripts/ncu_compare.py --details "$LOGS/new.txt" --raw "$LOGS/new.csv" \
    --source $(sources new) --ref-details "$LOGS/noskip.txt" --ref-raw "$LOGS/noskip.csv" --ref-source $(sources noskip) \
    --labels new,noskip --out "$out/ncu256_compare.md" \
    --title "fa3-fp8 D 256, N 16384, non-causal, B 1, H 8: new vs single_overlap_noskip ($(git log --oneline -1 | cut -c1-7))"
  grep -q "(turn: no hot" "$LOGS/compare.log" && step_failed turn_found "$(grep -c '(turn: no hot' "$LOGS/compare.log")"
else
  step_failed compare "a report's details page is missing"
fi
echo "== precompile"; grep -E "^precompiled|FAILED|Traceback" "$LOGS/precompile.log"
echo "== ncu"; head -n 1 "$LOGS/ncu_version.txt"; echo "metrics asked: ${METRICS:-none (sections only)}"
for name in new noskip; do
  [[ -f $LOGS/$name.log ]] || continue
  echo "== $name"; grep -E "^profiled|O difference|==ERROR==|Traceback|Error" "$LOGS/$name.log" | head -n 8
done
[[ -f $LOGS/compare.log ]] && cat "$LOGS/compare.log"
steps_exit
