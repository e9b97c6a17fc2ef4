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

    SPARSEDECODING_SP24_EARLY_TRIGGER=0 SPARSEDECODING_SP24_MULTICAST=0 \\
        python benchmarks/grouped_bench.py --out results/grouped_h200.md
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kernel_bench import geomean, linear_shapes
from overflow_bench import capped_weight, rotation
from sp24_bench import MODELS, TARGETS_12

from sparsedecoding.kernels import op, sp24
from sparsedecoding.kernels.autotune import replay_ms
from sparsedecoding.kernels.format import pack_nm
from sparsedecoding.kernels.overflow import split_overflow
from sparsedecoding.runenv import environment_markdown

ROUNDS = 4
SIDES = ("16:32g", "2:4", "16:32+2", "cuBLAS")
HALVES = "16:32g/8"  # --halves


@contextlib.contextmanager
def halves_acc(value: int | None):
    """SPARSEDECODING_SP24_HALVES_ACC set to `value` inside (left as it is for None), restored after."""
    before = os.environ.get(op.SP24_HALVES_ACC_SETTING)
    if value is not None:
        os.environ[op.SP24_HALVES_ACC_SETTING] = str(value)
    try:
        yield
    finally:
        if value is not None:
            os.environ.pop(op.SP24_HALVES_ACC_SETTING, None)
            if before is not None:
                os.environ[op.SP24_HALVES_ACC_SETTING] = before


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
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: grouped_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.out and not args.out.parent.is_dir():
        print(f"error: {args.out.parent} is not a folder", file=sys.stderr)
        return 2
    sides = [s for s in SIDES if not (args.no_overflow and s == "16:32+2")]
    halves = {} if not args.halves else {HALVES: 1} if args.halves_acc == [1] else {
        f"{HALVES} acc{value}": value for value in args.halves_acc}  # side -> SPARSEDECODING_SP24_HALVES_ACC
    sides[1:1] = list(halves)
    timed = sides[:-1]
    started = time.time()
    rows, speeds = [], {(b, s): [] for b in args.batches for s in timed}
    for model in args.models:
        for name, (out, inf) in linear_shapes(model, False).items():
            generator = torch.Generator(device="cuda").manual_seed(out + inf)
            weight, order = sp24.random_grouped(out, inf, generator)
            tiled = {"16:32g": sp24.tile_grouped(weight, order), "2:4": sp24.tile(pack_nm(plain_24(out, inf,
                                                                                                   generator), 2, 4))}
            if halves:
                eight = sp24.tile_grouped(*sp24.random_grouped(out, inf, generator, split_rows=8), split_rows=8)
                tiled.update({side: eight if n == 0 else eight.clone() for n, side in enumerate(halves)})
            if "16:32+2" in sides:
                tiled["16:32+2"] = sp24.tile_overflow(split_overflow(capped_weight(out, inf, generator)))
            copies = {side: sp24._copies(w) for side, w in tiled.items()}
            copies["cuBLAS"] = rotation(weight.clone, weight.numel() * 2)
            for batch in args.batches:
                x = torch.randn(batch, inf, device="cuda", generator=generator).bfloat16()
                launches = {}
                for side, w in tiled.items():  # each 16:32g/8 side tuned (and its build loaded) under its setting
                    with halves_acc(halves.get(side)):
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
                            + f" | {times['cuBLAS']:.1f} | {times['2:4'] / times['16:32g']:.3f} |")
                print(rows[-1], flush=True)
            del copies, tiled, weight, order
    summary = ["| batch | " + " | ".join(f"{s} vs cuBLAS (least shape)" for s in timed) + " | 16:32g / 2:4 speed | "
               "issue 12 target |", "|---" * (len(timed) + 3) + "|"]
    for batch in args.batches:
        ratio = [a / b for a, b in zip(speeds[(batch, "16:32g")], speeds[(batch, "2:4")])]
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
