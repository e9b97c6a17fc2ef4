"""16:32+2 weights as 2:4 + overflow slots against cuBLAS on the dense pruned weight and against what the op runs
for the same weight as plain 16:32 today (`nm_spmv`: Triton at batch 1-2, the tensor-core kernel nm_mma.cu from
batch 3), on the decoder linears of Llama-3.1-8B (and Qwen3-14B with --models), batch 1, 2, 4, 8, 16. Two ways
to run the slots: fused (`sp24.tile_overflow`: the sp24 warp adds them, one kernel) and as a second launch
(`triton_overflow.overflow_add_` after sp24 on the 2:4 part). Needs a CUDA GPU (compute capability 9.0) and nvcc.

The question it answers: is a 16:32-class mask, run as 2:4 tiles plus a fixed two slots a row and 32 columns,
faster than 16:32 on today's kernels, and how much of sp24's 2:4 speed does it keep?

Every output (fused, sp24 + slots, and today's op) is first checked against a float64 product of the whole 16:32+2
weight; a failure is marked FAIL and the script exits 1. Times are medians of CUDA-graph replays over enough weight
copies to rotate past the L2 (kernel_bench's helpers). Weights: standard normal, masked by `capped_keep_mask` on
their magnitudes (16:32+2): 16 of every 32 columns kept, at most two of them beyond two in a group of four, as in
a model pruned with that pattern.

    PYTHONPATH=src python benchmarks/overflow_bench.py --out benchmarks/results/overflow_h200.md
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from cuda_kernel_bench import environment, write_report
from sp24_bench import MODELS, baseline_settings, environment_set, gpu_start, shape_arguments
from kernel_bench import L2_ROTATION_BYTES, geomean, linear_shapes, time_rotated
from sparsedecoding.kernels import nm_spmv
from sparsedecoding.kernels.autotune import Float64Reference
from sparsedecoding.kernels.format import pack_nm
from sparsedecoding.kernels.overflow import split_overflow
from sparsedecoding.kernels.op import SP24_OVER_LOOP_CHOICES, SP24_OVER_LOOP_SETTING
from sparsedecoding.kernels.sp24 import launch_label, tile, tile_overflow, tuned_launch
from sparsedecoding.kernels import sp24_split
from sparsedecoding.kernels.triton_overflow import OverflowSlots, overflow_add_, tuned_config
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.solvers import capped_keep_mask

PATTERN = "16:32+2"
SLOTS = 2
# with --baseline: rounds of the fused kernel and its baseline launch timed alternately (median of each side)
BASELINE_ROUNDS = 3


@dataclass
class Row:
    model: str
    shape: str
    out: int
    in_features: int
    batch: int
    times: dict[str, float] = field(default_factory=dict)  # dense, op16, sp24, slots, both, fused
    checks: dict[str, float] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    slot_config: str = ""
    sp24_launch: str = ""
    fused_launch: dict[str, str] = field(default_factory=dict)  # loop order -> the tuner's launch


def capped_weight(out: int, in_features: int, generator: torch.Generator) -> torch.Tensor:
    """bf16 [out, in]: standard normal, masked 16:32+2 by magnitude, built in row slices on the GPU."""
    pattern = SparsityPattern.parse(PATTERN)
    weight = torch.empty(out, in_features, dtype=torch.bfloat16, device="cuda")
    step = max(1, (1 << 24) // in_features)
    for r0 in range(0, out, step):
        rows = min(step, out - r0)
        values = torch.randn(rows, in_features, device="cuda", generator=generator)
        weight[r0:r0 + rows] = (values * capped_keep_mask(values.abs(), pattern)).bfloat16()
    return weight


def rotation(make, nbytes: int) -> list:
    return [make() for _ in range(1 + math.ceil(L2_ROTATION_BYTES / nbytes))]


def float64_error(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, roundings: int = 1) -> float:
    """y's largest error over `autotune.Float64Reference`'s bound on the whole weight, with the bound's one-ulp
    term taken `roundings` times (sp24 + slots round the 2:4 part's sum to bf16 before adding the slots)."""
    reference = Float64Reference.of_rows(x, weight.shape[0], lambda r0, r1: weight[r0:r1].double())
    if roundings > 1:
        reference.bound = reference.bound + (roundings - 1) * torch.finfo(x.dtype).eps * reference.exact.abs()
    return reference.error(y)


def bench_shape(model: str, shape: str, batches: list[int], reps: int, generator: torch.Generator,
                loops: list[str], baseline: dict[str, str] | None = None) -> list[Row]:
    """`baseline`: kernel settings under which the fused kernel's tuned launch (first loop order) is also tuned,
    checked and timed, side by side ("fused:baseline")."""
    out, in_features = linear_shapes(model, unfused=False)[shape]
    weight = capped_weight(out, in_features, generator)
    split = split_overflow(weight, SLOTS)
    w24 = tile(split.w24)
    slots = OverflowSlots.of(split)
    fused = tile_overflow(split)
    packed16 = pack_nm(weight, 16, 32)
    del split
    dense = rotation(lambda: weight.clone(), weight.numel() * 2)
    w24s = [w24] + rotation(lambda: w24.clone(), w24.nbytes + slots.nbytes)
    slot_copies = [slots] + [slots.clone() for _ in range(len(w24s) - 1)]
    fuseds = [fused] + rotation(lambda: fused.clone(), fused.nbytes)
    ops = rotation(lambda: type(packed16)(packed16.values.clone(), packed16.bitmask.clone(), 16, 32,
                                          packed16.shape), packed16.values.numel() * 2)
    rows = []
    for batch in batches:
        row = Row(model, shape, out, in_features, batch)
        x = torch.randn(batch, in_features, device="cuda", generator=generator).bfloat16()
        y = torch.zeros(batch, out, dtype=torch.bfloat16, device="cuda")
        launch = tuned_launch(x, w24)  # the engine's pick for the 2:4 part, checked and timed by its tuner
        row.sp24_launch = launch_label(launch)
        row.slot_config = str(tuned_config(x, slots, y))
        fused_launches = {}
        for loop in loops:  # each loop order its own tuned launch (the setting is part of the tuner's key)
            os.environ[SP24_OVER_LOOP_SETTING] = loop
            try:  # the tuner checks every candidate against float64 of the whole weight and raises on a mismatch
                fused_launches[loop] = tuned_launch(x, fused)
                row.fused_launch[loop] = launch_label(fused_launches[loop])
            except RuntimeError as exc:  # reported as a failure, and the other columns still measured
                fused_launches[loop], row.fused_launch[loop] = None, f"FAIL: {exc}"[:200]
                print(f"{model} {shape} b{batch}: fused launch ({loop}) failed: {exc}", flush=True)

        def both(w, s):
            result = launch(x, w)
            return overflow_add_(x, s, result)

        row.checks["both"] = float64_error(both(w24, slots), x, weight, roundings=2)
        xt = sp24_split.transposed(x)

        def split_cuda(f, with_transpose=True):  # sp24 on the 2:4 part, then csrc/slots.cu (sp24_split)
            return sp24_split.slots_add(launch(x, sp24_split.base(f)), x, f, None if with_transpose else xt)

        row.checks["split"] = float64_error(split_cuda(fused), x, weight, roundings=2)
        row.checks["op16"] = float64_error(nm_spmv(x, packed16), x, weight)
        for loop, fused_launch in fused_launches.items():
            row.checks[f"fused:{loop}"] = (float64_error(fused_launch(x, fused), x, weight)
                                           if fused_launch is not None else math.inf)
        row.times["dense"] = time_rotated([lambda d=d: F.linear(x, d) for d in dense], reps)[0]
        row.times["op16"] = time_rotated([lambda p=p: nm_spmv(x, p) for p in ops], reps)[0]
        row.times["sp24"] = time_rotated([lambda w=w: launch(x, w) for w in w24s], reps)[0]
        row.times["slots"] = time_rotated([lambda s=s: overflow_add_(x, s, y) for s in slot_copies], reps)[0]
        row.times["split"] = time_rotated([lambda f=f: split_cuda(f) for f in fuseds], reps)[0]
        row.times["split_kernels"] = time_rotated([lambda f=f: split_cuda(f, False) for f in fuseds], reps)[0]
        row.times["slots_cuda"] = time_rotated([lambda f=f: sp24_split.slots_add(y, x, f, xt) for f in fuseds],
                                               reps)[0]
        row.times["both"] = time_rotated([lambda w=w, s=s: both(w, s) for w, s in zip(w24s, slot_copies)], reps)[0]
        for loop, fused_launch in fused_launches.items():
            row.times[f"fused:{loop}"] = (time_rotated([lambda f=f, c=fused_launch: c(x, f) for f in fuseds],
                                                       reps)[0] if fused_launch is not None else math.nan)
        if baseline:  # tuned anew under them (they are part of the tuner's key); the launch keeps its library
            under = {SP24_OVER_LOOP_SETTING: loops[0], **baseline}
            with environment_set(under):
                base = tuned_launch(x, fused)
                row.fused_launch["baseline"] = launch_label(base)
                row.checks["fused:baseline"] = float64_error(base(x, fused), x, weight)
            # cuBLAS and the two sides alternated, BASELINE_ROUNDS each, the baseline under its settings, median
            # each: timed once one after the other, the side timed second (the baseline, just tuned) came out 1-5%
            # faster in both orders, and the fused kernel's median 2-3% faster than its single timing (thirty-fifth
            # session), so cuBLAS is timed the same way for the ratios against it
            now = fused_launches[loops[0]]
            sides = {"dense:paired": ([lambda d=d: F.linear(x, d) for d in dense], {}),
                     "fused:paired": ([lambda f=f: now(x, f) for f in fuseds] if now is not None else None, {}),
                     "fused:baseline": ([lambda f=f: base(x, f) for f in fuseds], under)}
            sides = {name: side for name, side in sides.items() if side[0] is not None}
            times = {name: [] for name in sides}
            for _ in range(BASELINE_ROUNDS):
                for name, (calls, settings) in sides.items():
                    with environment_set(settings):
                        times[name].append(time_rotated(calls, reps)[0])
            row.times.update({name: statistics.median(values) for name, values in times.items()})
        row.times["fused"], row.checks["fused"] = row.times[f"fused:{loops[0]}"], row.checks[f"fused:{loops[0]}"]
        row.bytes = {"dense": 2 * out * in_features, "both": w24.nbytes + slots.nbytes, "fused": fused.nbytes,
                     "op16": packed16.values.numel() * 2 + packed16.bitmask.numel() * 4}
        t = row.times
        print(f"{model} {shape} b{batch}: cuBLAS {t['dense'] * 1e6:.1f} us, 16:32 op {t['op16'] * 1e6:.1f}, sp24 "
              f"{t['sp24'] * 1e6:.1f} + slots {t['slots'] * 1e6:.1f} = {t['both'] * 1e6:.1f}, fused "
              f"{t['fused'] * 1e6:.1f} (x{t['dense'] / t['fused']:.2f} cuBLAS, x{t['op16'] / t['fused']:.2f} the "
              f"16:32 op), split {t['split'] * 1e6:.1f} (x{t['dense'] / t['split']:.2f}; without the transpose "
              f"{t['split_kernels'] * 1e6:.1f}, slots kernel {t['slots_cuda'] * 1e6:.1f}), checks "
              f"{row.checks['fused']:.2f} / {row.checks['both']:.2f} / {row.checks['op16']:.2f} / "
              f"{row.checks['split']:.2f}" + (f"; fused under the baseline {t['fused:baseline'] * 1e6:.1f} us "
                                               f"({row.fused_launch['baseline']})" if baseline else ""), flush=True)
        rows.append(row)
    del dense, w24s, slot_copies, ops, fuseds
    torch.cuda.empty_cache()
    return rows


def summary(rows: list[Row]) -> str:
    lines = ["| batch | fused vs cuBLAS (geomean, min) | sp24 + slots, two launches | 16:32 op today | sp24 alone "
             "(2:4 part; what 2:4 gets) | fused vs the 16:32 op | fused's time over sp24 alone | split: sp24 + "
             "slots.cu (geomean, min) | split without the transpose of x |",
             "|---|---|---|---|---|---|---|---|---|"]
    for batch in sorted({r.batch for r in rows}):
        sel = [r for r in rows if r.batch == batch]
        fused = [r.times["dense"] / r.times["fused"] for r in sel]

        def vs_dense(key: str) -> str:
            return f"{geomean([r.times['dense'] / r.times[key] for r in sel]):.2f}x"
        lines.append(f"| {batch} | {geomean(fused):.2f}x ({min(fused):.2f}x) | {vs_dense('both')} | "
                     f"{vs_dense('op16')} | {vs_dense('sp24')} | "
                     f"{geomean([r.times['op16'] / r.times['fused'] for r in sel]):.2f}x | "
                     f"{geomean([r.times['fused'] / r.times['sp24'] for r in sel]):.2f}x | "
                     f"{vs_dense('split')} ({min(r.times['dense'] / r.times['split'] for r in sel):.2f}x) | "
                     f"{vs_dense('split_kernels')} |")
    return "\n".join(lines)


def baseline_summary(rows: list[Row], baseline: dict[str, str]) -> str:
    """The fused kernel under this run's settings against its tuned launch under the baseline settings."""
    lines = ["| batch | fused vs cuBLAS (geomean, min) | fused under the baseline vs cuBLAS (geomean, min) | fused vs "
             "baseline, geomean of time ratios |", "|---|---|---|---|"]
    for batch in sorted({r.batch for r in rows}):
        sel = [r for r in rows if r.batch == batch]
        paired = [r.times.get("fused:paired", r.times["fused"]) for r in sel]
        dense = [r.times.get("dense:paired", r.times["dense"]) for r in sel]
        now = [d / t for d, t in zip(dense, paired)]
        base = [d / r.times["fused:baseline"] for d, r in zip(dense, sel)]
        lines.append(f"| {batch} | {geomean(now):.2f}x ({min(now):.2f}x) | {geomean(base):.2f}x ({min(base):.2f}x) | "
                     f"{geomean([r.times['fused:baseline'] / t for r, t in zip(sel, paired)]):.3f}x |")
    return ("\n\n## The fused kernel against the baseline settings ("
            + ", ".join(f"{k}={v}" for k, v in baseline.items()) + ")\n\n" + "\n".join(lines)
            + "\n\nEach side is the engine tuner's pick under its settings, checked against float64 of the whole "
            + f"weight, the two and cuBLAS timed alternately ({BASELINE_ROUNDS} rounds each, median each: this "
            + "table's times are these, not the single timings of the table above); per-shape times and launches in "
            + "the table below (its `fused` column, this run's settings, also names the baseline's launch and median).")


def loop_summary(rows: list[Row], loops: list[str]) -> str:
    """The fused kernel in each slot-loop order (SPARSEDECODING_SP24_OVER_LOOP), side by side: geomean vs cuBLAS."""
    lines = ["| batch | " + " | ".join(f"fused, {loop}" for loop in loops) + " |", "|---|" + "---|" * len(loops)]
    for batch in sorted({r.batch for r in rows}):
        sel = [r for r in rows if r.batch == batch]
        lines.append(f"| {batch} | " + " | ".join(
            f"{geomean([r.times['dense'] / r.times[f'fused:{loop}'] for r in sel]):.2f}x" for loop in loops) + " |")
    return "\n".join(lines)


def details(rows: list[Row], copy_bw: float, loops: list[str]) -> str:
    lines = ["| model | linear | out x in | batch | cuBLAS us | 16:32 op us | sp24 us (launch) | slots us (config) | "
             "sp24 + slots us | fused us (launch; % copy bw) | fused x cuBLAS | split us (without the transpose; "
             "slots.cu alone) | split x cuBLAS | float64 (fused / two / op / split) |",
             "|" + "---|" * 14]
    for r in rows:
        t = r.times
        pct = (r.bytes["fused"] + 2 * r.batch * (r.out + r.in_features)) / t["fused"] / copy_bw * 100
        checks = " / ".join("ok" if r.checks[k] <= 1 else f"FAIL ({r.checks[k]:.2f})"
                            for k in ("fused", "both", "op16", "split"))
        base = (f"; baseline {r.fused_launch['baseline']} {t['fused:baseline'] * 1e6:.1f}"
                if "fused:baseline" in t else "")
        lines.append(f"| {r.model} | {r.shape} | {r.out}x{r.in_features} | {r.batch} | {t['dense'] * 1e6:.1f} | "
                     f"{t['op16'] * 1e6:.1f} | {t['sp24'] * 1e6:.1f} ({r.sp24_launch}) | {t['slots'] * 1e6:.1f} "
                     f"({r.slot_config}) | {t['both'] * 1e6:.1f} | {t['fused'] * 1e6:.1f} ({r.fused_launch[loops[0]]}; "
                     f"{pct:.0f}%{base}) | {t['dense'] / t['fused']:.2f}x | {t['split'] * 1e6:.1f} ("
                     f"{t['split_kernels'] * 1e6:.1f}; {t['slots_cuda'] * 1e6:.1f}) | {t['dense'] / t['split']:.2f}x | "
                     f"{checks} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shape_arguments(parser, MODELS[:1])
    parser.add_argument("--over-loops", nargs="+", default=["rows"], choices=SP24_OVER_LOOP_CHOICES,
                        help="slot-loop orders of the fused kernel to time side by side (SPARSEDECODING_SP24_OVER_LOOP;"
                             " the first is the 'fused' column; default: rows)")
    parser.add_argument("--baseline", nargs="+", default=[], metavar="NAME=VALUE",
                        help="kernel settings (op.SETTINGS) under which the fused kernel's tuned launch is also timed, "
                             "side by side, e.g. SPARSEDECODING_SP24_EARLY_TRIGGER=0")
    args = parser.parse_args(argv)
    baseline = baseline_settings(parser, args.baseline)
    start = gpu_start("overflow_bench")
    if start is None:
        return 2
    started, generator, copy_bw = start
    build_start = time.perf_counter()
    probe = capped_weight(128, 256, generator)
    probe_split = split_overflow(probe, SLOTS)
    x = torch.randn(1, 256, device="cuda", generator=generator).bfloat16()
    w24 = tile(probe_split.w24)
    probe_y = overflow_add_(x, OverflowSlots.of(probe_split), tuned_launch(x, w24)(x, w24))
    build_s = time.perf_counter() - build_start
    if float64_error(probe_y, x, probe, roundings=2) > 1:
        print("error: the probe fails its float64 check", file=sys.stderr)
        return 1
    rows = []
    for model in args.models:
        for shape in args.shapes:
            rows += bench_shape(model, shape, args.batches, args.reps, generator, args.over_loops, baseline)
    failures = sum(1 for r in rows for k, v in r.checks.items() if k != "fused" and v > 1)
    loops = baseline_summary(rows, baseline) if baseline else ""
    if len(args.over_loops) > 1:
        loops += ("\n\n## The fused kernel's slot-loop orders side by side\n\n"
                 + loop_summary(rows, args.over_loops) + "\n\nEach order's launch is the engine tuner's pick "
                 + "for it; the per-shape times are in the log.")
    report = ("# 16:32+2 as 2:4 tiles + two overflow slots a word vs cuBLAS and today's 16:32 op\n\n"
              + environment(copy_bw, build_s)
              + f"- pattern {PATTERN} ({SLOTS} slots a row and word; bf16 values, uint8 columns), random weights\n"
              + f"- fused kernel's slot loop: {', '.join(args.over_loops)} (SPARSEDECODING_SP24_OVER_LOOP; the first "
              + "is the 'fused' column)\n"
              + "\n## Geomeans over the shapes\n\n" + summary(rows) + loops + "\n\n## All measurements\n\n"
              + "cuBLAS: `F.linear` on the dense pruned weight. 16:32 op: `nm_spmv` on the same weight packed as "
              + "16:32 (what the engine runs for a 16:32 model today). sp24: the engine tuner's launch "
              + "(`sp24.tuned_launch`) on the 2:4 part, splits (`/Ns`: slices). slots: `triton_overflow."
              + "overflow_add_` alone, its tuner's pick. sp24 + slots: both in a row. split: sp24 on the 2:4 part "
              + "then `sp24_split.slots_add` (csrc/slots.cu) on the tiled slots, with x's transpose as eager calls "
              + "make it (and without it: x transposed once, outside the timing). fused: sp24 with the slots "
              + "inside (`tile_overflow`), the engine tuner's launch. Every float64 check is over the whole 16:32+2 "
              + "weight. % copy bw: bytes that must move (tiled 2:4 part, tiled slots, x, y) / time, against a "
              + "device copy in the same run.\n\n" + details(rows, copy_bw, args.over_loops)
              + f"\n\nfloat64 failures: {failures}. Whole run: {time.perf_counter() - started:.0f} s\n")
    write_report(report, args.out)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
