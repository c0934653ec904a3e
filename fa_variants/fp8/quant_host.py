"""The host side of the FP8 quantisation pass (the kernel, its design and its pipelines "v1" / "v2" / "v3":
``fp8.quant_kernel``): the pipelines' switches (``PIPELINES``, ``DEFAULT_PIPELINE``, ``V2_*``, ``V3_*``,
``QUANT_PLANS``; some read an environment variable at import, as their comments say), the per-process caches of
compiled passes, launch plans and device constants (``_pass``, ``launch_plan``, ``_signs``, ``_zeros``), one tensor
through a pass (``quantize_tensor``) and q, k, v through a pipeline (``quantize``: what ``quantize_fp8(...,
impl="kernel")`` runs; ``why_not`` says when it cannot)."""
from __future__ import annotations

import contextlib

import torch

from fa_variants.common import env as _env
from fa_variants.common import interop, workspace
from fa_variants.common.checks import one_line
from fa_variants.fp8 import layout
from fa_variants.fp8.quant_kernel import (DTYPES, HEAD_DIMS, MAX_BLOCK, SMEM_PER_CTA, VARIANT, PassConfig,
                                          static_config)
from fa_variants.fp8.quant_maps import k_parts_per_block
from fa_variants.fp8.quantize import (E4M3, FP8Config, FP8Inputs, HadamardRotation, _check, k_mean, k_sample_count,
                                      k_sample_tiles, tiles_for)

__all__ = ["PIPELINES", "DEFAULT_PIPELINE", "why_not", "quantize", "quantize_tensor", "pipeline_of", "own_mean",
           "k_mean_from_parts", "stages_for", "staged_store_for", "wide_for", "qk_layout", "launch_plan",
           "planned_passes"]

