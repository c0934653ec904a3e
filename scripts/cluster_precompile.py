"""Compile, in parallel processes and into the disk cache (``common.diskcache``), the kernels scripts/cluster_gpu.sh
needs: the A/B plan of ``decode_ab.py --s10c`` (``plan_items``: `auto`'s configs and the cluster variant's, worked
out on meta tensors), what `auto` runs with FA_VARIANTS_DECODE_CLUSTER_MERGE at the shapes of
tests/test_cluster_merge_gpu.py (``AUTO``, and the seqlens_k test's lengths 193 / 4097), its explicit kernels
(``kernels()``), the occupancy probe's (``cluster_occupancy.SIZES``), and the merges (bf16, D 64 / 128).

    python3 scripts/cluster_precompile.py --variants cluster clusterdual [--jobs 16] [--list]
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts"), str(ROOT / "tests")]

# (head_dim, heads, heads_kv, batch, seqlen_k[, seqlen_q]) that tests/test_cluster_merge_gpu.py runs through `auto`
# with the switch on: its AUTO shapes and the seqlens_k test's sequences (batch 1 each, lengths 193 and 4097)
TEST_AUTO = [(64, 32, 8, 1, 32768), (64, 64, 8, 1, 32768), (64, 32, 8, 1, 32768, 4), (64, 64, 8, 1, 32768, 4),
             (64, 32, 8, 1, 1024), (64, 64, 8, 1, 4097, 16), (64, 32, 8, 1, 193), (64, 32, 8, 1, 4097)]


def items(variants, num_sms: int) -> list:
    import cluster_occupancy
    import decode_ab
    import test_cluster_merge_gpu as gpu_tests

    out = list(decode_ab.plan_items(decode_ab.plan(decode_ab.S10C, variants, num_sms, skip_same=True)))
    for shape in TEST_AUTO:
        for name in ("cluster", "clusterdual", "shipped"):
            config, _ = decode_ab.public_entry(name, shape, num_sms)
            if config is not None:
                out.append(("fa3", shape[0], True, config))
    out += [("fa3", d, causal, cfg) for d, causal, cfg in gpu_tests.kernels()]
    out += [("fa3", 64, True, cluster_occupancy.config(64, n)) for n in cluster_occupancy.SIZES]  # the probe's
    out.append(("fa3", 64, True, cluster_occupancy.config(64, 16, 2)))
    out += decode_ab.merge_items((64, 128))
    return list(dict.fromkeys(out))


def main() -> int:
    import decode_ab

    return decode_ab.precompile_main(__doc__.splitlines()[0], "--s10c", items, "cluster_precompile")


if __name__ == "__main__":
    sys.exit(main())
