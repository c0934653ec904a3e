"""Cached call plans of the FP8 quantisation pass (``quant_host.QUANT_CALL_PLANS``): the host side of one
``quant_host.quantize`` call of pipeline v3 with block scales worked out once per (shapes, strides, dtypes,
devices, recipe, softmax_scale, pipeline, switches) and replayed: per call only the pointer alignment check, the
outputs' allocations, the three launches with their prepared arguments (and torch's sum of K's partials unless the
fused mean is on). The same launches with the same arguments as ``quant_host._quantize`` (tests: the recorded
launches of both paths equal): the outputs are bit for bit the uncached path's.

Why: an eager call is host-bound (session 12, H200: 0.25-0.34 ms of host per call against 0.07-0.15 ms of GPU):
``_check``, the device context, ``interop.aligned``, ``quantize_tensor``'s argument defaults, ``launch_plan``'s key
(17 switches) and ``PassConfig`` work are per-call Python that this plan does once.

Not planned (``plan_for`` answers None, the caller runs the uncached path): another pipeline, per-head / per-tensor
scales (torch reduces the amaxes between two launches), a sampled K mean, an empty tensor, inputs that are not plain
CUDA ``torch.Tensor`` with 16-byte aligned strides, a softmax_scale that is not a Python float / int or None. A call
whose pointers are not 16-byte aligned, or whose device is not the current one, runs the uncached path too."""
from __future__ import annotations

import torch

from fa_variants.common import interop
from fa_variants.fp8 import layout
from fa_variants.fp8 import quant_host as qh
from fa_variants.fp8.quant_maps import k_parts_per_block
from fa_variants.fp8.quantize import E4M3, FP8Config, FP8Inputs, _check, k_sample_tiles, tiles_for

__all__ = ["CallPlan", "plan_for", "quantize_planned", "MAX_PLANS"]

#: at most this many call plans per process (the cache is emptied when full: shapes of a serving loop repeat)
MAX_PLANS = 256
_CALLS: dict[tuple, "CallPlan | None"] = {}
_SCALAR_TYPES = (type(None), float, int)


def _switches() -> tuple:
    """The module switches of ``quant_host`` a v3 call's launches depend on (part of a plan's key)."""
    return (qh.V2_STAGES, qh.V2_PDL, qh.V2_PDL_MAX_HEAD_DIM, qh.V2_REVERSE, qh.V3_COALESCED, qh.V3_HEAD_MAJOR,
            qh.V3_FUSED_MEAN, qh.V3_FUSED_MEAN_LATE, qh.V3_STAGED_MEAN, qh.V3_STAGED_STORE, qh.V3_WIDE, qh.V3_WIDE128,
            qh.SHIFT_CHAINS, qh.GRID_CAP, qh.NONFINITE, qh.NONFINITE_DEFERRED)


