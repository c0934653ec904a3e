import torch, fa_variants
for seq in (False, True):
    torch._dynamo.reset()
    q = torch.randn(4, 1, 32, 128, device="cuda", dtype=torch.bfloat16)
    k = torch.randn(4, 1023, 8, 128, device="cuda", dtype=torch.bfloat16); v = torch.randn_like(k)
    n = torch.tensor([700, 1, 0, 1023], dtype=torch.int32, device="cuda")
    fn = (lambda q, k, v, n: fa_variants.attention(q, k, v, causal=True, seqlens_k=n)) if seq else \
         (lambda q, k, v, n: fa_variants.attention(q, k, v, causal=True))
    try:
        c = torch.compile(fn, fullgraph=True, mode="reduce-overhead")
        for _ in range(3):
            c(q, k, v, n)
        torch.cuda.synchronize()
        print("grad mode, reduce-overhead, seqlens_k" if seq else "grad mode, reduce-overhead, plain", "ok")
    except Exception as e:
        print("grad mode, reduce-overhead", "seqlens_k" if seq else "plain", "FAILED:", type(e).__name__, str(e).splitlines()[-1][:200] if str(e) else "", [l for l in str(e).splitlines() if "leaf" in l][:1])
