"""Compile, in parallel processes and into the disk cache (``common.diskcache``), the kernels scripts/decode4_gpu.sh
needs, so that its GPU steps only load them: the A/B plan of ``decode_ab.py --short-nk`` (its ``plan_items``), the
configs `auto` runs for the ``bench --decode`` subset (worked out on meta tensors by ``decode_ab.public_entry``),
fa2's kernels of its narrow test and bench (default, split, narrow; causal and not) and the merges. The compile
jobs are scripts/decode_ab.py's (``compile_item``, ``compile_all``).

    python3 scripts/decode4_precompile.py --variants pdl2 min1 ... --nk 1024,4096 --batch 1,8 [--jobs 16] [--list]
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]


def _ints(text: str) -> tuple:
    return tuple(int(x) for x in text.split(",") if x.strip())


def items(variants, nk, batch, nq, num_sms: int) -> list:
    import decode_ab

    from fa_variants.ampere import fa2
    from fa_variants.bench import decode
    from fa_variants.common.split_combine import MergeConfig
    from fa_variants.hopper import fa3

    out = list(decode_ab.plan_items(decode_ab.plan(decode_ab.SHORT_NK + decode_ab.CONTROLS, variants, num_sms)))
    for c in decode.cases(nq=nq, nk=nk, batch=batch):  # `bench --decode` subset: ours (auto), as it plans them
        shape = (c.head_dim, c.heads, c.heads_kv, c.batch, c.seqlen_k, c.seqlen_q)
        config, splits = decode_ab.public_entry("two", shape, num_sms)
        out.append(("fa3", c.head_dim, True, config or fa3.DEFAULT_CONFIGS[c.head_dim]))
        if splits > 1:
            out.append(("merge", c.head_dim, False, MergeConfig()))
    for causal in (True, False):  # fa2: tests/test_fa2_split_gpu.py -k narrow, scripts/fa2split_bench.py
        out += [("fa2", 128, causal, None), ("fa2", 128, causal, fa2.narrow_config("sm_90a", 128)),
                ("fa2", 128, causal, fa2.split_config("sm_90a", 128, 0))]
    out.append(("merge", 128, False, MergeConfig()))
    return list(dict.fromkeys(out))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--variants", nargs="*", default=[], help="scripts/decode_ab.py variants of the --short-nk A/B")
    p.add_argument("--nk", type=_ints, default=None, help="bench --decode subset: seqlen_k (comma list)")
    p.add_argument("--batch", type=_ints, default=None, help="bench --decode subset: batch sizes")
    p.add_argument("--nq", type=_ints, default=None, help="bench --decode subset: seqlen_q")
    p.add_argument("--jobs", type=int, default=min(12, os.cpu_count() or 1))
    p.add_argument("--list", action="store_true", help="print what would be compiled and exit")
    a = p.parse_args()
    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import decode_ab

    todo = items(a.variants, a.nk, a.batch, a.nq, decode_ab.gpu_num_sms())
    return decode_ab.precompile_or_list(todo, a.jobs, "decode4_precompile", a.list)


if __name__ == "__main__":
    sys.exit(main())
