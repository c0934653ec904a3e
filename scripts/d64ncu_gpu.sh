#!/usr/bin/env bash
# d64ncu_gpu.sh: issue 12, session 11, on one H200: where our fa3's warps stall at head_dim 64 and flash-attn-4's don't
# (Nsight Compute, per-SASS-line warp stall sampling). No kernel change; <= 100 s cold (limits 35 + 40, then 30 if
# <= 52 s have passed). The static comparison found no cause (bench/NOTES.md, "Session 11 (2026-12-02): fa3 head_dim
# 64 vs flash-attn-4"); this is the dynamic one (same NOTES, "... dynamic stall comparison vs flash-attn-4").
#
#   source .gpu/env.sh; scripts/d64ncu_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 0. Precompile, both at once, into the disk caches: fa3's default (`new`) at D 64 bf16 non-causal and flash-attn-4's
#    D 64 kernels for N 16k (B 1) and N 4k (B 4) (its cache: FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED/DIR); ncu's
#    version and metric list beside them.
# 1. ncu over scripts/ncu_attribution.py --impl fa3,flash-attn-4 --head-dim 64 --seqlen 16384 (bf16, B*N = 16k, H*D =
#    2048: B 1, H 32; non-causal; same inputs; each called twice, the third call profiled inside a profiler range:
#    --profile-from-start off, --kernel-name regex:fa_variants|flash_attn, --launch-count 4, so one kernel each);
#    sections SpeedOfLight, Occupancy, LaunchStats, SchedulerStats, WarpStateStats, ComputeWorkloadAnalysis,
#    InstructionStats, MemoryWorkloadAnalysis, SourceCounters (PC sampling, --warp-sampling-interval 7: every 2^12
#    cycles, the same for both kernels), the pipes' metrics where `ncu --query-metrics` lists them, --import-source
#    no; ncu locks the clocks to base (its default, as session 7). Exports (ncu --import, in parallel): the details
#    page (text), the raw page (CSV), the source page (CSV, SASS: both kernels in one file, and one file per kernel;
#    per kernel without --print-source too when none has an Address header). Then scripts/ncu_compare.py: summary
#    side by side, WarpStateStats stall reasons, the top 15 SASS lines by stall samples of each kernel, stall samples
#    by opcode class / mnemonic / reason / executed count (hot, warm, cold), each with ours - fa4 in % of fa4's warp
#    time -> $out/d64ncu_compare.md (and the log).
# 2. The same at N 4k (B 4) if <= 52 s have passed (else skipped, not failed; a cut run is noted as rc=124).
# A run that leaves no report (an option this ncu refused) is run once more with the sections only (if <= 60 s; the
# first run's rc stays noted).
# Pass: (0) a "precompiled" line, no Traceback; (1) both "profiled" lines, "max |O difference|" <= 2e-2 (same
# attention, bf16 outputs), ncu_compare exit 0 (both kernels in the summary AND both with stall samples on the source
# page: session 7's source pages were lost to a parser bug, fixed in scripts/ncu_table.py). The logs, pages and
# reports end packed in $out/d64ncu_logs.tar.gz (logs/ncu16k.ncu-rep, logs/ncu4k.ncu-rep open in the Nsight Compute GUI
# for the source view); $out keeps d64ncu_compare.md beside it.
# Prediction (bench/NOTES.md): elapsed cycles ours / fa4 1.04-1.08 (timed 0.938 at N 16k: 1.066); instructions
# 0.95-1.00; achieved occupancy and registers equal; tensor pipe active 0.92-0.96 of fa4's; source-page diff over all
# classes +4..+8% of fa4's warp time, >= half of it in the GMMA waits (WARPGROUP.DEPBAR / HGMMA) and the ping-pong
# BAR.SYNC together, MUFU / FFMA / FMNMX / conversions each within +-1, cold rows (prologue, epilogue) <= 1 at N 16k.
# What each outcome points to: NOTES, same section.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/d64ncu}"; gpu_session "$out/logs" "$@"
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR="$out/fa4cache"
# ncu's facts beside the precompile (the pipes' metrics only where this ncu knows them: an unknown name fails a run)
{ ncu --version > "$LOGS/ncu_version.txt" 2>&1
  { ncu --query-metrics --chip gh100 || ncu --query-metrics; } > "$LOGS/ncu_metrics.txt" 2>&1; } &
# two processes (fa3 + flash-attn-4 N 16k; fa3 again + flash-attn-4 N 4k): their compiles overlap
step precompile 35 bash -c "python3 scripts/fa3_speed_ab.py --precompile 2 --precompile-fa4 --variants new \
  --shapes 64:16384:full & a=\$!; python3 scripts/fa3_speed_ab.py --precompile 2 --precompile-fa4 --variants new \
  --shapes 64:4096:full & b=\$!; trap 'kill -INT \$a \$b' INT; wait"
