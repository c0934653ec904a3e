"""The thread maps of the FP8 quantisation pass (``quant_kernel.QuantPass``): which token / chunk of a scale block a
thread holds, where it reads and writes its 16-byte pieces in a shared-memory stage, which units of the staged e4m3
block it stores, and K's partial-sum groups and sample items of V's launch.

Pure index arithmetic: each function works on Python ints (tests/test_fp8_quant_kernel.py checks them on the CPU:
test_coalesced_stage_map, test_staged_store_map, ...) and on the kernel's Int32 (the kernel calls them while it is
traced). The terms (module docstring of ``quant_kernel``): a block is ``rows`` tokens x head_dim channels of one
(batch, head); a chunk is ``VEC`` = 16 contiguous channels; a thread holds ``SLOTS`` = 4 chunks (Q / K: 4 chunks of
one token, ``lanes`` = head_dim / 64 threads per token; V: one chunk of 4 tokens, ``quads`` = rows / 4 token quads);
a piece is 8 channels (16 bytes of 16-bit input), a unit 16 e4m3 bytes.
"""
from __future__ import annotations

__all__ = ["VEC", "SLOTS", "piece_swizzle", "thread_token", "thread_chunk", "stage_piece", "store_pitch",
           "store_swizzle", "store_unit", "store_map", "k_sum_group", "k_parts_per_block", "stage_load",
           "k_sample_item", "k_sample_slot", "late_first", "late_item"]

VEC = 16  # contiguous channels per slot: two 16-byte loads of 16-bit input, one 16-byte e4m3 store
SLOTS = 4  # slots per thread: 4 chunks of one token (Q / K) or one chunk of 4 tokens (V)


def piece_swizzle(role: str, lanes: int, row):
    """XOR mask of the 16-byte pieces of token ``row`` in a coalesced stage (``PassConfig.coalesced``): piece q
    of the token sits at q ^ mask. Works on ints and on the kernel's Int32.

    Why these bits: a token's row is 128 / 256 / 512 bytes (a multiple of the 128 bytes of the 32 banks), so
    unswizzled every token starts in bank 0. A 16-byte shared load is served 8 threads at a time; those 8 read
    one piece q = 2 * chunk + half each: role "qk" (``lanes`` = head_dim / 64 threads per token), 8 / lanes
    consecutive tokens whose pieces differ in q's bits 1 .. log2(lanes) (the lane), so the mask puts the
    token's low bits into q's other bits of 0..2; role "v", 8 consecutive token quads of one chunk, tokens
    2 (quad % 4) + 16 (quad / 4) (+ the slot's offset): their bits 1, 2, 4 go to q's bits 0, 1, 2. The
    writes (8 consecutive pieces of one token) stay conflict-free under any mask < 8. Checked on the CPU by
    tests/test_fp8_quant_kernel.py::test_coalesced_stage_map."""
    if role == "v":
        return ((row >> 1) & 3) | ((row >> 2) & 4)
    if lanes == 1:
        return row & 7
    if lanes == 2:
        return (row & 1) | ((row & 2) << 1)
    return row & 1