#: the pipelines of ``quantize`` (``pipeline=`` or the environment variable FA_VARIANTS_FP8_QUANT_PIPELINE):
#: "v1" one launch per tensor, one block of loads in flight per CTA, K's mean by torch; "v2" (see the module
#: docstring) ``V2_STAGES`` blocks in flight, K's mean as partial sums in V's launch, K's blocks read back to
#: front; "v3" v2 with coalesced loads and head-major order. Default "v3": faster than v1 in every row of the
#: H200 run of session 6 (quant3: scripts/fp8_quant_bandwidth.py; bench/NOTES.md, Session 6 outcomes; its GPU tests
#: and sanitizers clean).
PIPELINES = ("v1", "v2", "v3")
DEFAULT_PIPELINE = "v3"
V2_STAGES = 3
#: v2's other two parts, switchable for an ablation (scripts/fp8_quant_bandwidth.py --ablation): programmatic
#: dependent launch of K's and Q's passes (sm_90), K's blocks walked last to first after V's launch read them
#: (off, K's smoothed pass spills 16 bytes at head_dim 128 with 3 stages: keep it on)
V2_PDL = True
#: PDL for K's and Q's passes only up to this head_dim (64 since session 43; FA_VARIANTS_FP8_QUANT_PDL_MAX_HEAD_DIM,
#: read at import, sets it; 256 is PDL at every head_dim, the default before). Why: on an H100 with the non-finite
#: switch on, PDL at every head_dim took 1.020 / 1.057x the GPU time of the passes without it at head_dim 128 / 256
#: (session 42); this default against that one, 10 rotated rounds: 0.978 / 0.941 at 128 / 256 (graph replay 0.968 /
#: 0.927), 1.006 at 64 (graph 0.999), every row the torch recipe's bit for bit (bench/NOTES.md "Session 43")
V2_PDL_MAX_HEAD_DIM = _env.integer("FA_VARIANTS_FP8_QUANT_PDL_MAX_HEAD_DIM", "64", 0, "head_dim")
V2_REVERSE = True
#: pipeline "v3" (module docstring): v2 plus coalesced loads through a swizzled shared-memory stage
#: (``PassConfig.coalesced``) and blocks walked head fastest (``PassConfig.head_major``); each switchable for the
#: ablation of scripts/fp8_quant_bandwidth.py
V3_COALESCED = True
V3_HEAD_MAJOR = True
#: v3: K's mean finished inside V's launch (``PassConfig.fused_mean``): the CTA that adds the last partial of a
#: (batch, kv-head) sums its partials (no torch sum between V's launch and K's pass). Off: each K block's
#: release fence (MEMBAR.GPU) may wait for the CTA's cp.async prefetches; the ablation measures it
V3_FUSED_MEAN = False
#: v3: the fused mean for a sampled K mean only (``FP8Config.smooth_k_blocks``; the exact mean as V3_FUSED_MEAN says):
#: then only the m sample tiles per head pay the release fence (quant4 on the H200, sampled8: v3 + staged + fused
#: 63.3 / 68.5 / 55.0 / 55.6% of copy against 60.7 / 65.8 / 53.7 / 52.3% at D 64 / 128 / 256 / GQA; with the exact
#: mean 2-3 points slower). Off until the sampled mean is the default (scripts/fp8_quant_bandwidth.py's "v3sfs");
#: FA_VARIANTS_FP8_QUANT_FUSED_SAMPLED_MEAN=1 (read at import) turns it on
V3_FUSED_SAMPLED_MEAN = _env.flag("FA_VARIANTS_FP8_QUANT_FUSED_SAMPLED_MEAN", False)
#: v3: the fused mean (exact or sampled) with its counting moved after each CTA's loop (``PassConfig.late_count``):
#: one release fence per CTA and its K items' counts (one gpu-scope atomic each, the CTA's threads in parallel)
#: after its last item, instead of a fence + barrier + atomic + barrier per K block; the CTA that counts a head's last
#: block adds that head's partials as ``V3_FUSED_MEAN`` does (same partials, same order: outputs bit for bit the
#: fused mean's). Turns the fused mean on for the exact mean too (no torch sum of the partials between V's launch and
#: K's pass); the heads' sums load ``MEAN_LOADS`` partials at a time (``mean_of``). Off: session 8's H200 A/B
#: (scripts/fp8_quant_bandwidth.py, def / defl; bench/NOTES.md, Session 8 outcomes) measured late / default 1.024 /
#: 1.008 / 0.998 / 0.956 on the default recipe at D 64 / 128 / 256 / GQA, not faster everywhere;
#: FA_VARIANTS_FP8_QUANT_FUSED_MEAN_LATE=1 (read at import)
V3_FUSED_MEAN_LATE = _env.flag("FA_VARIANTS_FP8_QUANT_FUSED_MEAN_LATE", False)
#: v3: K's mean, which the smoothed K pass and Q's pass (the LSE shift) read per block, cp.async'd with the block's
#: stage into a mean buffer per stage (``PassConfig.staged_mean``) instead of a global load + a barrier per block
#: (the load's latency, ~1 us, is then exposed once per block in a CTA alone on its SM). The same operations:
#: outputs bit for bit v3's. On since the H200 run of session 6 (quant4; default recipe, % of copy
#: bandwidth, staged vs not: D64 53.1 vs 51.3, D128 57.2 vs 51.4, D256 46.9 vs 42.9, D128 GQA 51.5 vs 47.3; its GPU
#: tests equal v3 bit for bit, racecheck / synccheck clean); FA_VARIANTS_FP8_QUANT_STAGED_MEAN=0 (read at import)
#: turns it off
V3_STAGED_MEAN = _env.flag("FA_VARIANTS_FP8_QUANT_STAGED_MEAN", True)
#: v3: Q's / K's e4m3 bytes stored through shared memory (``PassConfig.staged_store``): after the block amax's barrier
#: each thread writes its 16-byte chunks into the stage it has just read (``store_unit``, swizzled), a barrier, then
#: thread t stores units t, t + threads, ... of the block (``store_map``): a warp's store covers 512 contiguous bytes
#: of whole token rows (whole 32-byte sectors at head_dim 64, where each thread's own 16-byte stores half-fill a
#: sector) instead of 16 / 8 / 4 tokens' pieces. The same bytes: outputs bit for bit v3's. H200, session 7
#: (quant5, staged / not, gpu time): head_dim 64 0.785-0.845 (default recipe 50.9 -> 60.2% of copy,
#: no-smooth 67.0 -> 85.3%), head_dim 128 1.015-1.020, 256 1.039-1.050 (their stores already cover whole sectors):
#: so on at head_dim 64 only (None = that rule; ``staged_store_for``). FA_VARIANTS_FP8_QUANT_STAGED_STORE (read at
#: import): auto (that rule), 1 (every head_dim), 0 (none)
V3_STAGED_STORE: bool | None = _env.auto_flag("FA_VARIANTS_FP8_QUANT_STAGED_STORE")
#: v3: Q's / K's pass at head_dim 256 with 8 chunks of a token per thread (``PassConfig.wide``): 2 lanes per token
#: instead of 4, so the Hadamard has one cross-lane stage (shfl.bfly + FMA) instead of two: half the shuffles per block
#: (1024 warp shuffles instead of 2048, the MIO queue ncu found saturated: mio_throttle 1.7-2.1 per issue), half the
#: threads (256, 8 warps: one CTA per SM as before), up to 255 registers (0 spills, K and Q). Same pairs, stage order
#: and roundings, the LSE shift summed in the default's order: outputs bit for bit the narrow pass's. On since the
#: H200 run of session 12 (quantbw, default recipe, wide / narrow gpu time (graph): D 256 0.868 (0.879), back to
#: back K 46.2 -> 36.9 us, Q 52.5 -> 40.8 us; D 64 / 128 / GQA run the same passes: 1.004 / 1.006 / 0.988; every row
#: equal to the torch recipe; session 12's GPU tests bit for bit, racecheck clean); FA_VARIANTS_FP8_QUANT_WIDE=0 (read
#: at import) turns it off
V3_WIDE = _env.flag("FA_VARIANTS_FP8_QUANT_WIDE", True)
#: v3: Q's / K's pass at head_dim 128 with a token's 128 channels in one thread (``PassConfig.wide`` at 128, one lane
#: per token): the Hadamard has no cross-lane stage at all (no ``shfl.bfly`` of values: 1024 warp shuffles fewer per
#: K block), the per-thread work of a block (item decode, refill addresses, block max, descale) is shared by twice the
#: values, 8 warps per SM (K: one 256-thread CTA, Q: two 128-thread CTAs) at up to 255 registers; its e4m3 bytes go
#: through the stage (``staged_store_for``: a thread's own 16-byte stores would half-fill each 32-byte sector, as at
#: head_dim 64). Same pairs, stage order and roundings, the LSE shift summed in the default's order: outputs bit for
#: bit the default's. "k" by default: K's pass only, Q's as before (session 16's quantk run, H200, D 128, the second:
#: K 36.9 -> 29.4 us, Q 39.1 -> 39.3 us, the whole call 0.979 by gpu ms and 0.970 by CUDA graph, flip rule <= 0.98 by
#: both met; session 14's first run: K 33.8 -> 30.9 us, 0.985 / 0.978). Both passes (Q's wide form spills 40 bytes)
#: missed in session 14's quantocc run. FA_VARIANTS_FP8_QUANT_WIDE128 (read at import): 0 off, 1 both passes, k K's
#: pass only (the default)
V3_WIDE128: bool | str = _env.flag_or("FA_VARIANTS_FP8_QUANT_WIDE128", "k", ("k",))
#: the passes' non-finite rule (``PassConfig.nonfinite``, every pipeline and pass kind: Q, K, V, wide, staged store,
#: the per-head / per-tensor baselines' "amax" and "given" launches): a block whose max is inf or NaN (the max lets a
#: NaN win under the switch; Q / K: also from 2^125 / head_dim, Q / K then rotated again with the recipe's overflow
#: shift, sessions 35-36) takes its descale from its finite values and stores each inf as e4m3 NaN, as the torch recipe
#: (``quantize._amax_blocks`` / ``_to_e4m3``), so the rows that read it come out non-finite instead of a finite wrong
#: answer (an inf saturated to 448, the block's finite values quantised to 0); one uniform test per block, the slow
#: path only behind it. Finite inputs: outputs bit for bit as without it. On since session 14 for correctness, though
#: its pre-registered cost rule (<= 1.01) missed: H200, default recipe, B*N 16k, H*D 2048 (scripts/quantinf_gpu.sh):
#: the pass 1.028 / 1.015 / 1.016x by GPU time at head_dim 64 / 128 / 256 (graph 1.022 / 1.021 / 1.063), i.e. 2-8 us
#: of a call whose kernel alone takes ~0.4-3.5 ms at N 4k-16k; off, an inf gives a finite wrong O. Proof with it on:
#: tests/test_fp8_quant_kernel.py 289 passed, tests/test_fp8_quant_nonfinite.py 11 passed (GPU). Session 36 (H200,
#: with the overflow shift): the pass 1.112 / 1.015 / 1.057x of the switch off (bench/NOTES.md, "Session 36").
#: FA_VARIANTS_FP8_QUANT_NONFINITE=0 (read at import) turns it off
NONFINITE = _env.flag("FA_VARIANTS_FP8_QUANT_NONFINITE", True)
#: with NONFINITE, the slow path after each CTA's loop instead of inside it (``PassConfig.deferred``, ``redo_left``;
#: session 36): a block for it is left unstored and redone from global memory after the CTA's loop (the same
#: outputs). Why: the slow path inside the loop cost the pass 1.112 / 1.015 / 1.057x of NONFINITE off at
#: head_dim 64 / 128 / 256 (H200, session 36), its registers and spills moving with the slow code (sm_90a, D 64: Q
#: 16 bytes of spill); after the loop the loop's SASS is within -12 / +47 instructions of the switch-off one's, no
#: spill at the default recipe's head_dims. On since session 37 (H100, bench/NOTES.md "Session 37": the tests passed;
#: deferred / in the loop 0.984 / 0.991 / 0.986 at head_dim 64 / 128 / 256, deferred / switch off 1.070 / 0.998 /
#: 1.005); FA_VARIANTS_FP8_QUANT_DEFERRED=0 (read at import) puts the slow path back in the loop
NONFINITE_DEFERRED = _env.flag("FA_VARIANTS_FP8_QUANT_DEFERRED", True)
#: Q's pass: the LSE shift's products summed in this many interleaved chains (``PassConfig.shift_chains``, one of
#: ``quant_config.SHIFT_CHAIN_COUNTS``) instead of one serial chain of 64 dependent FMAs per thread (session 21's
#: ncu of Q's pass at head_dim 128: the shift costs it 8 us, its wide form stalls on fixed-latency dependencies;
#: bench/NOTES.md "Session 21"). 1 (the default until an H200 A/B says otherwise) keeps the default's order and SASS
SHIFT_CHAINS = 1
#: per-kind launch plans (``launch_plan``): the compiled pass and grid of each launch of ``quantize_tensor`` cached per
#: (device, dtype, shape, block, switches) instead of worked out per call (the stage count for the device, a
#: ``PassConfig``, the compiled-pass lookup): the same launches with the same arguments, less host work per call (an
#: eager call is host-bound: ~0.2 ms of host per call against 0.07-0.15 ms of GPU, session 12). On since the H200 run
#: of session 12 (quantbw, "defp", D 256 default recipe: host ms per call 0.338 -> 0.246, gpu time
#: 1.003 (graph 1.000), outputs equal to the torch recipe); FA_VARIANTS_FP8_QUANT_PLANS=0 (read at import) turns it off
QUANT_PLANS = _env.flag("FA_VARIANTS_FP8_QUANT_PLANS", True)
_PLANS: dict[tuple, tuple] = {}
#: whole-call plans (``fp8.quant_call``): pipeline v3 with block scales (exact or no K mean) replays a per-(shapes,
#: strides, dtypes, devices, recipe, softmax_scale, pipeline, switches) plan: no ``_check``, device context,
#: ``interop.aligned``, ``quantize_tensor`` defaults or ``launch_plan`` key per call; the same launches with the same
#: arguments (outputs bit for bit; CPU: test_call_plans_same_launches). On since the H200 run of session 13
#: (quantbw2, "defc" vs "def", default recipe: host ms per call 0.239 / 0.161 / 0.166 -> 0.141 / 0.101 / 0.105 at
#: head_dim 64 / 128 / 256, GPU time 0.994-1.007, CUDA graph 1.000-1.016, outputs equal to the torch recipe);
#: FA_VARIANTS_FP8_QUANT_CALL_PLANS=0 (read at import) turns it off
QUANT_CALL_PLANS = _env.flag("FA_VARIANTS_FP8_QUANT_CALL_PLANS", True)
#: tests only: at most this many CTAs per launch (None: the persistent grid), so that small inputs give a CTA many
#: work items (``late_count``'s rounds: more K blocks per CTA than threads; several heads finished by one CTA)
GRID_CAP: int | None = None


