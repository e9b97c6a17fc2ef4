"""End-to-end decode speed on one GPU, written to benchmarks/results/: presets × patterns × batch sizes.

Dense and sparse run in one process, with random weights (speed does not depend on values). Each model is built
on the GPU, measured at its batch sizes and freed before the next, so the 70B model never meets another model in
memory.

    python benchmarks/e2e_bench.py            # full plan, about 6-7 minutes on an H200
    python benchmarks/e2e_bench.py --quick    # Llama-3.1-8B dense and 2:4 at batch 1, about 2 minutes
    python benchmarks/e2e_bench.py --preset qwen3-32b --preset llama-3.3-70b   # part of the full plan
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from sparsedecoding.engine.bench import (SpeedResult, bench_preset, copy_bandwidth, format_table,
                                         model_bytes, run_label)
from sparsedecoding.engine.config import preset
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.runenv import environment_markdown

DENSE = None
P = SparsityPattern.parse
HYBRID_FROM = 3  # the 2:4 model with dense copies from batch 3 on: the packed kernel is faster than cuBLAS at batch 2

# preset -> [(pattern or DENSE, batch sizes)], measured in this order.
FULL = {
    "llama-3.1-8b": [(DENSE, [1, 2, 3, 4, 8]), (P("2:4"), [1, 2, 3, 4, 8]), (P("4:8"), [1]), (P("8:16"), [1]),
                     (P("16:32"), [1]), (P("2:4"), [3, 4, 8], HYBRID_FROM)],
    "qwen3-32b": [(DENSE, [1]), (P("2:4"), [1])],
    "llama-3.3-70b": [(P("2:4"), [1])],
}
QUICK = {"llama-3.1-8b": [(DENSE, [1]), (P("2:4"), [1])]}


def target_lines(results: list) -> list[str]:
    """The issue's targets for Llama-3.1-8B, checked against what this run measured."""
    speed = {(r.weights, r.batch): r.tokens_per_second for r in results
             if isinstance(r, SpeedResult) and r.model == "llama-3.1-8b"}
    lines = ["## Targets (Llama-3.1-8B preset)", ""]
    if ("dense", 1) in speed:
        lines.append(f"- dense bf16 at batch 1: {speed['dense', 1]:.1f} tok/s (target >= 185; gpt-fast 160.5)")
    if ("dense", 1) in speed and ("2:4", 1) in speed:
        base = speed["2:4", 1] / speed["dense", 1]
        lines.append(f"- 2:4 vs dense at batch 1: {base:.3f}x (target >= 1.60; byte limit 1.69)")
        for label in ("4:8", "8:16", "16:32"):
            if (label, 1) in speed:
                ratio = speed[label, 1] / speed["dense", 1]
                lines.append(f"- {label} vs dense at batch 1: {ratio:.3f}x, {100 * (ratio / base - 1):+.1f}% from 2:4 "
                             f"(target within 5%)")
    hybrid = run_label(P("2:4"), HYBRID_FROM)
    for batch in (2, 3, 4, 8):
        for label in ("2:4", hybrid):
            if ("dense", batch) in speed and (label, batch) in speed:
                ratio = speed[label, batch] / speed["dense", batch]
                lines.append(f"- {label} vs dense at batch {batch}: {ratio:.3f}x (target: never below 1)")
    return lines + [""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="Llama-3.1-8B dense and 2:4 at batch 1 only")
    parser.add_argument("--with-70b-dense", action="store_true",
                        help="also try Llama-3.3-70B dense (141 GB of weights: runs only if the free memory allows)")
    parser.add_argument("--preset", action="append", choices=list(FULL),
                        help="run only these presets of the full plan (repeatable)")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/e2e_{quick,full,PRESETS}.md")
    args = parser.parse_args()
    plan = dict(QUICK if args.quick else FULL)
    if args.preset:
        plan = {name: runs for name, runs in plan.items() if name in args.preset}
    if args.with_70b_dense and "llama-3.3-70b" in plan:
        plan["llama-3.3-70b"] = plan["llama-3.3-70b"] + [(DENSE, [1])]
    label = "quick" if args.quick else "full" if not args.preset else "_".join(args.preset)
    out = args.out or Path(__file__).parent / "results" / f"e2e_{label}.md"

    device = torch.device("cuda")
    copy = copy_bandwidth(device)
    results = []
    for name, runs in plan.items():
        results += bench_preset(name, runs, device, new_tokens=args.new_tokens, repeats=args.repeats)
        print(format_table(results, copy), flush=True)
    command = "python " + " ".join(sys.argv)
    lines = ["# End-to-end decode speed (random weights, presets)", "", environment_markdown(command, device),
             f"Decode steps only ({args.new_tokens - 1} per generation after a prefill of 16 random tokens), median "
             f"of {args.repeats}; ratio = sparse tok/s / dense tok/s at the same model and batch.", "",
             format_table(results, copy), *target_lines(results)]
    if "llama-3.3-70b" in plan and not any(p is DENSE for p, _ in plan["llama-3.3-70b"]):
        dense_bytes = model_bytes(preset("llama-3.3-70b"), None)
        total = torch.cuda.get_device_properties(device).total_memory
        lines.append(f"Llama-3.3-70B dense was not run: its bf16 weights alone are {dense_bytes / 1e9:.1f} GB against "
                     f"{total / 1e9:.1f} GB on this GPU (try `--with-70b-dense`); the 2:4 model "
                     f"({model_bytes(preset('llama-3.3-70b'), P('2:4')) / 1e9:.1f} GB) fits with room for the cache.")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
