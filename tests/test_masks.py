"""Masks that need per-sequence key lengths (CPU, reference backend), from Hugging Face (``hf.mask_as_lengths``) and
SDPA's ``attn_mask`` (``fa_variants.scaled_dot_product_attention``): a static KV cache (keys past each sequence's
filled slots hidden) and keys padded on the right, expressed as ``causal`` + ``seqlens_k``
(``common.mask_lengths``); what stays refused (left padding, a window that bites, heads that disagree, biases); the
mask read once per step, not once per layer. Sizes and lengths are drawn fresh each run."""
import importlib.util
import inspect

import pytest
import torch
import torch.nn.functional as F

import fa_variants
from fa_variants.common import host_values, mask_lengths
from fa_variants.integrations import hf
from fa_variants.reference import attention_reference
from helpers import assert_eager_ranks_first, assert_model_within_rule, float64_twin, seeded_generator

HAS_HF = importlib.util.find_spec("transformers") is not None
needs_hf = pytest.mark.skipif(not HAS_HF, reason="needs transformers (pip install -e '.[real]')")


def _lengths_mask(lengths, seqlen_q: int, seqlen_k: int, causal: bool) -> torch.Tensor:
    """(batch, 1, seqlen_q, seqlen_k) boolean mask: sequence b sees its first lengths[b] keys, bottom-right causal
    against that length when causal (as transformers' static cache builds it)."""
    rows = torch.arange(seqlen_q)[:, None]
    keys = torch.arange(seqlen_k)
    limit = torch.tensor(lengths)[:, None, None]
    visible = keys <= (limit + rows - seqlen_q if causal else limit - 1 + 0 * rows)
    return visible[:, None]


def _recorder():
    """(graphs, backend): a torch.compile backend that keeps each graph it is given and runs it as traced."""
    graphs = []

    def recording_backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    return graphs, recording_backend


def _assert_hidden_states_within_rule(model, ids, got: dict, masks: dict, keep: dict | None = None) -> None:
    """``got[kind]`` (the model's hidden states with our attention on ``masks[kind]``) within the rule against the
    same model in float64 with sdpa (float64 eager adds finfo.min to scores: -inf, rows seeing no key NaN), beside
    the float32 one with sdpa, at the tokens ``keep[kind]`` (all where None: left padding's rows see no key and give
    0 here, where eager attention averages). Leaves the model on sdpa: the caller restores its implementation."""
    model.set_attn_implementation("sdpa")
    twin = float64_twin(model)
    twin.set_attn_implementation("sdpa")
    with torch.no_grad():
        for kind, mask in masks.items():
            real = (keep or {}).get(kind, torch.ones(ids.shape, dtype=torch.bool))
            assert_model_within_rule(got[kind][real], model.model(ids, attention_mask=mask).last_hidden_state[real],
                                     twin.model(ids, attention_mask=mask).last_hidden_state[real], kind)


@pytest.mark.parametrize("chunk", [None, 5], ids=["one-step", "rows-in-chunks"])
@pytest.mark.parametrize("causal", [True, False])
def test_mask_as_lengths_reads_per_sequence_lengths(causal, chunk, monkeypatch):
    """Static-cache (causal) and right-padded (full) masks give (causal, seqlens_k) whose attention equals the
    float64 attention under the mask itself, for lengths 0, 1, short ones and the full seqlen_k in one batch; the
    mask compared whole or a few rows at a time (``CHUNK_ELEMENTS``)."""
    if chunk:
        monkeypatch.setattr(mask_lengths, "CHUNK_ELEMENTS", chunk)
    g = seeded_generator()
    seqlen_q = int(torch.randint(1, 6, (), generator=g)) if causal else int(torch.randint(2, 9, (), generator=g))
    seqlen_k = seqlen_q + int(torch.randint(3, 40, (), generator=g))
    lengths = [0, 1, seqlen_k, *torch.randint(seqlen_q, seqlen_k, (2,), generator=g).tolist()]
    mask = _lengths_mask(lengths, seqlen_q, seqlen_k, causal)
    got_causal, seqlens_k = hf.mask_as_lengths(mask, seqlen_q, seqlen_k, len(lengths), 4)
    assert got_causal is (causal or seqlen_q == 1)
    assert seqlens_k.dtype == torch.int32 and seqlens_k.device.type == "cpu" and seqlens_k.tolist() == lengths

    q = torch.randn(len(lengths), seqlen_q, 4, 16, generator=g, dtype=torch.float64)
    k, v = (torch.randn(len(lengths), seqlen_k, 2, 16, generator=g, dtype=torch.float64) for _ in range(2))
    out = fa_variants.attention(q, k, v, causal=got_causal, seqlens_k=seqlens_k, backend="reference")
    # the mask applied directly: scores of hidden keys -inf, rows that see nothing 0
    scores = torch.einsum("bqhd,bkhd->bhqk", q, k.repeat_interleave(2, 2)) / 4.0
    probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
    expected = torch.einsum("bhqk,bkhd->bqhd", probs, v.repeat_interleave(2, 2))
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)


def test_mask_as_lengths_keeps_the_plain_answers_and_broadcasts():
    causal = torch.ones(5, 7, dtype=torch.bool).tril(diagonal=2)[None, None]
    assert hf.mask_as_lengths(causal, 5, 7, 3, 4) == (True, None)
    assert hf.mask_as_lengths(torch.ones(3, 1, 5, 7, dtype=torch.bool), 5, 7, 3, 4) == (False, None)
    one = _lengths_mask([4], 5, 7, True)  # one mask broadcast over a batch of 3
    causal_flag, seqlens_k = hf.mask_as_lengths(one, 5, 7, 3, 4)
    assert causal_flag is True and seqlens_k.tolist() == [4, 4, 4]
    with pytest.raises(hf.UnsupportedAttentionError, match="mask_as_lengths"):  # mask_is_causal keeps its contract
        hf.mask_is_causal(one, 5, 7)


@pytest.mark.parametrize("what", ["left padding", "causal right padding", "heads disagree", "window", "hole"])
def test_mask_as_lengths_refuses_what_lengths_cannot_express(what, monkeypatch):
    monkeypatch.setattr(mask_lengths, "CHUNK_ELEMENTS", 20)  # a row or so per step: a fault in any chunk is seen
    mask = _lengths_mask([9, 6], 5, 9, True).expand(2, 2, 5, 9).clone()
    if what == "left padding":  # generate()'s padded batch: a hole at the start
        mask[1, :, :, :2] = False
    elif what == "causal right padding":  # a right-padded training batch: top-left causal within each length
        mask = (torch.ones(5, 9, dtype=torch.bool).tril(4) & (torch.arange(9) < 7))[None, None].expand(2, 1, 5, 9)
    elif what == "heads disagree":
        mask[0, 1, :, 8] = False
    elif what == "window":  # a sliding window of 3 keys
        mask &= torch.ones(5, 9, dtype=torch.bool).triu(2)
    else:
        mask[0, 0, 4, 3] = False
    with pytest.raises(hf.UnsupportedAttentionError, match="^fa_variants attention cannot express this attention mask"):
        hf.mask_as_lengths(mask, 5, 9, 2, 2)


