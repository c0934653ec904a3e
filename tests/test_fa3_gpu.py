"""FA3 (sm90) on the GPU: the correctness matrix of issue 5 against the float64 reference.

Rule (docs/design.md): err(fa3) <= 2 * err(torch same dtype) + 1e-5 for the output and the LSE, where
err = max |x - float64 reference|. Outputs are poisoned with NaN before the kernel runs (any element it
does not write fails), inputs are fresh N(0, 1) draws. Runs on an sm90 GPU only:

    source .gpu/env.sh && python3 -m pytest -m gpu tests/test_fa3_gpu.py
"""
import dataclasses
import functools
import math

import pytest
import torch

from helpers import assert_attention_ok, make_qkv, sm90_only

pytestmark = sm90_only("FA3")
fa3 = pytest.importorskip("fa_variants.hopper.fa3")

BF16, F16 = torch.bfloat16, torch.float16

# (batch, seqlen_q, seqlen_k, heads, heads_kv): odd lengths (1, 3, 113, 127, 1023, 4224), Nq != Nk both
# ways, decode-like and tile-boundary shapes, GQA and MQA.
SHAPES = [
    (1, 1, 1, 2, 2), (2, 3, 3, 2, 2), (1, 113, 113, 3, 3), (2, 127, 127, 2, 2), (1, 1023, 1023, 2, 2),
    (1, 4224, 4224, 2, 2), (1, 128, 128, 2, 2), (1, 129, 257, 2, 2), (1, 113, 1023, 2, 2),
    (1, 1023, 113, 2, 2), (2, 1, 4224, 4, 2), (1, 300, 77, 2, 2), (1, 200, 200, 8, 2), (2, 255, 511, 6, 1),
]
SHAPE_IDS = ["x".join(map(str, s)) for s in SHAPES]


@pytest.fixture(autouse=True)
def poisoned(poisoned_workspace):
    """NaN-filled allocations (out and LSE included: an element the kernel never writes fails) and a fresh split
    scratch for every test (conftest.poisoned_workspace). Before, this fixture patched a helper (new_outputs) that
    the launcher (common.launch) no longer calls since the cached plans (4a88b4e): outputs were not poisoned."""


def _qkv(b, nq, nk, h, hkv, d, dtype, std=1.0):
    return make_qkv(b, nq, nk, h, hkv, d, dtype=dtype, device="cuda", std=std)


def _check(q, k, v, causal, softmax_scale=None, config=None, what=""):
    scale = softmax_scale if softmax_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    out, lse = fa3.run(q, k, v, causal=causal, softmax_scale=scale, config=config)
    assert_attention_ok(out, lse, q, k, v, causal, scale, what=what)
    return out, lse


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_matrix_bf16(head_dim, causal, shape):
    q, k, v = _qkv(*shape, head_dim, BF16)
    _check(q, k, v, causal, what=f"bf16 D={head_dim} causal={causal} {shape}")


@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_matrix_fp16_d128(causal, shape):
    q, k, v = _qkv(*shape, 128, F16)
    _check(q, k, v, causal, what=f"fp16 D=128 causal={causal} {shape}")


@pytest.mark.parametrize("shape", [(2, 127, 127, 2, 2), (1, 1023, 300, 4, 1)], ids=["127", "1023x300"])
def test_head_dim_96(shape):
    q, k, v = _qkv(*shape, 96, BF16)
    _check(q, k, v, False, what=f"bf16 D=96 {shape}")


ABLATIONS = {
    "no-pingpong": dict(pingpong=False),
    "no-overlap": dict(intra_wg_overlap=False),
    "neither": dict(pingpong=False, intra_wg_overlap=False),
    # issue 12's structural switches (Sm90Config), with the overlapped and the serial mainloop
    "lean": dict(shared_kv_state=True, first_pv_overwrites=True, epilogue_arrive=True),
    "lean-serial": dict(shared_kv_state=True, first_pv_overwrites=True, epilogue_arrive=True, intra_wg_overlap=False),
    "kv1-no-pingpong": dict(shared_kv_state=True, pingpong=False),
    # issue 12, round 3: O's rescale before its P V GEMM
    "o-before-pv": dict(rescale_o_before_pv=True),
}


