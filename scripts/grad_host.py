"""Host time of a training step's attention (forward with inputs that require grad + ``autograd.grad``), ours against
SDPA's, on the GPU: where the waited-for step of scripts/backward_time.py loses to SDPA's when the queued one does not.

    python3 scripts/grad_host.py --out $OUT/gradhost     # ~30 s on an H100 / H200 (warm DSL cache: ~10 s more cold)

Per shape (bf16, B x N = 16k, H x D = 2048) and entry (``ours``: fa_variants.attention with the default backward;
``sdpa``: torch's scaled_dot_product_attention; ``sdpa-cudnn``: the same on cuDNN's attention alone, whose backward
is the one ours calls), the median over steps of

* ``fwd host``: the forward call's host time (no sync inside), ``bwd host``: autograd.grad's;
* ``step waited``: the whole step, synchronised before and after (CUDA events);
* ``host syncs``: the host-device synchronisations of one forward and of one backward (torch.cuda.set_sync_debug_mode
  "warn": each one warns), which would expose the backward's host work; each one's Python stack in
  ``<out>/syncs_<shape>_<entry>.txt`` (session 45's "one per step of ours at D 128 N 1k" was the debug mode's own
  once-per-process notice, at the first shape measured: session 46's stack showed it; none are real);

the caching allocator's retry / device-sync / cudaMalloc / cudaFree counts over the timed steps; then torch.profiler's
CPU self time per op over 5 steps (top 15) in ``<out>/profile_<shape>_<entry>.txt`` (SDPA's
names the backend it chose: ``aten::_scaled_dot_product_cudnn_attention`` or ``..._flash_attention``).
No pass or fail: a measurement.
"""
from __future__ import annotations

import argparse
import contextlib
import statistics
import time
import traceback
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SHAPES = [(128, 1024, False), (64, 1024, False), (256, 4096, True)]  # (head_dim, seqlen, causal)


#: each entry's SDPA backends (a fresh context per step): "sdpa-cudnn" is SDPA on cuDNN's attention alone, the
#: backward ours calls: a host sync in both is PyTorch's / cuDNN's, one in ours alone is ours
#: the caching allocator's counters whose growth over the timed steps means cudaMalloc / cudaFree in the loop: a
#: failed allocation frees cached blocks after synchronising every stream (not a sync the debug mode reports)
ALLOCATOR_COUNTERS = ("num_alloc_retries", "num_sync_all_streams", "num_device_alloc", "num_device_free")
SDPA_BACKENDS = {"ours": contextlib.nullcontext, "sdpa": contextlib.nullcontext,
                 "sdpa-cudnn": lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION)}
ENTRIES = tuple(SDPA_BACKENDS)


def make_step(entry: str, q, k, v, grad_out, causal: bool):
    import fa_variants

    def forward():
        if entry.startswith("sdpa"):
            return F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v)),
                                                  is_causal=causal).transpose(1, 2)
        return fa_variants.attention(q, k, v, causal=causal)

    def step(times=None):
        with SDPA_BACKENDS[entry]():  # SDPA's own choice, or cuDNN's attention alone ("sdpa-cudnn")
            t0 = time.perf_counter()
            out = forward()
            t1 = time.perf_counter()
            grads = torch.autograd.grad(out, (q, k, v), grad_out)
            t2 = time.perf_counter()
        if times is not None:
            times.append((t1 - t0, t2 - t1))
        return grads

    def forward_alone():
        with SDPA_BACKENDS[entry]():
            return forward()

    def backward_alone(out):
        with SDPA_BACKENDS[entry]():
            return torch.autograd.grad(out, (q, k, v), grad_out)
    step.forward, step.backward = forward_alone, backward_alone
    return step


def measure(step, steps: int) -> dict[str, float]:
    host, waited = [], []
    for _ in range(steps):
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(host)
        end.record()
        torch.cuda.synchronize()
        waited.append(start.elapsed_time(end) * 1e3)
    return {"fwd host": statistics.median(t[0] for t in host) * 1e6,
            "bwd host": statistics.median(t[1] for t in host) * 1e6, "step waited": statistics.median(waited)}


def find_syncs(step) -> list[str]:
    """"<innermost frame>: <message>" and the Python stack (innermost last) at each host-device synchronisation of
    one step: sync debug mode "warn" warns at each, and ``warnings.showwarning`` runs inside that warning's call, so
    its stack is the sync's. A sync on the autograd engine's thread (the backward) may show at autograd.grad's line
    instead: the engine hands its threads' warnings to the caller when the backward ends."""
    stacks = []

    def show(message, category, filename, lineno, file=None, line=None):
        # (the mode's own "Synchronization debug mode is a prototype feature" notice, given once per process when it
        # is first set: not a sync; session 46 found it was session 45's "one sync at D 128 N 1k", the first shape)
        if "synchroniz" in str(message) and "prototype feature" not in str(message):
            frames = [f for f in traceback.extract_stack(limit=20)[:-1] if not f.filename.endswith("warnings.py")]
            where = f"{frames[-1].filename}:{frames[-1].lineno} ({frames[-1].name})" if frames else "?"
            stacks.append(f"{where}: {message}\n" + "".join(traceback.format_list(frames[-14:])))

    torch.cuda.synchronize()
    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = show  # restored by catch_warnings
        torch.cuda.set_sync_debug_mode("warn")
        try:
            step()
        finally:
            torch.cuda.set_sync_debug_mode("default")
    return stacks


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--out", type=Path, default=Path("results/gradhost"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    warnings.filterwarnings("ignore", message=".*no backward kernel.*")
    for head_dim, seqlen, causal in SHAPES:
        heads, batch = 2048 // head_dim, 16384 // seqlen
        q, k, v = (torch.randn(batch, seqlen, heads, head_dim, device="cuda", dtype=torch.bfloat16,
                               requires_grad=True) for _ in range(3))
        grad_out = torch.randn_like(q)
        name = f"D{head_dim}_N{seqlen}{'_causal' if causal else ''}"
        for entry in ENTRIES:
            step = make_step(entry, q, k, v, grad_out, causal)
            try:
                for _ in range(3):
                    step()
            except RuntimeError as exc:  # e.g. SDPA without a cuDNN engine for the shape: say so and go on
                print(f"{name} {entry:10s} not run: {str(exc).splitlines()[0][:150]}", flush=True)
                continue
            before = torch.cuda.memory_stats()
            row = measure(step, args.steps)
            after = torch.cuda.memory_stats()
            allocator = {name: after.get(name, 0) - before.get(name, 0) for name in ALLOCATOR_COUNTERS}
            forward_syncs = find_syncs(step.forward)
            out = step.forward()
            syncs = forward_syncs + find_syncs(lambda: step.backward(out))
            print(f"{name} {entry:10s} fwd host {row['fwd host']:7.1f} us  bwd host {row['bwd host']:7.1f} us  "
                  f"step waited {row['step waited']:8.1f} us  host syncs {len(forward_syncs)} in the forward, "
                  f"{len(syncs) - len(forward_syncs)} in the backward; allocator over the steps {allocator}",
                  flush=True)
            if syncs:
                (args.out / f"syncs_{name}_{entry}.txt").write_text("\n".join(syncs))
                print("  innermost Python frame of each:", [stack.split(": ", 1)[0] for stack in syncs])
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                for _ in range(5):
                    step()
                torch.cuda.synchronize()
            table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=15)
            (args.out / f"profile_{name}_{entry}.txt").write_text(table)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
