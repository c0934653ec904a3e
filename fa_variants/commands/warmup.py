"""`fa-variants warmup`: compile the kernels a model will call into the disk cache (`common.diskcache`), so that
no process pays a compile at its first call.

    fa-variants warmup --head-dims 64,128 --dtypes bf16 --backends fa3,fa2       # this GPU's arch
    fa-variants warmup --arch sm_90a --model config.json                        # no GPU needed
    fa-variants warmup --arch sm_90a --head-dims 128 --gqa 32:8 --prune
    fa-variants warmup --head-dims 128 --gqa 32:8 --seqlens-k --jobs 8             # 8 compiles at a time

Per (backend, dtype, head_dim, causal): the static configurations a call would compile (`registry.static_config`
with the variant's default config, and those its calls may switch to, ``Variant.warm_configs``: fa3's
split-KV config for decode shapes), exactly the keys `common.launch` looks up. fa3-fp8 on fp16 / bf16 inputs: the
e4m3 kernel writing O in that dtype (``registry.call_static_config``), and the FP8 quantisation passes its calls launch first
(``quant_passes``: the default recipe, worked out on the CPU by ``quant_host.planned_passes``; the
FA_VARIANTS_FP8_QUANT_* switches of this process, so warm up with the environment of the runs).
Batch, sequence lengths, head counts and strides are runtime values, but for one thing: fa3 packs the query
heads of a KV head into its tile rows at seqlen_q > 1 (decode of a few query rows with GQA) in kernels that fix
the group (num_heads / num_heads_kv; 64-row tiles, and 128-row ones where ``hopper.fa3.wide_rows`` takes them).
``--gqa`` and a model's head counts are checked (num_heads % num_heads_kv == 0) and add those kernels; without
them, such a call compiles at first use. ``--seqlens-k`` adds the kernels that read per-sequence KV lengths
(``Variant.with_lengths`` of each config above: fa3, fa2) and those that read each sequence's first key too
(``leftpad_k``: what a compiled Hugging Face model with a mask runs, ``torch.ops.fa_variants.mask_window``) and,
causal, its query count (``seqlens_q``: a right-padded training batch, ``mask_sequence_windows``). The other kernels a
call on one of these configs
launches come too (``Variant.warm_companions``: the split-KV merge kernel). A backend that
does not serve a dtype / head_dim / arch is skipped with a note. The last line printed to stdout is one JSON
object. Exit status 2, with one line on stderr naming the cause: an --arch that is not a compile target, an
unknown --backends name, a run with nothing to compile, no place for the disk cache (no FA_VARIANTS_CACHE_DIR and
no home directory) or one that cannot be written (a file, read-only: before any compile), or kernels whose disk-cache
entries could not be written.
"""
from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from fa_variants import registry
from fa_variants.cli import positive_int
from fa_variants.common import diskcache, interop
from fa_variants.common.checks import INT64_MAX, one_line

KERNEL_BACKENDS = ("fa3", "fa3-fp8", "fa2", "fa1")


def _csv(kind):
    """argparse type: a non-empty comma list of ``kind`` (an empty one, e.g. ",", meant "the defaults" for --dtypes
    and compiled 49 kernels; session 27)."""
    def parse(text: str) -> list:
        try:
            values = [kind(x) for x in text.split(",") if x.strip()]
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not a comma-separated list of {kind.__name__}") from None
        if not values:
            raise argparse.ArgumentTypeError(f"{text!r} is an empty list")
        return values
    return parse


