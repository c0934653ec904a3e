"""One-off (session 54): a left-padded batch's attention, one launch (leftpad_k) against one call per window and SDPA."""
import torch
import fa_variants
from fa_variants import windowed
from fa_variants.common.mask_windows import Window
torch.manual_seed(0)
def _per_window(q, k, v, wins):
    saved = windowed.one_call
    windowed.one_call = lambda *a: None
    try:
        return windowed.attention(q, k, v, wins)
    finally:
        windowed.one_call = saved
def t(fn, n=20):
    for _ in range(3): fn()
    torch.cuda.synchronize()
    s, e = torch.cuda.Event(True), torch.cuda.Event(True)
    s.record()
    for _ in range(n): fn()
    e.record(); torch.cuda.synchronize()
    return s.elapsed_time(e) / n * 1000
for B, nq, nk in ((16, 1, 4096), (16, 1, 32768), (8, 512, 512), (8, 2048, 2048)):
    q = torch.randn(B, nq, 32, 128, dtype=torch.bfloat16, device="cuda")
    k, v = (torch.randn(B, nk, 8, 128, dtype=torch.bfloat16, device="cuda") for _ in range(2))
    pads = torch.randint(0, nk // 2, (B,)).tolist()
    wins = [Window(p, nk, nk - nq) for p in pads]
    starts = torch.tensor(pads, dtype=torch.int32, device="cuda")
    rows, keys = torch.arange(nq, device="cuda")[:, None] + nk - nq, torch.arange(nk, device="cuda")
    mask = torch.stack([(keys >= p) & (keys <= rows) for p in pads])[:, None]
    qs, ks, vs = (x.transpose(1, 2) for x in (q, k, v))
    res = {}
    for _ in range(3):
        res.setdefault("leftpad", []).append(t(lambda: fa_variants.attention(q, k, v, causal=True, leftpad_k=starts)))
        res.setdefault("per-window", []).append(t(lambda: _per_window(q, k, v, wins)))
        res.setdefault("sdpa-mask", []).append(t(lambda: torch.nn.functional.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask, enable_gqa=True)))
    print(B, nq, nk, {n: round(sorted(x)[1], 1) for n, x in res.items()}, "us", flush=True)