def _wide128(tensor: str) -> bool:
    """Whether ``V3_WIDE128`` takes this tensor's pass ("q" or "k"): True both, "k" K's only."""
    if tensor not in ("q", "k"):
        raise ValueError(f"fp8-quant: tensor must be 'q' or 'k', got {one_line(tensor)}")
    return V3_WIDE128 is True or (V3_WIDE128 == "k" and tensor == "k")


def staged_store_for(head_dim: int, tensor: str) -> bool:
    """Whether v3 stores this tensor's ("q" or "k") e4m3 through shared memory at this head_dim
    (``V3_STAGED_STORE``; None: at head_dim 64, and at 128 where ``V3_WIDE128`` takes the pass: where a thread's own
    16-byte stores half-fill each 32-byte sector)."""
    wide128 = _wide128(tensor)
    if V3_STAGED_STORE is None:
        return head_dim == 64 or (head_dim == 128 and wide128)
    return bool(V3_STAGED_STORE)


def wide_for(head_dim: int, tensor: str) -> bool:
    """Whether v3's pass of this tensor ("q" or "k") holds 8 chunks of a token per thread at this head_dim
    (``PassConfig.wide``): ``V3_WIDE`` at 256, ``V3_WIDE128`` at 128 (True: both passes, "k": K's only)."""
    return (V3_WIDE and head_dim == 256) or (head_dim == 128 and _wide128(tensor))