wait
METRICS=$(for m in sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_elapsed \
    sm__inst_executed_pipe_fma.avg.pct_of_peak_sustained_active \
    sm__inst_executed_pipe_alu.avg.pct_of_peak_sustained_active \
    sm__inst_executed_pipe_xu.avg.pct_of_peak_sustained_active \
    sm__inst_executed_pipe_uniform.avg.pct_of_peak_sustained_active smsp__inst_issued.sum; do
  grep -qE "^${m%%.*}[[:space:]]" "$LOGS/ncu_metrics.txt" && printf '%s,' "$m"; done)
METRICS=${METRICS%,}
SECTIONS=(--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats
          --section WarpStateStats --section ComputeWorkloadAnalysis --section InstructionStats
          --section MemoryWorkloadAnalysis --section SourceCounters)
pages() {  # pages REP: the report's details / raw / source pages (both kernels, and per kernel), in parallel, bounded
  local rep=$1 impl
  timeout -s INT 20 ncu --import "$rep.ncu-rep" --page details > "$rep.txt" 2>&1 &
  timeout -s INT 20 ncu --import "$rep.ncu-rep" --page raw --csv > "$rep.csv" 2>&1 &
  timeout -s INT 20 ncu --import "$rep.ncu-rep" --page source --csv --print-source sass > "${rep}_source.csv" 2>&1 &
  for impl in fa_variants flash_attn; do
    timeout -s INT 20 ncu --import "$rep.ncu-rep" --kernel-name "regex:$impl" --page source --csv --print-source sass \
      > "${rep}_source_$impl.csv" 2>&1 &
  done
  wait
  grep -qE '^"?(# )?Address"?,' "${rep}"_source*.csv && return 0
  for impl in fa_variants flash_attn; do  # no Address header anywhere: what this ncu gives without --print-source
    timeout -s INT 15 ncu --import "$rep.ncu-rep" --kernel-name "regex:$impl" --page source --csv \
      > "${rep}_plain_$impl.csv" 2>&1 &
  done
  wait
}
run_ncu() {  # run_ncu NAME LIMIT SEQLEN [ncu options]: one report of both kernels
  local name=$1 limit=$2 seqlen=$3; shift 3
  step "$name" "$limit" ncu --profile-from-start off --kernel-name "regex:fa_variants|flash_attn" --launch-count 4 \
    --import-source no "${SECTIONS[@]}" "$@" -f -o "$LOGS/$name" \
    python3 scripts/ncu_attribution.py --impl fa3,flash-attn-4 --head-dim 64 --seqlen "$seqlen" --causal no
}
profile() {  # profile NAME LIMIT SEQLEN: the report (once more with the sections only if none), pages, tables
  local name=$1 limit=$2 seqlen=$3 rep="$LOGS/$1" diff
  run_ncu "$name" "$limit" "$seqlen" --warp-sampling-interval 7 ${METRICS:+--metrics "$METRICS"}
  if [[ ! -f $rep.ncu-rep ]] && (( SECONDS <= 60 )); then  # an option this ncu refused: its defaults
    mv "$LOGS/$name.log" "$LOGS/${name}_first.log"; run_ncu "$name" 30 "$seqlen"
  fi
  if [[ ! -f $rep.ncu-rep ]]; then step_failed "${name}_report" missing; return 1; fi
  pages "$rep"
  diff=$(sed -n 's/^max |O difference|.*: //p' "$LOGS/$name.log")
  awk -v d="${diff:-nan}" 'BEGIN { exit !(d + 0 == d && d <= 2e-2) }' ||
    step_failed "${name}_O_difference" "${diff:-none}"
  local sources; shopt -s nullglob; sources=("$rep"_source*.csv "$rep"_plain_*.csv); shopt -u nullglob
  step "${name}_compare" 15 python3 scripts/ncu_compare.py --details "$rep.txt" --raw "$rep.csv" \
    --source "${sources[@]}" --out "$out/d64ncu_compare.md" \
    --title "D 64, N $seqlen, bf16, non-causal, B*N 16k, H*D 2048 ($(git log --oneline -1 | cut -c1-7))"
}
profile ncu16k 40 16384
if (( SECONDS <= 52 )); then
  profile ncu4k 30 4096
else
  echo "== ncu4k: skipped (${SECONDS}s passed)"
fi
echo "== precompile"; grep -E "^precompiled|Error|Traceback" "$LOGS/precompile.log"
echo "== ncu"; head -n 1 "$LOGS/ncu_version.txt"; echo "metrics asked: ${METRICS:-none (sections only)}"
for name in ncu16k ncu4k; do
  [[ -f $LOGS/$name.log ]] || continue
  echo "== $name"; grep -E "^profiled|max \|O difference|==ERROR==|Traceback|Error" "$LOGS/$name.log" | head -n 8
  [[ -f $LOGS/${name}_compare.log ]] || continue
  if [[ $name == ncu16k ]]; then cat "$LOGS/${name}_compare.log"; else  # N 4k: the tables after the top lines
    sed -n '/^diff columns/,$p' "$LOGS/${name}_compare.log"; fi
done
pack_logs "$out/d64ncu_logs.tar.gz" && rm -rf "$LOGS" "$out/fa4cache"
steps_exit
