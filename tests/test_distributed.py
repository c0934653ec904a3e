"""fa_variants.distributed: context-parallel (ring) attention, checked against single-process attention.

The multi-process tests start `world` = 2 and 4 CPU processes (tests/cp_worker.py forks them from one fresh
interpreter; gloo over the loopback interface, a file store in a temporary folder, so no port to pick), run
every case in one launch per world, and judge the saved results here: the unsharded output and LSE against the float64 reference (the
project's tolerance rule) and against ``fa_variants.attention`` on the whole sequence, on the reference backend.
"""
from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import fa_variants
from fa_variants import distributed as cp
from fa_variants.reference import causal_visible, max_abs_error
from helpers import assert_attention_ok, make_qkv

ROOT = Path(__file__).resolve().parents[1]
WORKER = Path(__file__).with_name("cp_worker.py")
TIMEOUT_S = 150  # per launch (the worker stops its ranks after 90 s); a hang fails instead of blocking CI

F16, BF16, F32, F64 = torch.float16, torch.bfloat16, torch.float32, torch.float64
#: the merge tests run on the CPU (eager) and on one GPU, where the merge is the compiled one (``_compiled``)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.fixture(autouse=True)
def _cuda_merge_compiled(request):
    """A test run on CUDA must have merged through the compiled path, not the eager fallback a compile failure
    takes (it only warns)."""
    yield
    callspec = getattr(request.node, "callspec", None)
    if callspec is not None and callspec.params.get("device") == "cuda":
        assert not cp._COMPILED_MERGE["failed"], "torch.compile of the LSE merge failed: the eager fallback ran"
#: name -> sizes and options; every case runs with world 2 and 4
GOOD = {
    "noncausal_f64": dict(seqlen=24, dtype=F64, causal=False, layout="contiguous"),
    "noncausal_zigzag_f32": dict(seqlen=40, dtype=F32, causal=False, layout="zigzag", head_dim=24),
    "causal_zigzag_f32": dict(seqlen=48, dtype=F32, causal=True, layout="zigzag"),
    "causal_zigzag_uneven_f64": dict(seqlen=37, dtype=F64, causal=True, layout="zigzag"),
    "causal_contiguous_uneven_f64": dict(seqlen=29, dtype=F64, causal=True, layout="contiguous"),
    "gqa_causal_zigzag_f64": dict(seqlen=32, dtype=F64, causal=True, layout="zigzag", heads=6, heads_kv=2),
    "mqa_noncausal_uneven_f32": dict(seqlen=23, dtype=F32, causal=False, layout="contiguous", heads=4, heads_kv=1),
    "cross_noncausal_uneven_f64": dict(seqlen=13, seqlen_k=30, dtype=F64, causal=False, layout="contiguous"),
    "scale_causal_zigzag_f64": dict(seqlen=20, dtype=F64, causal=True, layout="zigzag", softmax_scale=-0.7),
    "tiny_causal_zigzag_f64": dict(seqlen=3, dtype=F64, causal=True, layout="zigzag"),  # world 4: a rank has 0
    # the own step cut into pieces of one or two rows (world 4: 3 rows a rank, tail 1 row first, then head 2)
    "small_causal_zigzag_f64": dict(seqlen=12, dtype=F64, causal=True, layout="zigzag"),
    "tiny_causal_contiguous_f64": dict(seqlen=6, dtype=F64, causal=True, layout="contiguous"),  # 2, 2, 1, 1
    "tiny_noncausal_uneven_f64": dict(seqlen=5, dtype=F64, causal=False, layout="contiguous"),  # 2, 1, 1, 1
    # 16-bit inputs: rounded once, after the merge (test_matches_single_process)
    "causal_zigzag_bf16": dict(seqlen=40, dtype=BF16, causal=True, layout="zigzag", head_dim=32),
    "noncausal_gqa_f16": dict(seqlen=33, dtype=F16, causal=False, layout="contiguous", heads=4, heads_kv=2),
    "after_errors_f64": dict(seqlen=17, dtype=F64, causal=True, layout="zigzag"),  # runs after the bad cases
    # distributed.OVERLAP_START off (check, post, then the whole own step; on elsewhere: head, check, tail)
    "check_first_causal_zigzag_uneven_f64": dict(seqlen=37, dtype=F64, causal=True, layout="zigzag",
                                                 overlap_start=False),
    "check_first_noncausal_gqa_f32": dict(seqlen=26, dtype=F32, causal=False, layout="contiguous", heads=4,
                                          heads_kv=2, overlap_start=False),
}
_SHARD = {"zigzag": cp.zigzag_shard, "contiguous": cp.contiguous_shard}
_UNSHARD = {"zigzag": cp.zigzag_unshard, "contiguous": cp.contiguous_unshard}


def _inputs(gen, seqlen, dtype, seqlen_k=None, heads=2, heads_kv=None, head_dim=16, batch=2, **_):
    seqlen_k = seqlen if seqlen_k is None else seqlen_k
    heads_kv = heads if heads_kv is None else heads_kv
    return make_qkv(batch, seqlen, seqlen_k, heads, heads_kv, head_dim, dtype=dtype, generator=gen)


def _options(spec):
    return dict(causal=spec["causal"], layout=spec["layout"], softmax_scale=spec.get("softmax_scale"),
                backend="reference")


def _sharded(tensors, layout, world):
    return [tuple(_SHARD[layout](t, 1, r, world) for t in tensors) for r in range(world)]