class CallPlan:
    """One planned call: the three launches' compiled passes and grids, the constants they read, the outputs'
    shapes. ``run(q, k, v)``: ``quant_host.quantize``'s FP8Inputs for inputs of the planned geometry (16-byte
    aligned pointers, the plan's device current)."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, config: FP8Config, scale: float) -> None:
        B, Nq, H, D = q.shape
        _, Nk, Hkv, _ = k.shape
        dev = self.dev = q.device
        tile_m, tile_n = tiles_for(D)
        self.config, self.block_n, self.seqlen_k = config, tile_n, Nk
        self.scale, self.negate = abs(scale), scale < 0
        seed = config.seed if config.rotate else None
        self.signs, self.k_signs = qh._signs(dev, D, seed, False), qh._signs(dev, D, seed, scale < 0)
        self.ones = qh._signs(dev, D, None, False)
        self.z_mean, self.z_shift = qh._zeros(dev, (1, 1, D)), qh._zeros(dev, (1, 1, 1))
        self.z_parts, self.z_count = qh._zeros(dev, (1, 1, 1, D)), qh._zeros(dev, (1,), torch.int32)
        self.shapes = ((B, Nq, H, D), (B, H, -(-Nq // tile_m)), (B, Nk, Hkv, D), (B, Hkv, -(-Nk // tile_n)),
                       (B, Hkv, D, layout.padded_seqlen_k(Nk)))
        self.smooth, self.fused = config.smooth_k, config.smooth_k and (qh.V3_FUSED_MEAN or qh.V3_FUSED_MEAN_LATE)
        self.parts_shape = (B, Hkv, -(-Nk // tile_n) * k_parts_per_block(tile_n), D)
        self.shift_shape = (B, H, Nq)
        self.inv_n = 1.0 / Nk
        coalesced, head_major = qh.V3_COALESCED, qh.V3_HEAD_MAJOR
        pdl = qh.V2_PDL and D <= qh.V2_PDL_MAX_HEAD_DIM and qh._capability(dev) >= (9, 0)
        common = dict(block=0, stages=qh.V2_STAGES, reverse=False, pdl=False, coalesced=coalesced,
                      head_major=head_major, fused=False, staged_mean=False, k_sample=False, staged_store=False,
                      late_count=False, wide=False)
        v_items = B * Hkv * -(-Nk // tile_n)
        self.v_launch = qh.launch_plan(dev, q.dtype, D, False, v_items, v_items, **dict(
            common, role="v", rotate=False, smooth=False, shift=False, block=tile_n, kmean=self.smooth,
            fused=self.fused, late_count=qh.V3_FUSED_MEAN_LATE and self.fused))[0]
        qk = dict(common, role="qk", rotate=config.rotate, pdl=pdl, staged_mean=qh.V3_STAGED_MEAN and coalesced,
                  kmean=False)
        self.k_launch = qh.launch_plan(dev, q.dtype, D, False, v_items, v_items, **dict(
            qk, smooth=self.smooth, shift=False, block=tile_n, reverse=qh.V2_REVERSE and self.smooth,
            **qh.qk_layout(D, "k", coalesced)))[0]
        q_items = B * H * -(-Nq // tile_m)
        self.q_launch = qh.launch_plan(dev, q.dtype, D, False, q_items, q_items, **dict(
            qk, smooth=False, shift=self.smooth, block=tile_m, reverse=False, **qh.qk_layout(D, "q", coalesced)))[0]

    def _v_pass(self, k: torch.Tensor, v: torch.Tensor, v_t: torch.Tensor, vd: torch.Tensor) -> torch.Tensor | None:
        """V's launch (with K's partial sums when smoothing); K's mean (None without smoothing)."""
        fn, grid = self.v_launch
        if not self.smooth:
            fn(v, v_t, vd, self.ones, self.z_mean, self.z_shift, v, self.z_parts, self.z_count, 0.0, grid)
            return None
        B, Hkv, P, D = self.parts_shape
        if self.fused:  # the mean finished in V's launch (the per-stream scratch of ``quant_host._fused_scratch``)
            parts, counters = qh._fused_scratch(self.dev, B, Hkv, P, D)
            mean = torch.empty(B, Hkv, D, dtype=torch.float32, device=self.dev)
            fn(v, v_t, vd, self.ones, mean, self.z_shift, k, parts, counters, self.inv_n, grid)
            return mean
        parts = torch.empty(self.parts_shape, dtype=torch.float32, device=self.dev)
        fn(v, v_t, vd, self.ones, self.z_mean, self.z_shift, k, parts, self.z_count, self.inv_n, grid)
        return parts.sum(dim=2)  # quant_host.k_mean_from_parts for seqlen_k > 0

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> FP8Inputs:
        dev, (q_shape, qd_shape, k_shape, kd_shape, vt_shape) = self.dev, self.shapes
        v_t = torch.empty(vt_shape, dtype=E4M3, device=dev)
        vd = torch.empty(kd_shape, dtype=torch.float32, device=dev)
        mean = self._v_pass(k, v, v_t, vd)
        k8 = torch.empty(k_shape, dtype=E4M3, device=dev)
        kd = torch.empty(kd_shape, dtype=torch.float32, device=dev)
        q8 = torch.empty(q_shape, dtype=E4M3, device=dev)
        qd = torch.empty(qd_shape, dtype=torch.float32, device=dev)
        if mean is None:
            mean_eff = shift = None
            k_mean, q_mean, q_shift = self.z_mean, self.z_mean, self.z_shift
        else:
            mean_eff = -mean if self.negate else mean
            shift = torch.empty(self.shift_shape, dtype=torch.float32, device=dev)
            k_mean, q_mean, q_shift = mean, mean_eff, shift
        fn, grid = self.k_launch
        fn(k, k8, kd, self.k_signs, k_mean, self.z_shift, k, self.z_parts, self.z_count, 0.0, grid)
        fn, grid = self.q_launch
        fn(q, q8, qd, self.signs, q_mean, q_shift, q, self.z_parts, self.z_count, self.scale, grid)
        return FP8Inputs(q8, k8, v_t, qd, kd, vd, self.scale, self.seqlen_k, mean_eff, shift, self.config,
                         block_n=self.block_n)


