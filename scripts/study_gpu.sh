#!/usr/bin/env bash
# study_gpu.sh: issue 11's FP8 accuracy study on one H200 (the fa3-fp8 kernel, its emulation beside it).
#
#   source .gpu/env.sh; scripts/study_gpu.sh [sweep|model|all] [MODEL_DIR]     (repository root; writes $OUT)
#
# sweep (~3 min): the outlier-p and other-input sweeps, the seqlen_k drift (1k..128k) and head_dim 64/128/256 x
#   causal, as five processes at once (each compiles only its own configurations: the compiles, ~5-10 s each,
#   run in parallel on the host's cores; the cache reuses a configuration within a process).
# model (~1-2 min): SmolLM2-135M from MODEL_DIR (default .smollm2: scripts/pack_model_chunks.py's pieces):
#   per-layer errors (Q, K, V of all 30 layers captured from the model on the text) and end to end (KL,
#   top-1, perplexity: float64 / bf16 fa3 / fa3-fp8 default / fa3-fp8 per-head attention in every layer).
# all: both at once (six processes). Then one merged report (merge runs of separate calls on any machine:
# fa-variants fp8-study --merge A/fp8_study.json B/fp8_study.json --out DIR).
# Back under $OUT: study.tgz (every run's folder and log), fp8_study.md, summary.txt.
set -uo pipefail
source "$(dirname "$0")/steps.sh"; help_from_header "$@"
part="${1:-all}"; model_dir="${2:-.smollm2}"
out="${OUT:-results/study-gpu}"; session_setup "$out/study"; r=$LOGS
S="python3 -m fa_variants.cli fp8-study --backend kernel"
noted() { step "$@" | tee -a "$r/steps.txt"; }                      # the status line kept for summary.txt
study() { local name=$1 limit=$2; shift 2; noted "$name" "$limit" "$@" --out "$r/$name"; }
if [[ $part == model || $part == all ]]; then   # beside the sweep: its compiles are other configurations
  if [[ -f $model_dir/chunks.json ]]; then
    study model 240 $S --sweeps layer --model-dir "$model_dir" &
    noted gpu_test 150 python3 -m pytest -q -m gpu -p no:cacheprovider tests/test_fp8_study_model.py &  # tiny Llama
  else
    echo "== model: skipped, no $model_dir/chunks.json (carry the pieces of scripts/pack_model_chunks.py)" | tee -a "$r/steps.txt"
  fi
fi
if [[ $part == sweep || $part == all ]]; then
  study p_inputs 200 $S --no-e2e --sweeps p inputs &
  study seqlen 200 $S --no-e2e --sweeps seqlen &
  for d in 64 128 256; do study "head_dim_$d" 200 $S --no-e2e --sweeps head_dim --head-dims $d & done
fi
wait
jsons=$(ls "$r"/*/fp8_study.json 2>/dev/null)
if [[ -n $jsons ]]; then
  python3 -m fa_variants.cli fp8-study --merge $jsons --out "$r/merged" > "$r/merge.log" 2>&1
  cp "$r/merged/fp8_study.md" "$out/fp8_study.md"
fi
pack_logs "$out/study.tgz"
{
  cat "$r/steps.txt"
  for f in "$r"/*.log; do grep -H -E "Error|error:|Traceback" "$f" | head -n 3; done
  [[ -f $out/fp8_study.md ]] && grep -A 14 -E "^## (Table 3|RMSE vs head_dim|End to end)" "$out/fp8_study.md"
} > "$out/summary.txt" 2>&1
cat "$out/summary.txt"
steps_exit
