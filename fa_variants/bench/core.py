"""The pure part of the benchmark: cases, the FLOP count, and the loops that turn a timing function into
result records (tests drive them with synthetic timings; `runtime.GpuRuntime` supplies the real ones)."""
from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Callable

from fa_variants.bench import report

TOKENS = 16384  # batch * seqlen
HIDDEN = 2048  # num_heads * head_dim


# ---------------------------------------------------------------------------------------------- the maths
def attention_flops(batch: int, heads: int, seqlen_q: int, seqlen_k: int, head_dim: int, causal: bool) -> float:
    """FLOPs of one attention forward by the FlashAttention-paper convention: two matmuls (Q K^T and P V) of
    2 * Nq * Nk * D each per (batch, head), halved for causal (about half the scores are masked)."""
    flops = 4.0 * batch * heads * seqlen_q * seqlen_k * head_dim
    return flops / 2 if causal else flops


def tflops(flops: float, ms: float) -> float:
    """10^12 FLOP/s from FLOPs and a time in milliseconds."""
    return flops / (ms * 1e-3) / 1e12


class BenchShape:
    """The benchmark's shape rule for a class with ``head_dim``, ``seqlen`` and ``causal`` fields: q, k, v of shape
    (batch, seqlen, heads, head_dim), batch * seqlen = TOKENS (at least 1) and heads * head_dim = HIDDEN."""

    head_dim: int
    seqlen: int
    causal: bool

    @property
    def batch(self) -> int:
        return max(1, TOKENS // self.seqlen)

    @property
    def heads(self) -> int:
        return HIDDEN // self.head_dim

    @property
    def flops(self) -> float:
        return attention_flops(self.batch, self.heads, self.seqlen, self.seqlen, self.head_dim, self.causal)


@dataclass(frozen=True)
class Case(BenchShape):
    """One benchmark shape in one dtype (BenchShape's rule)."""

    dtype: str
    head_dim: int
    seqlen: int
    causal: bool

    @property
    def label(self) -> str:
        return f"{self.dtype} D={self.head_dim} N={self.seqlen} {'causal' if self.causal else 'non-causal'}"

    def fields(self) -> dict:
        return dict(asdict(self), batch=self.batch, heads=self.heads)


@dataclass(frozen=True)
class Impl:
    """An attention implementation: fn(q, k, v, causal) on (batch, seqlen, heads, head_dim) tensors."""

    name: str
    kind: str  # "ours" or "peer"
    fn: Callable


@dataclass
class Timing:
    """What a timing function returns for one (implementation, case)."""

    ms: float  # median forward time, milliseconds
    first_call_s: float | None = None  # the first call, compile included for JIT kernels
    max_diff: float | None = None  # max |out - torch SDPA out| on the same inputs (ours only)


@dataclass
class Plan:
    cases: list[Case]
    ours: list[str]
    peers: list[str]
    memory_seqlens: list[int]
    memory_dtype: str
    memory_head_dim: int
    warmup_ms: float
    rep_ms: float
    input_sets: int  # 0: enough to exceed the L2 cache (see GpuRuntime.input_sets)
    settings: dict = field(default_factory=dict)


# ------------------------------------------------------------------------------------------------- loops
def short_error(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0] if text else "")[:240]


def is_oom(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, getattr(torch, "OutOfMemoryError", torch.cuda.OutOfMemoryError))


def describe_error(exc: BaseException) -> str:
    """One line for a failed measurement: ValueError -> 'cannot serve: ...' (the backend contract for a shape,
    dtype or GPU it does not handle), out of memory -> 'out of memory: ...', anything else -> 'Type: ...'."""
    if isinstance(exc, ValueError):
        return f"cannot serve: {short_error(exc)}"
    if is_oom(exc):
        return f"out of memory: {short_error(exc)}"
    return f"{type(exc).__name__}: {short_error(exc)}"


def sweep(cases: list[Case], impls: list[Impl], timer: Callable[[Impl, Case], Timing], *,
          log: Callable[[str], None] = print, step: Callable[[str], None] | None = None,
          on_case: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Time every implementation on every case and return one result record per pair (see bench.report).

    A failure never stops the sweep: it is recorded in the record's "error" and logged once per distinct
    (implementation, message), so a backend that cannot serve a shape prints one clear line.
    """
    results: list[dict] = []
    said: set[tuple[str, str]] = set()
    for case in cases:
        for impl in impls:
            if step:
                step(f"{impl.name} {case.label}")
            rec = dict(impl=impl.name, kind=impl.kind, **case.fields(), ms=None, tflops=None,
                       first_call_s=None, max_diff=None, error=None)
            try:
                t = timer(impl, case)
            except Exception as exc:  # noqa: BLE001 - every failure is reported, none stops the sweep
                rec["error"] = describe_error(exc)
                generic = re.sub(r"\d+", "#", rec["error"])
                if (impl.name, generic) not in said:
                    said.add((impl.name, generic))
                    log(f"{impl.name} on {case.label}: {rec['error']}")
            else:
                rec.update(ms=t.ms, tflops=tflops(case.flops, t.ms), first_call_s=t.first_call_s,
                           max_diff=t.max_diff)
            results.append(rec)
        log(summary_line(case, results[-len(impls):]))
        if on_case:
            on_case(results)
    return results


def summary_line(case: Case, records: list[dict]) -> str:
    """'bf16 D=128 N=4096 causal  fa2=310 sdpa-flash=340 ... fa2/best=0.91' for one case."""
    row = report.case_rows(records)[0]
    cells = [f"{r['impl']}={report.cell_text(r['tflops'], r['error'])}" for r in records]
    cells += [f"{n}/best={v:.2f}" for n, v in row["ratio"].items()]
    return f"{case.label:28s} " + "  ".join(cells)


def memory_sweep(seqlens: list[int], impls: list[Impl], measure: Callable[[Impl, int], tuple[float, float]], *,
                 dtype: str, head_dim: int, log: Callable[[str], None] = print,
                 step: Callable[[str], None] | None = None,
                 on_row: Callable[[list[dict]], None] | None = None) -> list[dict]:
    """Peak memory of one forward per implementation as seqlen grows (batch 1, heads = HIDDEN // head_dim).

    measure(impl, seqlen) -> (inputs_mib, peak_mib). An implementation that fails (runs out of memory,
    cannot serve the shape) is not tried at larger seqlens (its later records say so); the others go on.
    on_row(rows so far) runs after each record, so a run cut off by a time limit keeps what it measured.
    """
    rows, stopped = [], {}
    for n in sorted(seqlens):
        for impl in impls:
            if step:
                step(f"memory {impl.name} N={n}")
            rec = dict(impl=impl.name, kind=impl.kind, dtype=dtype, head_dim=head_dim, seqlen=n, batch=1,
                       heads=HIDDEN // head_dim, inputs_mib=None, peak_mib=None, error=None)
            if impl.name in stopped:
                rec["error"] = stopped[impl.name]
            else:
                try:
                    rec["inputs_mib"], rec["peak_mib"] = measure(impl, n)
                except Exception as exc:  # noqa: BLE001
                    rec["error"] = describe_error(exc)
                    stopped[impl.name] = f"{rec['error'].split(':')[0]} (not tried after seqlen {n})"
                    log(f"memory: {impl.name} at seqlen {n}: {rec['error']}; not tried at larger seqlens")
            rows.append(rec)
            if on_row:
                on_row(rows)
    return rows