def qk_layout(head_dim: int, tensor: str, coalesced: bool) -> dict:
    """The v3 layout switches of this tensor's ("q" or "k") pass, as ``quantize_tensor`` takes them: staged_store
    (``staged_store_for``, with the coalesced stage it rides on) and wide (``wide_for``); one rule for ``_quantize``
    and ``quant_call.CallPlan``."""
    return dict(staged_store=staged_store_for(head_dim, tensor) and coalesced, wide=wide_for(head_dim, tensor))


def why_not(q: torch.Tensor, config: FP8Config) -> str | None:
    """Why the GPU pass cannot quantise these inputs (None if it can)."""
    if not q.is_cuda:
        return f"the GPU quantisation pass needs CUDA tensors; the inputs are on {q.device.type}"
    if q.dtype not in DTYPES:
        return f"the GPU quantisation pass takes float16 / bfloat16, got {q.dtype}"
    D = q.shape[-1]
    if D not in HEAD_DIMS:
        return f"the GPU quantisation pass is built for head_dim {HEAD_DIMS}, not {D}"
    if max(tiles_for(D)) * D > MAX_BLOCK:
        return (f"the GPU quantisation pass holds a scale block in one CTA's registers: {max(tiles_for(D))} rows "
                f"x head_dim {D} > {MAX_BLOCK} values")
    arch = interop.arch_of_capability(*torch.cuda.get_device_capability(q.device))
    if arch not in VARIANT.archs:  # sm_89 / sm_90a: the e4m3 conversion, and the archs it is tuned for
        return f"the GPU quantisation pass is built for {', '.join(VARIANT.archs)}, not {arch}"
    return None


# per process: (device, dtype, head_dim, PassConfig) -> (compiled function, CTAs per launch at most)
_PASSES: dict[tuple, tuple] = {}
# per process: (device, head_dim, seed, negate) -> float32 signs on the device; (device, head_dim) -> zeros
# (``workspace.persistent``: never in a torch.compile CUDA graph's pool)
_CONSTANTS: dict[tuple, torch.Tensor] = {}


