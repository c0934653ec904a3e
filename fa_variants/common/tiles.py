"""Tile configurations per (arch, head_dim) and the shared-memory budget they must fit.

An sm80-style attention CTA holds in shared memory one Q tile (Br x D) and `stages` buffers of each
of K and V (Bc x D); its registers hold, per thread, the O accumulator (Br x D / threads fp32), the S/P
tile (Br x Bc / threads fp32) and the operand fragments. The choices below follow FlashAttention-2's
own sm80 table (flash-attention csrc ``flash_fwd_launch_template.h``) as a start: 4 warps, Br = 128
(two 16-row MMA blocks per warp, so each K/V fragment read from shared memory feeds two MMAs), and
Br = 64 for D = 256 (a 128-row O accumulator would not fit in registers). Bc is then the widest that
compiles without local-memory spills here (checked with `fa-variants compile`, sm_80, ptxas of
nvidia-cutlass-dsl 4.8.1): FA2's 128 x 128 at D = 64 and 128 x 64 at D = 96 / 128 spill 8-32
bytes once K/V are double-buffered, so D = 64 uses Bc = 64 and D = 96 / 128 use Bc = 32 (FA2's own
choice for sm86 / sm89 at D = 128). K and V are double-buffered (stages = 2) so the next tile's
loads overlap the current tile's MMAs. Smaller-smem parts (sm86 / sm89, 99 KiB per CTA) get a
narrower Bc at D = 256.
"""
from __future__ import annotations

import dataclasses
import os

# Shared memory one CTA may use (opt-in maximum), bytes (CUDA programming guide, compute capabilities).
SMEM_CAPACITY = {"sm_80": 163 * 1024, "sm_86": 99 * 1024, "sm_89": 99 * 1024, "sm_90a": 227 * 1024}


@dataclasses.dataclass(frozen=True)
class AttentionTiles:
    """Br query rows x Bc keys per step, `warps` warps (all along Br), `stages` K/V buffers."""

    Br: int
    Bc: int
    warps: int = 4
    stages: int = 2

    def smem_bytes(self, head_dim: int, elem_bytes: int = 2) -> int:
        """Q tile + stages x (K tile + V tile), bytes."""
        return (self.Br + 2 * self.stages * self.Bc) * head_dim * elem_bytes

    def key(self) -> tuple:
        """The hashable form stored in a StaticConfig."""
        return tuple(dataclasses.asdict(self).items())

    @classmethod
    def from_key(cls, key: tuple) -> "AttentionTiles":
        return cls(**dict(key))

    def check(self, arch: str, head_dim: int, elem_bytes: int = 2) -> "AttentionTiles":
        """Raise ValueError unless the tile fits the arch's shared memory and the MMA shape."""
        need, have = self.smem_bytes(head_dim, elem_bytes), SMEM_CAPACITY.get(arch, SMEM_CAPACITY["sm_86"])
        if need > have:
            raise ValueError(f"tiles {self} need {need} bytes of shared memory at head_dim {head_dim}; "
                             f"{arch} has {have}")
        if self.Br % (16 * self.warps) or self.Bc % 16 or head_dim % 16:
            raise ValueError(f"tiles {self}: Br must be a multiple of 16 * warps, Bc and head_dim of 16")
        return self


_FA2_SM80 = {64: AttentionTiles(128, 64), 96: AttentionTiles(128, 32), 128: AttentionTiles(128, 32),
             256: AttentionTiles(64, 64)}
_FA2_SMALL_SMEM = {256: AttentionTiles(64, 32)}


def fa2_tiles(arch: str, head_dim: int, dtype: str = "bf16", causal: bool = False) -> AttentionTiles:
    """The FA2 tile configuration for an arch and head_dim (ValueError if head_dim unsupported).

    The environment variable FA2_TILES="BrxBc" (e.g. "128x64") overrides the table, for tile sweeps
    (scripts/fa2_bench.py --tiles); the tiles are part of the compile-cache key."""
    if head_dim not in _FA2_SM80:
        raise ValueError(f"head_dim {head_dim} has no FA2 tile configuration; supported: {sorted(_FA2_SM80)}")
    tiles = _FA2_SM80[head_dim]
    override = os.environ.get("FA2_TILES")
    if override:
        br, bc = (int(x) for x in override.lower().split("x"))
        return AttentionTiles(br, bc).check(arch, head_dim)
    if SMEM_CAPACITY.get(arch, 0) < tiles.smem_bytes(head_dim):
        tiles = _FA2_SMALL_SMEM.get(head_dim, tiles)
    return tiles.check(arch, head_dim)
