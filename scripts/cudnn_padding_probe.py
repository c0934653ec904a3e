"""Which geometries give NaN gradients from cuDNN's attention backward on rows whose LSE is below -88.7 (session 44).

SDPA restricted to cuDNN's backend (forward and backward both cuDNN's, as PyTorch runs them), queries anti-aligned with
every key (each scaled score near -14 sqrt(head_dim)), bf16, batch 2, 4 heads, over 22 seqlen_k from 2 to 1216 (residues
mod 128, the sm_90 backward's key tile, around 0, 64 and 127), seqlen_q 1 and 100, head_dim 64, 128 and 256 (cuDNN 9.10+ on
sm_90 only; an error line elsewhere), full and square causal;
random inputs beside as the control. Prints one line per geometry with a non-finite gradient and a summary: the data
behind ``integrations.backward.cudnn_trusted``.

    python3 scripts/cudnn_padding_probe.py [--out DIR]
"""
from __future__ import annotations

import argparse
import json
import pathlib

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

SEQLENS_K = [2, 3, 16, 32, 48, 63, 64, 65, 96, 100, 112, 127, 128, 129, 160, 191, 192, 193, 256, 320, 1000, 1216]


def nonfinite(seqlen_q: int, seqlen_k: int, head_dim: int, causal: bool, anti: bool) -> str:
    """The names of the non-finite gradients (dq / dk / dv), '' when all are finite."""
    q, k, v = (torch.randn(2, 4, n, head_dim, device="cuda") for n in (seqlen_q, seqlen_k, seqlen_k))
    if anti:
        direction = torch.randn(head_dim, device="cuda").sign()
        q, k = 0.1 * q + 3.75 * direction, 0.1 * k - 3.75 * direction
    leaves = [t.bfloat16().requires_grad_(True) for t in (q, k, v)]
    with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
        out = F.scaled_dot_product_attention(*leaves, is_causal=causal)
        grads = torch.autograd.grad(out, leaves, torch.randn_like(out))
    return "".join(name for name, g in zip(("dq", "dk", "dv"), grads) if not g.isfinite().all())


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--out", type=pathlib.Path, default=None, help="write cudnn_padding.json there")
    args = parser.parse_args()
    print(f"torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, {torch.cuda.get_device_name()}")
    rows, refused_dims = [], set()  # an error (cuDNN refusing the head_dim) is printed once per head_dim
    for head_dim in (64, 128, 256):
        for seqlen_q in (1, 100):
            for seqlen_k in SEQLENS_K:
                for causal in (False, True):
                    if causal and seqlen_q != seqlen_k:
                        continue
                    for anti in (True, False):
                        try:
                            bad = nonfinite(seqlen_q, seqlen_k, head_dim, causal, anti)
                        except RuntimeError as error:
                            bad = f"error: {str(error).splitlines()[0][:80]}"
                        rows.append(dict(head_dim=head_dim, seqlen_q=seqlen_q, seqlen_k=seqlen_k, causal=causal,
                                         very_negative_lse=anti, nonfinite=bad))
                        if bad and not (bad.startswith("error") and head_dim in refused_dims):
                            refused_dims.update([head_dim] if bad.startswith("error") else [])
                            print(f"D {head_dim} Nq {seqlen_q} Nk {seqlen_k} (mod 128: {seqlen_k % 128}) "
                                  f"{'causal' if causal else 'full'} {'anti' if anti else 'random'}: {bad}")
        for seqlen in (100, 192, 1216):  # square causal
            try:
                bad = nonfinite(seqlen, seqlen, head_dim, True, True)
            except RuntimeError as error:
                bad = f"error: {str(error).splitlines()[0][:80]}"
            rows.append(dict(head_dim=head_dim, seqlen_q=seqlen, seqlen_k=seqlen, causal=True, very_negative_lse=True,
                             nonfinite=bad))
            if bad and not bad.startswith("error"):
                print(f"D {head_dim} Nq = Nk {seqlen} causal anti: {bad}")
    refused = [r for r in rows if r["nonfinite"].startswith("error")]
    bad = [r for r in rows if r["nonfinite"] and r not in refused]
    bad_k = sorted({r["seqlen_k"] % 128 for r in bad if not r["causal"]})
    print(f"summary: {len(bad)} of {len(rows) - len(refused)} geometries run non-finite ({len(refused)} refused by "
          f"cuDNN: head dims {sorted({r['head_dim'] for r in refused})}); seqlen_k mod 128 of the full ones: {bad_k}; "
          f"seqlen_q of the full ones: {sorted({r['seqlen_q'] for r in bad if not r['causal']})}; causal ones: "
          f"{sum(1 for r in bad if r['causal'])}; random-input ones: {sum(1 for r in bad if not r['very_negative_lse'])}")
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "cudnn_padding.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