def test_a_sliding_window_is_judged_by_the_mask_it_comes_with():
    """transformers hands a sliding-window layer its window inside the mask (sdpa reads only the mask): a static
    cache longer than the window, whose filled keys fit in it, runs; a window that bites in the mask is refused."""
    q, k = torch.randn(1, 4, 1, 16), torch.randn(1, 2, 12, 16)
    mask = _lengths_mask([3], 1, 12, True)
    out, _ = hf.attention_forward(torch.nn.Module(), q, k, k, mask, sliding_window=4, backend="reference")
    expected, _ = attention_reference(q.transpose(1, 2), k.transpose(1, 2)[:, :3], k.transpose(1, 2)[:, :3])
    torch.testing.assert_close(out, expected.float(), rtol=1e-5, atol=1e-6)
    with pytest.raises(hf.UnsupportedAttentionError, match="sliding window"):
        hf.attention_forward(torch.nn.Module(), q, k, k, None, sliding_window=4, backend="reference")
    # without a mask, at the window's edge (transformers: a query sees itself and the window - 1 keys before it): as
    # many keys as the window hide none (causal), one more hides the first key from the last query (refused)
    window = int(torch.randint(2, 9, ()))
    q, k = torch.randn(1, 4, window + 1, 16), torch.randn(1, 2, window + 1, 16)
    out, _ = hf.attention_forward(torch.nn.Module(), q[:, :, 1:], k[:, :, 1:], k[:, :, 1:], None,
                                  sliding_window=window, backend="reference")
    sliced = (t[:, :, 1:].transpose(1, 2) for t in (q, k, k))
    torch.testing.assert_close(out, attention_reference(*sliced, causal=True)[0].float(), rtol=1e-5, atol=1e-6)
    with pytest.raises(hf.UnsupportedAttentionError, match=f"a sliding window of {window} keys over {window + 1} keys"):
        hf.attention_forward(torch.nn.Module(), q, k, k, None, sliding_window=window, backend="reference")


def test_the_same_mask_is_read_once_until_it_changes(monkeypatch):
    """Every layer gets the same mask tensor: it is read once; an in-place change, its storage rebound (``.data =``),
    another tensor or other sizes read it again; each answer is a new tensor (a caller's edit of one does not reach the next); a refusal is kept
    too (a padded batch's layers then read the mask's key windows, kept the same way); inference tensors (no version
    counter) are read every time; a few masks are kept (hybrid models alternate two)."""
    reads = []
    real = mask_lengths._read
    monkeypatch.setattr(mask_lengths, "_read", lambda *a: reads.append(1) or real(*a))
    mask = _lengths_mask([5, 3], 2, 8, True)
    first = hf.mask_as_lengths(mask, 2, 8, 2, 4, memo=True)[1]
    first += 1  # the caller's edit
    other = _lengths_mask([2, 8], 2, 8, True)  # a second mask (a hybrid model's other kind of layer), in turn
    window = _lengths_mask([5, 3], 2, 8, True) & (torch.arange(8) > 0)  # refused: a hole at the start
    for _ in range(3):
        assert hf.mask_as_lengths(mask, 2, 8, 2, 4, memo=True)[1].tolist() == [5, 3]
        assert hf.mask_as_lengths(other, 2, 8, 2, 4, memo=True)[1].tolist() == [2, 8]
        with pytest.raises(hf.UnsupportedAttentionError):
            hf.mask_as_lengths(window, 2, 8, 2, 4, memo=True)
    assert len(reads) == 2 + 1  # both masks kept, and the refusal
    monkeypatch.setattr(mask_lengths, "MEMO_SIZE", 1)  # one kept: the two evict each other
    for _ in range(2):
        hf.mask_as_lengths(mask, 2, 8, 2, 4, memo=True), hf.mask_as_lengths(other, 2, 8, 2, 4, memo=True)
    assert len(reads) == 3 + 3  # (the first call a hit: its entry the one kept)
    monkeypatch.setattr(mask_lengths, "MEMO_SIZE", 8)
    hf.mask_as_lengths(mask, 2, 8, 2, 2, memo=True)  # other heads: read again
    mask.copy_(_lengths_mask([5, 4], 2, 8, True))  # the second sequence's next slot filled, in place
    assert hf.mask_as_lengths(mask, 2, 8, 2, 2, memo=True)[1].tolist() == [5, 4]
    assert hf.mask_as_lengths(mask.clone(), 2, 8, 2, 2, memo=True)[1].tolist() == [5, 4]
    assert len(reads) == 9
    mask.data = _lengths_mask([1, 6], 2, 8, True)  # rebound: the version counter stands, the storage does not
    assert hf.mask_as_lengths(mask, 2, 8, 2, 2, memo=True)[1].tolist() == [1, 6]
    assert len(reads) == 10
    with torch.inference_mode():  # no version counter: never kept
        frozen = _lengths_mask([5, 3], 2, 8, True)
        hf.mask_as_lengths(frozen, 2, 8, 2, 2, memo=True), hf.mask_as_lengths(frozen, 2, 8, 2, 2, memo=True)
    assert len(reads) == 12
    hf.mask_as_lengths(mask, 2, 8, 2, 2), hf.mask_as_lengths(mask, 2, 8, 2, 2)  # without memo: every call reads
    assert len(reads) == 14


def test_a_kept_mask_read_with_other_sizes_is_read_again():
    """The memo's answer is for the call's sizes too: the same unchanged tensor broadcast to other sizes (another
    batch, more query rows, other heads) gives what a fresh read gives, not the answer kept for the first sizes (one
    row that sees 5 keys is causal with 5 keys; 4 rows that each see 5 keys are not: a kept causal=True would hide
    keys from the first rows)."""
    g = seeded_generator()
    seqlen_k = int(torch.randint(6, 12, (), generator=g))
    seen = int(torch.randint(1, seqlen_k, (), generator=g))
    mask = (torch.arange(seqlen_k) < seen)[None, None, None]  # (1, 1, 1, seqlen_k): broadcast to every size
    calls = [(1, seqlen_k, 2, 4), (4, seqlen_k, 2, 4), (4, seqlen_k, 3, 4), (4, seqlen_k, 3, 2), (1, seqlen_k, 2, 4)]
    for sizes in calls:
        got = mask_lengths.as_lengths(mask, *sizes, memo=True)
        fresh = mask_lengths.as_lengths(mask, *sizes)
        assert got[0] == fresh[0] and got[1].tolist() == fresh[1].tolist(), (sizes, got, fresh)
    assert mask_lengths.as_lengths(mask, 1, seqlen_k, 2, 4)[0] != mask_lengths.as_lengths(mask, 4, seqlen_k, 2, 4)[0]
    assert mask_lengths.as_lengths(mask, 4, seqlen_k, 3, 4, memo=True)[1].tolist() == [seen] * 3


@pytest.mark.parametrize("empty", ["batch", "heads", "seqlen_q", "seqlen_k"])
@pytest.mark.parametrize("mask_heads", ["heads", "1"])
def test_an_empty_call_with_a_mask_gives_sdpa_s_empty_answer(empty, mask_heads):
    """A call with no batch, no heads, no query rows or no keys, with a mask of its own sizes (or heads 1): the SDPA
    drop-in and ``as_lengths`` answer as torch's SDPA does (an output of the call's shape: empty, or zeros where no key
    is given) instead of reading an empty mask (an IndexError, mutation audit L15)."""
    sizes = dict(batch=2, heads=4, seqlen_q=3, seqlen_k=5)
    sizes[empty] = 0
    b, h, n_q, n_k = sizes.values()
    q, k = torch.randn(b, h, n_q, 16), torch.randn(b, h, n_k, 16)
    mask = torch.ones(b, h if mask_heads == "heads" else 1, n_q, n_k, dtype=torch.bool)
    assert mask_lengths.as_lengths(mask, n_q, n_k, b, h)[1] is None  # no lengths: nothing to hide
    out = fa_variants.scaled_dot_product_attention(q, k, k, attn_mask=mask, backend="reference")
    # torch 2.11's CPU SDPA stops the process at zero heads (SIGFPE, the GPU host's CPU tests): its answer, the
    # empty output, is written out there
    want = F.scaled_dot_product_attention(q, k, k, attn_mask=mask) if h else torch.zeros(b, h, n_q, 16)
    assert out.shape == want.shape and torch.equal(out.nan_to_num(), torch.zeros_like(want)), (out, want)


