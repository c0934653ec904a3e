#!/usr/bin/env bash
# ab_checkout.sh REV [DIR]: REV's fa_variants package, renamed fa_variants_before, into DIR (default .before),
# so that scripts/ab_bench.py can time it beside the working tree's package in one process; and DIR.tar.xz, its
# archive (~0.25 MB against the folder's ~1.1 MB; scripts/before_pkg.py --pack).
# A GPU call carries [".gpu", ".before.tar.xz"] (both git-ignored; the call's 64 MiB limit has no room for the
# folder beside .gpu/ and the tracked tree): there scripts/ab_bench.py --before .before and steps.sh's
# unpack_before (the GPU scripts) unpack DIR.tar.xz into DIR when DIR is missing.
set -euo pipefail
source "$(dirname "$0")/steps.sh"; help_from_header "$@"
rev=${1:?usage: ab_checkout.sh REV [DIR]}; dir=${2:-.before}
rm -rf "$dir"; mkdir -p "$dir"
git archive "$rev" fa_variants | tar -x -C "$dir"
mv "$dir/fa_variants" "$dir/fa_variants_before"
grep -rlw fa_variants "$dir" | xargs sed -i 's/\bfa_variants\b/fa_variants_before/g'
python3 "$(dirname "$0")/before_pkg.py" --pack "$dir" > /dev/null
kib=$(du -k "$dir.tar.xz" | cut -f1)
echo "ab_checkout: $(git rev-parse --short "$rev") -> $dir/fa_variants_before, $dir.tar.xz ($kib KiB)" >&2
