"""Issue 12: fa3 config variants timed side by side in one process, with flash-attn-4 and cuDNN beside them.

    python3 scripts/fa3_speed_ab.py --out $OUT/fa3ab            # the default plan, ~3-4 min on an H200
    python3 scripts/fa3_speed_ab.py --plan                       # print the plan (no GPU needed)
    python3 scripts/fa3_speed_ab.py --precompile 16              # the plan's kernels into the disk cache

Variants are fa3's DEFAULT_CONFIGS with switches changed (``VARIANTS``): `old` is the config before issue 12's
softmax switches (exact exponent, one serial reduction chain, O always rescaled; at D 256 P converted per value, the
default before session 9), `new` the current default, and
the structural switches of issue 12's second round (Sm90Config; the softmax switches were measured on
2026-11-30, bench/h200-2026-11-30/session2/fa3_speed_ab.md): each alone at D = 128 (the ncu shape), and all
of them together (`lean`) at every head dim (D = 256: without first_pv_overwrites, which spills there); issue 12's
third round (`o-before-pv`: O rescaled under the next S GEMM, flash-attn-4's RescaleOBeforeGemm; bench/NOTES.md,
"Issue 12, round 3"); issue 12's fourth round (bench/NOTES.md, "Issue 12, round 4":
flash-attn-4's sm90 choices that ours lacked, and C++ FA3's); the per-tile instruction gap (`FA3GAP`: fa4-256; its
alpha-from-the-bases variants were removed with that switch in session 15: slower on the H200; bench/NOTES.md, "Issue
12, SASS gap"); session 6's
persistent grid (`PERSIST`: `persistent`, Sm90Config.persistent at D 64/128/256);
session 8's O rescale under the exponentials (`ALPHA`: `alpha`, Sm90Config.alpha_first, and `alpha-noskip` at D 64);
session 8's D 256 comparison (`GAP9`: `alpha-256` beside fa4-256; run in session 9 with
pairs-256, which became the D 256 default); session 12's descriptors built once per tile, out of the ping-pong turn
(`TURN`: `turn`, Sm90Config.hoisted_descriptors at D 128; on in D 64's default since session 12 and in D 128's since
session 15; `noturn` is each default before its flip).
--shapes D:N:full|causal,... picks shapes one by one
instead.
The default run (--variants, --seqlens) is round 4's:
old, new, fa4-256, n176, stages3, k-first at N 4k/16k; the
earlier variants stay selectable. --peers takes the bench's peer names (flash-attn-4, sdpa-cudnn, ...) or the
aliases cudnn / fa4 / flash; an unknown name is an error (before 2026-12-01 evening an unknown name such as
`cudnn` ran flash-attn-4 under that label, and the SUMMARY's cuDNN column, which reads `sdpa-cudnn`, printed nan). Shapes: the
FlashAttention papers' setup (batch * seqlen = 16384 tokens, heads * head_dim = 2048, bf16, forward),
TFLOP/s = 4 B H N^2 D / time (halved for causal).

Protocol: every variant compiles and runs once outside the timing (its max |difference| to `old` is reported);
then, per shape, one of two protocols (--protocol; a comma list runs each in turn on every shape, e.g. to compare):
- `paired` (default; fa_variants.bench.paired): each entry is a CUDA graph of as many calls as fill --burst-ms;
  --warmup-ms of bursts of all entries first (the power-capped steady state), then --rounds rounds of --cycles
  cycles, each cycle one burst per entry, orders rotated and every second cycle reversed (ABC CBA); a ratio sample
  is the pair of cycles' times, its median over rounds and a bootstrap 95% interval are reported, and an A/A
  control (`old`'s callable timed again as entry AA) gives the noise band: a verdict "faster" / "slower" needs the
  interval to exclude 1 and the median to differ from 1 by more than the A/A band, else "same". Variants whose
  configs are equal (pairs-256 and new at D 256 since session 9) are timed once and their ratio is the A/A
  control's, marked "A/A".
  The SM clock and power are read by NVML during every burst.
- `rounds` (before 2026-12-01): each entry warmed up for --warmup-ms once per shape; --rounds rounds, each timing
  every entry once (triton do_bench median, --rep-ms), the order rotated by one entry per round; ratios are
  medians of per-round ratios. Its A/A test (old vs new at D 256) spread 0.94-0.98 on an H200 at its power cap.
Reported per entry: the median TFLOP/s over rounds, the spread (max - min) / median between rounds' median times,
and ratios to `old` and to flash-attn-4. nvidia-smi logs SM clock, power and temperature every 500 ms to
clocks.csv beside ab.json and ab.md. The last lines printed are the summary: new / old, new / flash-attn-4,
new / cuDNN per shape, x / new and x / flash-attn-4 per other variant; with `paired`, then the A/A interval and
band, and the intervals and verdicts of new/old, new/fa4, new/cudnn and x/new.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # this checkout's fa_variants, run from anywhere

TOKENS, HIDDEN = 16384, 2048
OLD = dict(exp2_ffma=False, reduce_chains=1, skip_unit_rescale=False, alpha_first=False, convert_pairs=False)
#: name -> (head dims it runs at, changes to DEFAULT_CONFIGS[head_dim])
LEAN = dict(shared_kv_state=True, first_pv_overwrites=True, epilogue_arrive=True)
VARIANTS = {
    "old": ((64, 128, 256), OLD),
    "new": ((64, 128, 256), {}),
    "kv1": ((128,), dict(shared_kv_state=True)),
    "o-overwrite": ((128,), dict(first_pv_overwrites=True)),
    "epi-arrive": ((128,), dict(epilogue_arrive=True)),
    "lean": ((64, 128), LEAN),
    "lean-256": ((256,), dict(LEAN, first_pv_overwrites=False)),  # first_pv_overwrites spills at D 256 causal
    # issue 12, round 3
    "o-before-pv": ((64, 128, 256), dict(rescale_o_before_pv=True)),
    # issue 12, round 4 (bench/NOTES.md, "Issue 12, round 4"): flash-attn-4's D 256 choices one by one (P converted
    # in pairs; + one-FFMA exponent, 4 reduction chains and O rescaled before the P V GEMM), C++ FA3's 128 x 176
    # tile at D 128, 3 stages, the first K tile loaded before Q. pairs-256 is the D 256 default since session 9 (equal
    # to `new` there: timed once, as the A/A control; in no set)
    "pairs-256": ((256,), dict(convert_pairs=True)),
    "fa4-256": ((256,), dict(convert_pairs=True, exp2_ffma=True, reduce_chains=4, rescale_o_before_pv=True)),
    "n176": ((128,), dict(tile_n=176, convert_pairs=True)),
    "stages3": ((64, 128), dict(stages=3)),
    "k-first": ((128,), dict(k_before_q=True)),
    # session 6: the persistent grid (Sm90Config.persistent; bench/NOTES.md, "Session 6 (2026-12-01): persistent")
    "persistent": ((64, 128, 256), dict(persistent=True)),
    # session 8: every row's alpha before the exponentials, so O's rescale runs under them as in flash-attn-4
    # (Sm90Config.alpha_first; bench/NOTES.md, "Session 8 (2026-12-01): fa3 vs flash-attn-4 consumer loop"); at D 64
    # the default skips O's rescale in a branch when no row max moved, which keeps it out of the exponentials: also
    # without the skip (`alpha-noskip`)
    "alpha": ((64, 128), dict(alpha_first=True)),
    "alpha-noskip": ((64,), dict(alpha_first=True, skip_unit_rescale=False)),
    # session 8, D 256 vs flash-attn-4 (bench/NOTES.md, "Session 8 (2026-12-01): fa3 vs flash-attn-4 at head_dim 64
    # and 256"): flash-attn-4's choices but O rescaled under the exponentials (alpha_first, D 128's structure) instead
    # of before the P V GEMM (fa4-256)
    "alpha-256": ((256,), dict(convert_pairs=True, exp2_ffma=True, reduce_chains=4, alpha_first=True)),
    # session 12, fa3's ping-pong turn (bench/NOTES.md, "Session 12 (2026-12-02): fa3's ping-pong turn, descriptors
    # built once per tile; ..."): the K/V ring's WGMMA descriptors built once per tile instead of in every step's
    # turn (Sm90Config.hoisted_descriptors); on in D 64's default since session 12 (turn/new 1.000-1.012), in D 128's
    # since session 15 (1.008-1.015): `turn` equals `new` there now (timed once, as the A/A control)
    "turn": ((128,), dict(hoisted_descriptors=True)),
    # the default before the flip: D 64's before session 12 (the GPU tests' reference), D 128's before session 15
    "noturn": ((64, 128), dict(hoisted_descriptors=False)),
    # session 16, short prefill (bench/NOTES.md, "Session 16 (2026-12-02): outcome of the short-sequence run"): at D 64
    # the 192-row tile leaves a third of its last query tile empty at N 512 / 1k (576 / 1152 rows for 512 / 1024);
    # 128-row tiles fit those lengths exactly, in the persistent grid `auto` runs there
    "persistent-m128": ((64,), dict(persistent=True, tile_m=128)),
    # session 17, the persistent grid's causal balance (bench/NOTES.md, "Session 17 (2026-12-02): the persistent grid
    # dealt by load; predictions before the run"): the tiles of each round of the static schedule dealt to the CTAs by
    # their load so far (Sm90Config.balanced, common.tile_order.balanced_order)
    "balanced": ((64, 128, 256), dict(persistent=True, balanced=True)),
    # session 18: D 64's 128-row short causal tile (session 17's narrow flip, timed on the static schedule) dealt by
    # load too (bench/NOTES.md, "Session 18 (2026-12-03): the balanced grid's reach; predictions before the run")
    "balanced-m128": ((64,), dict(persistent=True, balanced=True, tile_m=128)),
    # session 19: the persistent kernel on the one-CTA-per-tile grid (the static schedule with as many CTAs as tiles:
    # CTA b runs tile b only, the order `new`'s hardware dispatch gives), to tell the persistent code's cost at long N
    # from its schedule's (bench/NOTES.md, "Session 19 ..."); a measurement, not a config: ONE_TILE_GRID runs it
    "persistent-1tile": ((64, 128, 256), dict(persistent=True)),
    # session 19: D 256 causal ran 7-8 % faster with P converted per value (`old` there) than with convert_pairs (the
    # default since session 9, timed non-causal then): the balanced grid without it
    "balanced-nopairs": ((256,), dict(persistent=True, balanced=True, convert_pairs=False)),
    # session 19: the softmax switches at D 256 (one FFMA per score, 4 reduction chains; off there since 2026-11-30,
    # timed before convert_pairs and causal D 256's per-value conversion), on the call's default (causal: per value)
    "ffma-256": ((256,), dict(exp2_ffma=True, reduce_chains=4)),
    "ffma-balanced-256": ((256,), dict(exp2_ffma=True, reduce_chains=4, persistent=True, balanced=True)),
}
#: variants run with the persistent grid's CTA count raised past the tile count (``one_tile_grid``); each must be the
#: only variant of its config in a run
ONE_TILE_GRID = ("persistent-1tile",)
ROUND4 = ("old", "new", "fa4-256", "n176", "stages3", "k-first")
FA3GAP = ("old", "new", "fa4-256")  # basis, basis-kv1, basis-256 removed in session 15 (alpha from the bases: slower)
PERSIST = ("old", "new", "persistent")
SHORT = ("old", "new", "persistent", "persistent-m128")  # session 16's short prefill (scripts/short_gpu.sh)
BALANCED = ("old", "new", "persistent", "balanced")  # session 17 (scripts/balanced_gpu.sh)
ALPHA = ("old", "new", "alpha", "alpha-noskip")
GAP9 = ("old", "new", "fa4-256", "alpha-256")
TURN = ("old", "new", "turn")
PEERS = ("flash-attn-4", "sdpa-cudnn")
#: other spellings of the peers accepted by --peers (bench.runtime.build_impls knows only the canonical names)
PEER_ALIASES = {"cudnn": "sdpa-cudnn", "fa4": "flash-attn-4", "flash": "sdpa-flash"}
KNOWN_PEERS = ("flash-attn-4", "sdpa-cudnn", "sdpa-flash", "sdpa-efficient", "sdpa-math")
PROTOCOLS = ("paired", "rounds")
WARMUP_MS = {"paired": 500, "rounds": 100}


def variant_config(name: str, head_dim: int, causal: bool = False):
    """The variant's config: the default a call of that head dim (and causality: ``fa3.default_config``, D 256 causal
    without convert_pairs since session 19) runs with the variant's changes."""
    from fa_variants.hopper import fa3

    return dataclasses.replace(fa3.default_config("sm_90a", head_dim, causal), **VARIANTS[name][1])