def test_a_mask_rewritten_behind_its_version_counter_is_read_again():
    """The SDPA drop-in keeps nothing (nor does the compiled graphs' mask op: the GPU test of reduce-overhead): a mask
    rewritten without its version counter moving (here through .data) gives its new lengths."""
    q, k = torch.randn(2, 4, 1, 16), torch.randn(2, 2, 9, 16)
    mask = _lengths_mask([9, 4], 1, 9, True)
    first = fa_variants.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True, backend="reference")
    mask.data.copy_(_lengths_mask([2, 7], 1, 9, True))
    second = fa_variants.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True, backend="reference")
    want = F.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(second, want, rtol=1e-5, atol=1e-5)
    assert not torch.allclose(first, second)


@needs_hf
def test_static_cache_generation_runs_on_our_attention():
    """generate(cache_implementation="static") (a KV cache of fixed length, its empty slots masked) used to be refused;
    it now runs on fa_variants.attention with seqlens_k, and every token it picks is one eager attention ranks first."""
    from test_integrations import tiny_llama

    model = tiny_llama()
    g = seeded_generator()
    ids = torch.randint(0, 97, (2, int(torch.randint(3, 12, (), generator=g))), generator=g)
    calls = []
    attention = fa_variants.attention
    name = hf.register(backend="reference")
    model.set_attn_implementation(name)
    try:
        with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
            mp.setattr(fa_variants, "attention",
                       lambda q, k, v, **kw: calls.append((kw["seqlens_k"], k.shape[1])) or attention(q, k, v, **kw))
            ours = model.generate(ids, max_new_tokens=5, do_sample=False, cache_implementation="static")
    finally:
        model.set_attn_implementation("eager")
    # every layer of every step ran here: with the filled lengths, or none once every slot of the cache is filled
    lengths = [None if s is None else s.tolist() for s, _ in calls]
    expected = [None if n == slots else [n, n] for n in range(ids.shape[1], ours.shape[1]) for slots in [calls[0][1]]]
    assert lengths == [n for n in expected for _ in range(2)], lengths  # two layers
    assert_eager_ranks_first(model, ours, ids.shape[1])


@needs_hf
@pytest.mark.parametrize("padding", ["none", "left"])
def test_static_cache_decoding_under_torch_compile_fullgraph(padding):
    """Decoding steps over a static cache under torch.compile(fullgraph=True) give eager's logits: the mask's windows
    come from torch.ops.fa_variants.mask_window (seqlens_k, then leftpad_k), read when the graph runs (no graph
    break). Without padding one graph serves every step (no recompile as the filled length grows); a left-padded
    prompt batch (the second prompt three tokens shorter) passes its 2-D attention_mask, which grows a column a step,
    so torch.compile traces again as its length changes (3 graphs for 4 steps, static then dynamic shapes), as it
    does with transformers' own sdpa attention."""
    from test_integrations import tiny_llama
    from transformers import StaticCache

    model = tiny_llama()
    g = seeded_generator()
    prompt = int(torch.randint(5, 10, (), generator=g))
    ids = torch.randint(0, 97, (2, prompt + 4), generator=g)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0
    name = hf.register(backend="reference")
    graphs, recording_backend = _recorder()

    # the cache argument's name: `cache` where forward has it (past_key_values deprecated there, to be removed in
    # transformers 5.40), past_key_values in the older releases the dev extra admits
    key = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def decode(forward, model=model):
        cache = StaticCache(config=model.config, max_cache_len=32)
        masks = {i: {} if padding == "none" else dict(attention_mask=mask[:, :i]) for i in range(prompt, prompt + 5)}
        model(ids[:, :prompt], use_cache=True, **{key: cache}, **masks[prompt])
        return [forward(ids[:, i:i + 1], cache_position=torch.tensor([i]), use_cache=True, **{key: cache},
                        **masks[i + 1]).logits for i in range(prompt, prompt + 4)]

    torch._dynamo.reset()
    try:
        with torch.no_grad():
            expected = decode(model.forward)
            model.set_attn_implementation(name)
            got = decode(torch.compile(model.forward, fullgraph=True, backend=recording_backend))
    finally:
        model.set_attn_implementation("eager")
        torch._dynamo.reset()
    twin = float64_twin(model)
    twin.set_attn_implementation("sdpa")  # float64 eager adds finfo.min to scores: -inf, rows seeing no key NaN
    with torch.no_grad():
        exact = decode(twin.forward, twin)
    assert_model_within_rule(got, expected, exact, "logits of step")
    assert len(graphs) == (1 if padding == "none" else 3), f"{len(graphs)} graphs for 4 steps"
    for gm in graphs:
        targets = [str(n.target) for n in gm.graph.nodes]
        assert sum("fa_variants.attention_seqlens_k" in t for t in targets) == 2  # one per layer
        assert sum("fa_variants.mask_window" in t for t in targets) == 2


def test_the_mask_window_op_passes_opcheck():
    """torch.library.opcheck of fa_variants::mask_window on a left-padded mask: (2, batch) int32, ends then starts."""
    keys = torch.arange(8)
    mask = torch.stack([keys >= 3, keys >= 0])[:, None, None]  # (2, 1, 1, 8): one decoding row each
    op = torch.ops.fa_variants.mask_window
    torch.library.opcheck(op, (mask, True, 1, 8, 2, 4, "attn_mask"))
    assert op(mask, True, 1, 8, 2, 4, "attn_mask").tolist() == [[8, 8], [3, 0]]


@needs_hf
def test_a_padded_batch_under_torch_compile_runs_or_is_refused_when_it_runs():
    """Traced, a built mask is not read (the padding is, at a graph break, where it decides that a mask is needed):
    the mask op reads it when the compiled graph runs. A left-padded batch runs (each sequence's window as seqlens_k
    and leftpad_k: session 54), its hidden states at the real tokens within the rule; so does a causal batch padded
    on the right (its query counts as seqlens_q: session 55), at every token (its padding rows see the whole
    sequence, as in transformers' eager attention); a full mask in a causal layer runs as eagerly (counts 0), a causal
    one in a non-causal layer is refused in one line, under fullgraph=True."""
    from test_integrations import tiny_llama

    model = tiny_llama()
    ids = torch.randint(0, 97, (2, 9), generator=seeded_generator())
    left, right = torch.ones_like(ids), torch.ones_like(ids)
    left[1, :3] = 0
    right[1, 6:] = 0
    name = hf.register(backend="reference")
    torch._dynamo.reset()
    model.set_attn_implementation(name)
    try:
        with torch.no_grad():
            compiled = torch.compile(model.model, backend="eager")  # (the padding is read at a graph break)
            got = compiled(ids, attention_mask=left).last_hidden_state
            got_right = compiled(ids, attention_mask=right).last_hidden_state
        _assert_hidden_states_within_rule(model, ids, {"left": got, "right": got_right},
                                          {"left": left, "right": right}, {"left": left.bool()})
    finally:
        model.set_attn_implementation("eager")
        torch._dynamo.reset()
    module = torch.nn.Module()
    module.is_causal = True
    full = torch.ones(2, 1, 4, 6, dtype=torch.bool)
    q, k = torch.randn(2, 4, 4, 16), torch.randn(2, 2, 6, 16)
    step = torch.compile(lambda q, k, m: hf.attention_forward(module, q, k, k, m, backend="reference")[0],
                         fullgraph=True, backend="eager")
    # a full mask in a causal layer runs as the eager call does (each window's query count 0: every row sees it all)
    torch.testing.assert_close(step(q, k, full), hf.attention_forward(module, q, k, k, full, backend="reference")[0])
    module.is_causal = False
    with pytest.raises(hf.UnsupportedAttentionError, match="a causal mask for a non-causal layer"):
        step(q, k, torch.ones(4, 6, dtype=torch.bool).tril(2)[None, None].expand(2, 1, 4, 6))
    torch._dynamo.reset()

