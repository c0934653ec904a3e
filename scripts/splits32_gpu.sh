#!/usr/bin/env bash
# splits32_gpu.sh: issue 13, session 12, on one H200 (<= 100 s cold): decode at head_dim 64, batch 1, Nk 32k reads K/V
# at 63% of HBM (70% asked). The lever: FA_VARIANTS_DECODE_LONG_DUAL (off), `auto`'s packed seqlen_q = 1 calls at
# batch x heads_kv <= 16 and Nk >= 32k in the dual tiles (two CTAs per SM, 73 KiB of shared memory and 128 registers
# per thread at launch each; the heuristic over 264 slots): 32 splits x 8 K/V tiles (256 CTAs) instead of 16 x 16
# (128 CTAs, one per SM), twice the K/V stages in flight per SM, a merge of 32 partials instead of 16.
#
#   source .gpu/env.sh; scripts/splits32_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# 0. scripts/splits32_precompile.py: 23 kernels (the A/B's, `auto`'s at its shapes, the tests', 8 merges), 16 processes.
# 1. GPU tests (-n 4, 13), tests/test_long_dual_gpu.py vs float64 (O and LSE, outputs and split scratch NaN-poisoned,
#    fresh Q per call): LONG_DUAL "all" through the public API at D 64 32:8 Nk 32771 (33 splits) / 64:8 Nk 40001 (32),
#    MQA B 2 Nk 33000 (52), D 128 32:8 Nk 32833 (33), causal and not; seqlens_k with lengths 0 and 1 beside long
#    ones (D 64 / 128); a CUDA-graph replay after a new Q.
# 2. scripts/decode_ab.py --s12l: auto vs ldual (LONG_DUAL "all") beside SDPA, 8 shapes (D 64 B 1 Nk 32k / 128k at
#    32:8 / 64:8, D 128 B 1 Nk 32k, D 64 B 2 Nk 32k, B 8 Nk 32k guards where ldual runs what auto runs: "-").
#    CUDA graphs, 5 rotated rounds, median; HBM % per entry.
# 3. scripts/splits32_verdict.py: ldual / auto per shape with split counts and HBM %, the value for the default.
# Pass: (1) 0 failed / 0 errors; (2) no BAD/ERR cell, "compiles" 0; (3) prints a verdict line.
# Flip rule (for the lead): LONG_DUAL default "64" if (1) passes, ldual / auto geomean <= 0.97 over D 64 B 1 Nk 32k
# (32:8, 64:8), <= 1.00 at both D 64 B 1 Nk 128k shapes and <= 1.02 at every D 64 shape; "all" if also D 128 B 1 Nk 32k
# <= 0.99; else KEEP "off" (and the switch goes).
# Prediction (bench/NOTES.md, "Session 12 (2026-12-02): decode at head_dim 64, 32 splits ..."): ldual / auto 0.98-1.03
# at D 64 B 1 Nk 32k (22.1 us -> 21.7-22.8; HBM 63% -> 61-64%: 70% NOT reached), 0.97-1.01 at Nk 128k, 0.99-1.04 at
# D 128, 0.98-1.03 at B 2; verdict KEEP likely (~75%): D 128 (128 KiB in flight at the same grid) streams at 4.47 TB/s
# at the margin, so D 64's missing share is fixed cost, and the busiest SMs still stream 16 tiles.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/splits32}"; gpu_session "$out/logs" "$@"
VARIANTS=(ldual)
step precompile 40 python3 scripts/splits32_precompile.py --jobs 16 --variants "${VARIANTS[@]}"
NPROC=$(xdist_flag 4)
step pytest 28 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_long_dual_gpu.py
step decode_ab 25 python3 scripts/decode_ab.py --s12l --no-precompile --rounds 5 --variants "${VARIANTS[@]}" \
  --out "$out/decode_ab"
step verdict 3 python3 scripts/splits32_verdict.py "$out/decode_ab/decode_ab.json"
echo "== precompile"; tail -n 2 "$out/logs/precompile.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 12
echo "== decode_ab"; grep -E "^\| D|geomean|compiles|vs auto|^  D" "$out/logs/decode_ab.log" | cut -c1-170 | tail -n 30
grep -qE "BAD|ERR" "$out/decode_ab/decode_ab.md" 2>/dev/null && step_failed decode_ab "BAD/ERR cell"
grep -qE "compiles': [1-9]" "$out/logs/decode_ab.log" 2>/dev/null && step_failed decode_ab "compiled during the A/B"
echo "== verdict"; cat "$out/logs/verdict.log"
steps_exit