def _cases(world: int, gen) -> tuple[dict, list]:
    """(inputs of the good cases by name, the list of cases for the workers, in order)."""
    inputs, cases = {}, []
    for name, spec in GOOD.items():
        if name == "after_errors_f64":
            cases += _bad_cases(world, gen)
        inputs[name] = _inputs(gen, **spec)
        cases.append(dict(name=name, args=_sharded(inputs[name], spec["layout"], world),
                          kwargs=[_options(spec)] * world, group="world",
                          overlap_start=spec.get("overlap_start", True)))
    # a group of one per rank: plain attention of the rank's own shard
    inputs["self_group"] = _inputs(gen, 12, F64)
    cases.append(dict(name="self_group", args=_sharded(inputs["self_group"], "contiguous", world),
                      kwargs=[dict(causal=True, layout="contiguous", backend="reference")] * world, group="self"))
    # options that differ across ranks only where they mean the same: not causal, one rank names a layout (only
    # causal reads it) and the scale 0.0 there is -0.0 elsewhere
    inputs["same_meaning"] = _inputs(gen, 10, F64)
    cases.append(dict(name="same_meaning", args=_sharded(inputs["same_meaning"], "contiguous", world),
                      kwargs=[dict(causal=False, softmax_scale=0.0 if r == 0 else -0.0, backend="reference",
                                   layout="zigzag" if r == 0 else None) for r in range(world)], group="world"))
    return inputs, cases


def _bad_cases(world: int, gen) -> list:
    base = dict(causal=True, layout="zigzag", backend="reference")
    good = _sharded(_inputs(gen, 16, F64), "zigzag", world)

    def with_rank1(args, kwargs=base):
        return dict(args=[args if r == 1 else good[r] for r in range(world)],
                    kwargs=[kwargs if r == 1 else base for r in range(world)], group="world")

    q1, k1, v1 = good[1]
    narrow = _inputs(gen, q1.shape[1], F64, head_dim=8)
    # lengths that zig-zag sharding never gives: rank 0 two tokens more, rank 1 two fewer
    full = _inputs(gen, 8 * world, F64)
    lengths = [10, 6] + [8] * (world - 2)
    skewed = [tuple(t.split(lengths, 1)[r] for t in full) for r in range(world)]
    cross = _inputs(gen, 5, F64, seqlen_k=7)
    return [
        dict(name="bad_head_dim", **with_rank1(narrow)),
        dict(name="bad_dtype", **with_rank1((q1.float(), k1.float(), v1.float()))),
        dict(name="bad_causal", **with_rank1(good[1], dict(base, causal=False))),
        dict(name="bad_local", **with_rank1((q1, k1[0], v1))),
        # the own step's head is launched before the check's answer: computed, then the same error on every rank
        dict(name="bad_zigzag_lengths", args=skewed, kwargs=[base] * world, group="world"),
        dict(name="bad_causal_cross", args=[cross] * world, kwargs=[base] * world, group="world"),
        # a backend only rank 1 cannot use (fa2 needs a GPU; an unknown name): before, rank 1 raised from the own
        # step's first piece, before the shape check's all-gather, and the other ranks paired that all-gather with
        # rank 1's next call (a result from mismatched calls, then a hang or a closed peer)
        dict(name="bad_backend", **with_rank1(good[1], dict(base, backend="fa2"))),
        dict(name="bad_backend_name", **with_rank1(good[1], dict(base, backend="fa9"))),
        # causal without a layout: the shards carry no positions, so zig-zag shards read as contiguous (or the
        # reverse) would be a silent wrong answer
        dict(name="bad_no_layout", **with_rank1(good[1], dict(causal=True, backend="reference"))),
        # every rank passes a group it is not in
        dict(name="bad_not_member", args=good, kwargs=[base] * world, group="other"),
    ]


