"""Grouped columns (16:32g, sp24.cu's OVER 6) against cuBLAS, plain 2:4 and 16:32+2, side by side in one process.

`--halves` adds 16:32g/8, a weight whose tiles' 8-row halves each have their own order (the pattern's quality
nears 16:32's, results/grouped_rows_quality_cpu.md), at two gathers and two mma.sp a k-tile; `--halves-acc 1 2`
times it under both values of SPARSEDECODING_SP24_HALVES_ACC side by side (one accumulator, or one a half).

A 16:32g weight keeps 16 of every 32 columns of a row, like 16:32, with one more rule: the 16 rows of an mma.sp tile
share a split of each 32-column word into eight groups of four, and every row keeps two of each group. Tiled in that
order the weight is 2:4, and the kernel gathers x's rows in the same order by ldmatrix from a column-major copy of the
staged x (`sp24.tile_grouped`). This bench times it on the 8B and 14B decoder shapes (random orders and values; speed
does not depend on them) against cuBLAS on the weight's dense form, against a plain 2:4 weight of the same shape on
the same build (the gather's cost) and against 16:32+2 (today's 16:32 route, the over loop `auto` picks), each kernel
at its tuned launch (float64-checked by the tuner), graph replays round-robin over weight copies past the L2, the
least of four rounds that alternate the order. Geomean vs cuBLAS per batch, against issue 12's 16:32 targets.
The bytes a weight: 2:4's 1.125 plus one byte a lane and k-tile for the order (1/16 of a byte a weight): 1.1875.
A side named without a bound runs under the default SPARSEDECODING_SP24_GROUPED_CTAS: timed since the seventy-third
session (the faster bound for each shape and batch), the two-CTA bound in the reports before it.

    SPARSEDECODING_SP24_EARLY_TRIGGER=0 SPARSEDECODING_SP24_MULTICAST=0 \\
        python benchmarks/grouped_bench.py --out results/grouped_h200.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kernel_bench import geomean, linear_shapes
from overflow_bench import capped_weight, rotation
from sp24_bench import MODELS, TARGETS_12, environment_set

from sparsedecoding.kernels import op, sp24
from sparsedecoding.kernels.autotune import replay_ms
from sparsedecoding.kernels.format import pack_nm
from sparsedecoding.kernels.overflow import split_overflow
from sparsedecoding.runenv import environment_markdown

ROUNDS = 4
SIDES = ("16:32g", "2:4", "16:32+2", "cuBLAS")
HALVES = "16:32g/8"  # --halves


def grouped_sides(halves: bool, accs: list[int], ctas: list[str]) -> dict[str, tuple[int, dict[str, str]]]:
    """The grouped-columns sides, name -> (rows an order, the settings its launches are tuned and built under): 16:32g
    under each --grouped-ctas value, and with --halves 16:32g/8 under each pair of --halves-acc and --grouped-ctas
    values; a name carries a value's suffix only where more than one value or a value other than the default is
    asked for."""
    def suffix(label: str, values: list, value, default) -> str:
        return f" {label}{value}" if values != [default] else ""

    default = op.GROUPED_CTAS_DEFAULT
    sides = {f"16:32g{suffix('ctas', ctas, c, default)}": (16, {op.SP24_GROUPED_CTAS_SETTING: str(c)}) for c in ctas}
    if halves:
        sides.update({f"{HALVES}{suffix('acc', accs, a, 1)}{suffix('ctas', ctas, c, default)}": (
            8, {op.SP24_HALVES_ACC_SETTING: str(a), op.SP24_GROUPED_CTAS_SETTING: str(c)}) for a in accs for c in ctas})
    return sides


def plain_24(out: int, in_features: int, generator: torch.Generator) -> torch.Tensor:
    """bf16 [out, in]: standard normal, the two largest |w| of every group of four kept."""
    values = torch.randn(out, in_features // 4, 4, device="cuda", generator=generator)
    keep = values.abs().argsort(-1).argsort(-1) >= 2
    return (values * keep).reshape(out, in_features).bfloat16()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=MODELS)
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8, 16], choices=range(1, 17))
    parser.add_argument("--no-overflow", action="store_true", help="leave out the 16:32+2 side")
    parser.add_argument("--halves", action="store_true",
                        help="add 16:32g/8: each 8-row half of a tile in its own order (split_rows 8, a build with "
                             "SP24_GROUPED_HALVES: two gathers and two mma.sp a k-tile)")
    parser.add_argument("--halves-acc", type=int, nargs="+", choices=(1, 2), default=[1],
                        help="with --halves: the SPARSEDECODING_SP24_HALVES_ACC values timed side by side (1: one "
                             "accumulator, the default; 2: one for each half), each its own side")
    parser.add_argument("--grouped-ctas", nargs="+", choices=op.SP24_GROUPED_CTAS_CHOICES,
                        default=[op.GROUPED_CTAS_DEFAULT],
                        help="the SPARSEDECODING_SP24_GROUPED_CTAS values each grouped side is timed under, side by "
                             "side (timed: the tuner keeps the faster of the two bounds for each shape and batch, the "
                             "default; 2: the two-CTA launch bound; 1: one CTA, up to 255 registers)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: grouped_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.out and not args.out.parent.is_dir():
        print(f"error: {args.out.parent} is not a folder", file=sys.stderr)
        return 2
    grouped = grouped_sides(args.halves, args.halves_acc, args.grouped_ctas)
    sides = list(grouped) + [s for s in SIDES[1:] if not (args.no_overflow and s == "16:32+2")]
    first = sides[0]  # the first 16:32g side, against which 2:4's speed is read
    timed = sides[:-1]
    started = time.time()
    rows, speeds = [], {(b, s): [] for b in args.batches for s in timed}
    for model in args.models:
        for name, (out, inf) in linear_shapes(model, False).items():
            generator = torch.Generator(device="cuda").manual_seed(out + inf)
            weight, order = sp24.random_grouped(out, inf, generator)
            sixteen = sp24.tile_grouped(weight, order)
            eight = sp24.tile_grouped(*sp24.random_grouped(out, inf, generator, split_rows=8), split_rows=8) \
                if args.halves else None
            tiled = {side: (sixteen if rows == 16 else eight).clone() for side, (rows, _) in grouped.items()}
            tiled["2:4"] = sp24.tile(pack_nm(plain_24(out, inf, generator), 2, 4))
            if "16:32+2" in sides:
                tiled["16:32+2"] = sp24.tile_overflow(split_overflow(capped_weight(out, inf, generator)))
            copies = {side: sp24._copies(w) for side, w in tiled.items()}
            copies["cuBLAS"] = rotation(weight.clone, weight.numel() * 2)
            for batch in args.batches:
                x = torch.randn(batch, inf, device="cuda", generator=generator).bfloat16()
                launches = {}
                for side, w in tiled.items():  # each grouped side tuned (and its build loaded) under its settings
                    with environment_set(grouped[side][1] if side in grouped else {}):
                        launches[side] = sp24.tuned_launch(x, w)
                calls = {side: (lambda w, launch=launch: launch(x, w)) for side, launch in launches.items()}
                calls["cuBLAS"] = lambda d: F.linear(x, d)
                rounds = {side: [] for side in sides}
                for turn in range(ROUNDS):
                    for side in (sides if turn % 2 == 0 else sides[::-1]):
                        rounds[side].append(1000 * replay_ms(calls[side], copies[side]))
                times = {side: min(v) for side, v in rounds.items()}
                for side in timed:
                    speeds[(batch, side)].append(times["cuBLAS"] / times[side])
                rows.append(f"| {model} | {name} | {out}x{inf} | {batch} | "
                            + " | ".join(f"{times[s]:.1f} (x{times['cuBLAS'] / times[s]:.2f}; "
                                         f"{sp24.launch_label(launches[s])})" for s in timed)
                            + f" | {times['cuBLAS']:.1f} | {times['2:4'] / times[first]:.3f} |")
                print(rows[-1], flush=True)
            del copies, tiled, weight, order, sixteen, eight
    summary = ["| batch | " + " | ".join(f"{s} vs cuBLAS (least shape)" for s in timed) + f" | {first} / 2:4 speed | "
               "issue 12 target |", "|---" * (len(timed) + 3) + "|"]
    for batch in args.batches:
        ratio = [a / b for a, b in zip(speeds[(batch, first)], speeds[(batch, "2:4")])]
        summary.append(f"| {batch} | " + " | ".join(f"{geomean(speeds[(batch, s)]):.3f}x "
                                                     f"({min(speeds[(batch, s)]):.2f}x)" for s in timed)
                       + f" | {geomean(ratio):.3f} | {TARGETS_12.get(batch, float('nan')):.2f}x |")
    text = "\n".join([
        "# Grouped columns (16:32g, OVER 6) against cuBLAS, plain 2:4 and 16:32+2", "",
        environment_markdown("python benchmarks/grouped_bench.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])),
        "", f"Each kernel at its tuned launch (float64-checked); least of {ROUNDS} alternated rounds of graph replays "
        "over weight copies past the L2, us a launch. cuBLAS: `F.linear` on the 16:32g weight's dense form. "
        "Weights: random 16:32g (random orders, two random columns of each group), a random 2:4 weight of the same "
        "shape, 16:32+2 masked by magnitude" + (f"; {HALVES}: random orders for each 8-row half of a tile "
                                                "(`tile_grouped(..., split_rows=8)`)" if args.halves else "") + ".", "",
        op.settings_line(), "",
        *summary, "", f"Whole run: {time.time() - started:.0f} s.", "",
        "| model | linear | out x in | batch | " + " | ".join(f"{s} us (x cuBLAS; launch)" for s in timed)
        + " | cuBLAS us | 2:4 / 16:32g time |", "|---" * (len(timed) + 6) + "|", *rows, ""])
    print("\n".join(summary))
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