@needs_hf
def test_a_padded_batch_as_a_4d_mask_traces_fullgraph():
    """A padded batch under torch.compile(fullgraph=True) given as a 4-D boolean mask (README's way before session
    59, when a 2-D attention_mask's padding was read there and stopped Dynamo): the same padding as a 4-D mask
    (batch, 1, seqlen_q, seqlen_k). Left and right padding, one graph, the hidden states within the rule against
    the float64 model with the same mask (at the real tokens for left padding: rows that see no key give 0 here)."""
    from test_integrations import tiny_llama

    model = tiny_llama()
    n = 9
    ids = torch.randint(0, 97, (2, n), generator=seeded_generator())
    rows, cols = torch.arange(n)[:, None], torch.arange(n)[None]
    causal = cols <= rows
    right = torch.stack([causal, causal & (cols < 6)])[:, None]           # sequence 1: 6 tokens, then padding
    left = torch.stack([causal, causal & (cols >= 3)])[:, None]           # sequence 1: 3 padding tokens first
    name = hf.register(backend="reference")
    torch._dynamo.reset()
    graphs, recording_backend = _recorder()
    model.set_attn_implementation(name)
    try:
        compiled = torch.compile(model.model, fullgraph=True, backend=recording_backend)
        with torch.no_grad():
            got = {"right": compiled(ids, attention_mask=right).last_hidden_state,
                   "left": compiled(ids, attention_mask=left).last_hidden_state}
        assert len(graphs) == 1, len(graphs)
        _assert_hidden_states_within_rule(model, ids, got, {"right": right, "left": left},
                                          {"left": left[:, 0].any(-1)})
    finally:
        model.set_attn_implementation("eager")
        torch._dynamo.reset()


@needs_hf
@pytest.mark.parametrize("fallback", [None, "sdpa"])
def test_a_2d_attention_mask_traces_fullgraph(fallback):
    """A tokenizer's 2-D attention_mask (all ones, padded on the right, padded on the left) under
    torch.compile(fullgraph=True): one graph. build_mask does not read the padding while such a trace runs (Dynamo
    would stop on the read: "Could not guard on data-dependent expression", sessions 57-58's documented limit); it
    builds the mask, which our op reads when the graph runs (fallback None) or sdpa takes as it is
    (fallback="sdpa"). The hidden states within the rule against the float64 model (sdpa) with the same mask, at
    the real tokens (rows that see no key give 0 here). Without fullgraph an all-ones mask is still read at a graph
    break and runs as the plain causal call (no mask op in the graphs)."""
    from test_integrations import tiny_llama

    model = tiny_llama()
    g = seeded_generator()
    n = 9
    ids = torch.randint(0, 97, (2, n), generator=g)
    cut = 1 + int(torch.randint(0, n - 2, (), generator=g))  # sequence 1's padding: n - cut tokens
    ones = torch.ones(2, n, dtype=torch.long)
    masks = {"ones": ones, "right": ones.clone(), "left": ones.clone()}
    masks["right"][1, cut:] = 0
    masks["left"][1, :n - cut] = 0
    name = hf.register(backend="reference", fallback=fallback)
    model.set_attn_implementation(name)
    got = {}
    try:
        for kind, mask in masks.items():
            torch._dynamo.reset()
            graphs, recording_backend = _recorder()
            compiled = torch.compile(model.model, fullgraph=True, backend=recording_backend)
            with torch.no_grad():
                got[kind] = compiled(ids, attention_mask=mask).last_hidden_state
            assert len(graphs) == 1, (kind, len(graphs))
            nodes = {str(node.target) for gm in graphs for node in gm.graph.nodes}
            ours = any("fa_variants.attention" in target for target in nodes)
            assert ours == (fallback is None), (kind, sorted(nodes))
        torch._dynamo.reset()
        graphs, recording_backend = _recorder()
        with torch.no_grad():
            plain = torch.compile(model.model, backend=recording_backend)(ids, attention_mask=ones).last_hidden_state
        targets = [str(node.target) for gm in graphs for node in gm.graph.nodes]
        assert sum("fa_variants.attention" in t for t in targets) == 2, targets  # one per layer, causal, no mask op
        assert not any("mask_window" in t or "mask_sequence_windows" in t for t in targets), targets
        torch.testing.assert_close(plain, got["ones"], rtol=1e-5, atol=1e-5)
        _assert_hidden_states_within_rule(model, ids, got, masks, {"left": masks["left"].bool()})
    finally:
        model.set_attn_implementation("eager")
        torch._dynamo.reset()


@needs_hf
@pytest.mark.parametrize("strict", [False, True])
def test_a_2d_attention_mask_exports(strict):
    """torch.export of the tiny model with a right-padded 2-D attention_mask (strict: Dynamo, one_graph; non-strict:
    no tracer to ask): the mask is built unread and read when the program runs, so another padding gives its own
    answer, eager's (before session 59 both exports stopped on the read)."""
    from test_integrations import tiny_llama

    model = tiny_llama()
    g = seeded_generator()
    n = 9
    ids = torch.randint(0, 97, (2, n), generator=g)
    masks = [torch.ones(2, n, dtype=torch.long) for _ in range(2)]
    masks[0][1, 6:] = 0
    masks[1][1, 1 + int(torch.randint(0, 5, (), generator=g)):] = 0
    model.set_attn_implementation(hf.register(backend="reference"))
    try:
        program = torch.export.export(model.model, (ids,), {"attention_mask": masks[0], "use_cache": False},
                                      strict=strict).module()
        with torch.no_grad():
            for mask in masks:
                torch.testing.assert_close(program(ids, attention_mask=mask, use_cache=False).last_hidden_state,
                                           model.model(ids, attention_mask=mask, use_cache=False).last_hidden_state,
                                           rtol=1e-5, atol=1e-5)
    finally:
        model.set_attn_implementation("eager")
        torch._dynamo.reset()


def _region_contexts():
    """Compiled contexts where a graph break is not allowed although fullgraph is False (a helper's break-it run,
    session 59), and one where a traced read becomes an unbacked symbol: name -> (wrap(forward) -> compiled callable,
    a context manager around the call)."""
    import contextlib

    def error_region(forward):
        def inner(ids, mask):
            with torch._dynamo.error_on_graph_break(True):
                return forward(ids, attention_mask=mask).last_hidden_state
        return torch.compile(lambda ids, mask: inner(ids, mask), backend="eager")

    def nested_region(forward):
        region = torch.compiler.nested_compile_region(lambda ids, mask: forward(ids, attention_mask=mask)
                                                      .last_hidden_state)
        return torch.compile(lambda ids, mask: region(ids, mask) + 0, backend="eager")

    def plain(forward):
        return torch.compile(lambda ids, mask: forward(ids, attention_mask=mask).last_hidden_state, backend="eager")

    return {"error_on_graph_break region in an inlined frame": (error_region, contextlib.nullcontext()),
            "nested_compile_region body": (nested_region, contextlib.nullcontext()),
            "capture_scalar_outputs": (plain, torch._dynamo.config.patch(capture_scalar_outputs=True))}