def _launch(world: int, cases: list, folder: Path) -> list[dict]:
    folder.mkdir(parents=True)
    torch.save(cases, folder / "cases.pt")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
               GLOO_SOCKET_IFNAME="lo", OMP_NUM_THREADS="1")
    with open(folder / "log", "w") as log:
        # its own session, so that a hang is ended with every rank it forked (the worker has its own limit)
        proc = subprocess.Popen([sys.executable, str(WORKER), str(world), str(folder / "cases.pt"), str(folder)],
                                env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            proc.wait(timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    if proc.returncode != 0:
        pytest.fail(f"world {world}: the ranks failed or hung (exit {proc.returncode}, limit {TIMEOUT_S} s):\n"
                    + (folder / "log").read_text(encoding="utf-8")[-4000:])
    return [torch.load(folder / f"rank{r}.pt") for r in range(world)]


@pytest.fixture(scope="module", params=[2, 4], ids=lambda w: f"world{w}")
def ring(request, tmp_path_factory):
    """(world, seed, inputs by case name, per-rank results by case name) of one launch."""
    world, seed = request.param, random.randrange(2**31)
    inputs, cases = _cases(world, torch.Generator().manual_seed(seed))
    results = _launch(world, cases, tmp_path_factory.mktemp("cp") / f"world{world}")
    return world, seed, inputs, results


def _gathered(results, name, layout):
    outs = [r[name] for r in results]
    for rank, o in enumerate(outs):
        assert o[0] != "error", f"rank {rank} raised {o[1]}: {o[2]}"
    return _UNSHARD[layout]([o[0] for o in outs], 1), _UNSHARD[layout]([o[1] for o in outs], 2)


@pytest.mark.parametrize("name", list(GOOD))
def test_matches_single_process(ring, name):
    world, seed, inputs, results = ring
    spec = GOOD[name]
    q, k, v = inputs[name]
    out, lse = _gathered(results, name, spec["layout"])
    scale = spec.get("softmax_scale")
    where = f"{name}, world {world}, seed {seed}"
    assert_attention_ok(out, lse, q, k, v, spec["causal"], scale, what=where)
    single, single_lse = fa_variants.attention(q, k, v, causal=spec["causal"], softmax_scale=scale,
                                               backend="reference", return_lse=True)
    assert max_abs_error(lse, single_lse) <= 1e-5, where  # the LSE returned is float32
    if spec["dtype"] in (F16, BF16):
        # the reference backend's partials come unrounded, so each output is the float32 result rounded once:
        # within half a unit in the last place of it (plus the float32 maths' own difference), where rounding
        # every step's partial and again after the merge gave up to a whole unit
        exact = fa_variants.attention(q.float(), k.float(), v.float(), causal=spec["causal"], softmax_scale=scale,
                                      backend="reference")
        half_ulp = torch.finfo(spec["dtype"]).eps / 2 * torch.exp2(torch.floor(torch.log2(exact.abs())))
        excess = (out.float() - exact).abs() - half_ulp - 1e-5 * exact.abs() - 1e-6
        assert excess.max() <= 0, f"{where}: rounded more than once (excess {excess.max().item():.3g})"
        return
    # not bitwise: the ring adds the keys in another order; float64 inputs merge in float64 (the reference
    # backend's partials carry a float64 LSE), so their tolerance is float64's, not float32's
    tol = 1e-12 if spec["dtype"] == F64 else 1e-5
    assert max_abs_error(out, single) <= tol, where


def test_group_of_one_is_plain_attention(ring):
    world, seed, inputs, results = ring
    for rank, (q, k, v) in enumerate(_sharded(inputs["self_group"], "contiguous", world)):
        out, lse = results[rank]["self_group"]
        want, want_lse = fa_variants.attention(q, k, v, causal=True, backend="reference", return_lse=True)
        assert max_abs_error(out, want) <= 1e-12 and max_abs_error(lse, want_lse) <= 1e-6, (rank, seed)


def test_options_of_the_same_meaning_fit_together(ring):
    """Not causal, a layout on one rank and none on the others, and softmax_scale 0.0 against -0.0: accepted
    (the shape check compares what the options mean), and the result is uniform attention over all keys."""
    world, seed, inputs, results = ring
    out, _ = _gathered(results, "same_meaning", "contiguous")
    q, k, v = inputs["same_meaning"]
    want = fa_variants.attention(q, k, v, softmax_scale=0.0, backend="reference")
    assert max_abs_error(out, want) <= 1e-12, seed


@pytest.mark.parametrize("name, every_rank, rank1", [
    ("bad_head_dim", "rank 1 has head_dim 8 but rank 0 has 16", None),
    ("bad_dtype", "rank 1 has dtype torch.float32 but rank 0 has torch.float64", None),
    ("bad_causal", "rank 1 has causal False but rank 0 has True", None),
    ("bad_local", "rank 1 rejected its inputs", "k must be 4-D"),
    ("bad_zigzag_lengths", "rank 0 holds 10 tokens, but zig-zag sharding of", None),
    ("bad_causal_cross", None, None),
    ("bad_backend", "rank 1 rejected its inputs", "fa2 runs on sm_80"),
    ("bad_backend_name", "rank 1 rejected its inputs", "unknown backend 'fa9'"),
    ("bad_no_layout", "rank 1 rejected its inputs", "layout is required when causal"),
    ("bad_not_member", "this process is not a member of group", None),
])
def test_bad_input_raises_on_every_rank(ring, name, every_rank, rank1):
    """Every rank raises a one-line ValueError (none hangs), and the group stays usable afterwards."""
    world, _, _, results = ring
    for rank, result in enumerate(results):
        assert result[name][0] == "error", f"rank {rank} did not raise"
        _, kind, message = result[name]
        assert kind in ("ValueError", "BackendUnavailableError") and "\n" not in message, (rank, kind, message)
        if rank == 1 and rank1 is not None:
            assert rank1 in message, message
        elif every_rank is not None:
            assert every_rank in message, message
        else:
            assert "self-attention shards" in message, message


# ------------------------------------------------------------------------------------- single process

@pytest.mark.parametrize("world", [1, 2, 3, 4])
@pytest.mark.parametrize("seqlen", [0, 1, 5, 16, 23])
def test_shard_unshard_round_trip(world, seqlen):
    x = torch.randn(2, seqlen, 3)
    for shard, unshard, chunks in ((cp.zigzag_shard, cp.zigzag_unshard, 2 * world),
                                   (cp.contiguous_shard, cp.contiguous_unshard, world)):
        shards = [shard(x, 1, r, world) for r in range(world)]
        assert torch.equal(unshard(shards, 1), x)
        lengths = [s.shape[1] for s in shards]
        assert sum(lengths) == seqlen and max(lengths) - min(lengths) <= (2 if chunks > world else 1)


def test_zigzag_order_and_uneven_rule():
    x = torch.arange(10)
    # 10 tokens in 4 chunks: lengths 3, 3, 2, 2 (tensor_split: the first ones one longer)
    assert cp.zigzag_shard(x, 0, 0, 2).tolist() == [0, 1, 2, 8, 9]
    assert cp.zigzag_shard(x, 0, 1, 2).tolist() == [3, 4, 5, 6, 7]
    assert cp.contiguous_shard(x, 0, 1, 3).tolist() == [4, 5, 6]
    with pytest.raises(ValueError, match="shard 0 has length 4 along dim 0, but zig-zag sharding of 10"):
        cp.zigzag_unshard([x[:4], x[4:]], 0)
    with pytest.raises(ValueError, match=r"rank must be in \[0, 2\)"):
        cp.zigzag_shard(x, 0, 2, 2)
    with pytest.raises(ValueError, match="dim 1 is out of range"):
        cp.contiguous_shard(x, 1, 0, 2)
    with pytest.raises(TypeError, match="world must be an int"):
        cp.zigzag_shard(x, 0, 0, 2.0)


def test_zigzag_layout_is_torchs_head_tail_load_balancer():
    """Buffers sharded by torch's context_parallel (load balance on) are in our zig-zag order."""
    balancer = pytest.importorskip("torch.distributed.tensor.experimental._context_parallel._load_balancer")
    world, seqlen = 3, 24
    index = balancer._HeadTailLoadBalancer(seqlen, world, "cpu")._generate_indices().flatten()
    ours = torch.cat([cp.zigzag_shard(torch.arange(seqlen), 0, r, world) for r in range(world)])
    assert index.tolist() == ours.tolist()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True])
