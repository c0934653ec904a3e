"""Save fa3-fp8 kernel outputs with the exact FP8Inputs they came from, to study the emulation on the CPU.

    python3 scripts/fp8_dump.py --out $OUT/fp8_dump.pt          # on the GPU host (sm90)

Each case: the default recipe (and the single accumulator) on fresh bf16 N(0, 1) inputs; the file holds, per
case, the FP8Inputs moved to the CPU, the kernel's out and LSE, and the causal flag. On the CPU:
``torch.load(path, weights_only=False)`` then ``fa_variants.fp8.emulate_fp8_attention(case["inputs"], ...)``
against ``case["out"]`` — so a model of the FP8 tensor cores (accumulator bits, exp2) can be calibrated
without device time.
"""
from __future__ import annotations

import argparse
import dataclasses

import torch

from fa_variants import fp8

CASES = [  # (batch, seqlen_q, seqlen_k, num_heads, num_heads_kv, head_dim, causal, two_level)
    (1, 113, 113, 4, 2, 64, False, True),
    (1, 1023, 1023, 6, 2, 64, False, True),
    (1, 113, 113, 4, 2, 128, False, True),
    (1, 1023, 1023, 6, 2, 128, False, True),
    (1, 1023, 1023, 6, 2, 128, False, False),
    (1, 113, 113, 4, 2, 256, False, True),
    (1, 1023, 1023, 4, 2, 256, True, True),
]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1234)
    a = ap.parse_args()
    g = torch.Generator(device="cuda").manual_seed(a.seed)
    saved = []
    for batch, nq, nk, h, hkv, d, causal, two_level in CASES:
        q = torch.randn(batch, nq, h, d, device="cuda", generator=g).bfloat16()
        k = torch.randn(batch, nk, hkv, d, device="cuda", generator=g).bfloat16()
        v = torch.randn(batch, nk, hkv, d, device="cuda", generator=g).bfloat16()
        config = fp8.FP8Config(two_level=two_level)
        inp = fp8.quantize_fp8(q, k, v, config=config)
        out, lse = fp8.attention_from_fp8(inp, causal=causal, return_lse=True, out_dtype=torch.bfloat16)
        moved = {f.name: getattr(inp, f.name).cpu() for f in dataclasses.fields(inp)
                 if isinstance(getattr(inp, f.name), torch.Tensor)}
        emu, _ = fp8.emulate_fp8_attention(inp, causal=causal, out_dtype=torch.bfloat16)
        rel = ((out.double() - emu.double()).norm() / emu.double().norm()).item()
        print(f"B{batch} Nq{nq} Nk{nk} H{h}:{hkv} D{d} causal={causal} two_level={two_level}: "
              f"kernel vs emulation rel-L2 {rel:.3e}", flush=True)
        saved.append(dict(inputs=dataclasses.replace(inp, **moved), out=out.cpu(), lse=lse.cpu(), causal=causal))
    torch.save(saved, a.out)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