def _pass(device: torch.device, dtype: torch.dtype, head_dim: int, cfg: PassConfig) -> tuple:
    key = (device, dtype, head_dim, cfg)
    hit = _PASSES.get(key)
    if hit is None:
        fn = VARIANT.compiled(static_config(interop.device_arch(device), dtype, head_dim, cfg)).fn
        props = torch.cuda.get_device_properties(device)
        per_sm = cfg.ctas_per_sm(head_dim)
        smem_sm = getattr(props, "shared_memory_per_multiprocessor", 0)
        if smem_sm:
            per_sm = max(1, min(per_sm, (smem_sm - 1024) // (cfg.smem_bytes(head_dim) + 1024)))
        hit = _PASSES[key] = (fn, props.multi_processor_count * per_sm)
    return hit


def _capability(device: torch.device) -> tuple[int, int]:
    """The device's compute capability (``planned_passes`` answers it for an arch instead)."""
    return torch.cuda.get_device_capability(device)


def stages_for(device: torch.device, head_dim: int, rows: int, want: int) -> int:
    """The most stages <= want whose shared memory one CTA may use on this device (sm_90: 227 KB; sm_89:
    99 KB), at least 1."""
    limit = SMEM_PER_CTA if _capability(device) >= (9, 0) else 99 * 1024
    for s in range(want, 0, -1):
        if PassConfig(rows=rows, stages=s).smem_bytes(head_dim) <= limit:
            return s
    return 1


def own_mean(pipeline: str | None) -> bool:
    """Whether the pipeline sums K's mean itself (v2, v3: ``k_mean_from_parts``) rather than taking torch's."""
    return pipeline_of(pipeline) in ("v2", "v3")


def pipeline_of(pipeline: str | None) -> str:
    """The pipeline to use: ``pipeline``, else $FA_VARIANTS_FP8_QUANT_PIPELINE, else DEFAULT_PIPELINE (ValueError
    naming the argument or the variable for an unknown name)."""
    if pipeline is None:
        return _env.choice("FA_VARIANTS_FP8_QUANT_PIPELINE", DEFAULT_PIPELINE, PIPELINES)
    if pipeline not in PIPELINES:
        raise ValueError(f"pipeline must be one of {PIPELINES}, got {one_line(pipeline)}")
    return pipeline


def _signs(device: torch.device, head_dim: int, seed: int | None, negate: bool) -> torch.Tensor:
    """The rotation's random signs (seed) or ones (seed None), negated for a negative softmax_scale, on the
    device; made once per process (no host-to-device copy per call)."""
    key = (device, head_dim, seed, negate)
    hit = _CONSTANTS.get(key)
    if hit is None:
        s = HadamardRotation(head_dim, seed).signs if seed is not None else torch.ones(head_dim, device="cpu")
        hit = _CONSTANTS[key] = workspace.persistent(
            device, lambda: (-s if negate else s).to(device, torch.float32).contiguous())
    return hit


def _zeros(device: torch.device, shape: tuple, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """A zeros tensor standing in for an unused argument (made once per process)."""
    key = (device, shape, dtype)
    hit = _CONSTANTS.get(key)
    if hit is None:
        hit = _CONSTANTS[key] = workspace.persistent(device, lambda: torch.zeros(shape, device=device, dtype=dtype))
    return hit


def quantize_tensor(x: torch.Tensor, *, role: str, block: int, granularity: str, signs: torch.Tensor | None,
                    mean: torch.Tensor | None, rotate: bool, shift: torch.Tensor | None = None,
                    shift_mean: torch.Tensor | None = None, shift_scale: float = 0.0, stages: int = 1,
                    reverse: bool = False, k_of: torch.Tensor | None = None,
                    k_parts: torch.Tensor | None = None, pdl: bool = False, coalesced: bool = False,
                    head_major: bool = False, k_count: torch.Tensor | None = None,
                    k_mean_out: torch.Tensor | None = None, staged_mean: bool = False,
                    k_sample_tokens: int | None = None, staged_store: bool = False,
                    late_count: bool = False, wide: bool = False,
                    prepared: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """One tensor through the pass: (e4m3 data (like x, or v_t for role "v"), descale (B, H, T) float32).

    x: (B, N, H, D) float16 / bfloat16 CUDA; block: rows per scale block; signs: float32 (D,) on x's device
    (None: ones); mean: float32 (B, H, D) subtracted before the signs (None: no smoothing); shift: float32
    (B, H, N) written with shift_scale * x . shift_mean (shift_mean float32 (B, H_kv, D), H % H_kv == 0).
    stages: blocks of loads in flight per CTA; reverse: walk the blocks last to first. k_of, k_parts (role
    "v"): K (like x) and float32 (B, H, T * k_parts_per_block(block), D), written with K's per-channel sums over
    each block's tokens (``QuantPass.k_partial_sums``) in the same launch. pdl (sm_90): programmatic
    dependent launch; x (and k_of) must then have been ready before the previous kernel on the stream began
    (``PassConfig.pdl``'s prologue reads them before griddepcontrol.wait). coalesced, head_major: the
    ``PassConfig`` switches of pipeline v3 (coalesced needs 2 stages: off where the device's shared memory
    holds only one). k_count, k_mean_out (with k_of): int32 (B * H,) zeros, left zero (``workspace``
    counters), and float32 (B, H, D): K's mean finished in the same launch (``PassConfig.fused_mean``).
    staged_mean: K's mean (smoothing or the shift) cp.async'd with each block's stage (``PassConfig.staged_mean``;
    with coalesced only, ignored otherwise). k_sample_tokens (with k_of, not the fused mean): K's sums over
    ``quantize.k_sample_tiles`` only, m = k_parts.shape[2] / k_parts_per_block(block) tiles, covering this many tokens
    (``PassConfig.k_sample``; m * cdiv(N, block) < 2^31). staged_store (role "qk", with coalesced): the e4m3 bytes
    stored through the stage just read (``PassConfig.staged_store``; not in mode "amax"). late_count (with k_count):
    the fused mean's K blocks counted after each CTA's loop
    (``PassConfig.late_count``; the same mean bit for bit). wide (role "qk", rotate, coalesced, head_dim 128, or 256
    without the staged store; ignored otherwise): 8 chunks of a token per thread (``PassConfig.wide``; bit for bit).
    prepared (``quantize``'s calls): x and k_of are already ``interop.aligned`` and x's device is the current one, so
    neither is done again (the same launches with the same arguments, less host work per call)."""
    B, N, H, D = x.shape
    T_blocks = -(-N // block)
    if not prepared:
        x = interop.aligned(x)
    dev = x.device
    if role == "qk":
        y = torch.empty(B, N, H, D, dtype=E4M3, device=dev)
    else:
        y = torch.empty(B, H, D, layout.padded_seqlen_k(N), dtype=E4M3, device=dev)
    descale = torch.empty(B, H, T_blocks, dtype=torch.float32, device=dev)
    if B * N * H == 0:
        if k_parts is not None:
            k_parts.zero_()
        return y.zero_(), descale
    signs = _signs(dev, D, None, False) if signs is None else signs
    mean_t = mean if mean is not None else shift_mean if shift is not None else _zeros(dev, (1, 1, D))
    mean_t = mean_t.contiguous()
    shift_t = _zeros(dev, (1, 1, 1)) if shift is None else shift
    k_t = x if k_of is None else k_of if prepared else interop.aligned(k_of)
    parts_t = _zeros(dev, (1, 1, 1, D)) if k_parts is None else k_parts
    fused = k_of is not None and k_count is not None
    count_t = k_count if fused else _zeros(dev, (1,), torch.int32)
    if fused:
        mean_t = k_mean_out
    if k_of is not None:  # the kernel's scale argument: float32(1 / tokens summed) for K's partial sums
        shift_scale = 1.0 / (N if k_sample_tokens is None else k_sample_tokens)
    total = B * H * T_blocks
    k_items = total if k_sample_tokens is None else B * H * (k_parts.shape[2] // k_parts_per_block(block))
    plan = launch_plan(dev, x.dtype, D, granularity != "block", total, k_items, role=role, rotate=rotate,
                       smooth=mean is not None, shift=shift is not None, block=block, stages=stages,
                       kmean=k_of is not None, reverse=reverse, pdl=pdl, coalesced=coalesced, head_major=head_major,
                       fused=fused, staged_mean=staged_mean, k_sample=k_sample_tokens is not None,
                       staged_store=staged_store, late_count=late_count, wide=wide)
    args = (x, y, descale, signs, mean_t, shift_t, k_t, parts_t, count_t, shift_scale)
    with contextlib.nullcontext() if prepared or dev.type != "cuda" else torch.cuda.device(dev):
        if granularity == "block":
            fn, grid = plan[0]
            fn(*args, grid)
        else:  # baselines: the blocks' amaxes (and the shift), reduced by torch, then the pass with that descale
            from fa_variants.fp8.quantize import _reduce_amax, descale_from_amax

            (fn, grid), (fn_given, grid_given) = plan
            fn(*args, grid)
            descale.copy_(descale_from_amax(_reduce_amax(descale, granularity))[0])
            fn_given(*args, grid_given)
    return y, descale


def launch_plan(dev: torch.device, dtype: torch.dtype, head_dim: int, two_launches: bool, total: int, k_items: int,
                **kind) -> tuple:
    """((compiled pass, grid), ...) of ``quantize_tensor``'s launches: one (mode "block"), or two (``two_launches``:
    "amax" then "given"), for ``total`` work items (+ ``k_items`` K items with ``kind["kmean"]``) and ``kind``:
    ``quantize_tensor``'s switches as booleans (role, rotate, smooth, shift, block, stages, kmean, reverse, pdl,
    coalesced, head_major, fused, staged_mean, k_sample, staged_store, late_count, wide). With ``QUANT_PLANS`` cached
    per (device, dtype, head_dim, two_launches, total, k_items, GRID_CAP, NONFINITE, NONFINITE_DEFERRED,
    SHIFT_CHAINS, kind); the same result either way."""
    if not QUANT_PLANS:
        return _launch_plan(dev, dtype, head_dim, two_launches, total, k_items, kind)
    key = (dev, dtype, head_dim, two_launches, total, k_items, GRID_CAP, NONFINITE, NONFINITE_DEFERRED, SHIFT_CHAINS,
           *kind.items())
    hit = _PLANS.get(key)
    if hit is None:
        hit = _PLANS[key] = _launch_plan(dev, dtype, head_dim, two_launches, total, k_items, kind)
    return hit


def _launch_plan(dev: torch.device, dtype: torch.dtype, D: int, two_launches: bool, total: int, k_items: int,
                 kind: dict) -> tuple:
    """``launch_plan`` worked out: the device's stage count, each launch's ``PassConfig``, compiled pass and grid."""
    stages = stages_for(dev, D, kind["block"], kind["stages"]) if kind["stages"] > 1 else 1
    coalesced = kind["coalesced"] and stages >= 2
    role, block, fused, smooth = kind["role"], kind["block"], kind["fused"], kind["smooth"]
    out = []
    for mode in ("amax", "given") if two_launches else ("block",):
        kmean = kind["kmean"] and mode != "given"
        with_shift = kind["shift"] and mode != "given"
        staged_store = kind["staged_store"] and coalesced and role == "qk" and mode != "amax" and block % 32 == 0
        cfg = PassConfig(role=role, rotate=kind["rotate"], smooth=smooth, mode=mode, rows=block, shift=with_shift,
                         stages=stages, kmean=kmean, reverse=kind["reverse"], pdl=kind["pdl"], coalesced=coalesced,
                         head_major=kind["head_major"], fused_mean=fused and kmean,
                         staged_mean=kind["staged_mean"] and coalesced and (smooth or with_shift),
                         k_sample=kmean and kind["k_sample"], staged_store=staged_store,
                         late_count=kind["late_count"] and fused and kmean,
                         wide=kind["wide"] and role == "qk" and kind["rotate"] and coalesced
                         and (D == 128 or (D == 256 and not (kind["staged_store"] and mode != "amax"
                                                             and block % 32 == 0))),
                         nonfinite=NONFINITE, shift_chains=SHIFT_CHAINS if with_shift else 1,
                         deferred=NONFINITE and NONFINITE_DEFERRED)
        fn, ctas = _pass(dev, dtype, D, cfg)
        out.append((fn, min(ctas, total + (k_items if kmean else 0), GRID_CAP or ctas)))
    return tuple(out)


def _fused_scratch(device: torch.device, B: int, Hkv: int, P: int, D: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K's partial sums (B, Hkv, P, D) float32 and the (B * Hkv,) int32 counters of the fused mean, from the
    per-(device, stream) scratch of ``common.workspace`` (counters zero and left zero by the kernel; the partials
    are consumed inside the launch, so the stream's next user may reuse them)."""
    n_parts, n_count = B * Hkv * P * D, B * Hkv

    def make(partials, counters):
        return partials[:n_parts].view(B, Hkv, P, D), counters[:n_count]

    return workspace.views(device, n_parts, n_count, ("fp8-quant-kmean", B, Hkv, P, D), make)


def k_mean_from_parts(parts: torch.Tensor, seqlen_k: int) -> torch.Tensor:
    """K's mean (B, H_kv, D) float32 from the pass's partial sums (B, H_kv, P, D), each already divided by
    seqlen_k: their float32 sum over P (one torch reduction, deterministic); zeros for seqlen_k = 0."""
    if seqlen_k == 0:
        return torch.zeros(parts.shape[0], parts.shape[1], parts.shape[3], device=parts.device)
    return parts.sum(dim=2)


def quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, config: FP8Config = FP8Config(),
             softmax_scale: float | None = None, pipeline: str | None = None) -> FP8Inputs:
    """``quantize_fp8`` on the GPU (16-bit CUDA inputs, head_dim in HEAD_DIMS): the same FP8Inputs as
    ``quantize_fp8_torch``, bit for bit on the e4m3 bytes and descales (same operations in the same order);
    ``lse_shift`` is computed in the Q pass (float32, its own summation order: equal to torch's to rounding).

    pipeline (``pipeline_of``): "v1" takes K's mean from torch (``quantize.k_mean``), so every output equals
    ``quantize_fp8_torch``'s; "v2" and "v3" sum K in V's launch (``k_mean_from_parts``: another float32
    summation order, equal to ``k_mean`` to rounding), and their outputs equal ``quantize_fp8_torch(...,
    k_mean=that mean)``'s bit for bit (``FP8Inputs.k_mean`` holds it). v3 changes only which thread loads
    which bytes and the order of the blocks, not the arithmetic: its outputs equal v2's. With ``QUANT_CALL_PLANS``
    a repeated call runs its cached plan (``fp8.quant_call``: the same launches)."""
    if QUANT_CALL_PLANS:
        out = quant_call.quantize_planned(q, k, v, config, softmax_scale, pipeline)
        if out is not None:
            return out
    scale = _check(q, k, v, config, softmax_scale)
    pipe = pipeline_of(pipeline)
    with torch.cuda.device(q.device):  # one device context for the call's launches (``quantize_tensor``'s prepared)
        return _quantize(q, k, v, config, scale, pipe)


def _quantize(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: FP8Config, scale: float,
              pipe: str) -> FP8Inputs:
    """``quantize`` after its checks, with q's device current: v2 / v3 align q, k, v once and run their passes
    ``prepared``; v1 aligns in each pass as before."""
    D, dev = q.shape[-1], q.device
    tile_m, tile_n = tiles_for(D)
    seed = config.seed if config.rotate else None
    signs = _signs(dev, D, seed, False)
    k_signs = _signs(dev, D, seed, scale < 0)  # softmax(c Q K^T) = softmax(|c| Q (-K)^T)
    staged = pipe in ("v2", "v3")  # v3 = v2 + coalesced loads + head-major order
    common = dict(granularity=config.granularity, stages=V2_STAGES if staged else 1, prepared=staged)
    if pipe == "v3":
        common.update(coalesced=V3_COALESCED, head_major=V3_HEAD_MAJOR)
        smooth_common = dict(common, staged_mean=V3_STAGED_MEAN and V3_COALESCED)  # it rides on coalesced stages
        k_common, q_common = (dict(smooth_common, **qk_layout(D, t, V3_COALESCED)) for t in ("k", "q"))
    else:
        smooth_common = k_common = q_common = common
    # v2 launches V's pass first (plain launch), then K's and Q's with programmatic dependent launch, whose
    # prologue loads run before griddepcontrol.wait: so every 16-bit input is made aligned (a copy if
    # needed) before the first launch
    pdl = staged and V2_PDL and D <= V2_PDL_MAX_HEAD_DIM and _capability(dev) >= (9, 0)
    if staged:
        q, k, v = interop.aligned(q), interop.aligned(k), interop.aligned(v)
    mean = mean_eff = shift = None
    v_t = None
    if config.smooth_k:
        B, Nk, Hkv, _ = k.shape
        n_tiles = -(-Nk // tile_n)
        tiles = k_sample_tiles(Nk, tile_n, config.smooth_k_blocks)
        sampled = len(tiles) < n_tiles  # the mean over some of K's tiles (FP8Config.smooth_k_blocks)
        # v2 / v3 sum K's mean in V's launch, but for a sample too large for the kernel's int32 tile arithmetic
        own = staged and not (sampled and len(tiles) * n_tiles >= 2**31)
        if own and sampled:  # V's launch also sums K's sample tiles (m / T of one read of K)
            P = len(tiles) * k_parts_per_block(tile_n)
            sample = dict(k_sample_tokens=k_sample_count(Nk, tile_n, config.smooth_k_blocks))
            if pipe == "v3" and (V3_FUSED_MEAN or V3_FUSED_SAMPLED_MEAN or V3_FUSED_MEAN_LATE):  # ... and finishes it
                parts, counters = _fused_scratch(dev, B, Hkv, P, D)
                mean = torch.empty(B, Hkv, D, dtype=torch.float32, device=dev)
                v_t, vd = quantize_tensor(v, role="v", block=tile_n, signs=None, mean=None, rotate=False, k_of=k,
                                          k_parts=parts, k_count=counters, k_mean_out=mean, **common, **sample,
                                          late_count=V3_FUSED_MEAN_LATE)
                if B * Hkv == 0:
                    mean.zero_()
            else:
                parts = torch.empty(B, Hkv, P, D, dtype=torch.float32, device=dev)
                v_t, vd = quantize_tensor(v, role="v", block=tile_n, signs=None, mean=None, rotate=False, k_of=k,
                                          k_parts=parts, **common, **sample)
                mean = k_mean_from_parts(parts, Nk)
        elif own:  # V's launch also sums K per block; K's launch then reads K last block first (L2)
            P = n_tiles * k_parts_per_block(tile_n)
            if pipe == "v3" and (V3_FUSED_MEAN or V3_FUSED_MEAN_LATE):  # the mean finished in V's launch (workspace)
                parts, counters = _fused_scratch(dev, B, Hkv, P, D)
                mean = torch.empty(B, Hkv, D, dtype=torch.float32, device=dev)
                v_t, vd = quantize_tensor(v, role="v", block=tile_n, signs=None, mean=None, rotate=False, k_of=k,
                                          k_parts=parts, k_count=counters, k_mean_out=mean, **common,
                                          late_count=V3_FUSED_MEAN_LATE)
                if Nk == 0 or B * Hkv == 0:
                    mean.zero_()
            else:
                parts = torch.empty(B, Hkv, P, D, dtype=torch.float32, device=dev)
                v_t, vd = quantize_tensor(v, role="v", block=tile_n, signs=None, mean=None, rotate=False, k_of=k,
                                          k_parts=parts, **common)
                mean = k_mean_from_parts(parts, Nk)
        else:  # subtracted from K before its signs (-s for a negative scale)
            mean = k_mean(k, config.smooth_k_blocks, tile_n)
        mean_eff = -mean if scale < 0 else mean  # the mean of the K the kernel sees, unrotated (-mean for a negative scale)
        shift = torch.empty(q.shape[0], q.shape[2], q.shape[1], dtype=torch.float32, device=dev)
    if v_t is None:
        v_t, vd = quantize_tensor(v, role="v", block=tile_n, signs=None, mean=None, rotate=False, **common)
    k8, kd = quantize_tensor(k, role="qk", block=tile_n, signs=k_signs, mean=mean, rotate=config.rotate,
                             reverse=staged and V2_REVERSE and config.smooth_k, pdl=pdl, **k_common)
    q8, qd = quantize_tensor(q, role="qk", block=tile_m, signs=signs, mean=None, rotate=config.rotate, shift=shift,
                             shift_mean=mean_eff, shift_scale=abs(scale), pdl=pdl, **q_common)
    if shift is not None and q.shape[0] * q.shape[1] * q.shape[2] == 0:
        shift.zero_()
    return FP8Inputs(q8, k8, v_t, qd, kd, vd, abs(scale), k.shape[1], mean_eff, shift, config)


def planned_passes(arch: str, dtype: torch.dtype, head_dim: int, config: FP8Config = FP8Config(), *,
                   pipeline: str | None = None, groups: tuple[int, ...] = (1,)) -> list:
    """The compile keys (``quant_kernel.static_config``) of the passes ``quantize(q, k, v, config=config,
    pipeline=pipeline)`` launches on a GPU of ``arch`` ("sm_89", "sm_90a") for float16 / bfloat16 inputs of this
    head_dim with ``groups`` query heads per KV head, in first-launch order, without a GPU and without compiling
    (what ``fa-variants warmup`` compiles for fa3-fp8): ``_quantize`` itself runs on small CPU tensors, the device's
    compute capability answered from arch, each pass recorded instead of compiled and launched (outputs discarded),
    ``QUANT_PLANS`` off meanwhile (no plan keeps the recorder). Batch, lengths and heads are runtime values but for
    a sampled K mean (``FP8Config.smooth_k_blocks``), which launches otherwise when K has more tiles than the sample:
    both lengths are run (not the torch mean of a sample beyond the pass's int32 tile arithmetic). The switches
    (module globals, FA_VARIANTS_FP8_QUANT_*) are this process's: warm up with the environment of the runs. Swaps
    module globals for the duration: not while another thread quantises. ValueError (registry's
    UnsupportedConfigError) for an arch, dtype or head_dim the pass is not built for."""
    static_config(arch, dtype, head_dim, PassConfig())  # the arch / dtype / head_dim checks
    capability = interop.capability_of_arch(arch)
    keys: dict = {}

    def record(device, dt, d, cfg):
        keys[static_config(arch, dt, d, cfg)] = None
        return (lambda *args: None), 1

    tile_n = tiles_for(head_dim)[1]
    lengths = [tile_n + 3]
    if config.smooth_k and config.smooth_k_blocks is not None:  # more tiles than the sample: its own launch
        lengths.append((config.smooth_k_blocks + 1) * tile_n + 3)
    pipe = pipeline_of(pipeline)
    names = ("_pass", "_capability", "QUANT_PLANS", "_CONSTANTS")
    saved = {name: globals()[name] for name in names}
    globals().update(_pass=record, _capability=lambda device: capability, QUANT_PLANS=False, _CONSTANTS={})
    try:
        for group in groups:
            for seqlen_k in lengths:
                q = torch.zeros(1, 5, group, head_dim, dtype=dtype)
                k = torch.zeros(1, seqlen_k, 1, head_dim, dtype=dtype)
                for softmax_scale in (None, -0.5):
                    scale = _check(q, k, k, config, softmax_scale)
                    _quantize(q, k, k.clone(), config, scale, pipe)
    finally:
        globals().update(saved)
    return list(keys)


from fa_variants.fp8 import quant_call  # noqa: E402 - it reads this module's switches (import cycle)