def test_merge_of_key_blocks_is_attention_over_all_keys(causal, device):
    """Partials over disjoint key blocks (one empty, one fully masked under causal) merge to full attention."""
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    q, k, v = _inputs(gen, 9, F64, seqlen_k=20, heads=4, heads_kv=2)
    want, want_lse = fa_variants.attention(q, k, v, causal=causal, backend="reference", return_lse=True)
    # bottom-right causal over 20 keys for 9 queries: query i sees keys <= i + 11
    out = torch.zeros_like(q, device=device)
    lse = torch.full((2, 4, 9), -math.inf, dtype=F64, device=device)
    for keys in (slice(0, 7), slice(7, 7), slice(7, 20)):
        kb, vb = k[:, keys], v[:, keys]
        if causal:  # the mask of the whole sequence, restricted to the block, through the reference directly
            part, part_lse = _masked_attention(q, kb, vb, causal_visible(9, 20)[:, keys])
        else:
            part, part_lse = fa_variants.attention(q, kb, vb, backend="reference", return_lse=True)
        cp.merge_partial_(out, lse, part.to(device), part_lse.to(device))
    out, lse = out.cpu(), lse.cpu()
    assert max_abs_error(out, want) <= 1e-6 and max_abs_error(lse.float(), want_lse) <= 1e-5


def _masked_attention(q, k, v, visible):
    """Plain float64 attention with an explicit (seqlen_q, seqlen_k) mask; rows that see nothing: 0, -inf."""
    group = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(group, 2), v.repeat_interleave(group, 2)
    s = torch.einsum("bqhd,bkhd->bhqk", q, k) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~visible, -math.inf)
    lse = torch.logsumexp(s, -1)
    p = torch.where(lse[..., None] == -math.inf, torch.zeros_like(s), torch.exp(s - lse[..., None]))
    return torch.einsum("bhqk,bkhd->bqhd", p, v), lse


@pytest.mark.parametrize("device", DEVICES)
def test_merge_neutral_element_and_all_masked_rows(device):
    out = torch.randn(1, 3, 2, 4, dtype=F32)
    lse = torch.tensor([[[0.5, -math.inf, -math.inf], [1.0, 2.0, -math.inf]]])
    part = torch.randn(1, 3, 2, 4, dtype=torch.bfloat16)
    part_lse = torch.tensor([[[-math.inf, 0.3, -math.inf], [-math.inf, -math.inf, -math.inf]]])
    before, before_part = out.clone(), part.float()
    out, lse = _merged_on(device, out, lse, part, part_lse)
    assert torch.equal(out[:, 0, 0], before[:, 0, 0])          # -inf partial: the accumulator unchanged
    assert torch.allclose(out[:, 1, 0], before_part[:, 1, 0])   # -inf accumulator: the partial
    assert torch.equal(out[:, 2], torch.zeros_like(out[:, 2]))  # both -inf: 0 and LSE -inf, no NaN
    assert lse[0, 0, :2].tolist() == pytest.approx([0.5, 0.3])
    assert lse[0, 0, 2] == -math.inf and lse[0, 1, 2] == -math.inf and not torch.isnan(out).any()


@pytest.mark.parametrize("device", DEVICES)
def test_a_partial_of_weight_zero_adds_nothing_whatever_its_o(device):
    """A partial with LSE -inf weighs 0, also when its O holds NaN or inf (an accumulator started with torch.empty
    and lse -inf, "no keys yet"): 0 x NaN made the row NaN (a break-it pass, session 34)."""
    for fill in (math.nan, math.inf):
        out = torch.full((1, 2, 1, 4), fill, dtype=F32)
        lse = torch.full((1, 1, 2), -math.inf)
        part, part_lse = torch.randn(1, 2, 1, 4), torch.randn(1, 1, 2)
        merged, merged_lse = _merged_on(device, out, lse, part, part_lse)
        torch.testing.assert_close(merged, part.float())
        torch.testing.assert_close(merged_lse, part_lse)
        out, lse = torch.randn(1, 2, 1, 4, dtype=F32), torch.randn(1, 1, 2)  # and the other way round
        merged, _ = _merged_on(device, out.clone(), lse, torch.full((1, 2, 1, 4), fill), torch.full((1, 1, 2), -math.inf))
        torch.testing.assert_close(merged, out)
    acc, acc_lse = torch.empty(1, 2, 1, 4).fill_(math.nan), torch.full((1, 1, 2), -math.inf)
    cp.merge_partial_(acc, acc_lse, part, part_lse)
    torch.testing.assert_close(acc, part)