def _device_ok(q: torch.Tensor, config: FP8Config) -> bool:
    """Whether the GPU pass runs on q's device (``quant_host.why_not``; the CPU tests stub it)."""
    return q.is_cuda and qh.why_not(q, config) is None


def _plannable(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, config: FP8Config, pipe: str) -> bool:
    """Whether a call of these (already checked) inputs is one ``CallPlan`` replays (the module docstring)."""
    if pipe != "v3" or config.granularity != "block" or q.dtype not in qh.DTYPES or not q.dtype == k.dtype == v.dtype:
        return False
    if not _device_ok(q, config):
        return False
    B, Nq, H, D = q.shape
    Nk, Hkv, tile_n = k.shape[1], k.shape[2], tiles_for(D)[1]
    if B * Nq * H == 0 or Nk * Hkv == 0:
        return False
    if config.smooth_k and len(k_sample_tiles(Nk, tile_n, config.smooth_k_blocks)) < -(-Nk // tile_n):
        return False  # a sampled mean: its own launch arithmetic (quant_host._quantize)
    return all(interop.strides_aligned(t) for t in (q, k, v))  # the pointers: per call (``plan_for``)


def plan_for(q, k, v, config, softmax_scale, pipeline) -> CallPlan | None:
    """The cached ``CallPlan`` of this call (built on its first call), or None where the uncached path runs (the
    module docstring). Raises what ``quant_host.quantize`` raises for bad arguments (its checks run when a plan is
    built; a cached plan's key holds everything they and ``CallPlan`` read: the module switches and the block
    heights of ``layout.KERNEL_TILES``, whose change is a new plan)."""
    if not (type(q) is type(k) is type(v) is torch.Tensor and type(config) is FP8Config
            and type(softmax_scale) in _SCALAR_TYPES):
        return None
    pipe = qh.pipeline_of(pipeline)
    key = (q.shape, k.shape, v.shape, q.stride(), k.stride(), v.stride(), q.dtype, k.dtype, v.dtype, q.device,
           k.device, v.device, config, softmax_scale, pipe, _switches(), tiles_for(q.shape[-1]))
    try:
        plan = _CALLS[key]
    except KeyError:
        scale = _check(q, k, v, config, softmax_scale)
        plan = CallPlan(q, k, config, scale) if _plannable(q, k, v, config, pipe) else None
        if len(_CALLS) >= MAX_PLANS:
            _CALLS.clear()
        _CALLS[key] = plan
    if plan is None or (q.data_ptr() | k.data_ptr() | v.data_ptr()) % interop.DEFAULT_ALIGN:
        return None
    if plan.dev.type == "cuda" and plan.dev.index != torch.cuda.current_device():
        return None  # the launches need q's device current (the uncached path makes it so)
    return plan


def quantize_planned(q, k, v, config, softmax_scale, pipeline) -> FP8Inputs | None:
    """``quant_host.quantize`` through a cached plan, or None where the caller runs the uncached path."""
    plan = plan_for(q, k, v, config, softmax_scale, pipeline)
    return None if plan is None else plan.run(q, k, v)