def plan(head_dims, seqlens, causals, variants) -> list[dict]:
    shapes = []
    for d in head_dims:
        for n in seqlens:
            for causal in causals:
                names = [v for v in variants if d in VARIANTS[v][0]]
                shapes.append(dict(head_dim=d, seqlen=n, causal=causal, batch=max(1, TOKENS // n),
                                   heads=HIDDEN // d, variants=names))
    return shapes


def parse_shapes(text: str) -> list[tuple[int, int, bool]]:
    """--shapes "D:N:full|causal,..." as (head_dim, seqlen, causal) triples; ValueError naming --shapes."""
    out = []
    for item in (x for x in text.split(",") if x):
        parts = item.split(":")
        if len(parts) != 3 or not parts[0].isdigit() or not parts[1].isdigit() or parts[2] not in ("full", "causal"):
            raise ValueError(f"--shapes: {item!r} is not D:N:full or D:N:causal (e.g. 128:4096:full)")
        out.append((int(parts[0]), int(parts[1]), parts[2] == "causal"))
    if not out:
        raise ValueError("--shapes: no shape given")
    return out


def shapes_plan(text: str, variants) -> list[dict]:
    """`plan` over the --shapes triples, in their order (each shape with the variants that run at its head dim)."""
    return [s for d, n, causal in parse_shapes(text) for s in plan([d], [n], (causal,), variants)]


def peer_names(spec: str) -> list[str]:
    """--peers as canonical names (PEER_ALIASES applied); ValueError naming an unknown one."""
    names = [PEER_ALIASES.get(p.strip(), p.strip()) for p in spec.split(",") if p.strip()]
    unknown = [p for p in names if p not in KNOWN_PEERS]
    if unknown:
        raise ValueError(f"--peers: unknown {unknown} (known: {', '.join(KNOWN_PEERS)}; aliases: "
                         f"{', '.join(f'{k}={v}' for k, v in PEER_ALIASES.items())})")
    return list(dict.fromkeys(names))


def summary_lines(rows: list[dict]) -> list[str]:
    """The SUMMARY lines: per shape new/old, new/flash-attn-4, new/cuDNN (medians of per-round ratios; nan where
    that entry did not run), then x/new and x/flash-attn-4 for every other variant."""
    nan = float("nan")
    out = ["SUMMARY (median of per-round ratios): D N causal: new/old new/fa4 new/cudnn | x/new x/fa4 per variant"]
    for r in rows:
        per = ", ".join(f"{k} {r['ratio_to_new'][k]:.3f} {r['ratio_to_fa4'].get(k, nan):.3f}"
                        for k in r["ratio_to_new"] if k not in ("old", "new") and k in VARIANTS)
        out.append(f"SUMMARY D={r['head_dim']} N={r['seqlen']} {'causal' if r['causal'] else 'full'}: "
                   f"{r['ratio_to_old'].get('new', nan):.3f} {r['ratio_new_to'].get('flash-attn-4', nan):.3f} "
                   f"{r['ratio_new_to'].get('sdpa-cudnn', nan):.3f} | {per}" + interval_columns(r))
    return out


def interval_columns(r: dict) -> str:
    """The paired protocol's columns of a SUMMARY line: the A/A control's interval and band, then each reported
    ratio's interval and verdict ("" for rows of the rounds protocol, which have none)."""
    if "aa" not in r:
        return f" | protocol {r['protocol']}" if "protocol" in r else ""
    aa = r["aa"]
    cols = "; ".join(f"{k} {v['median']:.3f} [{v['lo']:.3f},{v['hi']:.3f}] {v['verdict']}{' A/A' if v['aa'] else ''}"
                     for k, v in r["intervals"].items())
    return f" | A/A [{aa['lo']:.3f},{aa['hi']:.3f}] band {aa['band']:.3f} | {cols}"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--head-dims", default="64,128,256")
    ap.add_argument("--seqlens", default="4096,16384")
    ap.add_argument("--causal", default="both", choices=["both", "yes", "no"])
    ap.add_argument("--shapes", default="", help="comma list of D:N:full|causal, in the order timed (replaces "
                    "--head-dims, --seqlens and --causal)")
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    ap.add_argument("--variants", default=",".join(ROUND4), help=f"subset of {', '.join(VARIANTS)}")
    ap.add_argument("--peers", default=",".join(PEERS))
    ap.add_argument("--protocol", default="paired",
                    help="paired (default), rounds (the protocol before 2026-12-01), or a comma list: each in turn")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument("--warmup-ms", type=int, default=None,
                    help="per shape: paired 500 (bursts of all entries), rounds 100 (each entry)")
    ap.add_argument("--rep-ms", type=int, default=40, help="rounds: do_bench's rep per entry and round")
    ap.add_argument("--cycles", type=int, default=4, help="paired: cycles per round (even)")
    ap.add_argument("--burst-ms", type=float, default=20.0, help="paired: length of one burst (a CUDA graph)")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--plan", action="store_true", help="print the shapes, variants and their configs; no GPU")
    ap.add_argument("--precompile", type=int, default=0, metavar="JOBS",
                    help="compile every (variant, head_dim, causal) of the plan into the disk cache in JOBS processes "
                         "and exit (no GPU needed; the timed run then only loads them)")
    ap.add_argument("--precompile-fa4", action="store_true",
                    help="with --precompile: flash-attn-4's kernels of the plan too, into its disk cache (needs "
                         "FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 here and in the timed run)")
    a = ap.parse_args()
    variants = [v for v in a.variants.split(",") if v]
    unknown = set(variants) - set(VARIANTS)
    if unknown or ("old" not in variants and not (a.plan or a.precompile)):
        ap.error(f"--variants: unknown {sorted(unknown)} (known: {', '.join(VARIANTS)}); 'old' is required")
    try:
        a.peers = ",".join(peer_names(a.peers))
    except ValueError as exc:
        ap.error(str(exc))
    a.protocols = [p for p in a.protocol.split(",") if p]
    if not a.protocols or set(a.protocols) - set(PROTOCOLS):
        ap.error(f"--protocol: {a.protocol!r} (known: {', '.join(PROTOCOLS)}, or a comma list of them)")
    if a.cycles < 2 or a.cycles % 2:
        ap.error(f"--cycles: must be even and >= 2, got {a.cycles}")
    causals = {"both": (False, True), "yes": (True,), "no": (False,)}[a.causal]
    shapes = plan([int(x) for x in a.head_dims.split(",")], [int(x) for x in a.seqlens.split(",")], causals, variants)
    if a.shapes:
        try:
            shapes = shapes_plan(a.shapes, variants)
        except ValueError as exc:
            ap.error(str(exc))
    if a.plan:
        for d in sorted({s["head_dim"] for s in shapes}):
            for v in variants:
                if d in VARIANTS[v][0]:
                    print(f"D={d} {v}: {variant_config(v, d)}")
        from fa_variants.bench.paired import Entry, canonical_names

        for d in sorted({s["head_dim"] for s in shapes}):
            names = [v for v in variants if d in VARIANTS[v][0]]
            for v, first in canonical_names([Entry(v, print, variant_config(v, d)) for v in names]).items():
                if v != first:
                    print(f"D={d}: {v} = {first} (same config: the paired protocol times it once, as an A/A pair)")
        entries = sum(len(s["variants"]) + len(a.peers.split(",")) for s in shapes)
        compiles = len({(s["head_dim"], s["causal"], v) for s in shapes for v in s["variants"]})
        print(f"{len(shapes)} shapes, {compiles} compiles, {entries} entries x {a.rounds} rounds")
        return 0
    if a.precompile:
        return precompile(shapes, a.dtype, a.precompile, a.precompile_fa4)
    if a.out is None:
        ap.error("--out is required (unless --plan or --precompile)")
    return run(a, shapes)


def compile_items(shapes, dtype: str) -> list[tuple]:
    """(variant, head_dim, causal, dtype) of every kernel the plan runs, once each."""
    return sorted({(v, s["head_dim"], s["causal"], dtype) for s in shapes for v in s["variants"]})


def _compile_one(item) -> str:
    import os

    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    from fa_variants import registry

    name, d, causal, dtype = item
    t = time.time()
    registry.compiled(registry.static_config("fa3", "sm_90a", dtype, d, causal, variant_config(name, d, causal)))
    return f"{name} D={d} {'causal' if causal else 'full'} {dtype}: {time.time() - t:.0f} s"


def _compile_fa4(item) -> str:
    """flash-attn-4's kernel for one shape into its disk cache (FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 must be
    set for the timed run too), compiled on fake tensors (scripts/sass_dump.py)."""
    import os

    os.environ.setdefault("CUTE_DSL_ARCH", "sm_90a")
    import sass_dump

    d, causal, dtype, batch, seqlen = item
    t = time.time()
    done = sass_dump.fa4_compile(d, causal, dtype, batch, seqlen, keep_cubin=False)
    return f"flash-attn-4 D={d} N={seqlen} {'causal' if causal else 'full'} {dtype}: " + (
        f"{time.time() - t:.0f} s" if done else "cached")


def precompile(shapes, dtype: str, jobs: int, fa4: bool = False) -> int:
    """Compile the plan's kernels in `jobs` processes (spawned: the DSL is not fork-safe) into the disk cache; with
    ``fa4`` flash-attn-4's too (its own disk cache: FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1, checked here)."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    items, t0 = compile_items(shapes, dtype), time.time()
    peers = []
    if fa4:
        if os.environ.get("FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED") != "1":
            print("--precompile-fa4 needs FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 (for this run and the timed one)",
                  file=sys.stderr)
            return 2
        # one per (head_dim, causal) first, the other seqlens after (cache hits if the key ignores the seqlen)
        peers = sorted({(s["head_dim"], s["causal"], dtype, s["batch"], s["seqlen"]) for s in shapes},
                       key=lambda p: (p[4] != shapes[0]["seqlen"], p))
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # sass_dump, in the spawned processes too
    with ProcessPoolExecutor(jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
        futures = [pool.submit(_compile_fa4, p) for p in peers[:len({p[:2] for p in peers})]]
        for line in pool.map(_compile_one, items):
            print(line, flush=True)
        for f in futures:
            print(f.result(), flush=True)
        for p in peers[len(futures):]:
            print(pool.submit(_compile_fa4, p).result(), flush=True)
    print(f"precompiled {len(items)} kernels{' + flash-attn-4' if fa4 else ''} in {time.time() - t0:.0f} s")
    return 0


def run(a, shapes) -> int:
    import torch

    from fa_variants.bench.runtime import build_impls

    a.out.mkdir(parents=True, exist_ok=True)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[a.dtype]
    peers, notes = build_impls([], [p for p in a.peers.split(",") if p])
    for note in notes:
        print(note, flush=True)
    smi = subprocess.Popen(["nvidia-smi", "--query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu",
                            "--format=csv", "-lms", "500"], stdout=open(a.out / "clocks.csv", "w"))
    rows, t0 = [], time.time()
    try:
        for shape in shapes:
            fns, keys, errors, diffs = shape_entries(shape, peers, dtype, torch)
            for protocol in a.protocols:
                rows.append(time_shape(shape, protocol, fns, keys, a, dtype, errors, diffs))
                print(_line(rows[-1]), f"[{time.time() - t0:.0f} s]", flush=True)
                for line in rows[-1].get("report", []):
                    print("   ", line, flush=True)
                (a.out / "ab.json").write_text(json.dumps(rows, indent=1))
            del fns
            torch.cuda.empty_cache()
    except KeyboardInterrupt:  # a time limit (SIGINT): the table and SUMMARY of the shapes done so far
        print(f"INTERRUPTED after {len(rows)} of {len(shapes) * len(a.protocols)} rows [{time.time() - t0:.0f} s]",
              flush=True)
    finally:
        smi.terminate()
    md = ["| D | N | causal | " + "entry TFLOP/s (spread) | " + "new/old | new/fa4 | new/cuDNN | max diff vs old |",
          "|---|---|---|---|---|---|---|---|"] + [_line(r) for r in rows]
    (a.out / "ab.md").write_text("\n".join(md) + "\n")
    print("\n".join(md))
    print("\n".join(summary_lines(rows)))
    if len(a.protocols) > 1:
        print("\n".join(protocol_lines(rows)))
    return 0


def protocol_lines(rows: list[dict]) -> list[str]:
    """Per shape and protocol, over its repeats (--protocol rounds,paired,rounds,paired ...): new/old and
    new/flash-attn-4 of every repeat and their range (max - min); with the paired protocol also the A/A bands and
    the verdicts of new/old."""
    nan = float("nan")
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["head_dim"], r["seqlen"], r["causal"], r.get("protocol", "rounds")), []).append(r)
    out = ["PROTOCOL D N causal protocol: new/old per repeat (range) | new/fa4 per repeat (range) | paired: A/A "
           "bands, new/old verdicts"]
    for (d, n, causal, protocol), rs in groups.items():
        cols = []
        for values in ([r["ratio_to_old"].get("new", nan) for r in rs],
                       [r["ratio_new_to"].get("flash-attn-4", nan) for r in rs]):
            cols.append(" ".join(f"{v:.3f}" for v in values) + f" ({max(values) - min(values):.3f})")
        if protocol == "paired":
            cols.append(" ".join(f"{r['aa']['band']:.3f}" for r in rs) + ", " + " ".join(
                r["intervals"]["new/old"]["verdict"] + (" A/A" if r["intervals"]["new/old"]["aa"] else "")
                for r in rs if "new/old" in r["intervals"]))
        out.append(f"PROTOCOL D={d} N={n} {'causal' if causal else 'full'} {protocol}: " + " | ".join(cols))
    return out


def shape_entries(shape, peers, dtype, torch) -> tuple[dict, dict, dict, dict]:
    """One shape's callables (variants of fa3 and the peers on the same inputs), each compiled and run once:
    (name -> fn, name -> key (the variant's config; None for peers), name -> error of the entries that failed,
    name -> max |output - old's|)."""
    from fa_variants.hopper import fa3

    d, n, causal, batch, heads = (shape[k] for k in ("head_dim", "seqlen", "causal", "batch", "heads"))
    g = torch.Generator(device="cuda").manual_seed(n * 1000 + d + causal)
    q, k, v = (torch.randn(batch, n, heads, d, device="cuda", dtype=dtype, generator=g) for _ in range(3))
    scale = d ** -0.5
    fns, keys = {}, {}
    for name in shape["variants"]:
        cfg = keys[name] = variant_config(name, d, causal)
        fns[name] = lambda cfg=cfg: fa3.run(q, k, v, causal=causal, softmax_scale=scale, config=cfg)
        if name in ONE_TILE_GRID:
            if any(variant_config(other, d, causal) == cfg for other in shape["variants"] if other != name):
                raise SystemExit(f"{name} shares its config with another variant of this run: run it alone")
            fns[name] = one_tile_grid(fns[name], fa3)
    for p in peers:
        fns[p.name], keys[p.name] = (lambda p=p: p.fn(q, k, v, causal)), None
    outs, errors = {}, {}
    for name, fn in fns.items():  # compile + first run outside the timing
        try:
            with torch.no_grad():
                out = fn()
            outs[name] = (out[0] if isinstance(out, (tuple, list)) else out).float()
        except Exception as exc:  # noqa: BLE001 - a peer that cannot run this shape is reported, not fatal
            errors[name] = f"{type(exc).__name__}: {str(exc)[:120]}"
    torch.cuda.synchronize()
    fns = {k_: f for k_, f in fns.items() if k_ not in errors}
    diffs = {name: (o - outs["old"]).abs().max().item() for name, o in outs.items()}
    return fns, keys, errors, diffs


def one_tile_grid(fn, fa3):
    """fn run on a GPU that seems to have more SMs than the shape has tiles (``fa3._sm_count`` patched around each
    call: ``fa3.run`` plans every call, and the CTA count is a runtime argument of the launch), so the persistent
    grid gets one CTA per tile. Host-side only; a CUDA graph of fn keeps the launch as planned."""
    def call():
        real, fa3._sm_count = fa3._sm_count, (lambda q: 1 << 30)
        try:
            return fn()
        finally:
            fa3._sm_count = real
    return call


def time_rounds(fns: dict, a) -> dict[str, list[float]]:
    """The protocol before 2026-12-01: name -> per-round do_bench medians (ms), order rotated by one per round."""
    from triton.testing import do_bench

    for fn in fns.values():
        do_bench(fn, warmup=WARMUP_MS["rounds"] if a.warmup_ms is None else a.warmup_ms, rep=1)
    names = list(fns)
    times = {name: [] for name in names}
    for r in range(a.rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            times[name].append(do_bench(fns[name], warmup=10, rep=a.rep_ms, return_mode="median"))
    return times


def time_paired(fns: dict, keys: dict, a, timer=None):
    """The paired protocol (fa_variants.bench.paired) against `old`, with its A/A control; equal configs timed
    once. ``timer``: a BurstTimer (default: the GPU's runtime.GraphBurstTimer)."""
    from fa_variants.bench import paired

    if timer is None:
        from fa_variants.bench.runtime import GraphBurstTimer

        timer = GraphBurstTimer()
    entries = [paired.Entry(name, fn, keys.get(name)) for name, fn in fns.items()]
    return paired.paired_ab(entries, "old", timer, rounds=a.rounds, cycles=a.cycles, burst_ms=a.burst_ms,
                            warmup_ms=WARMUP_MS["paired"] if a.warmup_ms is None else a.warmup_ms)


def time_shape(shape, protocol: str, fns: dict, keys: dict, a, dtype, errors: dict, diffs: dict, timer=None) -> dict:
    """One row of the table: the shape's entries timed by `protocol` ("paired" or "rounds")."""
    from fa_variants.bench import core

    from fa_variants.bench.paired import Entry, canonical_names

    names = list(fns)
    same = {n: m for n, m in canonical_names([Entry(n, f, keys.get(n)) for n, f in fns.items()]).items() if n != m}
    extra = {}
    if protocol == "paired":
        res = time_paired(fns, keys, a, timer)
        times = {name: res.times(name) for name in names}
        ratio = res.median_ratio
        aa = res.aa()
        from fa_variants.bench import paired
        from fa_variants.bench.paired import aa_band

        pairs = [("new", "old"), ("new", "flash-attn-4"), ("new", "sdpa-cudnn")] + [
            (x, "new") for x in names if x not in ("old", "new") and x in VARIANTS]
        extra = dict(aa=dict(median=aa.median, lo=aa.lo, hi=aa.hi, band=aa_band(aa), samples=aa.samples),
                     intervals={f"{x}/{y}": dataclasses.asdict(res.ratio(x, y)) for x, y in pairs
                                if x in fns and y in fns},
                     clocks={name: res.clocks(name) for name in names}, how=res.how, paired=res.to_dict(),
                     report=paired.report_lines(res, [p_ for p_ in pairs if p_[0] in fns and p_[1] in fns]))
    else:
        times = time_rounds(fns, a)

        def ratio(x, y):  # > 1: x faster than y; median of per-round ratios
            return statistics.median(ty / tx for tx, ty in zip(times[x], times[y]))

    d, n, causal, batch, heads = (shape[k] for k in ("head_dim", "seqlen", "causal", "batch", "heads"))
    flops = core.attention_flops(batch, heads, n, n, d, causal)
    return dict(shape, dtype=str(dtype).removeprefix("torch."), protocol=protocol, same_config=same, times_ms=times,
                errors=errors, max_diff_vs_old=diffs,
                tflops={k_: core.tflops(flops, statistics.median(ts)) for k_, ts in times.items()},
                spread={k_: (max(ts) - min(ts)) / statistics.median(ts) for k_, ts in times.items()},
                ratio_to_old={k_: ratio(k_, "old") for k_ in names if k_ != "old"},
                ratio_new_to={k_: ratio("new", k_) for k_ in names if k_ != "new" and "new" in times},
                ratio_to_new={k_: ratio(k_, "new") for k_ in names if k_ != "new" and "new" in times},
                ratio_to_fa4={k_: ratio(k_, "flash-attn-4") for k_ in names if "flash-attn-4" in times}, **extra)


def _line(r: dict) -> str:
    entries = ", ".join(f"{k}: {t:.0f} ({r['spread'][k]:.0%})" for k, t in r["tflops"].items())
    nan = float("nan")
    return (f"| {r['head_dim']} | {r['seqlen']} | {'yes' if r['causal'] else 'no'} | {entries} | "
            f"{r['ratio_to_old'].get('new', nan):.3f} | {r['ratio_new_to'].get('flash-attn-4', nan):.3f} | "
            f"{r['ratio_new_to'].get('sdpa-cudnn', nan):.3f} | "
            f"{max((x for k, x in r['max_diff_vs_old'].items() if k in VARIANTS), default=nan):.2e} |"
            + " new/x: " + ", ".join(f"{k} {x:.3f}" for k, x in r["ratio_new_to"].items())
            + "".join(f" [{k} = {m}: same config]" for k, m in r.get("same_config", {}).items())
            + (f" [{r['protocol']}]" if "protocol" in r else "")
            + (f" errors: {r['errors']}" if r["errors"] else ""))


if __name__ == "__main__":
    sys.exit(main())
