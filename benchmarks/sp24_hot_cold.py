"""Where the sp24 kernel's time goes at small batch: each Llama-3.1-8B decoder linear (2:4, tiled, the tuner's
launch) timed from memory (round-robin over copies past the L2, as every other kernel bench here) and from L2
(the same weight every launch; every 8B weight but gate_up and down fits the H200's L2), and a tiny problem
(16 x 256) as the floor of a launch in a CUDA graph. If a linear takes about as long from L2 as from memory, its
time is spent in its latency chain (launch, staging x, split-K) rather than in moving its bytes.

    PYTHONPATH=src python benchmarks/sp24_hot_cold.py --out benchmarks/results/sp24_hot_cold_h200.md
"""

from __future__ import annotations

import argparse
import math
import sys

import torch

from cuda_kernel_bench import write_report
from kernel_bench import L2_ROTATION_BYTES, environment, linear_shapes, random_nm_weight
from sparsedecoding.engine.bench import copy_bandwidth
from sparsedecoding.kernels.autotune import replay_ms
from sparsedecoding.kernels.format import pack_nm
from sparsedecoding.kernels.sp24 import tile, tuned_launch


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 16], help="batch sizes, 1..16 (default: 1 16)")
    parser.add_argument("--out", help="also write the markdown report here")
    args = parser.parse_args(argv)
    if not all(1 <= batch <= 16 for batch in args.batch):
        print("error: --batch values must lie in 1..16", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    generator = torch.Generator("cuda").manual_seed(0)
    copy_bw = copy_bandwidth(torch.device("cuda"))
    shapes = {"tiny": (16, 256), **linear_shapes("llama-3.1-8b", unfused=False)}
    lines = ["| linear | out x in | batch | launch (splits/slices) | from memory us | from L2 us | L2 / memory | "
             "bytes at copy bandwidth us |", "|---|---|---|---|---|---|---|---|"]
    for name, (out, in_features) in shapes.items():
        w = tile(pack_nm(random_nm_weight(out, in_features, 2, 4, generator), 2, 4))
        rotation = [w] + [w.clone() for _ in range(math.ceil(L2_ROTATION_BYTES / w.nbytes))]
        for batch in args.batch:
            x = torch.randn(batch, in_features, device="cuda").bfloat16()
            launch = tuned_launch(x, w)
            cold = replay_ms(lambda weight: launch(x, weight), rotation) * 1000
            hot = replay_ms(lambda weight: launch(x, weight), [w]) * 1000
            floor = w.nbytes / copy_bw * 1e6  # as "% of copy" everywhere here
            lines.append(f"| {name} | {out}x{in_features} | {batch} | {launch.splits}/{launch.slices} | {cold:.1f} | "
                         f"{hot:.1f} | {hot / cold:.2f} | {floor:.1f} |")
            print(lines[-1], flush=True)
        del rotation
    write_report("\n".join(["# sp24 from memory and from L2 (Llama-3.1-8B linears, 2:4)", "", environment(copy_bw)]
                           + lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
