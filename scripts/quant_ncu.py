"""One default-recipe quantisation call per pipeline under Nsight Compute (session 12's quantlanes run).

    ncu --kernel-name regex:QuantPass --launch-skip 6 --launch-count 6 ... python3 scripts/quant_ncu.py

B*N = 16k, H*D = 2048 bf16 at head_dim 128 (64 MiB per 16-bit tensor, as scripts/fp8_quant_bandwidth.py). Each
pipeline of ``--pipelines`` (default v1,v3) is called once to compile and warm up, then once more: with three
QuantPass launches per call (v1: V, K, Q after torch's K mean; v3: V with K's sums, K, Q), --launch-skip 6
--launch-count 6 profiles the second call of each. Prints one line per call. ``--recipe`` (default, sampled8) and
the labels of scripts/fp8_quant_bandwidth.py's PIPES (v3s: v3 with ``V3_STAGED_MEAN``) as for that script;
``--pipelines v3,v3s --recipes default,sampled8`` pairs them in order (v3 default, v3s sampled8).
"""
from __future__ import annotations

import argparse


def main() -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--pipelines", default="v1,v3")
    parser.add_argument("--recipes", default=None, help="one recipe per pipeline (default: default for each)")
    parser.add_argument("--head-dim", type=int, default=128)
    args = parser.parse_args()
    from fp8_quant_bandwidth import PIPES, recipes, run_with

    pipelines = args.pipelines.split(",")
    names = args.recipes.split(",") if args.recipes else ["default"] * len(pipelines)
    if len(names) != len(pipelines):
        parser.error("--recipes: one per pipeline")
    if unknown := [p for p in pipelines if p not in PIPES] + [r for r in names if r not in recipes()]:
        parser.error(f"--pipelines / --recipes: unknown {unknown} (fp8_quant_bandwidth.py's PIPES and recipes)")
    import torch

    from fa_variants.fp8 import quant_host

    d = args.head_dim
    g = torch.Generator(device="cuda").manual_seed(1)
    q, k, v = (torch.randn(1, 16384, 2048 // d, d, device="cuda", generator=g).to(torch.bfloat16) for _ in range(3))
    for rnd in ("warm", "profiled"):
        for pipe, recipe in zip(pipelines, names):
            cfg = recipes()[recipe]
            run_with(pipe, lambda: quant_host.quantize(q, k, v, config=cfg, pipeline=PIPES[pipe][0]))
            torch.cuda.synchronize()
            print(f"{rnd} {pipe} {recipe} D={d}: 3 QuantPass launches", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
