"""Where a step of sp24's codes kernels spends its time: the tuned-shape launches at batch 1 timed on the normal
build and on builds with one part of a step taken out (sp24.cu's SP24_ABLATE: 1 constant metadata, 2 no
dequantization, 3 no MMAs, 4 no weight loads, 5 the loads alone), side by side in one process; bf16 values with
their own tuned launches for comparison. The ablated builds compute wrong products on purpose; only their times
mean anything. Prints a markdown table; writes it to --out too.

    python benchmarks/ablate_probe.py --out results/ablate_h200.md
    python benchmarks/ablate_probe.py --kinds int4 --builds "half metadata=" "full metadata=-DSP24_HALF_META=0"
    python benchmarks/ablate_probe.py --builds "after=" "early=-DSP24_EARLY_TRIGGER=1" --slices 2 4 8

--slices times every shape at each of those slice counts (with one split, or with each of --splits) instead of its
tuned launch, and --stream G ... also stream-K launches over G CTAs; each build's fastest of them is its time for the
shape.

--models with --kinds int4 / int8 / bf16 takes every decoder shape of those presets instead of the four 8B shapes,
and times cuBLAS (`F.linear` on the dense pruned weight) in the same alternated rounds, so that each build's
geomean against cuBLAS, beside the kind's batch-1 target (issue 13 for codes, issue 12 for bf16), comes from one run:

    python benchmarks/ablate_probe.py --kinds int4 --models llama-3.1-8b qwen3-14b --slices 1 2 4 8 --splits 1 2 3 4 \
        --builds "default=" "early=-DSP24_EARLY_TRIGGER=1" "early, 3 CTAs=-DSP24_EARLY_TRIGGER=1,-DSP24_INT4_CTAS=3"

--kinds slots takes 16:32+2 bf16 weights (2:4 tiles + two overflow slots a word) at --batch rows of x (default
8) with the slots on the tensor cores (SPARSEDECODING_SP24_OVER_LOOP=mma) against the builds that take one part of
their path out (SP24_ABLATE 6: no shuffle of the offsets, 7: no bank conflicts in the gathers, 8: no slot MMAs nor
gathers), every build at the launch the tuner picks in the normal one, and cuBLAS (`F.linear` on the dense pruned
weight) and the weight's 2:4 part alone (tiled and tuned on its own) in the same alternated rounds, so that each
build's speed against cuBLAS, and its geomean against issue 12's 16:32 target at that batch, come from one run;
--models adds the Qwen3-14B shapes (the target's other half):

    python benchmarks/ablate_probe.py --kinds slots --batch 16 --models llama-3.1-8b qwen3-14b \
        --out results/ablate_slots_cublas_h200_b16.md
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from helpers import random_nm_weight  # noqa: E402
from test_cuda_mma_codes import grid_weight  # noqa: E402

from kernel_bench import geomean, linear_shapes  # noqa: E402
from overflow_bench import capped_weight, rotation  # noqa: E402
from sp24_bench import MODELS, TARGETS_12, TARGETS_13  # noqa: E402

from sparsedecoding.kernels import cuda_mma, sp24  # noqa: E402
from sparsedecoding.kernels.autotune import replay_ms  # noqa: E402
from sparsedecoding.kernels.format import pack_nm  # noqa: E402
from sparsedecoding.kernels.op import SP24_OVER_LOOP_SETTING  # noqa: E402
from sparsedecoding.kernels.overflow import split_overflow  # noqa: E402
from sparsedecoding.kernels.quantized import pack_nm_quantized  # noqa: E402
from sparsedecoding.runenv import environment_markdown  # noqa: E402

VARIANTS = {0: "full step", 1: "constant metadata", 2: "no dequantization", 3: "no MMAs", 4: "no weight loads",
            5: "loads alone"}
SLOT_VARIANTS = {0: "full step", 6: "no offset shuffle", 7: "conflict-free gathers", 8: "no slot MMAs or gathers"}
# (name, out, in, splits, slices): the 8B shapes with sp24_h200.md's tuned int4 launches at batch 1 (and bf16's)
SHAPES = (("8B qkv", 6144, 4096, 1, 4), ("8B o", 4096, 4096, 1, 8), ("8B gate_up", 28672, 4096, 1, 1),
          ("8B down", 4096, 14336, 1, 8))
ROUNDS = 4  # timings of every build and shape, in alternating order
BF16_LAUNCHES = {"8B qkv": (1, 4), "8B o": (1, 8), "8B gate_up": (1, 4), "8B down": (4, 2)}
CUBLAS = "cuBLAS"  # the dense pruned weight's F.linear, timed beside the slot builds
PART = "2:4 part alone"  # the weight's 2:4 part tiled and tuned on its own (no slots, no slot bytes)
SCALED = "2:4 part alone, scaled to the weight's bytes"  # derived: what free slot compute would leave
SHORT = {"llama-3.1-8b": "8B", "qwen3-14b": "14B"}


def slot_shapes(models: list[str]) -> list[tuple[str, int, int, int, int]]:
    """SHAPES' form for --kinds slots: every decoder linear of `models` (splits and slices come from the tuner)."""
    return [(f"{SHORT[model]} {name}", out, inf, 0, 0) for model in models
            for name, (out, inf) in linear_shapes(model, False).items()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    parser.add_argument("--builds", nargs="+", metavar="LABEL=DEFINES",
                        help="compare these builds instead of the ablations: a label, =, and nvcc -D flags separated "
                             "by commas (empty: the normal build), e.g. 'normal=' 'full metadata=-DSP24_HALF_META=0'")
    parser.add_argument("--kinds", nargs="+", choices=("int4", "int8", "bf16", "slots"),
                        default=["int4", "int8", "bf16"])
    parser.add_argument("--batch", type=int, default=None,
                        help="rows of x (1-16; default 1, and 8 with --kinds slots)")
    parser.add_argument("--slices", nargs="+", type=int, choices=(1, 2, 4, 8),
                        help="time each shape at each of these slice counts (and each --splits), not its tuned launch")
    parser.add_argument("--splits", nargs="+", type=int, choices=range(1, 17), metavar="N",
                        help="with --slices: the split counts to pair with them (default: 1)")
    parser.add_argument("--stream", nargs="+", type=int, metavar="G",
                        help="with --slices: also stream-K launches over G CTAs (where `sp24.stream_fits`)")
    parser.add_argument("--models", nargs="+", choices=MODELS,
                        help="the presets whose decoder shapes run, with cuBLAS timed beside them (default: "
                             f"{MODELS[0]}; without it, the codes and bf16 kinds time four 8B shapes and no cuBLAS)")
    args = parser.parse_args()
    bad = [b for b in args.builds or [] if "=" not in b or not b.partition("=")[0].strip()]
    if bad:
        parser.error(f"--builds {bad[0]!r}: use LABEL=DEFINES (DEFINES may be empty)")
    slots = "slots" in args.kinds
    if slots and len(args.kinds) > 1:
        parser.error("--kinds slots runs alone (its builds are the slot ablations)")
    if args.splits and not args.slices:
        parser.error("--splits pairs with --slices")
    if args.stream and (not args.slices or min(args.stream) < 1):
        parser.error("--stream pairs with --slices and takes CTA counts of at least 1")
    against_cublas = slots or args.models is not None
    models = args.models or MODELS[:1]
    batch = args.batch if args.batch is not None else (8 if slots else 1)
    if not 1 <= batch <= 16:
        parser.error(f"--batch must be 1-16; got {batch}")
    if not torch.cuda.is_available():
        print("error: ablate_probe needs a CUDA GPU", file=sys.stderr)
        return 2
    if slots:
        os.environ[SP24_OVER_LOOP_SETTING] = "mma"
    builds = {label: tuple(d for d in flags.split(",") if d) for label, _, flags in
              (b.partition("=") for b in args.builds)} if args.builds else {
        label: (f"-DSP24_ABLATE={n}",) if n else () for n, label in (SLOT_VARIANTS if slots else VARIANTS).items()}
    original = cuda_mma.open_library
    rows = []
    # --kinds slots: cuBLAS time over each side's, by shape; SCALED: the 2:4 part's times its bytes' share (derived)
    speeds = {variant: [] for variant in (*builds, PART, SCALED)}
    # the codes and bf16 kinds with --models: cuBLAS time over each build's fastest launch, by kind and shape
    kind_speeds = {kind: {variant: [] for variant in builds} for kind in args.kinds}
    for kind, group in (("int4", 128), ("int8", None), ("bf16", None), ("slots", None)):
        if kind not in args.kinds:
            continue
        for name, out, inf, tuned_splits, tuned_slices in (slot_shapes(models) if against_cublas else SHAPES):
            x = torch.randn(batch, inf, device="cuda").bfloat16()
            dense = None
            if kind == "slots":
                generator = torch.Generator(device="cuda").manual_seed(1)
                dense = capped_weight(out, inf, generator)
                split = split_overflow(dense)
                w = sp24.tile_overflow(split)
                tuned = sp24.tuned_launch(x, w)  # the normal build's pick, every build timed at it
                tuned_splits, tuned_slices = tuned.splits, tuned.slices
                part = sp24.tile(split.w24)  # the 2:4 part alone at its own tuned launch, no slot bytes at all
                part_launch = sp24.tuned_launch(x, part)
                part_ratio = part.nbytes / w.nbytes
            elif kind == "bf16":
                tuned_splits, tuned_slices = BF16_LAUNCHES.get(name, (0, 0))
                dense = random_nm_weight(out, inf, 2, 4, torch.bfloat16, seed=1).cuda()
                w = sp24.tile(pack_nm(dense, 2, 4))
            else:
                scale = group or inf
                dense = grid_weight(out, inf, kind, scale).cuda()
                w = sp24.tile(pack_nm_quantized(dense, 2, 4, kind, scale))
            if not against_cublas:
                dense = None
            elif kind != "slots" and not args.slices:  # the normal build's pick, every build timed at it
                tuned = sp24.tuned_launch(x, w)
                tuned_splits, tuned_slices = tuned.splits, tuned.slices
            weights = sp24._copies(w)
            configs = ([(splits, n, 0) for splits in args.splits or [1] for n in args.slices] if args.slices
                       else [(tuned_splits, tuned_slices, 0)])
            configs += [(1, 1, ctas) for ctas in args.stream or [] if sp24.stream_fits(w, batch, ctas)]
            dense_copies = None
            if dense is not None:
                dense_copies = rotation(dense.clone, dense.numel() * 2)
                F.linear(x, dense)  # cuBLAS's handle and workspace come before any graph capture
            best = {}  # each build's least time over the configs, and cuBLAS's
            for splits, slices, ctas in configs:
                launches = {}
                for variant, extra in builds.items():
                    # the slot ablations change only the build with the column copy (the mma order's); the
                    # default build a launch also loads stays as it is
                    cuda_mma.open_library = (lambda source, min_major, defines, extra=extra: original(
                        source, min_major=min_major, defines=tuple(defines)
                        + (extra if not slots or "-DSP24_COLUMNS" in defines else ())))
                    sp24._libraries.clear()
                    try:
                        launches[variant] = sp24.Sp24Launch(x, w, splits, slices, ctas=ctas)
                    except ValueError as exc:  # a split or slice count the shape has too few steps for
                        print(f"skipped {name} {sp24.choice_label((splits, slices, False, ctas))}: {exc}", flush=True)
                        break
                cuda_mma.open_library = original
                sp24._libraries.clear()
                if len(launches) < len(builds):
                    continue
                # timed in rounds of alternating order (first to last, then last to first), the minimum kept: in the
                # twenty-third session's two probes the build timed first was about 1 us slower on one shape alone
                sides = {variant: (lambda wt, launch=launch: launch(x, wt), weights)
                         for variant, launch in launches.items()}
                if dense is not None:
                    if kind == "slots":
                        sides[PART] = (lambda wt: part_launch(x, wt), sp24._copies(part))
                    sides[CUBLAS] = (lambda d: F.linear(x, d), dense_copies)
                rounds = {side: [] for side in sides}
                for order in range(ROUNDS):
                    for side in (list(sides) if order % 2 == 0 else list(sides)[::-1]):
                        call, copies = sides[side]
                        rounds[side].append(1000 * replay_ms(call, copies))
                times = {side: min(values) for side, values in rounds.items()}
                for side, value in times.items():
                    best[side] = min(best.get(side, value), value)
                del sides
                same = ""
                if args.builds:  # builds meant to compute one product: each against the first, bit for bit
                    products = [launches[variant](x, weights[0]) for variant in builds]
                    same = " | " + ("yes" if all(torch.equal(products[0], p) for p in products[1:]) else "NO")
                if dense is not None and kind == "slots":
                    for variant in (*builds, PART):
                        speeds[variant].append(times[CUBLAS] / times[variant])
                    speeds[SCALED].append(times[CUBLAS] / times[PART] * part_ratio)
                    same = (f" | {times[PART]:.1f} (x{times[CUBLAS] / times[PART]:.2f}; "
                            f"{sp24.launch_label(part_launch)}; {part_ratio:.3f}) | {times[CUBLAS]:.1f}")
                if kind != "slots" and dense is not None:
                    same += f" | {times[CUBLAS]:.1f}"
                grid = f"sk{ctas}" if ctas else f"{splits}/{slices}s"
                rows.append(f"| {kind} | {name} ({out}x{inf}) | {grid} | "
                            + " | ".join(f"{times[v]:.1f}" + (f" (x{times[CUBLAS] / times[v]:.2f})" if dense is not
                                                              None else "") for v in builds) + same + " |")
                print(rows[-1], flush=True)
            if kind != "slots" and dense is not None and all(variant in best for variant in builds):
                for variant in builds:
                    kind_speeds[kind][variant].append(best[CUBLAS] / best[variant])
    text = "\n".join([
        (f"# sp24 at batch {batch}: builds side by side" if args.builds else
         f"# sp24 at batch {batch}: a step with one part taken out (SP24_ABLATE builds)"
         + (", 16:32+2 with the slots on the tensor cores" if slots else "")), "",
        environment_markdown("python benchmarks/ablate_probe.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])), "",
        f"Graph replays round-robin over weight copies past the L2, median us a launch, the least of {ROUNDS} rounds "
        "that alternate the builds' order"
        + ("; builds: " + ", ".join(f"{label}: `{' '.join(flags) or 'no defines'}`" for label, flags in builds.items())
           + "." if args.builds else "; the ablated builds compute wrong products on purpose."), "",
        *(slot_summary(speeds, batch) if slots else []),
        *(line for kind, by_build in kind_speeds.items() if any(by_build.values())
          for line in builds_summary(by_build, kind, batch, bool(args.slices))),
        "| values | shape | splits/slices | " + " | ".join(builds)
        + (" | bit for bit |" if args.builds else "")
        + (f" | {PART} (x cuBLAS; its launch; its bytes / the weight's) | {CUBLAS} |" if slots
           else f" | {CUBLAS} |" if against_cublas else " |"),
        "|---|---|---|" + "---|" * (len(builds) + bool(args.builds) + (2 * slots or against_cublas)), *rows, ""])
    if args.out:
        args.out.write_text(text)
    return 0


def slot_summary(speeds: dict[str, list[float]], batch: int) -> list[str]:
    """Markdown lines: each build's geomean and least speed against cuBLAS over the shapes (like for like: the same
    rounds), beside issue 12's 16:32 target at `batch` where it has one."""
    target = TARGETS_12.get(batch)
    lines = [f"Against {CUBLAS} (its time over the build's, the least of the same alternated rounds), over the "
             f"shapes below; issue 12's 16:32 target at batch {batch}: "
             + (f"{target:.2f}x." if target else "none.")
             + f" `{PART}`: the weight's 2:4 part tiled on its own at its own tuned launch; `{SCALED}`: that speed "
             "times the part's share of the weight's bytes, derived, not timed (the speed the whole weight would "
             "have if its slots cost only their bytes at the part's rate).", "",
             "| build | geomean vs cuBLAS | least | shapes below 1.0x |", "|---|---|---|---|"]
    for variant, values in speeds.items():
        if values:
            lines.append(f"| {variant} | {geomean(values):.3f}x | {min(values):.3f}x | "
                         f"{sum(v < 1.0 for v in values)} of {len(values)} |")
    return lines + [""]


def builds_summary(speeds: dict[str, list[float]], kind: str, batch: int, fastest: bool) -> list[str]:
    """Markdown lines for --kinds int4 / int8 / bf16 with --models: each build's geomean and least speed against
    cuBLAS over the shapes (cuBLAS's least time over its rounds and launches), beside the kind's target at `batch`
    (issue 13's at batch 1 for codes, issue 12's for bf16)."""
    target = TARGETS_12.get(batch) if kind == "bf16" else (TARGETS_13[kind] if batch == 1 else None)
    lines = [f"{kind} against {CUBLAS} (its least time over the same alternated rounds over the build's least), at "
             f"batch {batch}; target: " + (f"{target:.2f}x." if target else "none.")
             + (" Each build's time for a shape is its fastest of the splits/slices below (a tuner over them)."
                if fastest else " Every build at the launch the tuner picks in the normal build."), "",
             "| build | geomean vs cuBLAS | least | verdict |", "|---|---|---|---|"]
    for variant, values in speeds.items():
        if values:
            mean = geomean(values)
            verdict = "-" if target is None else "meets" if mean >= target else f"{mean / target - 1:+.1%}"
            lines.append(f"| {variant} | {mean:.3f}x | {min(values):.3f}x | {verdict} |")
    return lines + [""]


if __name__ == "__main__":
    sys.exit(main())
