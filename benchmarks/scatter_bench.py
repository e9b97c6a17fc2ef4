"""The scatter-expansion kernel (`kernels/nm_scatter.py`) on plain 16:32 weights against cuBLAS and today's paths, side
by side in one process: the 8B and 14B decoder shapes, a 16:32+2 weight (magnitude-masked standard normal: a 16:32
weight that the 2:4 kernel with slots also runs), graph replays round-robin over weight copies past the L2, the least
of four rounds that alternate the order. Sides: the scatter kernel at its fastest split (each candidate checked
against float64), today's op on the same packed 16:32 weight (`nm_spmv` as dispatched: Triton or nm_mma), cuBLAS on
the dense weight; `--sp24` adds 16:32+2 on the 2:4 kernel at its tuned launch (what the engine runs; builds the sp24
libraries when none are cached), `--probe` the scatter build without its expansion (wrong products: what the loads,
the x copy and the MMAs cost alone). Geomean vs cuBLAS per batch against issue 12's 16:32 targets; writes markdown.

    python benchmarks/scatter_bench.py --probe --out results/scatter_h200.md
    python benchmarks/scatter_bench.py --sp24 --batches 8 16 --out results/scatter_h200_sp24.md
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
from overflow_bench import capped_weight, float64_error, rotation
from sp24_bench import MODELS, TARGETS_12

from sparsedecoding.kernels import nm_scatter, op
from sparsedecoding.kernels.autotune import replay_ms
from sparsedecoding.kernels.format import PackedNM, pack_nm
from sparsedecoding.runenv import environment_markdown

ROUNDS = 4
SCATTER, PROBE, PACKED = "scatter", "probe (no expansion)", "op (packed 16:32)"
SP24, CUBLAS = "sp24 (16:32+2)", "cuBLAS"


def split_candidates(words: int, range_words: int, library_default: int) -> list[int]:
    """The scatter kernel's splits to try: the fewest its x copy allows, the default, and up to three more."""
    fewest = nm_scatter.min_splits(words, range_words)
    wanted = {fewest, library_default, 2 * fewest, 2 * library_default, max(fewest, library_default // 2)}
    return sorted(s for s in wanted if fewest <= s <= max(fewest, words // 4))


def fastest_scatter(x: torch.Tensor, packed: PackedNM, copies: list, weight: torch.Tensor, warps: int,
                    prefetch: int = 0) -> tuple[tuple[int, int], float]:
    """((splits, row CTAs), us) of the fastest checked candidate: each split candidate with one CTA a row block and
    with `default_row_ctas` (row blocks shared, x copied once a CTA). A float64 mismatch raises (a kernel bug,
    never skipped)."""
    default = nm_scatter.ScatterLaunch(x, packed, warps=warps, prefetch=prefetch)
    best = None
    for splits in split_candidates(default.words, default.range_words, default.splits):
        shared = nm_scatter.default_row_ctas(default.out, splits, default.rows_per_block, default.slots)
        for row_ctas in dict.fromkeys([default.row_blocks, shared]):
            launch = nm_scatter.ScatterLaunch(x, packed, splits, warps=warps, prefetch=prefetch, row_ctas=row_ctas)
            error = float64_error(launch(x, packed.values, packed.bitmask), x, weight)
            if error > 1:
                raise AssertionError(f"scatter kernel, {tuple(packed.shape)} batch {x.shape[0]} splits {splits} row "
                                     f"CTAs {row_ctas}: float64 error {error:.2f}x the bound")
            us = 1000 * replay_ms(lambda p, launch=launch: launch(x, p.values, p.bitmask), copies)
            if best is None or us < best[1]:
                best = ((splits, row_ctas), us)
    return best


def packed_copies(packed: PackedNM) -> list[PackedNM]:
    """Copies of a packed weight whose bytes together pass the L2 (`rotation`)."""
    return rotation(lambda: PackedNM(packed.values.clone(), packed.bitmask.clone(), 16, 32, packed.shape),
                    packed.values.numel() * 2 + packed.bitmask.numel() * 4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", choices=MODELS, default=MODELS)
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 2, 4, 8, 12, 16], choices=range(1, 17))
    parser.add_argument("--warps", nargs="+", type=int, default=[8], choices=nm_scatter.WARPS,
                        help="CTA sizes of the scatter kernel to time, each a side (the probe takes the first)")
    parser.add_argument("--prefetch", nargs="+", type=int, default=[0], choices=nm_scatter.PREFETCH,
                        help="L2 prefetch distances (steps) of the scatter kernel to time, each a side with each CTA "
                             "size (and a probe each with --probe)")
    parser.add_argument("--probe", action="store_true", help="also time the build without the expansion")
    parser.add_argument("--sp24", action="store_true", help="also time 16:32+2 on the 2:4 kernel (tuned launch)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("error: scatter_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    if args.out is not None and not args.out.parent.is_dir():
        print(f"error: {args.out.parent} is not a folder", file=sys.stderr)
        return 2
    prefetches = list(dict.fromkeys(args.prefetch))
    named = len(prefetches) > 1 or prefetches[0] != 0  # sides name their prefetch unless it is only the default 0
    scatters = {f"{SCATTER} ({w} warps{f', prefetch {d}' if named else ''})": (w, d)
                for w in dict.fromkeys(args.warps) for d in prefetches}
    probes = {f"{PROBE[:-1]}{f', prefetch {d}' if named else ''})": d for d in prefetches} if args.probe else {}
    sides = [*scatters] + [*probes] + [PACKED] + ([SP24] if args.sp24 else []) + [CUBLAS]
    started = time.time()
    rows, speeds = [], {(b, s): [] for b in args.batches for s in sides[:-1]}
    for model in args.models:
        for name, (out, inf) in linear_shapes(model, False).items():
            generator = torch.Generator(device="cuda").manual_seed(out + inf)
            weight = capped_weight(out, inf, generator)
            packed = pack_nm(weight, 16, 32)
            copies = {SCATTER: packed_copies(packed), CUBLAS: rotation(weight.clone, weight.numel() * 2)}
            for side in [*scatters, *probes, PACKED]:
                copies[side] = copies[SCATTER]
            if args.sp24:
                from sparsedecoding.kernels import sp24
                from sparsedecoding.kernels.overflow import split_overflow
                tiled = sp24.tile_overflow(split_overflow(weight))
                copies[SP24] = sp24._copies(tiled)
            for batch in args.batches:
                x = torch.randn(batch, inf, device="cuda", generator=generator).bfloat16()
                calls = {PACKED: lambda p: op.nm_spmv(x, p), CUBLAS: lambda d: F.linear(x, d)}
                labels = {PACKED: "nm_mma" if batch >= op.CUDA_FROM_BATCH[(16, 32)] else "Triton"}
                chosen = {}  # the scatter sides' splits
                for side, (warps, prefetch) in scatters.items():
                    (splits, row_ctas), _ = fastest_scatter(x, packed, copies[SCATTER], weight, warps, prefetch)
                    chosen[side] = splits, row_ctas
                    launch = nm_scatter.ScatterLaunch(x, packed, splits, warps=warps, prefetch=prefetch,
                                                      row_ctas=row_ctas)
                    calls[side] = lambda p, launch=launch: launch(x, p.values, p.bitmask)
                    labels[side] = f"{splits} splits, {row_ctas}/{launch.row_blocks} row CTAs"
                checks = {side: float64_error(calls[side](packed), x, weight) for side in [*scatters, PACKED]}
                for side, prefetch in probes.items():  # at the splits of the first CTA size's side
                    twin = next(s for s, (_, d) in scatters.items() if d == prefetch)
                    probe = nm_scatter.ScatterLaunch(x, packed, chosen[twin][0], probe=True,
                                                     warps=scatters[twin][0], prefetch=prefetch,
                                                     row_ctas=chosen[twin][1])
                    calls[side] = lambda p, probe=probe: probe(x, p.values, p.bitmask)
                    labels[side] = "wrong products"
                if args.sp24:
                    launch = sp24.tuned_launch(x, tiled)
                    calls[SP24] = lambda w, launch=launch: launch(x, w)
                    checks[SP24] = float64_error(calls[SP24](tiled), x, weight, roundings=2)
                    labels[SP24] = sp24.launch_label(launch)
                bad = {side: error for side, error in checks.items() if not error <= 1}
                if bad:
                    raise AssertionError(f"{model} {name} batch {batch}: float64 check failed {bad}")
                rounds = {side: [] for side in sides}
                for order in range(ROUNDS):
                    for side in (sides if order % 2 == 0 else sides[::-1]):
                        rounds[side].append(1000 * replay_ms(calls[side], copies[side]))
                times = {side: min(v) for side, v in rounds.items()}
                for side in sides[:-1]:
                    speeds[(batch, side)].append(times[CUBLAS] / times[side])
                rows.append(f"| {model} | {name} | {out}x{inf} | {batch} | "
                            + " | ".join(f"{times[s]:.1f} (x{times[CUBLAS] / times[s]:.2f}; {labels[s]})"
                                         for s in sides[:-1])
                            + f" | {times[CUBLAS]:.1f} |")
                print(rows[-1], flush=True)
            del copies
    summary = ["| batch | " + " | ".join(f"{s} vs cuBLAS (least)" for s in sides[:-1]) + " | target |",
               "|---|" + "---|" * len(sides)]
    for batch in args.batches:
        cells = [f"{geomean(speeds[(batch, s)]):.3f}x ({min(speeds[(batch, s)]):.2f}x)" for s in sides[:-1]]
        target = TARGETS_12.get(batch)
        summary.append(f"| {batch} | " + " | ".join(cells) + f" | {f'{target:.2f}x' if target else '-'} |")
    text = "\n".join([
        "# The scatter-expansion kernel on 16:32 against cuBLAS and today's paths", "",
        environment_markdown("python benchmarks/scatter_bench.py " + " ".join(shlex.quote(a) for a in sys.argv[1:])),
        "", f"Least of {ROUNDS} alternated rounds of graph replays over weight copies past the L2, us a launch (x: "
        "cuBLAS's time over the side's). Weight: standard normal masked 16:32+2 by magnitude (a 16:32 weight), packed "
        "16:32 for the scatter kernel and the op, split into its 2:4 part and slots for sp24, dense for cuBLAS. Every "
        "timed output but the probe's passed its float64 check.", "",
        op.settings_line(), "",
        *summary, "", f"Whole run: {time.time() - started:.0f} s.", "",
        "| model | linear | out x in | batch | " + " | ".join(f"{s} us (x cuBLAS; launch)" for s in sides[:-1])
        + " | cuBLAS us |", "|---|---|---|---|" + "---|" * len(sides), *rows, ""])
    print("\n".join(summary))
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
