#!/usr/bin/env bash
# fa3_fp8_ab_gpu.sh: issue 10's FP8 A/B on one H200 (~5 min): the speed/accuracy A/B of every accumulation mode
# and tile shape (scripts/fa3_fp8_speed_ab.py, ~3-4 min with its parallel precompile), the GPU tests of the new
# kernel variants (tests/test_fa3_fp8_kernel.py -k variants: kernel vs its float64 model), and the FP8 MMA probe
# (scripts/fp8_mma_probe.py: the tensor core's alignment width for the emulation's accumulator model).
#
#   source .gpu/env.sh; scripts/fa3_fp8_ab_gpu.sh        (repository root; writes $OUT/fp8_ab.tar.gz + summary)
set -uo pipefail
out="${OUT:-results}"; work="$out/fp8_ab"; mkdir -p "$work"
LOGS="$work"; source "$(dirname "$0")/steps.sh"
nvidia-smi --query-gpu=name,clocks.max.sm,driver_version --format=csv,noheader > "$work/gpu.txt" 2>&1
step speed_ab 330 python3 scripts/fa3_fp8_speed_ab.py --out "$work/ab"
step variants 150 python3 -m pytest -q -m gpu tests/test_fa3_fp8_kernel.py -k variants -p no:cacheprovider
step mma_probe 60 python3 scripts/fp8_mma_probe.py --json "$work/mma_probe.json"
tar -czf "$out/fp8_ab.tar.gz" -C "$out" fp8_ab && rm -rf "$work"
echo; tar -xzOf "$out/fp8_ab.tar.gz" fp8_ab/ab/summary.md 2>/dev/null || echo "(no summary.md)"
tar -xzOf "$out/fp8_ab.tar.gz" fp8_ab/variants.log | tail -3
tar -xzOf "$out/fp8_ab.tar.gz" fp8_ab/mma_probe.log | grep "kept whole"
