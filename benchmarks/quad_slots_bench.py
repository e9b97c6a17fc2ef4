"""The quad-placed slot loop (16:32+4q, sp24.cu's OVER 5) against cuBLAS and against 16:32+2 on the mma slot loop,
side by side in one process: the 8B and 14B decoder shapes, each kernel at its tuned launch (float64-checked by the
tuner), graph replays round-robin over weight copies past the L2, the least of four rounds that alternate the
order. Geomean vs cuBLAS per batch, against issue 12's 16:32 targets. Writes a markdown report.

    python benchmarks/quad_slots_bench.py --out results/quad_slots_h200.md
"""

from __future__ import annotations

import argparse
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
from sparsedecoding.kernels.op import SP24_OVER_LOOP_SETTING
from sparsedecoding.kernels.overflow import split_overflow
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.runenv import environment_markdown
from sparsedecoding.solvers import keep_mask

ROUNDS = 4
SIDES = ("quads (16:32+4q)", "mma (16:32+2)", "cuBLAS")


def quad_weight(out: int, in_features: int, generator: torch.Generator) -> torch.Tensor:
    """bf16 [out, in]: standard normal, masked 16:32+4q by magnitude on the GPU."""
    values = torch.randn(out, in_features, device="cuda", generator=generator)
    return (values * keep_mask(values.abs(), SparsityPattern.parse("16:32+4q"))).bfloat16()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=MODELS)
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8, 16], choices=range(1, 17))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    if SP24_OVER_LOOP_SETTING in os.environ:
        parser.error(f"unset {SP24_OVER_LOOP_SETTING}: the bench sets it for the mma side itself")
    if not torch.cuda.is_available():
        print("error: quad_slots_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.time()
    rows, speeds = [], {(b, s): [] for b in args.batches for s in SIDES[:2]}
    for model in args.models:
        for name, (out, inf) in linear_shapes(model, False).items():
            generator = torch.Generator(device="cuda").manual_seed(out + inf)
            quad = quad_weight(out, inf, generator)
            wq = sp24.tile_quads(quad)
            capped = capped_weight(out, inf, generator)
            wm = sp24.tile_overflow(split_overflow(capped))
            copies = {SIDES[0]: sp24._copies(wq), SIDES[1]: sp24._copies(wm),
                      SIDES[2]: rotation(quad.clone, quad.numel() * 2)}
            for batch in args.batches:
                x = torch.randn(batch, inf, device="cuda").bfloat16()
                launches = {SIDES[0]: sp24.tuned_launch(x, wq)}
                os.environ[SP24_OVER_LOOP_SETTING] = "mma"  # the 16:32+2 side on the mma slot loop
                try:
                    launches[SIDES[1]] = sp24.tuned_launch(x, wm)
                finally:
                    os.environ.pop(SP24_OVER_LOOP_SETTING)
                calls = {SIDES[0]: lambda w, launch=launches[SIDES[0]]: launch(x, w),
                         SIDES[1]: lambda w, launch=launches[SIDES[1]]: launch(x, w),
                         SIDES[2]: lambda d: F.linear(x, d)}
                rounds = {side: [] for side in SIDES}
                for order in range(ROUNDS):
                    for side in (SIDES if order % 2 == 0 else SIDES[::-1]):
                        rounds[side].append(1000 * replay_ms(calls[side], copies[side]))
                times = {side: min(v) for side, v in rounds.items()}
                for side in SIDES[:2]:
                    speeds[(batch, side)].append(times[SIDES[2]] / times[side])
                rows.append(f"| {model} | {name} | {out}x{inf} | {batch} | "
                            + " | ".join(f"{times[s]:.1f} (x{times[SIDES[2]] / times[s]:.2f}; "
                                         f"{sp24.launch_label(launches[s])})" for s in SIDES[:2])
                            + f" | {times[SIDES[2]]:.1f} | {times[SIDES[1]] / times[SIDES[0]]:.3f} |")
                print(rows[-1], flush=True)
            del copies, wq, wm, quad, capped
    summary = ["| batch | quads vs cuBLAS (least) | mma vs cuBLAS (least) | quads / mma | target |",
               "|---|---|---|---|---|"]
    for batch in args.batches:
        q, m = speeds[(batch, SIDES[0])], speeds[(batch, SIDES[1])]
        summary.append(f"| {batch} | {geomean(q):.3f}x ({min(q):.2f}x) | {geomean(m):.3f}x ({min(m):.2f}x) | "
                       f"{geomean([a / b for a, b in zip(q, m)]):.3f} | {TARGETS_12.get(batch, float('nan')):.2f}x |")
    text = "\n".join([
        "# Quad-placed slots (16:32+4q, OVER 5) against 16:32+2 on the mma slot loop and cuBLAS", "",
        environment_markdown("python benchmarks/quad_slots_bench.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])),
        "", f"Each kernel at its tuned launch (float64-checked); least of {ROUNDS} alternated rounds of graph replays "
        "over weight copies past the L2, us a launch. cuBLAS: `F.linear` on the 16:32+4q weight's dense form. "
        "Weights: standard normal, masked by magnitude (16:32+4q; 16:32+2 for the mma side).", "",
        op.settings_line(), "",
        *summary, "", f"Whole run: {time.time() - started:.0f} s.", "",
        "| model | linear | out x in | batch | quads us (x cuBLAS; launch) | mma us (x cuBLAS; launch) | cuBLAS us | "
        "mma / quads time |", "|---|---|---|---|---|---|---|---|", *rows, ""])
    print("\n".join(summary))
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