@needs_hf
@pytest.mark.parametrize("fallback", [None, "sdpa"])
@pytest.mark.parametrize("context", list(_region_contexts()))
def test_a_padded_batch_in_compiled_regions_that_may_not_break(context, fallback):
    """A left-padded 2-D attention_mask where Dynamo may not break the graph although fullgraph is False (an
    error_on_graph_break(True) region entered in an inlined frame; a nested_compile_region's body), or where a traced
    read becomes an unbacked symbol (capture_scalar_outputs): before session 59 the padding read stopped Dynamo
    ("Unsupported Tensor.item()", "Could not guard on data-dependent expression"). The hidden states at the real
    tokens within the rule against the float64 model."""
    from test_integrations import tiny_llama

    model = tiny_llama()
    g = seeded_generator()
    n = 9
    ids = torch.randint(0, 97, (2, n), generator=g)
    mask = torch.ones(2, n, dtype=torch.long)
    mask[1, :1 + int(torch.randint(0, n - 2, (), generator=g))] = 0
    wrap, around = _region_contexts()[context]
    model.set_attn_implementation(hf.register(backend="reference", fallback=fallback))
    torch._dynamo.reset()
    try:
        with torch.no_grad(), around:
            got = wrap(model.model)(ids, mask)
        _assert_hidden_states_within_rule(model, ids, {context: got}, {context: mask}, {context: mask.bool()})
    finally:
        model.set_attn_implementation("eager")
        torch._dynamo.reset()


@needs_hf
def test_jit_trace_is_refused_in_one_line_or_falls_back():
    """torch.jit.trace records torch's ops only (the kernels would be missing from its recording: a traced module
    replaying an empty output) and gives shapes as tensors; it had baked the first call's mask into the HF path
    (another padding then gave the first one's answer: an error of 3.9 at the real tokens, session 59). The API
    refuses it in one line, also for a call of a kind already planned; hf refuses it (UnsupportedAttentionError) or,
    with fallback="sdpa", gives the call to sdpa, whose trace answers another padding as eager sdpa does."""
    from test_integrations import tiny_llama

    q, k = torch.randn(1, 5, 2, 16), torch.randn(1, 7, 2, 16)
    fa_variants.attention(q, k, k, causal=True, backend="reference")  # planned where the backend plans
    calls = {"attention": lambda q, k: fa_variants.attention(q, k, k, causal=True, backend="reference"),
             "scaled_dot_product_attention": lambda q, k: fa_variants.scaled_dot_product_attention(
                 q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2), backend="reference")}
    for name, call in calls.items():
        with pytest.raises(RuntimeError, match=r"^torch.jit.trace cannot record fa_variants attention .*use "
                                               r"torch.compile or torch.export$") as caught:
            torch.jit.trace(call, (q, k), check_trace=False)
        assert "\n" not in str(caught.value), name
    model = tiny_llama()
    model.config.use_cache = False
    n = 9
    ids = torch.randint(0, 97, (2, n), generator=seeded_generator())
    ones, left = torch.ones(2, n, dtype=torch.long), torch.ones(2, n, dtype=torch.long)
    left[1, :4] = 0
    try:
        model.set_attn_implementation(hf.register(backend="reference"))
        with torch.no_grad(), pytest.raises(hf.UnsupportedAttentionError, match="torch.jit.trace"):
            torch.jit.trace(model.model, (ids, ones), check_trace=False, strict=False)
        model.set_attn_implementation(hf.register("fa_variants_or_sdpa", backend="reference", fallback="sdpa"))
        with torch.no_grad():
            traced = torch.jit.trace(model.model, (ids, ones), check_trace=False, strict=False)
            got = traced(ids, left)["last_hidden_state"]
        model.set_attn_implementation("sdpa")
        with torch.no_grad():
            want = model.model(ids, attention_mask=left).last_hidden_state
        keep = left.bool()
        torch.testing.assert_close(got[keep], want[keep], rtol=1e-5, atol=1e-5)
    finally:
        model.set_attn_implementation("eager")


def test_trace_may_break_is_false_where_the_tracer_cannot_be_asked(monkeypatch):
    """Outside a Dynamo trace (a non-strict export, another torch's internals) the question has no tracer to ask:
    the answer is False, so the mask is built and read when the graph runs, never read on the host while traced.
    Eagerly the padding may be read."""
    from torch._dynamo.symbolic_convert import InstructionTranslator

    assert hf._may_read_padding()
    assert host_values.trace_may_break._dynamo_marked_constant is True
    monkeypatch.setattr(InstructionTranslator, "current_tx", staticmethod(lambda: None))
    assert host_values.trace_may_break() is False
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    assert hf._may_read_padding() is False


@pytest.mark.parametrize("form", ["key padding (batch, 1, 1, seqlen_k)", "key padding (1, seqlen_k) float",
                                  "static cache (batch, 1, seqlen_q, seqlen_k)", "static cache float -inf",
                                  "full (seqlen_q, seqlen_k)", "causal square", "top-left causal"])
def test_sdpa_attn_mask_runs_what_lengths_express(form):
    """fa_variants.scaled_dot_product_attention takes the masks causal + seqlens_k express, in SDPA's shapes and
    dtypes, and gives torch's SDPA result (GQA; rows that see no key: 0, as torch's)."""
    g = seeded_generator()
    batch, heads, heads_kv, head_dim = 3, 4, 2, 16
    seqlen_q = 1 + int(torch.randint(0, 6, (), generator=g))
    seqlen_k = seqlen_q + int(torch.randint(0, 30, (), generator=g))
    if form == "causal square":
        seqlen_k = seqlen_q
    query = torch.randn(batch, heads, seqlen_q, head_dim, generator=g)
    key, value = (torch.randn(batch, heads_kv, seqlen_k, head_dim, generator=g) for _ in range(2))
    lengths = [seqlen_k, 0, int(torch.randint(0, seqlen_k + 1, (), generator=g))]
    causal = form.startswith(("static", "causal", "top-left"))
    mask = _lengths_mask(lengths if form != "causal square" else [seqlen_k] * 3, seqlen_q, seqlen_k, causal)
    if form.startswith("key padding"):
        mask = mask[:, :, :1]  # (batch, 1, 1, seqlen_k), broadcast over the queries
        if form.endswith("float"):
            lengths = [lengths[2]] * batch
            mask = torch.zeros(1, seqlen_k).masked_fill(torch.arange(seqlen_k) >= lengths[0], float("-inf"))
    elif form.endswith("-inf"):
        mask = torch.zeros(mask.shape).masked_fill(~mask, float("-inf"))
    elif form.startswith("full"):
        mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool)
    elif form == "top-left causal":  # torch's is_causal for seqlen_q != seqlen_k: bottom-right against seqlen_q
        mask = torch.ones(seqlen_q, seqlen_k, dtype=torch.bool).tril()
    got = fa_variants.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True,
                                                   backend="reference")
    want = F.scaled_dot_product_attention(query, key, value, attn_mask=mask, enable_gqa=True)
    torch.testing.assert_close(got, want.nan_to_num(0.0), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("mask, error, message", [
    (torch.ones(5, 7, dtype=torch.bool).triu(), ValueError,
     r"^attn_mask: fa_variants cannot express this attention mask .*; use torch's SDPA for this mask"),
    (torch.zeros(5, 7).masked_fill(torch.ones(5, 7, dtype=torch.bool).tril(2) == 0, -1e9), ValueError,
     "an additive attention bias .*hide keys with -inf"),  # SDPA adds -1e9: not a -inf mask (an empty row differs)
    (torch.zeros(1, 5, 5, 7, dtype=torch.bool), ValueError,
     r"^attn_mask has shape \(1, 5, 5, 7\), which does not broadcast to .* = \(2, 4, 5, 7\)$"),
    (torch.ones(2, 2, 2, 5, 7, dtype=torch.bool), ValueError, r"does not broadcast .*\(it must have 2 to 4 dimensions\)"),
    (torch.ones(7, dtype=torch.bool), ValueError, r"does not broadcast .*\(it must have 2 to 4 dimensions\)"),
    (torch.ones(5, 3, dtype=torch.bool), ValueError, r"^attn_mask has shape \(5, 3\), which does not broadcast"),
    ([[True]], TypeError, "attn_mask must be a torch.Tensor or None"),
    (torch.zeros(5, 7, dtype=torch.uint8), TypeError, "attn_mask must be bool .* or floating .*, got torch.uint8"),
    (torch.zeros(5, 7).to(torch.float8_e4m3fn), TypeError, "^attn_mask is torch.float8_e4m3fn: 8-bit float masks are refused"),
    (torch.ones(5, 7, dtype=torch.bool).to_sparse(), TypeError, "attn_mask must be a dense"),
    (torch.zeros(5, 7, requires_grad=True), ValueError, "attn_mask requires grad"),
    (torch.ones(5, 7, dtype=torch.bool, device="meta"), ValueError, "attn_mask is on meta but query is on cpu"),
])
def test_sdpa_attn_mask_refusals_are_one_line(mask, error, message):
    q, k = torch.randn(2, 4, 5, 16), torch.randn(2, 2, 7, 16)
    with pytest.raises(error, match=message) as caught:
        fa_variants.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True, backend="reference")
    assert "\n" not in str(caught.value)
    with pytest.raises(ValueError, match="attn_mask and is_causal=True given together"):
        fa_variants.scaled_dot_product_attention(q, q, q, attn_mask=torch.ones(5, 5, dtype=torch.bool), is_causal=True)


