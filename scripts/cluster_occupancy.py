"""How many thread block clusters of the cluster-merge decode kernel (``Sm90Config.cluster_merge``) one GPU holds at
once (``cuOccupancyMaxActiveClusters`` on the compiled cubin, with its launch's block, shared memory and cluster
shape; cluster sizes ``SIZES`` and the 16-CTA cluster at two CTAs per SM), against what a B 1 call with 8 KV heads launches (8 clusters of num_splits CTAs): fewer than 8 resident
16-CTA clusters means a second wave. Prints one line per cluster size; needs a GPU (scripts/cluster_gpu.sh).

    python3 scripts/cluster_occupancy.py [--head-dim 64] [--splits 2 8 16]
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT)]


def _check(result):
    err, *rest = result
    if int(err) != 0:
        raise RuntimeError(f"CUDA driver error {err}")
    return rest[0] if len(rest) == 1 else rest


def kernel_name(blob: bytes) -> str:
    from fa_variants.common import cubin

    names = [n.removeprefix(".text.") for n in cubin._elf_sections(blob) if n.startswith(".text.")]
    if len(names) != 1:
        raise ValueError(f"expected one kernel in the cubin, found {names}")
    return names[0]


def max_active_clusters(blob: bytes, smem: int, threads: int, cluster: int) -> int:
    """cuOccupancyMaxActiveClusters of the cubin's kernel launched with ``threads`` threads per CTA, ``smem`` bytes
    of dynamic shared memory and clusters of ``cluster`` CTAs (non-portable sizes allowed)."""
    from cuda.bindings import driver as cu

    module = _check(cu.cuModuleLoadData(blob))
    func = _check(cu.cuModuleGetFunction(module, kernel_name(blob).encode()))
    attr = cu.CUfunction_attribute
    _check(cu.cuFuncSetAttribute(func, attr.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, smem))
    _check(cu.cuFuncSetAttribute(func, attr.CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED, 1))
    config = cu.CUlaunchConfig()
    config.gridDimX, config.gridDimY, config.gridDimZ = cluster * 8, 1, 1
    config.blockDimX, config.blockDimY, config.blockDimZ = threads, 1, 1
    config.sharedMemBytes = smem
    a = cu.CUlaunchAttribute()
    a.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    a.value.clusterDim.x, a.value.clusterDim.y, a.value.clusterDim.z = cluster, 1, 1
    config.attrs, config.numAttrs = [a], 1
    return int(_check(cu.cuOccupancyMaxActiveClusters(func, config)))


#: cluster sizes scripts/cluster_gpu.sh probes (cluster_precompile.py compiles their kernels)
SIZES = (2, 8, 16)


def config(head_dim: int, splits: int, ctas_per_sm: int = 1):
    """The seqlen_q 1 decode config `auto` splits with (base tiles, first_row_only, no PDL), merged in a cluster of
    ``splits``, launched for ``ctas_per_sm`` CTAs per SM (2: FA_VARIANTS_DECODE_CLUSTER_MERGE=dual)."""
    from fa_variants.hopper import fa3

    base = fa3.first_row(fa3.decode_tiles(fa3._PACKED_SPLIT_CONFIGS[head_dim], head_dim, "base", pdl=False), 8, True)
    return dataclasses.replace(base, num_splits=splits, cluster_merge=True, ctas_per_sm=ctas_per_sm)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--splits", type=int, nargs="+", default=list(SIZES))
    a = p.parse_args()
    import torch

    from fa_variants import registry

    torch.zeros(1, device="cuda")  # the primary context, current
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    d = a.head_dim
    for n, per_sm in [(n, 1) for n in a.splits] + [(16, 2)]:  # and the "dual" 16-CTA cluster
        cfg = config(d, n, per_sm)
        c = registry.compiled(registry.static_config("fa3", "sm_90a", "bf16", d, True, cfg))
        threads = 128 * (1 + cfg.consumer_warpgroups)
        try:
            clusters = max_active_clusters(c.cubin, c.smem_dynamic_bytes, threads, n)
            verdict = "one wave" if clusters >= 8 else "TWO WAVES"
            print(f"cluster {n:2d} (D {d}, {per_sm} CTA(s) per SM, {c.smem_dynamic_bytes} B smem): {clusters} resident "
                  f"clusters = {clusters * n} CTAs of {sms} SMs; B 1 x 8 KV heads needs 8: {verdict}", flush=True)
        except Exception as exc:  # noqa: BLE001 - one line per size, whatever the driver says
            print(f"cluster {n:2d} ({per_sm} CTA(s) per SM): ERR {type(exc).__name__}: {exc}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
