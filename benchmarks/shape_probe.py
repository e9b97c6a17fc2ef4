"""How fast sp24's tuned launch streams a 2:4 weight as its shape changes: the same kernel on shapes between and
beside the decoder linears (rows and in-features varied one at a time), each tuned as the engine tunes it (every
candidate float64-checked), then timed as the kernel bench times it (graph replays round-robin over weight copies
past the L2), with cuBLAS on the dense pruned weight in the same process. The question it answers: does a shape's
share of copy bandwidth follow its size, its in-features (steps of a row block) or its rows (row blocks against the
grid), where the Qwen3-14B gate_up (34816x5120) in int4 streams ~27% slower per byte than the 8B gate_up
(28672x4096)?

    python benchmarks/shape_probe.py --shapes 28672x4096 28672x5120 34816x5120 --out results/shape_probe_h200.md
"""

from __future__ import annotations

import argparse
import math
import re
import shlex
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from kernel_bench import L2_ROTATION_BYTES, random_nm_weight, time_rotated
from quant_kernel_bench import grid_weight
from sp24_bench import GROUP_SIZE, copies, float64_error, pct
from sparsedecoding.engine.bench import copy_bandwidth
from sparsedecoding.kernels import sp24
from sparsedecoding.kernels.format import pack_nm
from sparsedecoding.kernels.quantized import pack_nm_quantized
from sparsedecoding.runenv import environment_markdown

KINDS = ("bf16", "int8", "int4")


def shape_arg(text: str) -> tuple[int, int]:
    match = re.fullmatch(r"(\d+)x(\d+)", text)
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r}: use OUTxIN, e.g. 28672x4096")
    out, in_features = int(match[1]), int(match[2])
    if out < 16 or out % 16 or in_features < 512 or in_features % 512:
        raise argparse.ArgumentTypeError(f"{text}: rows a multiple of 16, in-features a multiple of 512")
    return out, in_features


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shapes", nargs="+", type=shape_arg, required=True, help="OUTxIN weights")
    parser.add_argument("--kinds", nargs="+", default=["int4"], choices=KINDS, help="values (default: int4)")
    parser.add_argument("--batch", type=int, default=1, choices=range(1, 17), metavar="1-16")
    parser.add_argument("--reps", type=int, default=7, help="timed graph replays, median (default: %(default)s)")
    parser.add_argument("--out", type=Path, help="write the markdown report here too")
    args = parser.parse_args(argv)
    if args.reps < 1:
        parser.error(f"--reps must be at least 1; got {args.reps}")
    if args.out is not None and not args.out.parent.is_dir():
        parser.error(f"--out: no folder {args.out.parent}")
    return args


def weight_of(kind: str, out: int, in_features: int, generator: torch.Generator):
    """(tiled weight, its float64 dense form, the dense bf16 pruned weight cuBLAS runs)."""
    if kind == "bf16":
        dense = random_nm_weight(out, in_features, 2, 4, generator)
        return sp24.tile(pack_nm(dense, 2, 4)), dense.double(), dense
    group = in_features if kind == "int8" else GROUP_SIZE
    packed = pack_nm_quantized(grid_weight(out, in_features, 2, 4, kind, generator), 2, 4, kind, group)
    dense64 = packed.to_dense(torch.float64)
    return sp24.tile(packed), dense64, dense64.bfloat16()


def probe(kind: str, out: int, in_features: int, batch: int, reps: int, generator, copy_bw: float) -> str:
    w, dense64, dense = weight_of(kind, out, in_features, generator)
    x = torch.randn(batch, in_features, device="cuda", generator=generator).bfloat16()
    rotation = [dense] + [dense.clone() for _ in range(math.ceil(L2_ROTATION_BYTES / (dense.numel() * 2)))]
    cublas = time_rotated([lambda d=d: F.linear(x, d) for d in rotation], reps)[0]
    del rotation
    launch = sp24.tuned_launch(x, w)  # every candidate float64-checked by the tuner
    error = float64_error(launch(x, w), x, dense64)
    key = sp24.problem_key(x, w)
    timings = sp24.launch_timings(key)
    split_k = min((t, c) for c, t in timings.items() if not c[3])
    stream = min(((t, c) for c, t in timings.items() if c[3]), default=None)
    weights = copies(w)
    tuned = time_rotated([lambda c=c: launch(x, c) for c in weights], reps)[0]
    del weights
    nbytes = w.nbytes + 2 * batch * (out + in_features)
    row_blocks = -(-out // sp24.ROWS_PER_BLOCK)
    text = (f"| {kind} | {out}x{in_features} | {w.nbytes / 1e6:.1f} | {row_blocks} | {w.steps} | "
            f"{cublas * 1e6:.1f} ({pct(dense.numel() * 2, cublas, copy_bw)}) | "
            f"{tuned * 1e6:.1f} | {sp24.launch_label(launch)} | {pct(nbytes, tuned, copy_bw)} | "
            f"{nbytes / tuned / 1e12:.2f} | {cublas / tuned:.2f} | "
            f"{split_k[0] * 1e3:.1f} ({sp24.choice_label(split_k[1])}) | "
            + (f"{stream[0] * 1e3:.1f} ({sp24.choice_label(stream[1])})" if stream else "-")
            + f" | {'ok' if error <= 1 else f'FAILED ({error:.3g})'} |")
    print(text, flush=True)
    return text


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        print("error: shape_probe.py needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.perf_counter()
    generator = torch.Generator(device="cuda").manual_seed(0)
    copy_bw = copy_bandwidth(torch.device("cuda"))
    header = ("| values | out x in | tiled MB | row blocks (128 rows) | steps a row block | cuBLAS us (% copy) | "
              "sp24 tuned us | launch | % copy | TB/s | x cuBLAS | tuner: best split-K us | tuner: best stream-K "
              "us | float64 |\n|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    print(header, flush=True)
    rows = [probe(kind, out, in_features, args.batch, args.reps, generator, copy_bw)
            for kind in args.kinds for out, in_features in args.shapes]
    report = "\n".join([
        "# sp24's tuned launch across shapes", "",
        environment_markdown("python " + shlex.join(sys.argv)) + f"- copy bandwidth (device-to-device, read + "
        f"written): {copy_bw / 1e12:.2f} TB/s", "",
        f"Batch {args.batch}. Tuned = `sp24.tuned_launch` under the default settings (its float64 checks and graph-"
        "replay timings), timed again here round-robin over weight copies past the L2; cuBLAS = `F.linear` on the "
        "dense pruned weight, same way; % copy = tiled weight + x + y bytes (cuBLAS: the bf16 weight) over the time, "
        "against the device-to-device copy; the tuner's columns are its own timings (ms per launch x 1000).",
        "", header, *rows, "", f"Whole run: {time.perf_counter() - started:.0f} s"])
    if args.out is not None:
        args.out.write_text(report + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