def test_sdpa_attn_mask_under_torch_export():
    """torch.export: the mask is read when the exported program runs (torch.ops.fa_variants.sdpa_masked), so another
    mask gives its own answer, and the program differentiates (a module's parameter, an input that requires grad);
    inside a torch.func transform it cannot be read while exporting, which the drop-in says in one line instead of
    the exporter's data-dependent guard error."""
    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.gain = torch.nn.Parameter(torch.ones(16))

        def forward(self, q, k, mask):
            return fa_variants.scaled_dot_product_attention(q * self.gain, k, k, attn_mask=mask, enable_gqa=True,
                                                            backend="reference")

    g = seeded_generator()
    q, k = torch.randn(2, 4, 3, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g)
    model = Model()
    program = torch.export.export(model, (q, k, _lengths_mask([9, 4], 3, 9, True)), strict=False)
    assert any("fa_variants.sdpa_masked" in str(n.target) for n in program.graph.nodes)
    for lengths, causal in (([9, 4], True), ([2, 7], True), ([5, 9], False)):
        mask = _lengths_mask(lengths, 3, 9, causal)
        grads = []
        for run in (lambda q, k: F.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True),
                    lambda q, k: program.module()(q, k, mask)):
            leaf = k.clone().requires_grad_(True)
            out = run(q, leaf)
            out.square().sum().backward()
            grads.append((out.detach(), leaf.grad))
        torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-5)

    class Vmapped(torch.nn.Module):
        def forward(self, qs, k, mask):
            return torch.vmap(lambda q: fa_variants.scaled_dot_product_attention(
                q, k, k, attn_mask=mask, enable_gqa=True, backend="reference"))(qs)

    refusal = (r"^attn_mask inside a torch.func transform \(vmap, grad, jvp\) under torch.export or "
               r"torch.compile\(fullgraph=True\): .*with causal and seqlens_k$")
    with pytest.raises(ValueError, match=refusal):
        torch.export.export(Vmapped(), (q[None], k, _lengths_mask([9, 4], 3, 9, True)), strict=False)
    # the same under torch.compile(fullgraph=True), where the read at the call cannot break the graph (before
    # session 59: Dynamo's "Call to torch.compiler.disable()", or on torch 2.11 this message naming torch.export)
    torch._dynamo.reset()
    grad = torch.func.grad(lambda q, mask: fa_variants.scaled_dot_product_attention(
        q, k, k, attn_mask=mask, enable_gqa=True, backend="reference").sum())
    with pytest.raises(Exception, match=refusal[1:-1]):
        torch.compile(grad, fullgraph=True, backend="eager")(q, _lengths_mask([9, 4], 3, 9, True))
    torch._dynamo.reset()


def test_sdpa_attn_mask_under_transforms_is_refused_in_one_line():
    """A mask batched by vmap (eagerly and under torch.compile, whose fallback for vmap runs the call with
    is_compiling() true) or functionalized has no values to read: a one-line ValueError naming attn_mask, not
    torch's errors about storage."""
    q, k = torch.randn(2, 4, 3, 16), torch.randn(2, 2, 9, 16)

    def run(mask):
        return fa_variants.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True, backend="reference")

    masks = torch.stack([_lengths_mask([9, 9], 3, 9, True)[0, 0], torch.ones(3, 9, dtype=torch.bool)])
    torch._dynamo.reset()
    try:
        for fn, what in ((torch.vmap(run), "batched by torch.func.vmap"),
                         (torch.compile(torch.vmap(run), backend="eager"), "batched by torch.func.vmap")):
            with pytest.raises(ValueError, match=f"^attn_mask: fa_variants cannot express a mask {what}") as caught:
                fn(masks)
            assert "\n" not in str(caught.value)
    finally:
        torch._dynamo.reset()
    with pytest.raises(ValueError, match="^attn_mask: fa_variants cannot express a mask functionalized by torch.func"):
        torch.func.functionalize(run)(masks[0])


@pytest.mark.parametrize("seqlen_q", [1, 3])
def test_sdpa_attn_mask_under_torch_compile_fullgraph(seqlen_q):
    """Without grad, a prefill's (three query rows) attn_mask and the attention are one op,
    torch.ops.fa_variants.sdpa_masked, which reads the mask when the graph runs (whether it is causal or full is the
    mask's to say); a decoding step's (one row: the kinds coincide) windows come from torch.ops.fa_variants.mask_window
    and the attention op stays a node of its own (inside reduce-overhead's CUDA graphs). So fullgraph=True works, a growing cache recompiles at most once (dynamic shapes
    after the second size), each step equals torch's SDPA whichever kind the mask is, and a mask it cannot express
    (a hole between visible keys) is refused with the drop-in's one-line ValueError when the graph runs."""
    def step(q, k, mask):
        return fa_variants.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True, backend="reference")

    graphs, recording_backend = _recorder()

    torch._dynamo.reset()
    compiled = torch.compile(step, fullgraph=True, backend=recording_backend)
    g = seeded_generator()
    try:
        for seqlen_k in range(9, 15):
            q, k = torch.randn(2, 4, seqlen_q, 16, generator=g), torch.randn(2, 2, seqlen_k, 16, generator=g)
            # sequence 1 keeps keys 0..2 visible in its last row (length >= 3), so the hole at key 1 below is
            # between visible keys whatever the draw (at seqlen_q 1 a drawn length of 2 left key 0 alone: no hole)
            lengths = [seqlen_k, int(torch.randint(max(3, seqlen_q + 1), seqlen_k + 1, (), generator=g))]
            mask = _lengths_mask(lengths, seqlen_q, seqlen_k, causal=seqlen_k % 2 == 0)
            want = F.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True)
            torch.testing.assert_close(compiled(q, k, mask), want, rtol=1e-5, atol=1e-5)
        assert len(graphs) <= 2, f"{len(graphs)} graphs for 6 cache sizes"
        op = "fa_variants.mask_window" if seqlen_q == 1 else "fa_variants.sdpa_masked"  # (see the docstring)
        assert all(any(op in str(n.target) for n in gm.graph.nodes) for gm in graphs)
        mask[1, ..., 1] = False  # a hole between sequence 1's visible keys 0 and 2
        with pytest.raises(ValueError, match=r"^attn_mask: fa_variants cannot express this attention mask"):
            compiled(q, k, mask)
    finally:
        torch._dynamo.reset()