def test_needs_an_initialized_process_group():
    q = torch.randn(1, 4, 1, 8)
    with pytest.raises(RuntimeError, match="torch.distributed is not initialized"):
        cp.context_parallel_attention(q, q, q)


def test_group_that_is_not_a_process_group_is_one_line(tmp_path):
    """group="x" or 0 (a name, a rank) on an initialised gloo group of one: a TypeError naming group (torch's own
    "Group x is not registered" error named no argument of ours; a break-it pass, session 42)."""
    import torch.distributed as dist

    q = torch.randn(1, 4, 1, 8)
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        for group in ("x", 0):
            with pytest.raises(TypeError, match="^group must be a torch.distributed ProcessGroup or None, got"):
                cp.context_parallel_attention(q, q, q, group=group)
        torch.testing.assert_close(cp.context_parallel_attention(q, q, q, group=dist.group.WORLD),
                                   fa_variants.attention(q, q, q))
    finally:
        dist.destroy_process_group()


def test_autocast_casts_the_inputs_as_attention_does(tmp_path):
    """Under torch.autocast (CPU, bf16) context_parallel_attention takes mixed float32 / bf16 inputs as
    fa_variants.attention does (cast to bf16, then without autocast; session 28), here on a gloo group of one in
    this process: bit for bit attention on the cast inputs."""
    import torch.distributed as dist

    g = torch.Generator().manual_seed(int(torch.randint(0, 2**31, ())))
    q, v = torch.randn(1, 12, 2, 16, generator=g), torch.randn(1, 12, 1, 16, generator=g)
    k = torch.randn(1, 12, 1, 16, generator=g).bfloat16()
    dist.init_process_group("gloo", store=dist.FileStore(str(tmp_path / "store"), 1), rank=0, world_size=1)
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            out, lse = cp.context_parallel_attention(q, k, v, causal=True, layout="contiguous", return_lse=True)
    finally:
        dist.destroy_process_group()
    want, want_lse = fa_variants.attention(q.bfloat16(), k, v.bfloat16(), causal=True, return_lse=True)
    assert out.dtype == torch.bfloat16 and torch.equal(out, want) and torch.equal(lse, want_lse)


