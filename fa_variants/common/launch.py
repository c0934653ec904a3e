"""A kernel variant (`Variant`: what it serves, its configuration, how to build and launch it) and the one
launcher every variant runs through (`launch`).

Each kernel module defines one ``VARIANT = Variant(...)``; `fa_variants.registry` finds it by name, and the
dispatcher, `fa-variants compile` and `fa-variants info` read it. `launch` does for every variant:

    check dtype / head_dim / heads  ->  the softmax scale in kernel form (`common.scale.positive_scale`)
    ->  O = 0, LSE = -inf without a launch when there is nothing to compute (no query, no key)
    ->  grid limits (`Variant.check_problem`, before anything is compiled)
    ->  config (the variant's default for (arch, head_dim, causal), or `config=`, checked)
    ->  the compiled kernel (`common.cache`, once per static configuration, then a per-process lookup)
    ->  operands the kernel can address (`Variant.operand`)
    ->  outputs (out like q, LSE float32)  ->  the runtime arguments (`Variant.prepare`)  ->  the launch.

Pure Python; the CuTe DSL is imported only when a kernel is first compiled.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import threading
from typing import Any, Callable

import torch

from fa_variants.common import cache, env, interop, workspace
from fa_variants.common.scale import kernel_scale

#: Whether a launcher's run with ``want_lse=False`` writes the LSE to the per-stream scratch
#: (``common.workspace.lse_function``) instead of allocating it (FA_VARIANTS_LSE_SCRATCH=0: always allocated).
#: Read when a plan is made.
LSE_SCRATCH = env.flag("FA_VARIANTS_LSE_SCRATCH", True)

# the current CUDA device's index (torch.cuda.current_device without its Python-level checks: a plan's tensors
# are on an initialised CUDA device already)
_current_device = getattr(torch._C, "_cuda_getDevice", None) or torch.cuda.current_device


#: The compile targets of the kernels written with sm80 instructions (mma.sync, cp.async, ldmatrix: fa1, fa2, the
#: split-KV merge): the archs they build for with nvidia-cutlass-dsl 4.8.1, each checked by compiling and storing
#: them (sm_87, sm_103a, sm_121a: session 35). The dispatcher gives GPUs its table does not list to these kernels
#: where their arch is here; sm_101a / sm_110a compile but the DSL returns no cubin to store, and sm_107a does not
#: compile (CUDA 12.9): not listed, so such a GPU gets the reference path with a warning saying why.
SM80_CODE_ARCHS = ("sm_80", "sm_86", "sm_87", "sm_89", "sm_90a", "sm_100a", "sm_103a", "sm_120a", "sm_121a")


def standard_args(config, q, k, v, out, lse, scale: float) -> tuple:
    """Runtime arguments of the standard signature (q, k, v, out, lse, softmax_scale)."""
    return q, k, v, out, lse, scale


@dataclasses.dataclass(frozen=True)
class Variant:
    """One kernel variant.

    name: the backend / compile name ("fa2", ...).
    archs: the compile targets it builds for ("sm_80", "sm_90a", ...; ``SM80_CODE_ARCHS`` for the sm80
        kernels); which GPUs prefer it is the dispatcher's table.
    dtypes: torch dtypes of q, k, v it serves; head_dims: the head dims it serves (None: any).
    default_config: (arch, head_dim, causal) -> its frozen config (`common.config`).
    check_config: (config, arch, head_dim) -> config, or ValueError (a `config=` override is checked).
    build: StaticConfig -> (jit callable, fake compile-time arguments).
    prepare: (config, q, k, v, out, lse, scale) -> the compiled kernel's runtime arguments.
    operand: a q / k / v tensor -> one the kernel can address (alignment; a copy or a re-strided view when
        needed); it must decide from the tensor's shape, strides, dtype and base-pointer alignment only (a
        launcher replays its decision for every tensor of the same kind).
    check_problem: (config or None for the default, q, k) -> None, or ValueError (grid limits).
    runner: a variant whose call is not the standard launch (the reference; fa3-fp8, which quantises) runs
        this instead of `launch`.
    auto_dtypes: the dtypes the dispatcher's ``auto`` may pick it for (None: all of `dtypes`); the others
        only on request (fa3-fp8 quantises 16-bit inputs: it changes the numerics).
    request_note: dtype -> a sentence the dispatcher adds to the reason when the variant is requested.
    problem_config: (config or None, q, k, causal) -> the config to run (None: the default), for variants
        whose best static shape depends on the problem (fa3: split-KV for decode shapes).
    finish: (config, runtime args, out, lse) -> None, after the launch (fa3: the split-KV merge into out, lse).
    warm_configs: (arch, head_dim, causal, groups=()) -> the configs besides the default that calls may compile
        (`problem_config`'s choices: fa3's split-KV config), for `fa-variants warmup`; groups: the query heads
        per KV head calls will have (fa3's packed seqlen_q > 1 kernels fix the group).
    with_lengths: config -> the same config reading per-sequence KV lengths in its kernel (``seqlens_k``), for
        `fa-variants warmup --seqlens-k`; None where no kernel of the variant reads them (fa1, fa3-fp8: one launch
        per distinct length on the plain kernels).
    warm_companions: (config, arch, dtype name, head_dim) -> the static configs of the other kernels a call on
        that config launches (fa3, fa2: the split merge, ``split_combine.merge_configs``), for `fa-variants warmup`.
    scale_config: (config or None, q, k, causal, |softmax_scale|) -> the config to plan with: ``config``, or for a
        call whose scale forbids split-KV (``common.split.MAX_SPLIT_SCALE``) the variant's choice without a split
        (fa3, fa2), fixed, so that `problem_config` cannot split it later.
    switches: () -> a hashable value of the module switches `problem_config` and `plan_call` read besides
        the tensors' kind (fa3: split-KV, packed GQA, merge kernel). With it, a launcher decides the config
        once and replays it while the value is unchanged; without it, `problem_config` runs per call.
    plan_call: (config, q, k, v, scale, causal) -> (prepare(q, k, v, out, lse) -> runtime args, finish(args, out,
        lse) or None): `prepare` and `finish` specialised once for tensors of q, k, v's kind (view geometry,
        workspace sizes, the merge kernel looked up, fa3's balanced tile table), instead of `prepare` / `finish` per
        call. A `prepare` with
        an attribute ``launch_with(fn) -> launch(q, k, v, out, lse)`` gives the launch itself as one function
        (``common.split_combine.split_steps``: no argument tuple carrying the split scratch to `finish`).
    """

    name: str
    archs: tuple[str, ...]
    dtypes: tuple[torch.dtype, ...]
    head_dims: tuple[int, ...] | None
    default_config: Callable[[str, int, bool], Any] | None = None
    check_config: Callable[[Any, str, int], Any] | None = None
    build: Callable[[cache.StaticConfig], tuple] | None = None
    prepare: Callable[..., tuple] = standard_args
    operand: Callable[[torch.Tensor], torch.Tensor] = interop.aligned
    check_problem: Callable[[Any, torch.Tensor, torch.Tensor], None] | None = None
    runner: Callable[..., tuple] | None = None
    auto_dtypes: tuple[torch.dtype, ...] | None = None
    request_note: Callable[[torch.dtype], str | None] | None = None
    problem_config: Callable[[Any, torch.Tensor, torch.Tensor, bool], Any] | None = None
    finish: Callable[[Any, tuple, torch.Tensor, torch.Tensor], None] | None = None
    warm_configs: Callable[..., tuple] | None = None
    with_lengths: Callable[[Any], Any] | None = None
    warm_companions: Callable[[Any, str, str, int], tuple] | None = None
    scale_config: Callable[..., Any] | None = None
    switches: Callable[[], Any] | None = None
    plan_call: Callable[..., tuple] | None = None

    def can_implement(self, dtype: torch.dtype, head_dim: int) -> str | None:
        """Why this variant cannot serve (dtype, head_dim); None if it can."""
        if dtype not in self.dtypes:
            return (f"{self.name} does not support dtype {_name(dtype)} "
                    f"(supports {', '.join(_name(d) for d in self.dtypes)})")
        if self.head_dims is not None and head_dim not in self.head_dims:
            return (f"{self.name} does not support head_dim {head_dim} "
                    f"(supports {', '.join(map(str, self.head_dims))})")
        return None

    def config_for(self, arch: str, head_dim: int, causal: bool, config=None):
        """The config a call runs with: `config` (checked) or the default for (arch, head_dim, causal).
        ValueError for a variant with no compile recipe (no `default_config`: the reference, a dispatch face
        whose kernel module defines no VARIANT)."""
        if config is None:
            if self.default_config is None:
                raise ValueError(f"{self.name} has no default config: its Variant record defines no compile recipe")
            return self.default_config(arch, head_dim, causal)
        return self.check_config(config, arch, head_dim) if self.check_config else config

    def static_config(self, arch: str, dtype: str, head_dim: int, causal: bool, config=None,
                      align: int = interop.DEFAULT_ALIGN) -> cache.StaticConfig:
        """The compile-cache key of a call."""
        return cache.StaticConfig(self.name, arch, dtype, int(head_dim), bool(causal),
                                  self.config_for(arch, int(head_dim), bool(causal), config), int(align))

    def compiled(self, cfg: cache.StaticConfig) -> cache.Compiled:
        """The compiled kernel of a static configuration (compiled on first use); ValueError without `build`."""
        if self.build is None:
            raise ValueError(f"{self.name} cannot be compiled: its Variant record defines no build")
        return cache.get_compiled(cfg, self.build)

    def run(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool, softmax_scale: float,
            config=None, seqlens_k: torch.Tensor | None = None, leftpad_k: torch.Tensor | None = None,
            seqlens_q: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Attention forward: (out (B, Nq, H, D) like q, lse float32 (B, H, Nq), natural log); see `launch`."""
        if self.runner is not None:
            if seqlens_k is not None or leftpad_k is not None or seqlens_q is not None:
                raise ValueError(f"{self.name}: seqlens_k / leftpad_k / seqlens_q are not read by this backend's "
                                 "runner")
            return self.runner(q, k, v, causal=causal, softmax_scale=softmax_scale)
        return launch(self, q, k, v, causal=causal, softmax_scale=softmax_scale, config=config, seqlens_k=seqlens_k,
                      leftpad_k=leftpad_k, seqlens_q=seqlens_q)


def window_config(seqlens_k, leftpad_k, seqlens_q, lengths: Callable, leftpad: Callable, windows: Callable):
    """Which of a kernel module's config makers (its lengths_config, leftpad_config, windows_config) serves a call
    with these per-sequence tensors (each None or given): the one reading the last of them given (`launch` fills
    the ones before it that the caller left out); None when none is given."""
    if seqlens_q is not None:
        return windows
    if leftpad_k is not None:
        return leftpad
    return lengths if seqlens_k is not None else None


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


_KERNELS: dict[tuple, tuple] = {}  # (variant, device, dtype, head_dim, causal, config) -> (fn, config)
_LOCK = threading.Lock()


def _kernel(variant: Variant, device: torch.device, dtype: torch.dtype, head_dim: int, causal: bool, config):
    key = (variant.name, device, dtype, head_dim, causal, config)
    hit = _KERNELS.get(key)  # the common case, once per process per configuration: a dict lookup
    if hit is None:
        with _LOCK:
            cfg = variant.static_config(interop.device_arch(device), interop.dtype_name(dtype), head_dim,
                                        causal, config)
            hit = _KERNELS[key] = (variant.compiled(cfg).fn, cfg.config)
    return hit


def launch(variant: Variant, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
           softmax_scale: float, config=None, seqlens_k: torch.Tensor | None = None,
           leftpad_k: torch.Tensor | None = None,
           seqlens_q: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Run a kernel variant on CUDA tensors: ``launcher(...)(q, k, v)``.

    Args:
        q: (batch, seqlen_q, num_heads, head_dim); k, v: (batch, seqlen_k, num_heads_kv, head_dim); one of
            the variant's dtypes and head dims, num_heads % num_heads_kv == 0 (GQA / MQA), unit last stride.
        causal: bottom-right aligned causal mask.
        softmax_scale: any finite real within `common.scale.MAX_SOFTMAX_SCALE` (`common.scale.kernel_scale`).
        config: the variant's config type, overriding its default (checked against the arch).
        seqlens_k: int32 (batch,) per-sequence KV lengths on q's device, passed to a kernel compiled to read them (a
            config with ``seqlens_k=True``, e.g. ``hopper.fa3.lengths_config``), after its other arguments; None
            otherwise (ValueError when the two disagree, or for a tensor of the wrong dtype, shape or device).
        leftpad_k: int32 (batch,) on q's device, each sequence's first key (keys [leftpad_k[b], seqlens_k[b])), for
            a config with ``leftpad_k=True`` (``hopper.fa3.leftpad_config``), passed after seqlens_k (seqlen_k for
            every sequence when seqlens_k is None); None otherwise (ValueError as for seqlens_k).
        seqlens_q: int32 (batch,) on q's device, each sequence's query count (its causal diagonal bottom-right
            against it and the window's key count), for a config with ``seqlens_q=True``
            (``hopper.fa3.windows_config``), passed after leftpad_k (0 for every sequence when leftpad_k is None,
            seqlen_k when seqlens_k is); None otherwise (ValueError as for seqlens_k).
    Returns:
        (out, lse): out (batch, seqlen_q, num_heads, head_dim) like q, contiguous; lse float32
        (batch, num_heads, seqlen_q), natural log; a row that sees no key gets O = 0, LSE = -inf.
    Raises:
        ValueError: a dtype, head_dim or head count the variant does not serve, an illegal scale or config,
            a grid beyond the hardware limits, an operand that cannot be aligned.
        TypeError: a softmax_scale that is not a real number.
    """
    from fa_variants.reference import check_seqlens_k

    batch, seqlen_q, seqlen_k = q.shape[0], q.shape[1], k.shape[1]
    # the tensors in the order the kernel takes them; a later one given fills the earlier ones left out (each window
    # from key 0, to seqlen_k), as its config reads them all (`window_config`)
    tensors = {"seqlens_k": seqlens_k, "leftpad_k": leftpad_k, "seqlens_q": seqlens_q}
    makers = {"seqlens_k": ("lengths_config", lambda: torch.full((batch,), seqlen_k, dtype=torch.int32,
                                                                 device=q.device)),
              "leftpad_k": ("leftpad_config", lambda: torch.zeros((batch,), dtype=torch.int32, device=q.device)),
              "seqlens_q": ("windows_config", None)}
    later = False
    for name in reversed(tensors):  # the kernel reads it as int32 (batch,) on q's device: checked, values clamped
        reads = bool(getattr(config, name, False))
        if later and tensors[name] is None:
            tensors[name] = makers[name][1]()
        if (tensors[name] is not None) != reads:
            raise ValueError(f"{variant.name}: {name} {'given' if tensors[name] is not None else 'missing'} for a "
                             f"config with {name}={reads} (pass both, e.g. its {makers[name][0]}, or neither)")
        if tensors[name] is not None:
            check_seqlens_k(tensors[name], batch, seqlen_q if name == "seqlens_q" else seqlen_k, q.device,
                            values=False, name=name)
            later = True
    extra = tuple(t.contiguous() for t in tensors.values() if t is not None)
    return launcher(variant, q, k, v, causal=causal, softmax_scale=softmax_scale, config=config)(q, k, v, True, *extra)


def launcher(variant: Variant, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, causal: bool,
             softmax_scale: float, config=None) -> Callable[..., tuple[torch.Tensor, torch.Tensor]]:
    """`launch` split in two: everything decided by what a call's *kind* fixes (shapes, strides, 16-byte
    alignment of the base pointers, dtype, device, causal, softmax_scale, config) is checked and looked up
    here, once; the returned ``run(q, k, v) -> (out, lse)`` does only the per-call work (allocate out and
    LSE, copy an operand the kernel cannot address, the launch) for tensors of the same kind; ``run(q, k, v,
    want_lse=False)`` for a caller that drops the LSE: it is written to the stream's scratch
    (``common.workspace.lse_function``, LSEs up to its ``LSE_SCRATCH_MAX`` elements; ``LSE_SCRATCH``) instead of a new
    tensor, and the returned one must not be read. The caller owns
    that contract (``fa_variants.api`` keys its cached plans on exactly those properties). A variant with
    `Variant.switches` gets its config chosen here too, and chosen again only if a switch changes; one
    without runs its `problem_config` per call. Raises as `launch`, here rather than in ``run``.
    """
    batch, seqlen_q, heads, head_dim = q.shape
    seqlen_k, heads_kv = k.shape[1], k.shape[2]
    problem = variant.can_implement(q.dtype, head_dim)
    if problem:
        raise ValueError(problem)
    if heads_kv == 0 or heads % heads_kv:
        raise ValueError(f"{variant.name}: num_heads {heads} is not divisible by num_heads_kv {heads_kv}")
    negate_k, scale = kernel_scale(softmax_scale)
    given = config if variant.scale_config is None else variant.scale_config(config, q, k, causal, scale)
    if variant.problem_config is not None:
        config = variant.problem_config(given, q, k, causal)
    if variant.check_problem is not None:
        variant.check_problem(config, q, k)
    if q.numel() == 0 or seqlen_k == 0:  # nothing to launch: O = 0, LSE = -inf
        return functools.partial(empty_outputs, (batch, seqlen_q, heads, head_dim), q.dtype, q.device)
    # per operand: None (used as is), its strides (a re-strided view of the same memory), or True (the
    # variant's operand() per call: a copy). `Variant.operand` decides from shape, strides and alignment.
    fixes = tuple(_operand_fix(variant.operand, t) for t in (q, k, v))
    if negate_k:
        fixes = (fixes[0], True, fixes[2])
    operands = _operands(variant.operand, fixes)
    switches = variant.switches
    state = switches() if switches is not None else None
    # (config, switch state) -> its launch steps: plan_call may read module switches besides the config (fa3:
    # MERGE_WARP, MERGE_KERNEL and MERGE_PDL choose the merge kernel it binds), so a step planned under other
    # switch values is not reused for an equal config (before: a MERGE_WARP flip after the first call of a
    # kind kept the shared-memory merge, and decode5's "warp" A/B timed that merge under the warp name)
    steps = {(config, state): _Steps(variant, q, k, v, causal, scale, config, operands)}
    device, lse_shape = q.device, (batch, heads, seqlen_q)
    index = q.device.index if q.device.type == "cuda" else None
    chosen = steps[(config, state)]
    decide = variant.problem_config if switches is None else None
    # an LSE the caller does not read (want_lse False) goes to the stream's scratch: one allocation per call, O's
    scratch_lse = workspace.lse_function(device, lse_shape) if (
        LSE_SCRATCH and batch * heads * seqlen_q <= workspace.LSE_SCRATCH_MAX) else None

    def outputs_and_launch(step, q, k, v, want_lse, extra):
        # O like q (shape, dtype, device), contiguous: empty_like parses one tensor where empty parses a shape, a
        # dtype and a device (about 1 us less per call on the host)
        out = torch.empty_like(q, memory_format=torch.contiguous_format)
        lse = torch.empty(lse_shape, dtype=torch.float32, device=device) if want_lse or scratch_lse is None \
            else scratch_lse()
        step.launch(q, k, v, out, lse, *extra)
        return out, lse

    def run(q, k, v, want_lse=True, *extra):  # extra: (seqlens_k,) for a config with seqlens_k
        step, now = chosen, state
        if switches is not None:
            now = switches()
            if now != state:  # a module switch changed since planning: decide as a new plan would
                step = None
        elif decide is not None:  # per call: the variant's choice may depend on more than the key
            step = steps.get((decide(given, q, k, causal), None))
        if step is None:
            config = variant.problem_config(given, q, k, causal) if variant.problem_config else given
            step = steps.get((config, now))
            if step is None:
                if variant.check_problem is not None:
                    variant.check_problem(config, q, k)
                step = steps[(config, now)] = _Steps(variant, q, k, v, causal, scale, config, operands)
        if negate_k:  # softmax(c Q K^T) = softmax(|c| Q (-K)^T): the online max needs c > 0
            k = -k
        if operands is not None:
            q, k, v = operands(q, k, v)
        if index is not None and _current_device() != index:
            with torch.cuda.device(index):  # launch (and take scratch) on the tensors' device, not the current one
                return outputs_and_launch(step, q, k, v, want_lse, extra)
        return outputs_and_launch(step, q, k, v, want_lse, extra)

    run.launch_step = chosen.launch  # diagnostics (scripts/api_overhead.py): the launch alone, outputs given
    run.lse_scratch = scratch_lse  # ... the LSE scratch of want_lse=False (None: allocated)
    run.steps = chosen  # ... and its parts (prepare, the compiled kernel, finish)
    return run


def _operands(operand: Callable, fixes: tuple):
    """``(q, k, v) -> (q, k, v)`` replaying the operand decisions (`_operand_fix`), or None when all are used
    as they are."""
    if all(fix is None for fix in fixes):
        return None
    fq, fk, fv = fixes

    def fix(t, how):
        if how is None:
            return t
        return operand(t) if how is True else t.as_strided(t.shape, how)

    return lambda q, k, v: (fix(q, fq), fix(k, fk), fix(v, fv))


class _Steps:
    """The launch of one config for tensors of a launcher's kind: the compiled kernel and the variant's
    argument steps (`Variant.plan_call`, else `Variant.prepare` / `Variant.finish` per call)."""

    __slots__ = ("launch", "prepare", "fn", "finish")

    def __init__(self, variant: Variant, q, k, v, causal: bool, scale: float, config, operands):
        fn, cfg = _kernel(variant, q.device, q.dtype, q.shape[-1], bool(causal), config)
        if variant.plan_call is not None:
            sample = operands(q, k, v) if operands is not None else (q, k, v)
            prepare, finish = variant.plan_call(cfg, *sample, scale, causal)
        elif variant.prepare is standard_args and variant.finish is None:
            prepare, finish = (lambda q, k, v, out, lse: (q, k, v, out, lse, scale)), None
        else:
            prepare = lambda q, k, v, out, lse, p=variant.prepare: p(cfg, q, k, v, out, lse, scale)  # noqa: E731
            finish = None if variant.finish is None else (
                lambda args, out, lse, f=variant.finish: f(cfg, args, out, lse))

        self.prepare, self.fn, self.finish = prepare, fn, finish  # diagnostics (scripts/api_overhead.py)
        launch_with = getattr(prepare, "launch_with", None)
        if launch_with is not None:  # the variant's own launch around fn (Variant.plan_call)
            self.launch = launch_with(fn)
            return
        if finish is None:  # extra: the runtime arguments after the others (seqlens_k), as given to run
            def launch(q, k, v, out, lse, *extra):
                fn(*prepare(q, k, v, out, lse), *extra)
        else:
            def launch(q, k, v, out, lse, *extra):
                args = prepare(q, k, v, out, lse)
                fn(*args, *extra)
                finish(args, out, lse)
        self.launch = launch


def _operand_fix(operand: Callable, t: torch.Tensor):
    """How `operand` treats tensors of t's kind: None (t itself), the strides of a view of the same memory
    (TMA's re-strided length-1 dimensions: redone per call by one ``as_strided``), or True (a copy)."""
    r = operand(t)
    if r is t:
        return None
    if r.data_ptr() == t.data_ptr() and r.shape == t.shape and r.dtype == t.dtype:
        return None if r.stride() == t.stride() else r.stride()  # the same view: nothing to redo per call
    return True


def empty_outputs(out_shape: tuple, dtype: torch.dtype, device: torch.device, q=None, k=None, v=None, want_lse=True,
                  *extra):
    """O = 0, LSE = -inf: a call with no query or no key."""
    return (torch.zeros(out_shape, dtype=dtype, device=device),
            torch.full((out_shape[0], out_shape[2], out_shape[1]), -math.inf, dtype=torch.float32, device=device))