@pytest.mark.inductor  # (tests/conftest.py: skipped without a C++ compiler)
@pytest.mark.parametrize("needs_grad", ["q", "k"])
def test_sdpa_attn_mask_under_torch_compile_with_grad(needs_grad, monkeypatch):
    """With an input that requires grad (any of the three), under torch.compile(fullgraph=True): sdpa_masked's
    backward gives torch's SDPA's gradients; it hands the backward the mask as read, so a plain mask takes the plain
    call's backward (no lengths: FA_VARIANTS_BACKWARD's fused one on a kernel backend) and a padded one the lengths
    (the same, length by length)."""
    from fa_variants.integrations import backward

    def run(q, k, mask):
        return fa_variants.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True, backend="reference")

    seen = []  # (causal, seqlens_k, out kept) of each backward
    kernel_backward = backward.kernel_backward
    monkeypatch.setattr(backward, "kernel_backward",
                        lambda *a, **kw: seen.append((a[8], a[7], a[5] is not None)) or kernel_backward(*a, **kw))
    g = seeded_generator()
    q, k = torch.randn(2, 4, 3, 16, generator=g), torch.randn(2, 2, 9, 16, generator=g)
    torch._dynamo.reset()
    compiled = torch.compile(run, fullgraph=True)
    try:
        for lengths, causal in (([9, 9], True), ([9, 5], True), ([9, 9], False), ([4, 9], False)):
            mask = _lengths_mask(lengths, 3, 9, causal)
            grads = []
            for fn in (lambda q, k, m: F.scaled_dot_product_attention(q, k, k, attn_mask=m, enable_gqa=True),
                       compiled):
                leaf = {"q": q, "k": k}[needs_grad].clone().requires_grad_(True)
                args = (leaf, k, mask) if needs_grad == "q" else (q, leaf, mask)
                out = fn(*args)
                out.square().sum().backward()
                grads.append((out.detach(), leaf.grad))
            torch.testing.assert_close(grads[1], grads[0], rtol=1e-5, atol=1e-5)
            plain = lengths == [9, 9]
            assert seen[-1][0] is causal and (seen[-1][1] is None) is plain, seen[-1]
            assert seen[-1][2] is backward.keeps_outputs(False)  # O and LSE reach the fused backwards
            if not plain:
                assert seen[-1][1].tolist() == lengths
    finally:
        torch._dynamo.reset()


@pytest.mark.inductor  # (tests/conftest.py: skipped without a C++ compiler)
@pytest.mark.parametrize("causal", [True, False], ids=["causal", "full"])
def test_sdpa_left_padded_mask_under_torch_compile_with_grad(causal):
    """A left-padded batch's attn_mask (prefill rows, an input that requires grad) under torch.compile(fullgraph=True):
    sdpa_masked reads it as each sequence's window and runs one call with seqlens_k and leftpad_k; its backward reads
    the windows from the mask again. Output and gradients equal torch's SDPA with the mask, but for rows that see no
    key (ours 0, torch's NaN); so do those of a causal batch padded on the right (its query counts as seqlens_q,
    session 55; before, refused when the graph ran), every row of it."""
    def run(q, k, mask):
        return fa_variants.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True, backend="reference")

    g = seeded_generator()
    q, k = torch.randn(3, 4, 6, 16, generator=g, dtype=torch.float64), torch.randn(3, 2, 6, 16, generator=g,
                                                                                   dtype=torch.float64)
    rows, keys = torch.arange(6)[:, None], torch.arange(6)
    mask = torch.stack([(keys >= p) & ((keys <= rows) if causal else (rows >= 0)) for p in (0, 2, 5)])[:, None]
    right = torch.stack([(keys < n) & (keys <= rows) for n in (6, 3, 1)])[:, None]
    torch._dynamo.reset()
    try:
        compiled = torch.compile(run, fullgraph=True)
        for mask in (mask, right) if causal else (mask,):
            seen = mask.any(-1, keepdim=True)  # rows that see a key
            grads = []
            for fn in (lambda q, k, m: F.scaled_dot_product_attention(q, k, k, attn_mask=m, enable_gqa=True),
                       compiled):
                leaves = [t.clone().requires_grad_(True) for t in (q, k)]
                out = fn(*leaves, mask)
                (out * seen).nan_to_num().square().sum().backward()
                grads.append(((out * seen).nan_to_num().detach(), *(t.grad for t in leaves)))
            for got, want in zip(grads[1], grads[0]):
                torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)
    finally:
        torch._dynamo.reset()


def test_sdpa_masked_with_windows_passes_opcheck():
    """torch.library.opcheck of sdpa_masked_sequence_windows on a left-padded mask and a causal one padded on the right
    (its windows: (3, batch), ends, first keys and query counts, handed to the backward) and of its backward op;
    sdpa_masked_windows, the op of session 54 ((2, batch): no query counts, the right padding refused), and
    sdpa_masked, the op before it (lengths (batch,), left padding refused), kept for graphs traced with them: the same
    gradients through the shared backward op."""
    q, k = torch.randn(2, 5, 4, 16, dtype=torch.float64), torch.randn(2, 5, 2, 16, dtype=torch.float64)
    rows, keys = torch.arange(5)[:, None], torch.arange(5)
    mask = torch.stack([(keys >= p) & (keys <= rows) for p in (0, 2)])[:, None]
    right = torch.stack([(keys < n) & (keys <= rows) for n in (5, 2)])[:, None]
    op = torch.ops.fa_variants.sdpa_masked_sequence_windows
    backward_op = torch.ops.fa_variants.sdpa_masked_backward
    for given, expected, how in ((mask, [[5, 5], [0, 2], [5, 5]], 2), (right, [[5, 2], [0, 0], [5, 2]], 3)):
        out, lse, windows, kind = op(q, k, k, given, None, "reference")
        assert kind.tolist() == [1, how] and windows.tolist() == expected
        torch.library.opcheck(op, (q, k, k, given, None, "reference"))
        grad = torch.randn_like(out)
        torch.library.opcheck(backward_op, (grad, None, q, k, k, out, lse, windows, kind, None, "reference"))
    session54 = torch.ops.fa_variants.sdpa_masked_windows
    out, lse, windows, kind = session54(q, k, k, mask, None, "reference")
    assert kind.tolist() == [1, 2] and windows.tolist() == [[5, 5], [0, 2]]
    torch.library.opcheck(session54, (q, k, k, mask, None, "reference"))
    with pytest.raises(ValueError, match="^attn_mask: fa_variants cannot express a padded batch whose rows past"):
        session54(q, k, k, right, None, "reference")
    # the op before session 54, kept for graphs traced with it: lengths only, the ends alone
    lengths = (torch.arange(5) < torch.tensor([5, 3])[:, None])[:, None, None]
    old = torch.ops.fa_variants.sdpa_masked(q, k, k, lengths, None, "reference")
    new = op(q, k, k, lengths, None, "reference")
    assert old[2].tolist() == [5, 3] and new[2].tolist() == [[5, 3], [0, 0], [5, 5]] and old[3].tolist() == [0, 1]
    torch.library.opcheck(torch.ops.fa_variants.sdpa_masked, (q, k, k, lengths, None, "reference"))
    for a, b in zip(backward_op(grad, None, q, k, k, *old[:2], old[2], old[3], None, "reference"),
                    backward_op(grad, None, q, k, k, *new[:2], new[2], new[3], None, "reference")):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    with pytest.raises(ValueError, match="^attn_mask: fa_variants cannot express this attention mask"):
        torch.ops.fa_variants.sdpa_masked(q, k, k, mask, None, "reference")  # left padding: not the old op's


