"""Split-KV (Flash-Decoding): how many CTAs share one query tile's K/V range, and the merge of their results.

When batch x heads x query tiles cannot fill the GPU (decode: one query tile per (batch, head)), the K/V
tiles of each query tile are cut into `num_splits` contiguous ranges, one CTA each. Split s returns its
partial result as if attention were over its keys only: O_s (normalised by its own row sum) and
LSE_s = log sum_{j in s} exp(scale q k_j). The whole result follows exactly (Dao, Haziza, Massa, Sizov,
"Flash-Decoding for long-context inference", 2023; FA2 paper section 3.1 for the rescaling identity):

    LSE = log sum_s exp(LSE_s),    O = sum_s exp(LSE_s - LSE) O_s.

A split that saw no key has LSE_s = -inf and contributes nothing (its O_s is never read: it may be
unwritten); when every split is empty the row gets O = 0 and LSE = -inf, like an unsplit row that sees no key.
A partial LSE_s of +inf (its true value beyond float32, at a huge softmax_scale) cannot be weighed against
another (exp(inf - inf)): `fa_variants.attention` runs such scales unsplit (``MAX_SPLIT_SCALE``).

`num_splits_heuristic` picks the count from the shape and the SM count; `merge` is the combine step in
torch (fp32; pairwise over the splits). fa3 merges with the one-launch kernel ``common.split_combine`` instead
(the same maths, sequential over the splits; FA_VARIANTS_MERGE_KERNEL=0: this one). Pure Python + torch.

Rounding, not maths, is what a split count changes: each split rounds its own P to 16 bits for the P V GEMM
(relative to its own row max), so results with different counts differ by bf16 rounding (measured on the CPU
model of fa3's split path, tests/test_split.py: rel-L2 2.7e-3 between 1 and 16 splits at Nk = 4096, each
count 2.2e-3 from float64, torch in bf16 4.9e-3). The merge itself adds elementwise in a fixed order (a
pairwise sum over the splits), so a row's result depends on its split count only, never on the batch size
or the other rows (docs/edge_cases.md, EC-19).
"""
from __future__ import annotations

import functools
import math

import torch

from fa_variants.common import env
from fa_variants.common.checks import is_int, one_line

MAX_SPLITS = 64
#: The largest |softmax_scale| a split-KV call runs with. A split's partial LSE_s = scale m_s + log l_s (m_s its
#: largest score) must be finite in float32 for the merge: two splits whose LSE_s overflowed to +inf cannot be
#: weighed (exp(inf - inf)), and their rows came out NaN where the unsplit kernel returns the right O (and LSE +inf).
#: Below 2^64 every fp16 input is safe (|score| <= head_dim x 65504^2 < 2^41) and a bf16 one whose scores stay
#: below 2^64; above it `fa_variants.attention` runs unsplit (and refuses num_splits > 1: ``check_split_scale``).
MAX_SPLIT_SCALE = 2.0 ** 64


#: The fewest K/V tiles the heuristic gives a split (counts giving fewer are not considered) when the caller passes
#: no min_tiles: fa2's count. 2 by default; fa3 passes its own (``hopper.fa3.SPLIT_MIN_TILES``, the same variable
#: with default 1 since the session-6 H200 A/B). 1 (FA_VARIANTS_SPLIT_MIN_TILES=1) lets short-Nk decode split into
#: one-tile CTAs:
#: B 1, Nk 1k, 128-key tiles, 8 packed CTAs -> 8 splits (64 CTAs of 1 tile) instead of 4 (32 CTAs of 2). The
#: latency/bandwidth model of bench/NOTES.md ("Decode at B 1, short Nk: where the time goes") predicts
#: max(1 tile x 0.85 us, 4.2 MB / 4 TB/s) = 1.05 us of streaming instead of 2 x 0.85 = 1.7 us there. Read once,
#: at import: fa3 and fa2 cache the count per shape.
MIN_BLOCKS_PER_SPLIT = env.integer("FA_VARIANTS_SPLIT_MIN_TILES", "2", 1, "K/V tiles per split")
# A CTA's fixed cost (launch slot, Q load, pipeline fill, epilogue, its share of the merge) in K/V tiles.
SPLIT_OVERHEAD_TILES = 1


