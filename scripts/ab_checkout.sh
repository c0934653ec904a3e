#!/usr/bin/env bash
# ab_checkout.sh REV [DIR]: REV's fa_variants package, renamed fa_variants_before, into DIR (default .before),
# so that scripts/ab_bench.py can time it beside the working tree's package in one process.
# Carry DIR to the GPU host (it is git-ignored).
set -euo pipefail
source "$(dirname "$0")/steps.sh"; help_from_header "$@"
rev=${1:?usage: ab_checkout.sh REV [DIR]}; dir=${2:-.before}
rm -rf "$dir"; mkdir -p "$dir"
git archive "$rev" fa_variants | tar -x -C "$dir"
mv "$dir/fa_variants" "$dir/fa_variants_before"
grep -rlw fa_variants "$dir" | xargs sed -i 's/\bfa_variants\b/fa_variants_before/g'
echo "ab_checkout: $(git rev-parse --short "$rev") -> $dir/fa_variants_before" >&2
