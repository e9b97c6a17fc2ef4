"""Does where x and the weight copies sit in memory move a small sp24 launch's time?

The same sp24 launches (2:4 + int4 at batch 1) timed on the same weights in different processes read 3.7-4.8 us on
the 8B o shape, and the tuner's picks moved with them. Here, in one process, each launch is timed with x in several
separately allocated buffers and over two separately allocated sets of weight copies (each set adding up to three L2
caches), every combination in the same interleaved rounds (`autotune.interleaved_replay_ms`). A spread across x
buffers or sets well above the spread across rounds would put the variance in placement (which L2 partition or
memory channel serves x, the output or the weights) rather than in the kernels.

    PYTHONPATH=src python benchmarks/placement_probe.py --out benchmarks/results/placement_probe_h200.md
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time

import torch

from cuda_kernel_bench import write_report
from kernel_bench import L2_ROTATION_BYTES, linear_shapes
from quant_kernel_bench import grid_weight
from sp24_bench import GROUP_SIZE
from sparsedecoding.kernels import sp24
from sparsedecoding.kernels.autotune import interleaved_replay_ms
from sparsedecoding.kernels.quantized import pack_nm_quantized
from sparsedecoding.runenv import environment_markdown

PROBLEMS = [("llama-3.1-8b", "o"), ("qwen3-14b", "o"), ("llama-3.1-8b", "qkv")]
# (splits, slices, early-trigger build)
LAUNCHES = [(1, 4, True), (1, 8, True), (2, 4, True), (1, 4, False)]


def clocks() -> str:
    """The GPU's SM and memory clocks, power and temperature as nvidia-smi reads them (read only)."""
    try:
        found = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu",
                                "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError) as exc:
        return f"unread ({exc})"
    return found or "unread"


def probe(model: str, shape: str, xs: int, rounds: int, generator) -> str:
    out, in_features = linear_shapes(model, unfused=False)[shape]
    quantized = pack_nm_quantized(grid_weight(out, in_features, 2, 4, "int4", generator), 2, 4, "int4", GROUP_SIZE)
    w = sp24.tile(quantized)
    count = math.ceil(L2_ROTATION_BYTES / w.nbytes)
    sets = [[w] + [w.clone() for _ in range(count)], [w.clone() for _ in range(count + 1)]]
    buffers = [torch.empty(1 << 20, dtype=torch.bfloat16, device="cuda") for _ in range(xs)]
    source = torch.randn(1, in_features, device="cuda").bfloat16()
    x_list = []
    for buffer in buffers:
        x = buffer[:in_features].view(1, in_features)
        x.copy_(source)
        x_list.append(x)
    calls, names = [], []
    for splits, slices, early in LAUNCHES:
        launch = sp24.Sp24Launch(x_list[0], w, splits, slices, early=early)
        for s, weights in enumerate(sets):
            for i, x in enumerate(x_list):
                calls.append(lambda k, launch=launch, x=x, weights=weights: launch(x, weights[k % len(weights)]))
                names.append((sp24.choice_label((splits, slices, early, 0)), s, i))
    times = interleaved_replay_ms(calls, list(range(count + 1)), rounds)
    found = dict(zip(names, times))
    lines = [f"### {model} {shape} ({out}x{in_features}) int4, batch 1", "",
             "| launch | weight set | " + " | ".join(f"x{i}" for i in range(xs)) + " | max / min across x |",
             "|---|---|" + "---|" * (xs + 1)]
    for label in dict.fromkeys(n[0] for n in names):
        for s in range(len(sets)):
            row = [found[(label, s, i)] * 1e3 for i in range(xs)]
            lines.append(f"| {label} | {s} | " + " | ".join(f"{t:.2f}" for t in row)
                         + f" | {max(row) / min(row):.3f} |")
    print("\n".join(lines), flush=True)
    del sets, w
    torch.cuda.empty_cache()
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--xs", type=int, default=6, help="separately allocated x buffers (default: 6)")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds, median (default: 9)")
    parser.add_argument("--repeat", type=int, default=2, help="passes over the problems (default: 2)")
    parser.add_argument("--out", help="write the markdown report here too")
    args = parser.parse_args(argv)
    if args.xs < 1 or args.rounds < 1 or args.repeat < 1:
        parser.error("--xs, --rounds and --repeat must be at least 1")
    if not torch.cuda.is_available():
        print("error: placement_probe.py needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.perf_counter()
    generator = torch.Generator(device="cuda").manual_seed(0)
    parts = [f"- clocks at the start (SM, memory, power, temperature): {clocks()}"]
    for p in range(args.repeat):
        parts += [f"## Pass {p + 1}"] + [probe(model, shape, args.xs, args.rounds, generator)
                                          for model, shape in PROBLEMS]
    parts.append(f"- clocks at the end: {clocks()}")
    report = ("# sp24 launch times against where x and the weights sit\n\n"
              + environment_markdown(" ".join(["python", *sys.argv]), torch.device("cuda"))
              + f"- {args.xs} x buffers (each its own 2 MB allocation), two sets of weight copies (each adding up "
              + f"to three L2 caches), {args.rounds} interleaved rounds, median us a launch\n\n"
              + "\n\n".join(parts) + f"\n\nWhole run: {time.perf_counter() - started:.0f} s\n")
    write_report(report, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