def _gqa(text: str) -> tuple[int, int]:
    try:
        heads, heads_kv = (int(x) for x in text.split(":"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not num_heads:num_heads_kv (e.g. 32:8)") from None
    if heads < 1 or heads_kv < 1 or heads % heads_kv or heads > INT64_MAX:
        raise argparse.ArgumentTypeError(f"--gqa {text}: num_heads must be a positive multiple of num_heads_kv, "
                                         "at most 2^63 - 1")
    return heads, heads_kv


def model_shape(path: str) -> dict:
    """head_dim, heads, heads_kv and dtype of a Hugging Face style config.json (head_dim, or hidden_size /
    num_attention_heads; num_key_value_heads defaults to num_attention_heads; torch_dtype / dtype), read from its
    "text_config" where that is an object."""
    try:
        cfg = json.loads(Path(path).read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not a JSON config.json ({exc})") from None
    if not isinstance(cfg, dict):
        raise ValueError(f"{path}: a config.json holds a JSON object, got a {type(cfg).__name__}")
    if isinstance(cfg.get("text_config"), dict):  # a multimodal model's language part; null or another value: none
        cfg = cfg["text_config"]
    if "num_attention_heads" not in cfg or not (cfg.get("head_dim") or "hidden_size" in cfg):
        raise ValueError(f"{path}: needs num_attention_heads and head_dim or hidden_size")
    heads = _config_int(cfg, "num_attention_heads", path)
    heads_kv = _config_int(cfg, "num_key_value_heads", path) if cfg.get("num_key_value_heads") is not None else heads
    if heads % heads_kv:
        raise ValueError(f"{path}: num_attention_heads {heads} is not a multiple of num_key_value_heads {heads_kv}")
    if cfg.get("head_dim"):
        head_dim = _config_int(cfg, "head_dim", path)
    else:
        hidden = _config_int(cfg, "hidden_size", path)
        if hidden % heads:
            raise ValueError(f"{path}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}")
        head_dim = hidden // heads
    dtype = {"bfloat16": "bf16", "float16": "fp16"}.get(str(cfg.get("torch_dtype") or cfg.get("dtype")), "bf16")
    return {"head_dim": head_dim, "heads": heads, "heads_kv": heads_kv, "dtype": dtype}


def _config_int(cfg: dict, key: str, path) -> int:
    """cfg[key] as a positive int (a JSON integer; not a bool, a fraction or a list; at most 2^63 - 1, as torch takes
    sizes), else a one-line ValueError."""
    value = cfg[key]
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{path}: {key} must be a positive integer, got {one_line(value)}")
    if value > INT64_MAX:
        raise ValueError(f"{path}: {key} must be a positive integer, got {one_line(value)} (> 2^63 - 1)")
    return value


def plan(backends, arch: str, dtypes, head_dims, causal, groups: tuple[int, ...] = (),
         seqlens_k: bool = False) -> tuple[list, list[str]]:
    """(static configs to build, notes on what was skipped); groups: query heads per KV head (``--gqa``);
    seqlens_k: also each config reading per-sequence KV lengths (``Variant.with_lengths``: fa3, fa2), alone and with
    each sequence's first key (the config's ``leftpad_k``), and causal with its query count too (``seqlens_q``)."""
    todo, notes = [], []
    for name in backends:
        for dtype in dtypes:
            for head_dim in head_dims:
                try:
                    lengths = registry.variant(name).with_lengths if seqlens_k else None
                    if seqlens_k and lengths is None and not any(n.startswith(f"{name}: ") for n in notes):
                        notes.append(f"{name}: no kernel of it reads seqlens_k (its calls run the plain kernels per "
                                     "length)")
                    for c in causal:
                        key = functools.partial(registry.call_static_config, name, arch, dtype, head_dim, c)
                        configs = [key()]  # raises for a head_dim not served
                        extra = registry.variant(name).warm_configs  # e.g. fa3's split-KV config (decode)
                        configs += [key(config) for config in (extra(arch, head_dim, c, groups) if extra else ())]
                        windows = [lengths(cfg.config) for cfg in (configs if lengths else ())]
                        windows += [dataclasses.replace(w, leftpad_k=True) for w in windows if hasattr(w, "leftpad_k")]
                        if c:  # + each sequence's query count (a causal batch padded on the right)
                            windows += [dataclasses.replace(w, seqlens_q=True) for w in windows
                                        if getattr(w, "leftpad_k", False)]
                        configs += [key(w) for w in windows]
                        companions = registry.variant(name).warm_companions  # e.g. the split merge kernel
                        todo += configs + [other for cfg in (configs if companions else ())
                                           for other in companions(cfg.config, arch, dtype, head_dim)]
                    if name == "fa3-fp8" and dtype in registry.FP8_QUANTISED_INPUTS:  # the default recipe's passes
                        todo += quant_passes(arch, dtype, head_dim, groups)
                except (registry.UnknownVariantError, registry.UnsupportedConfigError) as exc:
                    notes.append(f"skipped {name} {dtype} head_dim {head_dim}: {exc}")
    return list(dict.fromkeys(todo)), notes


def quant_passes(arch: str, dtype: str, head_dim: int, groups: tuple[int, ...] = ()) -> list:
    """The FP8 quantisation passes (``fp8-quant`` static configs) that ``attention(q, k, v, backend="fa3-fp8")`` on
    ``dtype`` inputs launches before the kernel (the default ``FP8Config``, this process's pipeline and switches), for
    query heads per KV head 1 and ``groups``: ``quant_host.planned_passes``, worked out on the CPU (on CPU tensors
    of that many heads: a ValueError naming the group where they cannot be allocated, e.g. --gqa 100000000:1)."""
    from fa_variants.common.checks import allocating
    from fa_variants.common.interop import TORCH_DTYPES
    from fa_variants.fp8 import quant_host

    most = max(groups, default=1)
    need = 5 * most * head_dim * TORCH_DTYPES[dtype].itemsize  # a lower bound: the planning q of the largest group
    with allocating(f"fa3-fp8's planning tensors for {most} query heads per KV head (--gqa or the model's head "
                    "counts)", "a real model has far fewer", need):
        return quant_host.planned_passes(arch, TORCH_DTYPES[dtype], head_dim,
                                         groups=tuple(dict.fromkeys((1, *groups))))


def warmup(configs, progress: bool = True, jobs: int = 1) -> list[dict]:
    """Compile (or load from disk) each static config, with a progress bar; one record per config, in the order
    of ``configs``. ``jobs`` > 1: that many processes compile side by side (spawned with this process's
    environment; each stores its kernels in the disk cache, whose writes are atomic; an interrupt stops this process,
    the running compiles finish)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    from fa_variants.cli import console

    # on stderr (stdout's last line is the JSON record), in cli.console's width (COLUMNS=0 drew nothing)
    with Progress(*columns, disable=not progress, transient=False, console=console(stderr=True)) as bar:
        task = bar.add_task("warmup", total=len(configs))
        if jobs <= 1 or len(configs) <= 1:
            records = []
            for cfg in configs:
                bar.update(task, description=_label(cfg))
                records.append(_warm_one(cfg))
                bar.advance(task)
            return records
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor, as_completed
        from concurrent.futures.process import BrokenProcessPool

        done = {}
        pool = ProcessPoolExecutor(min(jobs, len(configs)), mp_context=multiprocessing.get_context("spawn"),
                                   initializer=_leave_interrupts)
        try:
            futures = {pool.submit(_warm_one, cfg): i for i, cfg in enumerate(configs)}
            for future in as_completed(futures):
                i = futures[future]
                try:
                    done[i] = future.result()  # a compile's error is raised here, as in this process
                except BrokenProcessPool:
                    raise OSError(f"a compile process died (killed? out of memory?) while {_label(configs[i])} "
                                  "was among those compiling; run with --jobs 1 to see its error") from None
                bar.update(task, description=_label(configs[i]))
                bar.advance(task)
        finally:  # on an error: the queued compiles are dropped, the running ones finish
            pool.shutdown(wait=True, cancel_futures=True)
        return [done[i] for i in range(len(configs))]


def _leave_interrupts() -> None:
    """A --jobs worker's start: Ctrl-C, sent to the terminal's whole process group, is left to the parent (one line,
    ``cli.main``); the worker finishes and stores the kernel it compiles, as after a compile error elsewhere (each
    printed a KeyboardInterrupt traceback of the DSL's frames)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _label(cfg) -> str:
    label = f"{cfg.variant} {cfg.dtype} d{cfg.head_dim}{' causal' if cfg.causal else ''}"
    if cfg.variant == "fp8-quant":  # a pass of fa3-fp8's quantisation: which tensor
        label += f" {cfg.config.role} {cfg.config.mode}"
    return label


def _warm_one(cfg) -> dict:
    """Compile or load one static config (in this process); its record: how (compiled, on disk, in memory, not
    stored), seconds, the disk-cache path."""
    from fa_variants.common import cache

    before = cache.cache_info()
    t0 = time.perf_counter()
    registry.compiled(cfg)
    after = cache.cache_info()
    how = ("compiled" if after["compiles"] > before["compiles"] else
           "on disk" if after["disk_loads"] > before["disk_loads"] else "in memory")
    if after["store_failures"] > before["store_failures"] or not diskcache.entry_path(cfg).is_file():
        how = "not stored"  # the store failed (warned; a file already there may be the bad entry it replaces)
    return {"variant": cfg.variant, "arch": cfg.arch, "dtype": cfg.dtype, "head_dim": cfg.head_dim,
            "causal": cfg.causal, "how": how, "seconds": round(time.perf_counter() - t0, 3),
            "path": str(diskcache.entry_path(cfg))}


def configure_parser(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--arch", help="compile target, e.g. sm_90a, sm_80 (default: this GPU's; no GPU needed "
                        "when given)")
    parser.add_argument("--backends", type=_csv(str), help="comma-separated (default: the kernel backends auto "
                        "may pick on the arch for the dtypes, e.g. fa3, fa2, fa1 on sm_90a for bf16; fa3-fp8 "
                        "only when named)")
    parser.add_argument("--head-dims", type=_csv(int), help="comma-separated, e.g. 64,128")
    parser.add_argument("--dtypes", type=_csv(str),
                        help="comma-separated: fp16, bf16, e4m3 (fa3-fp8's kernels; default: bf16)")
    parser.add_argument("--gqa", type=_gqa, help="num_heads:num_heads_kv, checked; adds fa3's packed kernels "
                        "for decode of a few query rows, which fix the group")
    parser.add_argument("--model", help="a Hugging Face style config.json: head_dim, heads and dtype from it")
    parser.add_argument("--causal", choices=("both", "yes", "no"), default="both")
    parser.add_argument("--seqlens-k", action="store_true", help="also the kernels that read per-sequence KV "
                        "lengths, alone and with first keys (attention(..., seqlens_k=..., leftpad_k=...) on fa3 "
                        "and fa2; a compiled Hugging Face model with a mask)")
    parser.add_argument("--prune", action="store_true", help="also delete cache directories of other "
                        "kernel-source / DSL versions (only directories the cache wrote)")
    parser.add_argument("--jobs", type=positive_int, default=1, help="compile this many kernels at a time, one "
                        "process each (default 1: in this process)")
    parser.add_argument("--no-progress", action="store_true")


def run_cli(args: argparse.Namespace) -> int:
    if not diskcache.enabled():  # a ValueError: `fa-variants warmup: error: ...`, exit 2, as every refusal here
        raise ValueError(f"the disk cache is off ({diskcache.ENV_SWITCH}={os.environ[diskcache.ENV_SWITCH]}): "
                         "nothing would be kept")
    diskcache.root()  # OSError naming FA_VARIANTS_CACHE_DIR where there is no place for it, before any compile
    arch = args.arch
    if arch is None:
        import torch

        if not torch.cuda.is_available():
            raise ValueError("no CUDA device here: give --arch (e.g. sm_90a) to compile for one")
        arch = interop.device_arch(torch.cuda.current_device())
    _check_names(arch, args.backends)
    os.environ["CUTE_DSL_ARCH"] = arch  # read when the DSL loads (on the first compile)
    head_dims, dtypes = list(args.head_dims or []), list(args.dtypes or [])
    groups = (args.gqa[0] // args.gqa[1],) if args.gqa else ()
    if args.model:
        shape = model_shape(args.model)
        head_dims, dtypes = head_dims or [shape["head_dim"]], dtypes or [shape["dtype"]]
        if shape["heads"] % shape["heads_kv"]:
            raise ValueError(f"{args.model}: num_attention_heads {shape['heads']} is not a multiple of "
                             f"num_key_value_heads {shape['heads_kv']}")
        groups += (shape["heads"] // shape["heads_kv"],)
    if not head_dims:
        raise ValueError("give --head-dims or --model")
    dtypes = dtypes or ["bf16"]
    if any(d not in interop.TORCH_DTYPES for d in dtypes):
        raise ValueError(f"--dtypes {','.join(dtypes)}: choose from {', '.join(interop.TORCH_DTYPES)}")
    backends = args.backends or _auto_backends(arch, dtypes)
    causal = {"both": (False, True), "yes": (True,), "no": (False,)}[args.causal]
    configs, notes = plan(backends, arch, dtypes, head_dims, causal, groups, args.seqlens_k)
    for note in notes:
        print(note, file=sys.stderr)
    if not configs:  # a warm-up that warms nothing is a mistake, not a success
        raise ValueError(f"nothing to compile for {arch} ({', '.join(backends) or 'no kernel backend'}; "
                         f"head_dim {','.join(map(str, head_dims))}; {','.join(dtypes)})"
                         + (": every combination was skipped (above)" if notes else ""))
    directory = diskcache.root() / diskcache.fingerprint()
    try:  # before the compiles (minutes): a cache place that is a file or read-only stops the warm-up now
        stored = all(diskcache.entry_path(cfg).is_file() for cfg in configs)  # a read-only cache holding them all
        directory.mkdir(parents=True, exist_ok=True)
        if args.prune or not stored:  # a file made and removed: the file system's own error (read-only, denied)
            tempfile.TemporaryFile(dir=directory).close()
    except OSError as exc:
        raise OSError(f"{directory}: {exc.strerror or exc}: the kernels would be compiled but not written to the "
                      f"disk cache; set {diskcache.ENV_DIR} to a writable folder") from None
    pruned = [str(p) for p in diskcache.prune()] if args.prune else []
    records = warmup(configs, progress=not args.no_progress, jobs=args.jobs)
    counts = {how: sum(r["how"] == how for r in records)
              for how in ("compiled", "on disk", "in memory", "not stored")}
    print(f"{len(records)} kernels for {arch} in {directory}: "
          + ", ".join(f"{n} {how}" for how, n in counts.items() if n))
    print(json.dumps({"arch": arch, "directory": str(directory), **counts,
                      "skipped": notes, "pruned": pruned, "kernels": records}))
    unlinked = [note for note in map(diskcache.library_note, configs) if note]
    if unlinked:  # stored, but a new process loads them through the CuTe DSL: the first call's import
        print(f"fa-variants warmup: note: {len(unlinked)} of {len(records)} kernels have no shared library "
              f"({'; '.join(sorted(set(unlinked)))}): a new process loads them through the CuTe DSL (about 2 s more "
              "on its first call); to link them, delete their files (the JSON's paths) and warm up again with a C "
              "compiler at hand ($CC, cc, gcc or clang)", file=sys.stderr)
    if counts["not stored"]:  # warmup's one job is the disk cache
        raise OSError(f"{counts['not stored']} of {len(records)} kernels were not written to the disk cache "
                      f"{directory} (warnings above): a later process compiles them again")
    return 0


def _check_names(arch: str, backends: list[str] | None) -> None:
    """ValueError naming the flag for an --arch the kernels are not built for (``compile.ARCHS``; 'sm_90' for
    'sm_90a') or a --backends name the registry does not know."""
    from fa_variants.commands.compile import ARCHS

    if arch not in ARCHS:
        hint = f" (did you mean {arch}a?)" if arch + "a" in ARCHS else ""
        raise ValueError(f"--arch {arch}: not a compile target{hint}; choose from {', '.join(ARCHS)}")
    unknown = [b for b in backends or () if b not in registry.ENTRIES]
    if unknown:
        raise ValueError(f"--backends {','.join(unknown)}: unknown; choose from {', '.join(KERNEL_BACKENDS)}")


def _auto_backends(arch: str, dtypes: list[str]) -> list[str]:
    """The kernel backends ``auto`` may pick on an arch for some of the dtypes (names of
    ``interop.TORCH_DTYPES``), fastest first: the dispatcher's list for the arch without the backends that
    serve these dtypes only on request (``registry.Entry.auto_dtypes``): ('sm_90a', ['bf16']) -> fa3, fa2, fa1."""
    from fa_variants import dispatch
    from fa_variants.common.interop import TORCH_DTYPES

    capability = interop.capability_of_arch(arch)
    wanted = {str(TORCH_DTYPES[d]).removeprefix("torch.") for d in dtypes}

    def auto_may_pick(name: str) -> bool:
        entry = registry.ENTRIES[name]
        return bool(wanted & set(entry.auto_dtypes or entry.dtypes))

    return [b for b in dispatch.backends_for(capability) if b in KERNEL_BACKENDS and auto_may_pick(b)]