@pytest.mark.parametrize("dims", [2, 4])
def test_a_mask_changed_after_the_compiled_call_leaves_its_gradients(dims):
    """The compiled SDPA drop-in keeps what it read of the mask for the backward, not the mask: a mask buffer
    rewritten between forward and backward (reused across micro-batches) changes neither the gradients nor raises,
    as with torch's SDPA (plain, lengths and left-padded windows)."""
    def run(q, k, mask):
        return fa_variants.scaled_dot_product_attention(q, k, k, attn_mask=mask, backend="reference")

    g = seeded_generator()
    q, k = (torch.randn(1, 2, 5, 8, generator=g, dtype=torch.float64) for _ in range(2))
    rows, keys = torch.arange(5)[:, None], torch.arange(5)
    masks = [keys <= rows, (keys < 4) & (rows >= 0), (keys <= rows) & (keys >= 2)]  # plain, lengths, windows
    torch._dynamo.reset()
    try:
        compiled = torch.compile(run, fullgraph=True)
        for mask in masks:
            buffer = mask.clone() if dims == 2 else mask.clone()[None, None]
            grads = []
            for rewrite in (False, True):
                leaf = q.clone().requires_grad_(True)
                out = compiled(leaf, k, buffer.copy_(mask if dims == 2 else mask[None, None]))
                if rewrite:
                    buffer.copy_(torch.ones_like(buffer))
                (out * (rows >= 2)).square().sum().backward()  # rows 0, 1 see no key under the windows' mask
                grads.append(leaf.grad)
            torch.testing.assert_close(grads[1], grads[0], rtol=0, atol=0)
    finally:
        torch._dynamo.reset()


@needs_hf
def test_training_under_torch_compile_keeps_the_plain_call_for_an_unpadded_mask():
    """With grad (training), a traced layer reads its mask at a graph break, as eagerly: an all-ones attention_mask
    (what tokenizers pass) keeps the plain causal op, whose backward is the fused one without a host read, not the
    lengths op; the gradients equal eager attention's."""
    from test_integrations import tiny_llama

    model = tiny_llama()
    ids = torch.randint(0, 97, (2, 11), generator=seeded_generator())
    name = hf.register(backend="reference")
    graphs, recording_backend = _recorder()

    def loss_grads(forward, model=model):
        model.zero_grad()
        forward(ids, attention_mask=torch.ones_like(ids)).last_hidden_state.square().mean().backward()
        return [p.grad.clone() for p in model.parameters() if p.grad is not None]

    torch._dynamo.reset()
    try:
        expected = loss_grads(model.model)
        model.set_attn_implementation(name)
        got = loss_grads(torch.compile(model.model, backend=recording_backend))
    finally:
        model.set_attn_implementation("eager")
        model.zero_grad()
        torch._dynamo.reset()
    targets = [str(n.target) for gm in graphs for n in gm.graph.nodes]
    assert "fa_variants.attention" in targets  # the plain op (layers dynamo gives up on run it eagerly)
    assert not any("fa_variants.attention_seqlens_k" in t or "fa_variants.mask_window" in t for t in targets)
    twin = float64_twin(model)
    assert_model_within_rule(got, expected, loss_grads(twin.model, twin), "gradient")


def test_edge_masks_batch_zero_and_nothing_visible():
    """A mask broadcast over an empty batch gives an empty output (seqlens_k of shape (0,)); a mask that hides every
    key is both kinds at once: the mask op takes it for a non-causal layer as eagerly (rows 0)."""
    q, k = torch.randn(0, 4, 3, 16), torch.randn(0, 2, 9, 16)
    mask = _lengths_mask([4], 3, 9, False)  # (1, 1, 3, 9)
    out = fa_variants.scaled_dot_product_attention(q, k, k, attn_mask=mask, enable_gqa=True, backend="reference")
    assert out.shape == (0, 4, 3, 16)
    hidden = torch.zeros(2, 1, 3, 9, dtype=torch.bool)
    assert hf.mask_as_lengths(hidden, 3, 9, 2, 4)[1].tolist() == [0, 0]
    for causal in (False, True):
        lengths = torch.ops.fa_variants.mask_lengths(hidden, causal, 3, 9, 2, 4, "attention_mask")
        assert lengths.tolist() == [0, 0]
        windows = torch.ops.fa_variants.mask_window(hidden, causal, 3, 9, 2, 4, "attention_mask")
        assert windows.tolist() == [[0, 0], [0, 0]]


def test_the_refusal_is_raisable_under_dynamo():
    """InexpressibleMask raised in a frame Dynamo resumes after a graph break, and caught by its caller: torch 2.11's
    Dynamo could not raise an exception class with an __init__ of its own ("Attempted to raise a non-Exception
    type/value", session 53, on the GPU host's torch), so the class has none."""
    def inner(mask):
        torch.compiler.disable(lambda t: None)(mask)  # a graph break
        raise mask_lengths.InexpressibleMask("a test mask")

    def run(mask):
        try:
            inner(mask)
        except mask_lengths.InexpressibleMask as refused:
            return refused.what

    assert "__init__" not in vars(mask_lengths.InexpressibleMask)
    torch._dynamo.reset()
    try:
        assert torch.compile(run, backend="eager")(torch.ones(2)) == "a test mask"
    finally:
        torch._dynamo.reset()


def test_as_lengths_refuses_heads_that_differ_other_ranks_and_a_dtype_min_bias_when_asked():
    """mask_lengths.as_lengths: heads whose key counts differ are refused (one seqlens_k per sequence would give every
    head the first head's keys), so are masks of another rank than 4 (not left to fail inside expand), and with
    float_min_blocks=False (the SDPA drop-in) a float mask holding the dtype's lowest is an attention bias, not a
    mask; with it, any value at or below half the lowest hides its key."""
    heads = torch.zeros(1, 2, 3, 6, dtype=torch.bool)
    heads[:, 0, :, :4] = True
    heads[:, 1, :, :5] = True
    with pytest.raises(mask_lengths.InexpressibleMask, match="^this attention mask"):
        mask_lengths.as_lengths(heads, 3, 6, 1, 2)
    for shape in ((1, 1, 1, 3, 6), (1, 3, 6), (3, 6)):
        with pytest.raises(mask_lengths.InexpressibleMask, match=r"^a mask of shape \("):
            mask_lengths.as_lengths(torch.ones(shape, dtype=torch.bool), 3, 6, 1, 2)
    for dtype in (torch.float32, torch.bfloat16):
        bias = torch.zeros(2, 1, 3, 6, dtype=dtype)
        bias[0, ..., 4:] = torch.finfo(dtype).min
        bias[1, ..., 5:] = torch.finfo(dtype).min / 2
        causal, seqlens_k = mask_lengths.as_lengths(bias, 3, 6, 2, 1)
        assert causal is False and seqlens_k.tolist() == [4, 5]
        with pytest.raises(mask_lengths.InexpressibleMask, match="^an additive attention bias .*: hide keys with -inf"):
            mask_lengths.as_lengths(bias, 3, 6, 2, 1, float_min_blocks=False)
