"""One engine setting, A/B, side by side in one process: the preset's dense model once, then its N:M model built
under each value of the setting (read when the engine builds a model), every one measured like `sparsedecoding
bench` (random weights, decode steps compiled and captured in a CUDA graph, median of the repeats).

    python benchmarks/setting_ab_bench.py --setting SPARSEDECODING_FUSE_NORM --values 0 1 \\
        --preset llama-3.1-8b --batch 1 4 --out results/fuse_norm_h200_8b.md

`--builds LABEL=DEFINES ...` instead of a setting compares builds of the CUDA kernel libraries (nvcc -D flags,
comma-separated; empty: the normal build), as `ablate_probe.py --builds` does for single launches: for diagnostic
builds (sp24.cu's SP24_LATE_ROW_SCALES, say) that no setting selects.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

import torch

from sparsedecoding.engine.bench import SpeedResult, bench_preset, check_group_size, copy_bandwidth, format_table
from sparsedecoding.engine.config import preset
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.runenv import environment_markdown, write_report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    choice = parser.add_mutually_exclusive_group(required=True)
    choice.add_argument("--setting", help="an environment variable the engine reads")
    choice.add_argument("--builds", nargs="+", metavar="LABEL=DEFINES",
                        help="compare these kernel-library builds instead: a label, =, and nvcc -D flags separated by "
                             "commas (empty: the normal build)")
    parser.add_argument("--values", nargs="+")
    parser.add_argument("--preset", default="llama-3.1-8b")
    parser.add_argument("--pattern", type=SparsityPattern.parse, default=SparsityPattern.parse("2:4"))
    parser.add_argument("--batch", nargs="+", type=int, default=[1])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=256,
                        help="tokens a generation writes after its 16-token prompt; the KV cache holds both "
                             "(default: %(default)s)")
    parser.add_argument("--quantize", choices=["int8", "int4"],
                        help="quantize the N:M model's kept values (the dense baseline stays bf16)")
    parser.add_argument("--group-size", type=int, default=128, help="int4: columns a scale (default: 128)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from sparsedecoding.errors import SparseDecodingError
    from sparsedecoding.kernels import op

    if args.new_tokens < 2:
        parser.error(f"--new-tokens {args.new_tokens}: a generation needs at least 2 (one decode step timed)")
    if args.builds:
        return compare_builds(args, parser)
    known = op.SETTINGS
    if args.setting not in known:
        parser.error(f"--setting {args.setting}: not a setting the engine reads; use one of {', '.join(known)}")
    if not args.values:
        parser.error("--setting needs --values")

    try:  # the group size too, before the first model is built
        check_group_size(preset(args.preset), args.quantize, args.group_size)
    except SparseDecodingError as exc:
        parser.error(str(exc))
    original = os.environ.get(args.setting)

    def restore() -> None:  # the setting as the caller had it: for the dense model and the report's settings line
        if original is None:
            os.environ.pop(args.setting, None)
        else:
            os.environ[args.setting] = original

    for value in args.values:  # every value checked before the first model is built
        os.environ[args.setting] = value
        try:
            op.settings()
        except SparseDecodingError as exc:
            parser.error(str(exc))
    restore()

    device = torch.device("cuda")
    copy = copy_bandwidth(device)
    results = bench_preset(args.preset, [(None, args.batch)], device, new_tokens=args.new_tokens,
                           repeats=args.repeats)
    for value in args.values:
        os.environ[args.setting] = value
        torch._dynamo.reset()  # no compiled block reused from the previous value: each is compiled under its own
        op.clear_runners()  # nor a kernel runner built under it
        runs = bench_preset(args.preset, [(args.pattern, args.batch)], device, new_tokens=args.new_tokens,
                            repeats=args.repeats,
                            quantize=args.quantize, group_size=args.group_size)
        results += [dataclasses.replace(r, weights=f"{r.weights}, {args.setting}={value}")
                    if isinstance(r, SpeedResult) else r for r in runs]
        print(format_table(results, copy), flush=True)
    restore()
    kept = f" + {args.quantize}" if args.quantize else ""
    lines = [f"# {args.setting} A/B: {args.preset}, {args.pattern}{kept}, side by side", "",
             environment_markdown("python " + " ".join(sys.argv), device), "",
             f"Kernel settings outside the A/B (the dense model ran under these): {op.settings_line()}", "",
             "One process: dense once, then the N:M model built under each value; decode steps compiled and captured "
             f"in a CUDA graph ({args.new_tokens - 1} a generation after a 16-token prompt, a KV cache of "
             f"{-(-(16 + args.new_tokens) // 16) * 16} positions), median of {args.repeats}; ratio = tok/s / dense "
             "tok/s at the same batch.", "",
             format_table(results, copy), ""]
    write_report(args.out, "\n".join(lines))
    return 0


def compare_builds(args, parser) -> int:
    """The A/B over kernel-library builds: dense once, then the N:M model built and measured under each build (every
    library opened while that model is built comes from that build; the captured graphs keep their kernels)."""
    from sparsedecoding.errors import SparseDecodingError
    from sparsedecoding.kernels import cuda_mma, op, sp24, sp24_split

    bad = [b for b in args.builds if "=" not in b or not b.partition("=")[0].strip()]
    if bad or args.values:
        parser.error(f"--builds {bad[0]!r}: use LABEL=DEFINES (DEFINES may be empty)" if bad else
                     "--values goes with --setting, not --builds")
    builds = {label.strip(): tuple(d for d in flags.split(",") if d)
              for label, _, flags in (b.partition("=") for b in args.builds)}
    try:
        check_group_size(preset(args.preset), args.quantize, args.group_size)
    except SparseDecodingError as exc:
        parser.error(str(exc))
    device = torch.device("cuda")
    copy = copy_bandwidth(device)
    results = bench_preset(args.preset, [(None, args.batch)], device, new_tokens=args.new_tokens,
                           repeats=args.repeats)
    original = cuda_mma.open_library

    def forget() -> None:  # every cached library and runner, so that the next model opens its build's
        sp24._libraries.clear()
        for cache in (getattr(sp24_split, "_libraries", None), getattr(cuda_mma, "_libraries", None)):
            if isinstance(cache, dict):
                cache.clear()
        op.clear_runners()
        torch._dynamo.reset()

    try:
        for label, flags in builds.items():
            cuda_mma.open_library = (lambda source, min_major, defines, flags=flags:
                                     original(source, min_major=min_major, defines=tuple(defines) + flags))
            forget()
            runs = bench_preset(args.preset, [(args.pattern, args.batch)], device, new_tokens=args.new_tokens,
                                repeats=args.repeats, quantize=args.quantize, group_size=args.group_size)
            results += [dataclasses.replace(r, weights=f"{r.weights}, build {label}")
                        if isinstance(r, SpeedResult) else r for r in runs]
            print(format_table(results, copy), flush=True)
    finally:
        cuda_mma.open_library = original
        forget()
    kept = f" + {args.quantize}" if args.quantize else ""
    described = ", ".join(f"{label}: `{' '.join(flags) or 'no defines'}`" for label, flags in builds.items())
    lines = [f"# Kernel builds A/B: {args.preset}, {args.pattern}{kept}, side by side", "",
             environment_markdown("python " + " ".join(sys.argv), device), "",
             f"Kernel settings: {op.settings_line()}", "",
             f"Builds ({described}). One process: dense once, then the N:M model built under each build; decode "
             f"steps compiled and captured in a CUDA graph ({args.new_tokens - 1} a generation after a 16-token "
             f"prompt), median of {args.repeats}; ratio = tok/s / dense tok/s at the same batch.", "",
             format_table(results, copy), ""]
    write_report(args.out, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