def thread_token(role: str, lanes: int, quads: int, tidx, slot: int):
    """Token (within the block) of a thread's slot: Q / K one token per thread (``lanes`` threads per token);
    V the quad of ``v_token_order`` (``quads`` = rows / 4 token quads). Works on ints and Int32."""
    if role == "qk":
        return tidx // lanes
    quad = tidx % quads
    return 16 * (quad // 4) + 2 * (quad % 4) + (slot & 1) + 8 * (slot >> 1)


def thread_chunk(role: str, lanes: int, quads: int, tidx, slot: int):
    """Chunk (16 channels) of a thread's slot: Q / K lane + slot * lanes; V one chunk per thread."""
    if role == "qk":
        return tidx % lanes + slot * lanes
    return tidx // quads


def stage_piece(role: str, lanes: int, quads: int, head_dim: int, tidx, slot: int, half: int):
    """Where a thread reads half ``half`` (8 channels) of its slot in a coalesced stage: the 16-byte piece
    index token * head_dim / 8 + (q ^ piece_swizzle(token)), q = 2 chunk + half. For Q / K written as
    c - c % 8 + (h ^ c % 8), c = 2 slot lanes + half (compile-time), h = 2 lane ^ mask (one register per
    thread): the same number, since 2 lane < 2 lanes and c % 8 have no bit in common."""
    P = head_dim // 8
    row = thread_token(role, lanes, quads, tidx, slot)
    if role == "qk":
        c = 2 * slot * lanes + half
        h = (2 * (tidx % lanes)) ^ piece_swizzle(role, lanes, row)
        return row * P + (c - c % 8) + (h ^ (c % 8))
    q = 2 * thread_chunk(role, lanes, quads, tidx, slot) + half
    return row * P + (q ^ piece_swizzle(role, lanes, row))


def store_pitch(head_dim: int, slots: int = SLOTS) -> int:
    """16-byte units per token row in a staged store (``PassConfig.staged_store``): head_dim / 16, plus L =
    head_dim / (16 slots) units of padding at head_dim >= 128 (``store_swizzle``; L = 1 for ``PassConfig.wide`` at
    head_dim 128, 8 slots); rows x pitch x 16 bytes <= 1.25 x the block's e4m3 bytes, inside its 16-bit stage."""
    return head_dim // VEC + (head_dim // (VEC * slots) if head_dim >= 128 else 0)


def store_swizzle(head_dim: int, row):
    """XOR mask of the 16-byte e4m3 units of token ``row`` in a staged store: unit c of the token sits at
    row * ``store_pitch`` + (c ^ mask). A 16-byte shared access is served 8 threads at a time, which must hit the
    8 distinct 16-byte bank groups of 128 bytes: for the writes, the 8 threads of one slot (8 / L tokens x their
    L = head_dim / 64 lanes, chunk lane + slot L); for the reads, 8 consecutive units in (token, chunk) order.
    head_dim >= 128: no mask, the row's L units of padding shift token r + 1 by L bank groups from token r
    (writes: r L + lane takes the 8 values; reads: 8 chunks of one token), so a thread's 4 units are one address
    plus constant offsets (no extra registers beside the 64 values); head_dim 64 (a row is 4 units, two tokens
    share 128 bytes, and no padding serves both the writes and the reads): mask (row / 2) % 4, slot ^ mask then
    takes the 4 values over 4 token pairs. Works on ints and Int32; checked by
    tests/test_fp8_quant_kernel.py::test_staged_store_map."""
    if head_dim == 64:
        return (row >> 1) & 3
    return 0


def store_unit(head_dim: int, tidx, slot: int, slots: int = SLOTS):
    """The 16-byte unit of the staged e4m3 block (``PassConfig.staged_store``) where thread tidx writes its slot
    (chunk lane + slot L of its token tidx / L, L = head_dim / (16 slots), role "qk"): token * ``store_pitch`` +
    (chunk ^ store_swizzle(token)). slots: 8 with ``PassConfig.wide`` (head_dim 128: L = 1, a thread's 8 units
    of one token; the row's 1 unit of padding puts 8 consecutive tokens' unit j on 8 bank groups)."""
    lanes = head_dim // (VEC * slots)
    row = tidx // lanes
    return row * store_pitch(head_dim, slots) + ((tidx % lanes + slot * lanes) ^ store_swizzle(head_dim, row))


def store_map(head_dim: int, threads: int, tidx, r: int, slots: int = SLOTS):
    """(token, chunk, unit in the stage) of thread tidx's r-th global store (r = 0 .. slots - 1; slots 8 with
    ``PassConfig.wide``, threads = rows * head_dim / 128, a step of rows / 8 tokens) in a staged store: unit
    u = tidx + r * threads of the block in (token, chunk) order, token u / (head_dim / 16), chunk u % (head_dim /
    16), read from token * ``store_pitch`` + (chunk ^ store_swizzle(token)). threads = rows * head_dim / 64 is
    (rows / 4) x head_dim / 16, so the token is tidx / (head_dim / 16) + r rows / 4 and the chunk tidx % (head_dim
    / 16) for every r, and a step of rows / 4 tokens (a multiple of 8: ``PassConfig.check`` asks rows % 32 == 0)
    leaves ``store_swizzle`` unchanged: one address plus constant steps (tests/test_fp8_quant_kernel.py::
    test_staged_store_map checks this form against the units written). Works on ints and Int32."""
    per = head_dim // VEC
    step = threads // per  # rows / slots tokens
    row0, chunk = tidx // per, tidx % per
    pitch = store_pitch(head_dim, slots)
    return row0 + r * step, chunk, row0 * pitch + (chunk ^ store_swizzle(head_dim, row0)) + r * step * pitch


def k_sum_group(rows: int) -> int:
    """Token quads one butterfly of K's partial sums adds in V's launch (``QuantPass.k_partial_sums``): the
    largest power of two <= 32 dividing quads = rows / 4 (32 at rows 128 / 256, 16 at rows 192, whose 48 quads
    per 16 channels straddle warps: aligned groups of 16 lanes never do). rows: a multiple of 16."""
    quads = rows // SLOTS
    return min(32, quads & -quads)


def k_parts_per_block(rows: int) -> int:
    """K's float32 partial sums per scale block of ``rows`` tokens in V's launch: quads / ``k_sum_group``
    (1 at rows <= 128, 2 at 256, 3 at 192); ``k_parts`` holds T x this many per (batch, kv-head)."""
    return rows // SLOTS // k_sum_group(rows)


def stage_load(head_dim: int, rows: int, role: str, lanes: int, tidx, m: int, loads: int = 8):
    """(token, piece q of the token, piece index in the stage) of a thread's m-th 16-byte cp.async
    (m = 0 .. loads - 1; loads = 2 x the thread's slots: 8, 16 with ``PassConfig.wide``) in a coalesced stage: piece
    tidx % (head_dim / 8) of token tidx / (head_dim / 8) + m rows / loads."""
    P = head_dim // 8
    row = tidx // P + m * (rows // loads)
    q = tidx % P
    return row, q, row * P + (q ^ piece_swizzle(role, lanes, row))


def k_sample_item(j, heads, n_tiles, n_sample):
    """(batch, head, tile) of V's launch's K item j with a sampled mean (``PassConfig.k_sample``): sample
    s = j % n_sample of (batch, head) = divmod(j // n_sample, heads)[::-1], tile floor(s n_tiles / n_sample)
    (``quantize.k_sample_tiles``; n_sample < n_tiles, s * n_tiles < 2^31). Works on ints and Int32."""
    rest = j // n_sample
    return rest // heads, rest % heads, (j % n_sample) * n_tiles // n_sample


def k_sample_slot(tile, n_tiles, n_sample):
    """The sample index s of a sampled tile (tile = floor(s T / m) with m <= T: s = ceil(tile m / T)), where its
    K partial sums go. Works on ints and Int32."""
    return (tile * n_sample + n_tiles - 1) // n_tiles


def late_first(cta, grid, n_blocks):
    """The first K item (index >= n_blocks) among CTA ``cta``'s work items cta, cta + grid, ... of V's launch
    (items 0 .. n_blocks - 1 are V's blocks, the rest K's): cta itself when cta >= n_blocks. 0 <= cta < grid."""
    return cta + (n_blocks - cta + grid - 1) // grid * grid


def late_item(first, grid, threads: int, rnd, tidx):
    """``PassConfig.late_count``: the K item that thread ``tidx`` counts in round ``rnd`` after the CTA's loop
    (the CTA's K items first, first + grid, ... dealt to its ``threads`` threads, ``threads`` per round); the caller
    skips items >= the launch's total."""
    return first + (rnd * threads + tidx) * grid