def num_splits_heuristic(ctas: int, n_blocks: int, num_sms: int, max_splits: int = MAX_SPLITS,
                         min_tiles: int | None = None) -> int:
    """Splits per query tile: 1 when `ctas` (batch x heads x query tiles) already give every SM work, else the
    count with the least modelled time, the fewest on a tie.

    ctas: CTAs without splitting; n_blocks: K/V tiles per query tile (the longest); num_sms: SMs of the GPU, or
    the CTA slots of a kernel that runs several CTAs per SM (fa2 passes SMs x ``ampere.fa2.ctas_per_sm``);
    min_tiles: the fewest tiles per split (None: MIN_BLOCKS_PER_SPLIT).
    Model (one CTA per SM, true of every fa3 config: 240 registers x 256+ threads): s splits take
    ceil(ctas s / num_sms) waves of ceil(n_blocks / s) + SPLIT_OVERHEAD_TILES tile times each; counts giving a
    split fewer than `min_tiles` tiles are not considered. At B = 1, 32:8 packed (8 CTAs) and 4k keys
    (32 tiles) on 132 SMs it takes 16 splits (128 CTAs of 2 tiles) where the wave-efficiency rule of
    Dao-AILab/flash-attention (hopper/heuristics.h::num_splits_heuristic, which this replaced) took 14 (112 CTAs,
    some with 3 tiles: the longest CTA sets the time).
    """
    if ctas <= 0 or n_blocks <= 0 or num_sms <= 0:
        return 1
    if ctas >= 0.8 * num_sms:
        return 1
    limit = max(1, min(max_splits, num_sms, n_blocks // (min_tiles or MIN_BLOCKS_PER_SPLIT)))

    def cost(s: int) -> int:
        return math.ceil(ctas * s / num_sms) * (math.ceil(n_blocks / s) + SPLIT_OVERHEAD_TILES)

    return min(range(1, limit + 1), key=lambda s: (cost(s), s))


def check_options(num_splits, pack_gqa) -> int | None:
    """The public ``num_splits=`` / ``pack_gqa=`` options (``fa_variants.attention``): num_splits an int >= 1
    (a numpy integer too, as a Python int) or None (chosen per call), pack_gqa a bool or None (chosen per
    call). Returns num_splits as an int (or None). Raises TypeError / ValueError (one line naming the
    argument)."""
    if num_splits is not None:
        if not is_int(num_splits):
            raise TypeError(f"num_splits must be an int >= 1 or None (chosen per call), got {_shown(num_splits)}")
        num_splits = int(num_splits)
        if num_splits < 1:
            raise ValueError(f"num_splits must be >= 1 (1: no split) or None (chosen per call), got {num_splits}")
    if pack_gqa is not None and not isinstance(pack_gqa, bool):
        raise TypeError(f"pack_gqa must be a bool or None (chosen per call), got {_shown(pack_gqa)}")
    return num_splits


def splits_allowed(softmax_scale: float) -> bool:
    """Whether a call with this softmax_scale may split K/V (``MAX_SPLIT_SCALE``)."""
    return abs(softmax_scale) <= MAX_SPLIT_SCALE


def unsplit_choice(config, softmax_scale: float, auto, unsplit, default):
    """A split-KV backend's ``Variant.scale_config`` (fa3, fa2): ``config``; when it is None and |softmax_scale| is
    above MAX_SPLIT_SCALE, the backend's own choice ``auto()`` (a config, None: its default) where that does not
    split, else ``unsplit()`` (its choice with the split count 1); ``default()`` for a None choice, so that the
    config is fixed. ``auto``, ``unsplit``, ``default``: functions of no argument, called only when needed."""
    if config is not None or splits_allowed(softmax_scale):
        return config
    chosen = auto()
    if chosen is not None and chosen.num_splits != 1:
        return unsplit()
    return chosen or default()


def check_split_scale(num_splits: int | None, softmax_scale: float) -> None:
    """ValueError (one line naming both) for num_splits > 1 with |softmax_scale| above MAX_SPLIT_SCALE."""
    if num_splits is not None and num_splits > 1 and not splits_allowed(softmax_scale):
        raise ValueError(f"num_splits={num_splits} with softmax_scale={softmax_scale:.4g}: with |softmax_scale| "
                         f"above 2^64 a split's partial LSE can overflow float32 and the merge cannot weigh it; pass "
                         f"num_splits=1 or None")


def _shown(value) -> str:
    """A rejected argument in an error message: its repr, or its type's name while torch.compile traces (a traced
    value's repr cannot be traced)."""
    return type(value).__name__ if torch.compiler.is_compiling() else one_line(value)


@functools.lru_cache(maxsize=None)
def sm_count(device_index: int) -> int:
    """Streaming multiprocessors of a CUDA device (cached: the property query costs microseconds)."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def split_ranges(n_blocks: int, num_splits: int) -> list[tuple[int, int]]:
    """[start, end) K/V tile range of each split, as the kernels cut it: split s gets tiles
    [s n // S, (s + 1) n // S) (sizes differ by at most one; some are empty when n < S)."""
    return [(s * n_blocks // num_splits, (s + 1) * n_blocks // num_splits) for s in range(num_splits)]


def contiguous_strides(shape: tuple) -> tuple:
    """The strides (in elements) of a contiguous tensor of this shape: the split partials' layout, which the
    backends hand to their kernels and view again (``as_strided``) without building a tensor."""
    strides, n = [], 1
    for size in reversed(shape):
        strides.append(n)
        n *= size
    return tuple(reversed(strides))


def merge(o_parts: torch.Tensor, lse_parts: torch.Tensor, out: torch.Tensor | None = None,
          lse: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Combine split results by their LSE (module docstring).

    Args:
        o_parts: (num_splits, batch, seqlen_q, num_heads, head_dim) float32, each normalised by its own
            row sum; entries of a split whose LSE is -inf are ignored (may hold anything, NaN included).
        lse_parts: (num_splits, batch, num_heads, seqlen_q) float32, natural log; -inf: the split saw no key.
        out, lse: optional outputs to write: out (batch, seqlen_q, num_heads, head_dim) in any float dtype,
            lse (batch, num_heads, seqlen_q) float32.
    Returns:
        (out, lse); a row every split of which is empty gets O = 0 and LSE = -inf; a NaN LSE_s makes its
        row NaN (O and LSE), as the unsplit kernel's row would be.
    """
    lse_max = lse_parts.amax(dim=0)                                      # (B, H, Nq); max is exact
    safe_max = torch.where(lse_max == -math.inf, 0.0, lse_max)
    weights = torch.exp(lse_parts - safe_max)                            # 0 for empty splits
    total = _sum_splits(weights)
    lse_out = torch.where(total == 0, -math.inf, safe_max + torch.log(total))  # a NaN LSE_s stays NaN
    weights = weights / torch.where(total == 0, 1.0, total)
    w = weights.permute(0, 1, 3, 2).unsqueeze(-1)                        # (S, B, Nq, H, 1)
    o = _sum_splits(torch.where(w > 0, o_parts, 0.0).mul_(w))
    if out is None:
        out = o
    else:
        out.copy_(o)
    if lse is None:
        lse = lse_out
    else:
        lse.copy_(lse_out)
    return out, lse


def _sum_splits(x: torch.Tensor) -> torch.Tensor:
    """x.sum(0) as a pairwise sum of whole slices (x[i] + x[i + h]): every element is added in the same
    order whatever the other dimensions are, unlike a library reduction whose blocking may follow the
    tensor's size (this keeps a row's merge independent of the batch size; log2(num_splits) launches)."""
    while x.shape[0] > 1:
        half = x.shape[0] // 2
        pairs = x[:half] + x[half:2 * half]
        x = torch.cat((pairs, x[2 * half:])) if x.shape[0] % 2 else pairs
    return x[0]
