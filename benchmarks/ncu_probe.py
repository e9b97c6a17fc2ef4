"""One kernel, one problem, a few calls: the target that Nsight Compute profiles (`h200.sh ncu-probe`).

Nothing here times anything. The probe builds one random weight of a decoder shape, makes the layout a kernel path
reads, and calls that path `--calls` times, so that `ncu --launch-skip 2 --launch-count 1` catches a warm launch.
The paths:

- `generic`: the tensor-core kernel's generic expansion (`cuda_mma.nm_mm_cuda`, 16:32 by default);
- `fast24`: the same kernel on 2:4 with its FAST24 path, the reference the generic path is measured against;
- `sp24-bf16`, `sp24-int8`, `sp24-int4`: the tiled 2:4 sparse tensor-core kernel (`sp24.sp24_mm`, default splits,
  one slice, or `--splits` / `--slices`: the tuned launch itself is not called, whose tuning runs would be the
  launches ncu skips; name its pair instead, as `sp24_h200.md` reports it; `--ctas G` a stream-K launch over G
  CTAs, `--early 0/1` the build);
- `sp24-over`: the same kernel with two overflow slots a word inside (a 16:32+2 weight, `sp24.tile_overflow`);
- `cublas`: `F.linear` on the dense weight.

    ncu --clock-control none -k regex:nm_mma_kernel --launch-skip 2 --launch-count 1 \\
        python benchmarks/ncu_probe.py generic --batch 4
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.nn.functional as F

from kernel_bench import linear_shapes, random_nm_weight
from quant_kernel_bench import GROUP_SIZE, grid_weight
from sparsedecoding.kernels import cuda_mma
from sparsedecoding.kernels.format import pack_nm
from sparsedecoding.kernels.quantized import pack_nm_quantized
from sparsedecoding.kernels.sp24 import Sp24Launch, sp24_mm, tile

PATHS = ("generic", "fast24", "sp24-bf16", "sp24-int8", "sp24-int4", "sp24-over", "cublas")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("path", choices=PATHS)
    parser.add_argument("--model", default="llama-3.1-8b")
    parser.add_argument("--shape", default="gate_up", help="a decoder linear of --model (qkv, o, gate_up, down)")
    parser.add_argument("--pattern", default="16:32", help="N:M of the generic path (50%% only)")
    parser.add_argument("--batch", type=int, default=4, help="rows of x, 1-16")
    parser.add_argument("--calls", type=int, default=5, help="calls of the path (ncu skips the first ones)")
    parser.add_argument("--splits", type=int, help="sp24 paths: step ranges across CTAs (default: default_splits)")
    parser.add_argument("--slices", type=int, default=1, choices=(1, 2, 4, 8),
                        help="sp24 paths: warps sharing a row tile in a CTA (default: %(default)s)")
    parser.add_argument("--ctas", type=int, default=0,
                        help="sp24 paths: a stream-K launch over this many CTAs (one slice, no --splits)")
    parser.add_argument("--early", type=int, choices=(0, 1),
                        help="sp24 paths: 1 the early-trigger build, 0 the other (default: as the settings pick)")
    args = parser.parse_args(argv)
    if args.ctas < 0:
        parser.error(f"--ctas must be 0 (split-K) or a CTA count; got {args.ctas}")
    if args.ctas and (args.slices != 1 or args.splits not in (None, 1)):
        parser.error("--ctas (stream-K) takes one slice and no --splits")
    if args.early is not None:
        args.early = bool(args.early)
    shapes = linear_shapes(args.model, unfused=False)
    if args.shape not in shapes:
        parser.error(f"--shape must be one of {', '.join(shapes)} for {args.model}; got {args.shape}")
    if not 1 <= args.batch <= 16:
        parser.error(f"--batch must be 1-16; got {args.batch}")
    if args.calls < 1:
        parser.error(f"--calls must be at least 1; got {args.calls}")
    if args.splits is not None and args.splits < 1:
        parser.error(f"--splits must be at least 1; got {args.splits}")
    n, _, m = args.pattern.partition(":")
    if not (n.isdigit() and m.isdigit() and 2 * int(n) == int(m) and 32 % int(m) == 0):
        parser.error(f"--pattern must be a 50% N:M with M dividing 32 (2:4 ... 16:32); got {args.pattern}")
    args.n, args.m = int(n), int(m)
    return args


def build(args: argparse.Namespace, generator: torch.Generator):
    """The call to profile, as a function of x."""
    out, in_features = linear_shapes(args.model, unfused=False)[args.shape]
    if args.path == "cublas":
        weight = random_nm_weight(out, in_features, 2, 4, generator)
        return lambda x: F.linear(x, weight)
    if args.path in ("generic", "fast24"):
        n, m = (2, 4) if args.path == "fast24" else (args.n, args.m)
        packed = pack_nm(random_nm_weight(out, in_features, n, m, generator), n, m)
        return lambda x: cuda_mma.nm_mm_cuda(x, packed)
    kind = args.path.removeprefix("sp24-")
    if kind == "over":
        from overflow_bench import capped_weight
        from sparsedecoding.kernels.overflow import split_overflow
        from sparsedecoding.kernels.sp24 import tile_overflow

        w = tile_overflow(split_overflow(capped_weight(out, in_features, generator)))
    elif kind == "bf16":
        w = tile(pack_nm(random_nm_weight(out, in_features, 2, 4, generator), 2, 4))
    else:
        group = in_features if kind == "int8" else GROUP_SIZE
        w = tile(pack_nm_quantized(grid_weight(out, in_features, 2, 4, kind, generator), 2, 4, kind, group))
    if args.ctas or args.early is not None:  # a launch of exactly that grid and build
        return lambda x: Sp24Launch(x, w, args.splits, args.slices, early=args.early, ctas=args.ctas)(x, w)
    return lambda x: sp24_mm(x, w, args.splits, args.slices)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("ncu_probe.py needs a CUDA GPU", file=sys.stderr)
        return 2
    generator = torch.Generator(device="cuda").manual_seed(0)
    call = build(args, generator)
    out, in_features = linear_shapes(args.model, unfused=False)[args.shape]
    x = torch.randn(args.batch, in_features, device="cuda", generator=generator).bfloat16()
    for _ in range(args.calls):
        y = call(x)
    torch.cuda.synchronize()
    print(f"{args.path} {args.model} {args.shape} {out}x{in_features} batch {args.batch}: {args.calls} calls, "
          f"y {tuple(y.shape)} finite: {bool(torch.isfinite(y).all())}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