@pytest.mark.parametrize("layout", cp.LAYOUTS)
@pytest.mark.parametrize("world", [1, 2, 3, 4, 5])
@pytest.mark.parametrize("seqlen", [40, 37])
def test_causal_plan_computes_each_visible_pair_once_and_nothing_masked(layout, world, seqlen):
    """The causal step plan, on token positions: every (query, key) pair with key <= query is computed exactly
    once over all ranks and steps, an unmasked step holds no pair with key > query, a causal step's local mask
    is the global one; with zig-zag, every rank computes the same number of pairs (to within uneven chunks)."""
    positions = torch.arange(seqlen)
    shards = [_SHARD[layout](positions, 0, r, world) for r in range(world)]
    sizes = cp._chunk_sizes(seqlen, 2 * world)
    seen = torch.zeros(seqlen, seqlen, dtype=torch.int64)
    work = []
    for rank in range(world):
        work.append(0)
        for src in range(world):
            step = cp._plan(rank, src, True, layout, sizes[rank], sizes[src])
            if step is None:
                assert layout == "contiguous" and src > rank
                continue
            rows, keys = shards[rank][step.rows], shards[src][step.keys]
            visible = keys[None, :] <= rows[:, None]
            if step.causal:
                local = torch.ones(len(rows), len(keys), dtype=torch.bool).tril()
                assert torch.equal(visible, local), (rank, src)
            else:
                assert visible.all(), f"rank {rank} computes masked pairs with the K/V of rank {src}"
            seen[rows[:, None].expand_as(visible)[visible], keys[None, :].expand_as(visible)[visible]] += 1
            work[-1] += len(rows) * len(keys)
    assert torch.equal(seen, torch.ones(seqlen, seqlen, dtype=torch.int64).tril())
    if layout == "zigzag":
        chunk = -(-seqlen // (2 * world))
        assert max(work) - min(work) <= 4 * world * chunk, work  # equal when 2*world divides seqlen
        if seqlen % (2 * world) == 0:
            assert len(set(work)) == 1, work


def test_merge_traces_as_one_graph():
    """The merges that CUDA runs compiled: dynamo traces them whole (fullgraph, the module's options, row-slice
    views, a second size) and gives the eager result, -inf rows included; ``_merged_into`` writes into views of
    a larger output, leaving its other rows alone (backend "aot_eager": the trace and the functionalisation of
    the in-place writes, without inductor's compile)."""
    compiled = torch.compile(cp._merged, backend="eager", **cp._COMPILE_OPTIONS)
    into = torch.compile(cp._merged_into, backend="aot_eager", **cp._COMPILE_OPTIONS)
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    for seqlen, rows in ((9, slice(None)), (12, slice(5, None))):
        out_a, out_b = (torch.randn(2, seqlen, 3, 8, generator=gen, dtype=torch.bfloat16) for _ in range(2))
        lse_a, lse_b = (torch.randn(2, 3, seqlen, generator=gen) for _ in range(2))
        lse_a[0, 0, -3:], lse_b[0, 0, -2:] = -math.inf, -math.inf  # one row with both -inf
        args = (out_a[:, rows], lse_a[:, :, rows], out_b[:, rows], lse_b[:, :, rows])
        for dtype in (torch.bfloat16, torch.float32):
            got, want = compiled(*args, dtype), cp._merged(*args, dtype)
            assert got[0].dtype == dtype and max_abs_error(got[0], want[0]) <= 1e-6
            assert max_abs_error(got[1], want[1]) <= 1e-6
            assert torch.equal(got[0][0, -1, 0], torch.zeros(8, dtype=dtype))
            if dtype != torch.float32:
                continue
            dst, dst_lse = torch.full((2, seqlen, 3, 8), math.nan, dtype=dtype), torch.full((2, 3, seqlen), math.nan)
            into(dst[:, rows], dst_lse[:, :, rows], *args)
            assert max_abs_error(dst[:, rows], want[0]) <= 1e-6 and max_abs_error(dst_lse[:, :, rows], want[1]) <= 1e-6
            outside = torch.ones(seqlen, dtype=torch.bool)
            outside[rows] = False
            assert dst[:, outside].isnan().all() and dst_lse[:, :, outside].isnan().all()


def _merged_on(device, out, lse, part, part_lse):
    """merge_partial_ on ``device`` (the operands copied there), the accumulator brought back to the CPU."""
    out, lse = out.to(device), lse.to(device)
    cp.merge_partial_(out, lse, part.to(device), part_lse.to(device))
    return out.cpu(), lse.cpu()


@pytest.mark.parametrize("device", DEVICES)
def test_merger_of_row_pieces(device):
    """_Merger with partials over row ranges that cut the rows into segments (as the ring's own step cut into
    head and tail, then steps over all rows or the tail): each row's result is the merge of the partials that
    cover it, in any order of segments; rows no partial covers give 0 with LSE -inf."""
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    q = torch.randn(2, 10, 3, 4, generator=gen, dtype=F64)
    cover = [(0, 4), (4, 8), (0, 8), (4, 8), (2, 8)]
    parts = [(torch.randn(2, b - a, 3, 4, generator=gen, dtype=F64), torch.randn(2, 3, b - a, generator=gen, dtype=F64))
             for a, b in cover]
    merger = cp._Merger(q.to(device), cover)
    assert merger.segments == [(0, 2), (2, 4), (4, 8), (8, 10)]
    for out_part, lse_part in parts:
        merger.add(out_part.to(device), lse_part.to(device))
    out, lse = (t.cpu() for t in merger.result())
    want = torch.zeros_like(q)
    want_lse = torch.full((2, 3, 10), -math.inf, dtype=F64)
    for (a, b), part in zip(cover, parts):
        cp.merge_partial_(want[:, a:b], want_lse[:, :, a:b], *part)
    assert out.dtype == F64 and lse.dtype == F32
    assert max_abs_error(out, want) <= 1e-12 and max_abs_error(lse, want_lse.float()) <= 1e-6
    assert torch.equal(out[:, 8:], torch.zeros_like(out[:, 8:])) and (lse[:, :, 8:] == -math.inf).all()


class _SimulatedRing:
    """The ring's transport inside one process: step s + 1 'receives' the K/V shard of rank (rank - s - 1) mod
    world from the list of every rank's shards (what ``_Ring.post`` / ``_Ring.wait`` hand back, checked against
    the length the ring announces)."""

    def __init__(self, shards, rank: int, world: int):
        self.shards, self.rank, self.world, self.step = shards, rank, world, 0

    def post(self, k, v, seqlen_in: int):
        self.step += 1
        src = (self.rank - self.step) % self.world
        assert self.shards[src][0].shape[1] == seqlen_in, (self.rank, self.step)
        return src

    def wait(self, src: int):
        return self.shards[src]


def _ring_in_one_process(q, k, v, world: int, causal: bool, layout: str, overlap_start: bool,
                         scale: float | None = None):
    """Every rank's ``_ring_attention`` as ``context_parallel_attention`` runs it (the own step's first piece
    launched early when ``overlap_start``), over a simulated transport; the unsharded (out, lse)."""
    shard, unshard = _SHARD[layout], _UNSHARD[layout]
    qs = [shard(q, 1, r, world) for r in range(world)]
    kvs = [(shard(k, 1, r, world), shard(v, 1, r, world)) for r in range(world)]
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else scale
    rows = [cp._shape_row(qs[r], kvs[r][0], causal, layout, scale) for r in range(world)]
    cp._check_rows(rows, causal, layout)
    outs, lses = [], []
    for rank in range(world):
        (k_r, v_r), q_r = kvs[rank], qs[rank]
        pieces = cp._own_pieces(q_r.shape[1], k_r.shape[1], causal, layout) if overlap_start else None
        early = None
        if pieces is not None:
            if causal:  # the larger piece first: (query, key) pairs the causal mask leaves, tail then head
                (a, b), (_, h) = pieces[0].rows, pieces[1].rows
                assert (a + 1 + b) * (b - a) >= h * (h + 1), pieces
            early = (pieces, *cp._own_piece(q_r, k_r, v_r, pieces[0], causal, scale, "reference"))
        out, lse = cp._ring_attention(q_r, k_r, v_r, rows, None, rank, world, causal, layout, scale, "reference",
                                      early=early, ring=_SimulatedRing(kvs, rank, world))
        outs.append(out)
        lses.append(lse)
    return unshard(outs, 1), unshard(lses, 2)


@pytest.mark.parametrize("world", [2, 3, 4, 5])
def test_ring_in_one_process_every_small_length(world):
    """The ring's steps and merges for every rank in one process (transport simulated): tiny and uneven lengths
    (ranks with 0, 1, 2 or 3 tokens), one long enough for the own step's cut at a multiple of 128 rows,
    causal zig-zag and contiguous and non-causal, the own step cut into pieces (larger first) or whole; the
    result is attention over the whole sequence (the gloo tests run the real transport on fewer cases)."""
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    long = (518,) if world == 2 else ()  # 259 rows a rank: the own step cut at 128 when not zig-zag causal
    for seqlen in (1, 2, 3, 5, 7, 2 * world + 1, *long):
        q, k, v = _inputs(gen, seqlen, F64, heads=4, heads_kv=2, head_dim=8, batch=1)
        for causal, layout in ((True, "zigzag"), (True, "contiguous"), (False, "zigzag")):
            want, want_lse = fa_variants.attention(q, k, v, causal=causal, backend="reference", return_lse=True)
            for overlap_start in (True, False) if seqlen < 100 else (True,):
                out, lse = _ring_in_one_process(q, k, v, world, causal, layout, overlap_start)
                where = (world, seqlen, causal, layout, overlap_start)
                assert out.shape == q.shape and not out.isnan().any() and not lse.isnan().any(), where
                assert max_abs_error(out, want) <= 1e-12 and max_abs_error(lse, want_lse) <= 1e-5, where


@pytest.mark.parametrize("dtype, scale, magnitude", [(F32, 2e38, 1.0), (F32, -2e38, 1.0), (F64, None, 1e20)])
def test_ring_with_an_lse_beyond_float32(dtype, scale, magnitude):
    """Scores whose LSE float32 cannot hold (|softmax_scale x score| > ~3.4e38: the LSE returned is +inf, README):
    the ring's reference partials carry a float64 LSE, so O is still the single-process O, with no NaN."""
    gen = torch.Generator().manual_seed(random.randrange(2**31))
    q, k, v = _inputs(gen, 16, dtype, heads=2, head_dim=8, batch=1)
    q, k = q * magnitude, k * magnitude
    for causal, layout in ((True, "zigzag"), (False, "contiguous")):
        want = fa_variants.attention(q, k, v, causal=causal, softmax_scale=scale, backend="reference")
        out, lse = _ring_in_one_process(q, k, v, 2, causal, layout, True, scale=scale)
        assert not out.isnan().any() and max_abs_error(out, want) <= (1e-5 if dtype == F32 else 1e-12), (causal,)
        assert lse.isinf().any(), "the case must reach beyond float32's range"


@pytest.mark.parametrize("device", DEVICES)
def test_merge_an_lse_beyond_the_dtype(device):
    """An LSE of +inf (its true value beyond the dtype) outweighs a finite one: that partial is the row; two of
    them cannot be ordered, and the row is not finite (not a silent average)."""
    out, part = torch.randn(1, 3, 1, 4, dtype=F32), torch.randn(1, 3, 1, 4, dtype=F32)
    lse = torch.tensor([[[math.inf, 1.0, math.inf]]])
    part_lse = torch.tensor([[[2.0, math.inf, math.inf]]])
    before, before_part = out.clone(), part.clone()
    out, lse = _merged_on(device, out, lse, part, part_lse)
    assert torch.equal(out[:, 0], before[:, 0]) and torch.equal(out[:, 1], before_part[:, 1])
    assert not out[:, 2].isfinite().any() and lse[0, 0].tolist() == [math.inf] * 3


@pytest.mark.parametrize("change, exc, message", [
    (dict(out_part=(1, 3, 4, 8)), ValueError, r"^out_part has shape \(1, 3, 4, 8\) but out has \(2, 3, 4, 8\)"),
    (dict(lse_part=(2, 4, 1)), ValueError, r"^lse_part has shape \(2, 4, 1\); expected \(2, 4, 3\)"),
    (dict(lse=(2, 3, 4)), ValueError, r"^lse has shape \(2, 3, 4\); expected \(2, 4, 3\)"),
    (dict(dtype=torch.float16), TypeError, r"^out has dtype torch.float16; the accumulator must be float32 or float64"),
    (dict(lse_dtype=torch.float64), TypeError, r"^lse has dtype torch.float64 but out has torch.float32"),
    (dict(part_dtype=torch.int32), TypeError, r"^out_part has dtype torch.int32"),
])
def test_merge_partial_refuses_mismatched_operands(change, exc, message):
    """merge_partial_ (public) broadcast a partial of batch 1, or an LSE of one row, over the accumulator and
    returned a result: a silent wrong answer. A float16 accumulator was accepted against its docstring."""
    out = torch.zeros(*(2, 3, 4, 8), dtype=change.get("dtype", F32))
    lse = torch.full(change.get("lse", (2, 4, 3)), -math.inf, dtype=change.get("lse_dtype", out.dtype))
    part = torch.randn(*change.get("out_part", (2, 3, 4, 8))).to(change.get("part_dtype", F32))
    part_lse = torch.randn(*change.get("lse_part", (2, 4, 3)))
    before = out.clone()
    with pytest.raises(exc, match=message):
        cp.merge_partial_(out, lse, part, part_lse)
    assert torch.equal(out, before)


@pytest.mark.parametrize("which", ["out", "lse"])
def test_merge_partial_refuses_an_accumulator_that_overlaps_itself(which):
    """An expanded (stride 0) accumulator passed the checks and failed inside torch's copy_ with a traceback
    about a single memory location: now one line naming it, nothing written."""
    out, lse = torch.zeros(1, 7, 2, 8), torch.full((1, 2, 7), -math.inf)
    if which == "out":
        out = torch.zeros(1, 1, 1, 8).expand(1, 7, 2, 8)
    else:
        lse = torch.full((1, 1, 1), -math.inf).expand(1, 2, 7)
    before = (out.clone(), lse.clone())
    with pytest.raises(ValueError, match=rf"^{which} has elements that share memory"):
        cp.merge_partial_(out, lse, torch.randn(1, 7, 2, 8), torch.randn(1, 2, 7))
    assert torch.equal(out, before[0]) and torch.equal(lse, before[1])


@pytest.mark.parametrize("shards, dim, exc, message", [
    ([torch.zeros(4, 2)], 5, ValueError, r"^dim 5 is out of range for a 2-D tensor"),
    ([1, 2], 0, TypeError, r"^shards\[0\] must be a torch.Tensor, got int"),
])
def test_zigzag_unshard_names_a_bad_argument(shards, dim, exc, message):
    """zigzag_unshard raised IndexError ('tuple index out of range') for a bad dim and AttributeError for a shard
    that is not a tensor."""
    with pytest.raises(exc, match=message):
        cp.zigzag_unshard(shards, dim)


def test_merger_writes_the_output_dtype_of_e4m3_inputs():
    """e4m3 shards: the kernel's partials are bfloat16 (``api.output_dtype``) and so is the merged output, whatever
    the number of partials (it was rounded to e4m3 when two or more were merged)."""
    from fa_variants import distributed

    q = torch.zeros(1, 4, 2, 64).to(torch.float8_e4m3fn)
    part = torch.randn(1, 4, 2, 64, dtype=torch.bfloat16), torch.randn(1, 2, 4)
    for cover in ([(0, 4)], [(0, 4), (0, 4)], [(0, 2), (1, 4)]):
        merger = distributed._Merger(q, cover)
        for _ in cover:
            merger.add(*part)
        out, lse = merger.result()
        assert out.dtype == torch.bfloat16 and lse.dtype == torch.float32, cover


def test_shards_of_a_huge_world_are_found_by_arithmetic():
    """zigzag_shard / contiguous_shard built all 2 x world chunks (tensor_split) to return one: a world of 10^7 ran
    out of memory and one of 2^70 failed with "Overflow when unpacking long long" (a break-it pass, session 34). The
    chunk is now worked out directly: the same views as tensor_split's; a non-sequence of shards names shards."""
    x = torch.randn(2, 37, 3)
    for world in (1, 2, 3, 5, 8, 40):
        for rank in range(world):
            chunks = x.tensor_split(2 * world, 1)
            assert torch.equal(cp.zigzag_shard(x, 1, rank, world), torch.cat((chunks[rank], chunks[-1 - rank]), 1))
            assert torch.equal(cp.contiguous_shard(x, -2, rank, world), x.tensor_split(world, 1)[rank])
    assert cp.zigzag_shard(x, 1, 0, 10**7).shape == (2, 1, 3)
    assert cp.contiguous_shard(x, 1, 2**69, 2**70).shape == (2, 0, 3)
    for shards in (None, 3):
        with pytest.raises(TypeError, match=r"^shards must be a sequence of tensors"):
            cp.zigzag_unshard(shards, 1)


def test_merge_partial_names_an_accumulator_that_requires_grad():
    """A leaf accumulator requiring grad failed with torch's in-place message, which names no argument."""
    out, lse = torch.zeros(1, 2, 1, 4, requires_grad=True), torch.zeros(1, 1, 2)
    part, part_lse = torch.randn(1, 2, 1, 4), torch.randn(1, 1, 2)
    with pytest.raises(ValueError, match=r"^out is a leaf tensor that requires grad"):
        cp.merge_partial_(out, lse, part, part_lse)
    with torch.no_grad():
        cp.merge_partial_(out, lse, part, part_lse)
    torch.testing.assert_close(out.detach(), torch.where(lse.transpose(1, 2)[..., None] > -1e30, out.detach(), 0))


def test_cuda_inputs_off_the_current_device_are_one_line(monkeypatch):
    """A rank whose tensors are on cuda:1 while its current device is cuda:0 (no torch.cuda.set_device): one line
    naming the fix, in the rank's local check (exchanged like every local error), not NCCL's "duplicate GPU" or a
    hang (session 35's break-it pass)."""
    from fa_variants import distributed

    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    with pytest.raises(ValueError, match=r"q is on cuda:1 but this process's current CUDA device is cuda:0: "
                                         r"call torch\.cuda\.set_device\(1\) first"):
        distributed._check_current_device(torch.device("cuda", 1))
    for fine in (torch.device("cuda", 0), torch.device("cuda"), torch.device("cpu")):
        distributed._check_current_device(fine)