@pytest.mark.parametrize("shape", [(2, 1023, 1023, 4, 2), (1, 257, 4224, 2, 2), (1, 1, 129, 2, 1)],
                         ids=["1023", "257x4224", "1x129"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("ablation", list(ABLATIONS), ids=list(ABLATIONS))
def test_ablation_configs(ablation, causal, shape):
    config = dataclasses.replace(fa3.DEFAULT_CONFIGS[128], **ABLATIONS[ablation])
    q, k, v = _qkv(*shape, 128, BF16)
    _check(q, k, v, causal, config=config, what=f"{ablation} causal={causal} {shape}")


@pytest.mark.parametrize("head_dim, change", [
    (64, dict(shared_kv_state=True, first_pv_overwrites=True, epilogue_arrive=True)),
    (256, dict(shared_kv_state=True, epilogue_arrive=True)),
    (256, dict(first_pv_overwrites=True, intra_wg_overlap=False)),
    (256, dict(rescale_o_before_pv=True))],
    ids=["d64-lean", "d256-lean", "d256-overwrite-serial", "d256-o-before-pv"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_structural_switches_other_head_dims(head_dim, change, causal):
    """The structural switches at D 64 (three consumer warpgroups) and D 256 (no ping-pong); one K/V tile
    (the first PV is the last), several, and a row that sees no key (causal, Nq > Nk)."""
    config = dataclasses.replace(fa3.DEFAULT_CONFIGS[head_dim], **change)
    for shape in [(2, 1023, 1023, 4, 2), (1, 77, 77, 2, 2), (1, 300, 129, 2, 1)]:
        q, k, v = _qkv(*shape, head_dim, BF16)
        _check(q, k, v, causal, config=config, what=f"D={head_dim} {change} causal={causal} {shape}")


def _ab_variants(round_name: str):
    """(name, head_dim, config) of a set of scripts/fa3_speed_ab.py's variants (ROUND4, FA3GAP), "old" and "new"
    left out: the same configs the A/B times, so a disk-cached compile of these tests serves the A/B."""
    from helpers import load_script

    ab = load_script("fa3_speed_ab")
    return [(name, d, ab.variant_config(name, d)) for name in getattr(ab, round_name) if name not in ("old", "new")
            for d in ab.VARIANTS[name][0]]


@functools.cache
def _causal_config(name: str, head_dim: int, config, causal: bool):
    """A variant's config for a call of that causality, as scripts/fa3_speed_ab.py times it (``variant_config``: on
    the call's default, D 256 causal converting P per value since session 19); ``config`` is the non-causal one."""
    from helpers import load_script

    return load_script("fa3_speed_ab").variant_config(name, head_dim, True) if causal else config


ROUND4 = _ab_variants("ROUND4")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name, head_dim, config", ROUND4, ids=[f"{n}-d{d}" for n, d, _ in ROUND4])
def test_round4_variants(name, head_dim, config, causal):
    """Issue 12, round 4 (P converted in pairs, flash-attn-4's D 256 softmax and O rescale, 128 x 176 tiles, 3 stages,
    K before Q): one K/V tile, several (176 does not divide 1023 or 4224: a partial last tile), Nq != Nk both ways,
    causal rows that see no key (Nq > Nk), GQA."""
    config = _causal_config(name, head_dim, config, causal)
    for shape in [(2, 1023, 1023, 4, 2), (1, 257, 4224, 2, 2), (1, 77, 77, 2, 2), (1, 300, 129, 2, 1)]:
        q, k, v = _qkv(*shape, head_dim, BF16)
        _check(q, k, v, causal, config=config, what=f"{name} D={head_dim} causal={causal} {shape}")
    if config.convert_pairs:  # the fp16 conversion in pairs too
        q, k, v = _qkv(2, 1023, 1023, 4, 2, head_dim, F16)
        _check(q, k, v, causal, config=config, what=f"{name} fp16 D={head_dim} causal={causal}")


FA3GAP = _ab_variants("FA3GAP")  # the per-tile gap: fa4-256 (its alpha-from-the-bases variants removed in session 15)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name, head_dim, config", FA3GAP, ids=[f"{n}-d{d}" for n, d, _ in FA3GAP])
def test_fa3gap_variants(name, head_dim, config, causal):
    """Issue 12, the SASS gap: flash-attn-4's D 256 choices (fa4-256; the variants with alpha from the kept bases went
    with their switch in session 15): odd lengths, one K/V tile and several, Nq != Nk both ways (causal rows that see
    no key), GQA (fp16 in round 4's test); then EC-04's logit shifts (``_check_logit_shifts``: |m c| from ~500, the
    one-FFMA form, to +-1.3e5, the exact form's rare branch)."""
    config = _causal_config(name, head_dim, config, causal)
    for shape in [(2, 1023, 1023, 4, 2), (1, 257, 4224, 2, 2), (1, 77, 77, 2, 2), (1, 300, 129, 2, 1)]:
        q, k, v = _qkv(*shape, head_dim, BF16)
        _check(q, k, v, causal, config=config, what=f"{name} D={head_dim} causal={causal} {shape}")
    _check_logit_shifts(name, head_dim, config, causal)


def _check_logit_shifts(name, head_dim, config, causal):
    """EC-04's logit shifts: every logit of a row shifted by a b softmax_scale (|m c| from ~500, the one-FFMA form,
    to +-1.3e5, the exact form's rare branch); no NaN, O near float64's, and under causal masking row 0 (key 0 alone)
    returns V exactly."""
    from fa_variants.reference import references, rel_l2

    for a, b in [(-64, 64), (-256, 256), (-1024, 1024), (1024, 1024)]:
        q, k, v = _qkv(1, 257, 257, 2, 2, head_dim, BF16)
        q[..., 0], k[..., 0] = a, b
        scale = 1.0 / math.sqrt(head_dim)
        out, lse = fa3.run(q, k, v, causal=causal, softmax_scale=scale, config=config)
        want = references(q, k, v, causal=causal, softmax_scale=scale).out
        assert not torch.isnan(out).any() and not torch.isnan(lse).any(), (name, a, b)
        assert rel_l2(out, want) < (1e-1 if abs(a * b) >= 1048576 else 2e-2), (name, a, b, rel_l2(out, want))
        if causal:  # row 0 sees key 0 alone: weight exactly 1
            assert torch.equal(out[:, 0], v[:, 0]), (name, a, b)


PERSIST = _ab_variants("PERSIST")  # the persistent grid (Sm90Config.persistent) at D 64/128/256
PERSIST += [v for v in _ab_variants("SHORT") if v[0] == "persistent-m128"]  # session 16: 128-row tiles at D 64
PERSIST += [v for v in _ab_variants("BALANCED") if v[0] == "balanced"]  # session 17: tiles dealt by load
# (batch, seqlen_q, seqlen_k, heads, heads_kv): odd lengths, one K/V tile and several, Nq != Nk both ways (causal rows
# that see no key), GQA and MQA, and grids of many more tiles than SMs (each CTA walks several tiles; causal tiles of
# different lengths; more than one L2 section)
PERSIST_SHAPES = [(1, 1, 1, 2, 2), (2, 3, 3, 2, 2), (1, 113, 113, 3, 3), (1, 1023, 1023, 2, 2), (1, 113, 1023, 2, 2),
                  (1, 1023, 113, 2, 2), (1, 300, 77, 2, 2), (2, 255, 511, 6, 1), (2, 4224, 4224, 8, 2),
                  (3, 1023, 2000, 48, 8)]


@pytest.mark.parametrize("dtype", [BF16, F16], ids=["bf16", "fp16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name, head_dim, config", PERSIST, ids=[f"{n}-d{d}" for n, d, _ in PERSIST])
def test_persistent_variants(name, head_dim, config, causal, dtype):
    """Sm90Config.persistent: every CTA walks several (query tile, head, batch) tiles with its pipeline states carried;
    odd lengths, Nq != Nk both ways (rows that see no key: O = 0, LSE = -inf), GQA/MQA, bf16 and fp16, grids of 2-7
    tiles per SM; outputs NaN-poisoned (a tile that no CTA runs fails)."""
    config = _causal_config(name, head_dim, config, causal)
    for shape in PERSIST_SHAPES:
        q, k, v = _qkv(*shape, head_dim, dtype)
        _check(q, k, v, causal, config=config, what=f"{name} {dtype} D={head_dim} causal={causal} {shape}")


@pytest.mark.parametrize("balanced", [False, True], ids=["static", "balanced"])
def test_persistent_l2_sections(monkeypatch, balanced):
    """The persistent grid keeps the causal longest-first order in L2 sections: sections of 2 (batch, head) pairs with
    a short last one, several tiles per CTA; every tile must run exactly once (static schedule, and the tiles dealt by
    load: Sm90Config.balanced, whose O and LSE equal the static schedule's bit for bit: the same tile maths)."""
    config = dataclasses.replace(fa3.DEFAULT_CONFIGS[128], persistent=True, balanced=balanced)
    monkeypatch.setattr(fa3, "l2_section_heads", lambda *args: 2)
    for batch, heads in ((1, 5), (3, 7), (5, 41)):
        q, k, v = _qkv(batch, 1000, 1000, heads, 1, 128, BF16)
        got = _check(q, k, v, True, config=config, what=f"persistent, sections of 2, B={batch} H={heads}")
        if balanced:
            want = fa3.run(q, k, v, causal=True, softmax_scale=1.0 / math.sqrt(128),
                           config=dataclasses.replace(config, balanced=False))
            assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), (batch, heads)


def test_two_consumer_warpgroups_d64():
    """D=64 defaults to three consumer warpgroups (tile_m = 192, a ping-pong ring of three named
    barriers, covered by the matrix); the two-warpgroup tile must stay right too."""
    config = fa3.Fa3Config(tile_m=128, tile_n=128, stages=2)
    for causal in (False, True):
        q, k, v = _qkv(2, 1000, 1000, 4, 2, 64, BF16)
        _check(q, k, v, causal, config=config, what=f"tile_m=128 causal={causal}")


def test_l2_sections(monkeypatch):
    """The causal longest-first tile order walks (batch, head) pairs in L2-sized sections; with sections
    of 2 pairs, 5 or 7 pairs leave a short last section: every tile must still run exactly once."""
    assert fa3.l2_section_heads(4096, 128) == 16 and fa3.l2_section_heads(16384, 128) == 4
    assert fa3.l2_section_heads(10**7, 256) == 1
    monkeypatch.setattr(fa3, "l2_section_heads", lambda *args: 2)
    for batch, heads in ((1, 5), (3, 2), (1, 7)):
        q, k, v = _qkv(batch, 300, 300, heads, 1, 128, BF16)
        _check(q, k, v, True, what=f"sections of 2, B={batch} H={heads}")


def test_strided_inputs():
    """EC-10: K a slice of a wider buffer, V a transposed view, packed QKV, read in place by TMA."""
    b, n, h, d = 2, 250, 4, 128
    wide = torch.randn(b, n, h, 2 * d, device="cuda", dtype=BF16)
    q = torch.randn(b, n, h, d, device="cuda", dtype=BF16)
    k = wide[..., :d]
    v = torch.randn(b, h, n, d, device="cuda", dtype=BF16).transpose(1, 2)
    for causal in (False, True):
        _check(q, k, v, causal, what=f"strided causal={causal}")
    qkv = torch.randn(b, n, 3, h, d, device="cuda", dtype=BF16)
    _check(*qkv.unbind(dim=2), False, what="packed qkv")


def test_broadcast_and_misaligned_inputs():
    """EC-09: batch-broadcast K/V (stride 0) and views that TMA cannot address are copied, not misread."""
    k1, v1 = (torch.randn(1, 65, 1, 128, device="cuda", dtype=BF16) for _ in range(2))
    q = torch.randn(4, 16, 8, 128, device="cuda", dtype=BF16)
    k, v = k1.expand(4, 65, 8, 128), v1.expand(4, 65, 8, 128)
    out, _ = _check(q, k, v, True, what="broadcast")
    ref, _ = fa3.run(q, k.contiguous(), v.contiguous(), causal=True, softmax_scale=128 ** -0.5)
    torch.testing.assert_close(out, ref, atol=0, rtol=0)
    buf = torch.randn(2, 100, 2, 129, device="cuda", dtype=BF16)
    odd = buf[..., 1:]  # 2-byte offset, odd strides
    _check(odd, odd, odd, False, what="misaligned")


def test_no_out_of_bounds_reads():
    """EC-06(d): q, k, v at the front of larger buffers whose tails are NaN: any read past seqlen
    would turn the output into NaN."""
    nq, nk, extra = 77, 300, 256
    bufs = [torch.full((1, n + extra, 2, 128), math.nan, device="cuda", dtype=BF16) for n in (nq, nk, nk)]
    for buf, n in zip(bufs, (nq, nk, nk)):
        buf[:, :n] = torch.randn(1, n, 2, 128, device="cuda", dtype=BF16)
    q, k, v = bufs[0][:, :nq], bufs[1][:, :nk], bufs[2][:, :nk]
    for causal in (False, True):
        _check(q, k, v, causal, what=f"nan tails causal={causal}")


def test_padded_keys_get_no_weight():
    """EC-06(c): keys past seqlen_k must be -inf, not score 0 (real scores are about -11 here)."""
    for nk in (129, 193, 257):
        ar = torch.arange(64, device="cuda", dtype=torch.float32)
        q = (1 + 0.1 * ar).view(1, 64, 1, 1).expand(1, 64, 2, 128).to(BF16).contiguous()
        kk = -(1 + 0.1 * torch.arange(nk, device="cuda", dtype=torch.float32))
        k = kk.view(1, nk, 1, 1).expand(1, nk, 2, 128).to(BF16).contiguous()
        v = (-kk).view(1, nk, 1, 1).expand(1, nk, 2, 128).to(BF16).contiguous()
        _check(q, k, v, False, softmax_scale=1.0 / 128, what=f"sharp nk={nk}")


@pytest.mark.parametrize("scale", [0.0, -0.125, 1e-8, 10.0])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_softmax_scales(scale, causal):
    """EC-20: zero (plain mean of the visible V rows), negative, tiny and large scales."""
    q, k, v = _qkv(1, 64, 64, 2, 2, 64, BF16, std=4.0)
    _check(q, k, v, causal, softmax_scale=scale, what=f"scale={scale}")


def test_rows_that_see_no_key():
    """Causal with seqlen_q > seqlen_k: the first seqlen_q - seqlen_k rows see nothing: O = 0, LSE = -inf,
    including whole 128-row tiles that skip straight to the all-masked tile 0."""
    q, k, v = _qkv(1, 700, 40, 2, 2, 128, BF16)
    out, lse = _check(q, k, v, True, what="empty rows")
    assert (out[:, :660] == 0).all() and (lse[:, :, :660] == -math.inf).all()
    assert torch.isfinite(lse[:, :, 660:]).all()


def test_deterministic():
    q, k, v = _qkv(2, 1000, 1000, 4, 4, 128, BF16)
    first = fa3.run(q, k, v, causal=True, softmax_scale=0.1)[0]
    for _ in range(3):
        assert torch.equal(fa3.run(q, k, v, causal=True, softmax_scale=0.1)[0], first)


ALPHA = _ab_variants("ALPHA")  # every row's alpha before the exponentials (Sm90Config.alpha_first)
# (batch, seqlen_q, seqlen_k, heads, heads_kv): one K/V tile and many (both ring slots, many phase flips), seqlen_k not
# a multiple of tile_n, Nq != Nk both ways (causal rows that see no key), odd lengths, GQA and MQA
ALPHA_SHAPES = [(1, 1, 1, 2, 2), (2, 3, 3, 2, 2), (1, 113, 113, 3, 3), (1, 300, 77, 2, 2), (1, 1023, 113, 2, 2),
                (1, 257, 4224, 2, 2), (2, 1023, 1023, 4, 2), (2, 255, 511, 6, 1)]


def _check_alpha_shapes(name, head_dim, config, causal):
    """A variant's config vs float64 (``_check``: NaN-poisoned outputs, LSE) over ALPHA_SHAPES in bf16."""
    for shape in ALPHA_SHAPES:
        q, k, v = _qkv(*shape, head_dim, BF16)
        _check(q, k, v, causal, config=config, what=f"{name} D={head_dim} causal={causal} {shape}")


def _assert_same_values(head_dim, causal, base, changed):
    """fa3.run with config ``changed`` gives O and LSE equal to ``base``'s bit for bit (a switch that moves where
    something is computed, not how: the same operations on the same values in the same order), 2 x 1023 x 4 heads."""
    q, k, v = _qkv(2, 1023, 1023, 4, 2, head_dim, BF16)
    want = fa3.run(q, k, v, causal=causal, softmax_scale=0.1, config=base)
    got = fa3.run(q, k, v, causal=causal, softmax_scale=0.1, config=changed)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name, head_dim, config", ALPHA, ids=[f"{n}-d{d}" for n, d, _ in ALPHA])
def test_alpha_variants(name, head_dim, config, causal):
    """Sm90Config.alpha_first (alpha of every row computed before the exponentials; D 64 also without the unit-alpha
    skip): the same maths as the default, so the same float64 bound, over ALPHA_SHAPES (one K/V tile and
    many, odd lengths, Nq != Nk both ways, GQA and MQA), fp16 once (D 128, non-causal), NaN-poisoned outputs, LSE
    checked; then EC-04's logit shifts, whose huge rows take the exact form's branch that alpha now precedes."""
    config = _causal_config(name, head_dim, config, causal)
    _check_alpha_shapes(name, head_dim, config, causal)
    if head_dim == 128 and not causal:
        q, k, v = _qkv(2, 1023, 1023, 4, 2, head_dim, F16)
        _check(q, k, v, causal, config=config, what=f"{name} fp16 D={head_dim}")
    _check_logit_shifts(name, head_dim, config, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_alpha_first_same_values(causal):
    """alpha_first changes where alpha is computed, not how (the same operations on the same values, in the same
    reduction order): at D 128 (its default since session 8), O and LSE with it equal those without it bit for bit."""
    default = fa3.DEFAULT_CONFIGS[128]  # passed: the default call may plan another kernel (split, packed rows)
    _assert_same_values(128, causal, dataclasses.replace(default, alpha_first=False),
                        dataclasses.replace(default, alpha_first=True))


GAP9 = _ab_variants("GAP9")  # session 8, D 256 vs flash-attn-4 (its choices, O rescaled under the exponentials)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name, head_dim, config", GAP9, ids=[f"{n}-d{d}" for n, d, _ in GAP9])
def test_gap9_variants(name, head_dim, config, causal):
    """scripts/fa3_speed_ab.py's GAP9 variants: flash-attn-4's D 256 choices (`fa4-256`, and `alpha-256`: O rescaled
    under the exponentials) vs float64 over ALPHA_SHAPES (one K/V tile and many, odd lengths, Nq != Nk both ways, GQA
    and MQA), NaN-poisoned outputs, LSE checked; then EC-04's logit shifts (huge rows: the exact form's branch)."""
    config = _causal_config(name, head_dim, config, causal)
    _check_alpha_shapes(name, head_dim, config, causal)
    _check_logit_shifts(name, head_dim, config, causal)


# session 12: K/V descriptors built once per tile (Sm90Config.hoisted_descriptors): D 64's default (on there since
# session 12) and scripts/fa3_speed_ab.py's TURN variant at D 128
TURN = [("default", 64, fa3.DEFAULT_CONFIGS[64]), *_ab_variants("TURN")]


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("name, head_dim, config", TURN, ids=[f"{n}-d{d}" for n, d, _ in TURN])
def test_turn_variants(name, head_dim, config, causal):
    """Sm90Config.hoisted_descriptors (the K/V ring's WGMMA descriptors from one base + each stage's offset; D 64's
    default, `turn` at D 128) vs float64 over ALPHA_SHAPES (one K/V tile and 33: both ring slots, each wrapped
    several times; odd lengths, Nq != Nk both ways, GQA and MQA), NaN-poisoned outputs, LSE checked; fp16 once (D 64,
    non-causal); then EC-04's logit shifts. A wrong stage offset reads the other slot's K or V tile: O far off
    float64."""
    assert config.hoisted_descriptors, (name, head_dim)
    _check_alpha_shapes(name, head_dim, config, causal)
    if head_dim == 64 and not causal:
        q, k, v = _qkv(2, 1023, 1023, 4, 2, head_dim, F16)
        _check(q, k, v, causal, config=config, what=f"{name} fp16 D={head_dim}")
    _check_logit_shifts(name, head_dim, config, causal)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_hoisted_descriptors_same_values(head_dim, causal):
    """hoisted_descriptors builds the same descriptors another way (same GEMMs, same order): at D 64 (its default
    since session 12) and D 128 (`turn`) O and LSE with it equal those without it bit for bit."""
    default = fa3.DEFAULT_CONFIGS[head_dim]
    _assert_same_values(head_dim, causal, dataclasses.replace(default, hoisted_descriptors=False),
                        dataclasses.replace(default, hoisted_descriptors=True))


# session 16: `auto` runs the persistent grid for short seqlen_k at D 64 / 128 (fa3.short_config); session 17: up to
# seqlen_k 3072, causal 1536, D 64 causal up to 1024 on 128-row tiles; session 18: causal calls with two or more query
# tiles per head on the balanced grid up to 4096 keys (D 256: 8192)
# (batch, seqlen_q, seqlen_k, heads, heads_kv): grids of 192 to ~1000 tiles (fewer would be split), odd lengths, Nq !=
# Nk both ways (causal rows that see no key), GQA not packed, MHA; one query tile per head (64, 3, 3); past the static
# causal limit but on the balanced grid (2, 1999, 2048), (1, 3000, 1537), (1, 3072, 3000), (2, 4000, 4096); past
# every limit but D 256's causal one (1, 5000, 5000)
SHORT_SHAPES = [(4, 1023, 1023, 16, 4), (4, 512, 512, 16, 16), (2, 113, 1024, 96, 24), (3, 1024, 300, 48, 8),
                (64, 3, 3, 4, 4), (2, 1536, 1536, 32, 8), (2, 1999, 2048, 16, 16), (1, 3000, 1537, 16, 2),
                (1, 3072, 3000, 16, 16), (2, 4000, 4096, 16, 4), (1, 5000, 5000, 16, 16)]


def _short_want(head_dim, causal, seqlen_q, seqlen_k):
    """The config short_config gives at the session-18 defaults (None: the default grid)."""
    config = fa3._SHORT_CONFIGS.get((head_dim, causal))
    if config and causal and head_dim == 64 and seqlen_k <= 1024:
        config = dataclasses.replace(config, tile_m=128)
    if causal and seqlen_q > 128 and seqlen_k <= {64: 4096, 128: 4096, 256: 8192}.get(head_dim, 0):
        return dataclasses.replace(config, balanced=True)
    return config if head_dim in (64, 128) and seqlen_k <= (1536 if causal else 3072) else None


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("head_dim", [64, 128, 256])
def test_short_calls_run_persistent(head_dim, causal, monkeypatch):
    """A call without ``config=`` at seqlen_k <= SHORT_MAX_SEQLEN_K (causal: <= SHORT_MAX_SEQLEN_K_CAUSAL, or the
    balanced grid's BALANCED_MAX_SEQLEN_K) runs the persistent grid (the problem config is short_config's; D 64 causal
    up to 1024 keys: 128-row tiles; causal calls with two or more query tiles per head: the tiles dealt by load) and
    gives O and LSE equal bit for bit to the one-CTA-per-tile grid's on the same tiles (the same tile maths; grids of
    1 to ~8 tiles per SM, odd lengths, Nq != Nk both ways, GQA), and within the float64 bound; calls past their limit
    run the default. Shapes whose grid would not fill the GPU are split instead (test_decode.py covers that routing)."""
    for name, value in (("SHORT_MAX_SEQLEN_K", 3072), ("SHORT_MAX_SEQLEN_K_CAUSAL", 1536),
                        ("SHORT_NARROW_MAX_SEQLEN_K", 1024), ("SHORT_BALANCED", True)):
        monkeypatch.setattr(fa3, name, value)  # the defaults, whatever the environment says
    for shape in SHORT_SHAPES:
        q, k, v = _qkv(*shape, head_dim, BF16)
        config = _short_want(head_dim, causal, shape[1], shape[2])
        assert fa3._problem_config(None, q, k, causal) == config, shape
        got = _check(q, k, v, causal, what=f"short D={head_dim} causal={causal} {shape}")
        grid = dataclasses.replace(config, persistent=False, balanced=False) if config else fa3.default_config(
            "sm_90a", head_dim, causal)
        want = fa3.run(q, k, v, causal=causal, softmax_scale=1.0 / math.sqrt(head_dim), config=grid)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1]), shape
