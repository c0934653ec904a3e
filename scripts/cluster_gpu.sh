#!/usr/bin/env bash
# cluster_gpu.sh: session 10, issue 13: fa3's split decode with the merge inside one thread block cluster per query
# tile (Sm90Config.cluster_merge, FA_VARIANTS_DECODE_CLUSTER_MERGE=1 or dual; off by default), on one H200 (<= 120 s
# cold).
#
#   source .gpu/env.sh; scripts/cluster_gpu.sh          (repository root; writes under $OUT; --help: this text)
#
# Why: D 64 B 1 Nk 32k seqlen_q 1 / 4 run at 62-64% of HBM (target 70%) because of a fixed cost F ~6.7 us of a 21.7 us
# call, 2.1 us of it the merge kernel (bench/NOTES.md, sessions 7-8). With cluster_merge the 16 splits of a (batch, KV
# head) are one 16-CTA cluster: each CTA keeps its partial O (fp32) and LSE in its own shared memory, a cluster barrier,
# then every CTA merges a slice of the tile from its peers' shared memory (DSMEM) and writes O and LSE: no merge launch,
# no global partials, no atomics.
# 0. scripts/cluster_precompile.py: 38 kernels (cluster configs of 2..16 splits, one and two CTAs per SM, auto's, the
#    merges) in 16 processes.
# 1. scripts/cluster_occupancy.py: resident clusters of the D 64 kernel at cluster sizes 2 / 8 / 16, and 16 at two
#    CTAs per SM (cuOccupancyMaxActiveClusters); a B 1 call with 8 KV heads launches 8 clusters: fewer resident = a
#    second wave.
# 2. GPU tests, tests/test_cluster_merge_gpu.py (-n 4): explicit clusters of 2 / 5 / 16 splits at Nk 5 / 193 / 4097 /
#    32771, GQA 32:8 and 64:8, seqlen_q 1 and 4 (causal), 16 at two CTAs per SM (dual), D 128 B 2; `auto` with the
#    switch at the A/B's shapes and a 128-row wide tile (fresh Q calls, a CUDA-graph replay); seqlens_k with lengths 0
#    and 1. 68 tests, all vs float64, O and LSE, NaN-poisoned outputs.
# 3. scripts/decode_ab.py --s10c --variants cluster clusterdual: auto vs cluster (one CTA per SM) and clusterdual (the
#    same launched for two CTAs per SM: a 16-CTA cluster fits in 8 SMs of a GPC) beside SDPA, 9 shapes (D 64 B 1 Nk
#    32k seqlen_q 1 / 4 at 32:8 and 64:8; guards: seqlen_q 16, Nk 4k, Nk 1k (8 splits, PDL), B 8 Nk 1k (2 splits), D 128
#    B 1 Nk 32k).
#    CUDA graphs, 5 rotated rounds; last lines: ratios to SDPA, HBM % at Nk 32k, each variant / auto.
#    Left out unless step 2 passed with no failure or error (a variant whose GPU tests fail is not timed).
# Pass: (0) precompile ends "kernels in"; (2) 0 failed / 0 errors; (3) no BAD/ERR cell.
# Predictions (bench/NOTES.md, "Session 10 (2026-12-01): decode, the merge inside a thread block cluster"):
#  - occupancy: clusters of 2 and 8 fit (>= 8 resident); 16: 7-8 resident (H200 GPCs of 16-18 SMs; one GPC short of 16
#    would make it 7: then the 128-CTA grid runs in two waves and cluster loses badly at 16 splits).
#  - with 8 resident 16-clusters: cluster / auto at D 64 B 1 Nk 32k seqlen_q 1 0.88-0.95 (21.7 -> 19.3-20.6 us,
#    64 -> 67-72% of HBM: the 2.1 us merge launch and 0.5 us gap gone, +0.3-0.6 us for the in-cluster merge and the
#    cluster launch), seqlen_q 4 0.88-0.96 (22.4-22.7 -> 20-21.5 us, 62 -> 65-70%); Nk 4k (16 splits) 0.75-0.90;
#    Nk 1k (8 splits, auto has PDL there) 0.85-1.0; B 8 Nk 1k (2 splits) 0.85-1.0; D 128 Nk 32k 0.93-0.98; seqlen_q 16
#    0.93-0.99. With 7 resident: 1.3-1.8 at every 16-split shape.
#  - clusterdual / auto: where cluster fits one wave, within +-3% of cluster (the 128-register cap costs the consumer
#    nothing at 232 registers; two CTAs of one cluster may share an SM, halving its streaming SMs: up to 1.1x cluster);
#    where cluster needs two waves, clusterdual keeps one: 0.88-0.97.
# Flip rule for the lead: DECODE_CLUSTER_MERGE's default (hopper/fa3.py) to the better of 1 / dual if the GPU tests
# pass, its geomean / auto over its shapes < 0.97 and worst <= 1.02; else leave it off and record where it won.
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/cluster}"; gpu_session "$out/logs" "$@"
step precompile 48 python3 scripts/cluster_precompile.py --jobs 16 --variants cluster clusterdual
step occupancy 10 python3 scripts/cluster_occupancy.py --head-dim 64 --splits 2 8 16
NPROC=$(xdist_flag 4)
step pytest 36 python3 -m pytest -q $NPROC -m gpu -p no:cacheprovider --tb=short -rfEX tests/test_cluster_merge_gpu.py
if ! grep -qE "[0-9]+ passed" "$out/logs/pytest.log" || grep -qE "^(FAILED|ERROR)|[0-9]+ (failed|errors?)\b" "$out/logs/pytest.log"; then
  echo "== decode_ab: skipped (cluster merge GPU tests failed)"
else
  step decode_ab 26 python3 scripts/decode_ab.py --s10c --no-precompile --rounds 5 --variants cluster clusterdual \
    --out "$out/decode_ab"
fi
echo "== precompile"; tail -n 2 "$out/logs/precompile.log"
echo "== occupancy"; grep -E "^cluster" "$out/logs/occupancy.log"
echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$out/logs/pytest.log" | tail -n 12
if [[ -f "$out/logs/decode_ab.log" ]]; then
  echo "== decode_ab"; grep -E "^\| D|geomean|compiles|^HBM|^  D|^GPU time|vs auto" "$out/logs/decode_ab.log" | cut -c1-170 | tail -n 40
fi
