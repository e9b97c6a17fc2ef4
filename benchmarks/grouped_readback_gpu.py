"""How long the engine's tiling takes to read 16:32g / 16:32g8 splits back off the Llama-3.1-8B preset's masks (GPU).

The engine tiles a grouped linear by reading each word's split off its nonzeros on the weight's device
(`kernels.sp24.grouped_split`: the quick look, then `solvers.grouped_order_of`). In the seventy-third session the
8B preset's 16:32g8 decode ran past its 560 s limit on an H100 while tiling (the few words the first cover left
were searched one by one on the CPU, and every linear was read twice). This times `grouped_split` on one random mask
of each of the preset's linear shapes (`engine.loading.random_bitmask`, split shared by 16 rows and by 8), checks
every split (each row keeps two of every group of four), counts the words left to the one-by-one search, and adds up
what a whole model's tiling spends on it (each shape times the preset's 32 layers).

    PYTHONPATH=src python benchmarks/grouped_readback_gpu.py --out benchmarks/results/grouped_readback_h100.md
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from sparsedecoding import solvers
from sparsedecoding.engine.loading import random_bitmask
from sparsedecoding.kernels import sp24
from sparsedecoding.runenv import environment_markdown, write_report

SHAPES = {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)}  # Llama-3.1-8B
LAYERS = 32


def mask_weight(rows: int, columns: int, split_rows: int, seed: int) -> torch.Tensor:
    """A random 16:32g (split_rows 16) or 16:32g8 mask as a bf16 weight of ones on the GPU."""
    words = random_bitmask(rows, columns, 16, 32, "cuda", torch.Generator(device="cuda").manual_seed(seed),
                           placement="groups", split_rows=split_rows)
    bits = (words.unsqueeze(-1) >> torch.arange(32, device="cuda")) & 1
    return bits.view(rows, columns).to(torch.bfloat16)


def read_back(weight: torch.Tensor, split_rows: int) -> dict:
    """Seconds `sp24.grouped_split` takes on `weight`, words searched one by one, and a check of the split found."""
    searched = []
    search = solvers._order_by_search
    solvers._order_by_search = lambda word: searched.append(1) or search(word)
    try:
        torch.cuda.synchronize()
        start = time.perf_counter()
        order = sp24.grouped_split(weight, split_rows=split_rows)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - start
    finally:
        solvers._order_by_search = search
    if order is None:
        raise RuntimeError(f"no split read back off a random {weight.shape[0]}x{weight.shape[1]} grouped mask")
    rows, columns = weight.shape
    kept = (weight != 0).view(rows // split_rows, split_rows, columns // 32, 32).transpose(1, 2)
    kept = kept.reshape(-1, split_rows, 32)
    placed = kept.gather(2, order.reshape(-1, 32).unsqueeze(1).expand(-1, split_rows, -1))
    if not bool((placed.view(-1, split_rows, 8, 4).sum(-1) == 2).all()):
        raise RuntimeError("a split read back does not keep two of every group in every row")
    return {"seconds": seconds, "searched": len(searched), "words": len(kept)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.out and not args.out.parent.is_dir():
        print(f"error: {args.out.parent} is not a folder", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("error: grouped_readback_gpu needs a CUDA GPU", file=sys.stderr)
        return 2
    read_back(mask_weight(64, 256, 8, seed=0), 8)  # first launches and allocations, not timed
    lines = ["| split shared by | linear | out x in | words | searched one by one | s | us a word |",
             "|---|---|---|---|---|---|---|"]
    model = {}
    for split_rows in (16, 8):
        for name, (rows, columns) in SHAPES.items():
            result = read_back(mask_weight(rows, columns, split_rows, seed=split_rows), split_rows)
            model[split_rows] = model.get(split_rows, 0.0) + LAYERS * result["seconds"]
            line = (f"| {split_rows} rows | {name} | {rows}x{columns} | {result['words']} | {result['searched']} | "
                    f"{result['seconds']:.3f} | {1e6 * result['seconds'] / result['words']:.2f} |")
            print(line, flush=True)
            lines.append(line)
    lines += ["", "A whole 8B model's tiling, each shape's seconds times its 32 layers: "
              + ", ".join(f"{'16:32g' if rows == 16 else '16:32g8'} {seconds:.0f} s" for rows, seconds in model.items())
              + ".", ""]
    command = "python benchmarks/grouped_readback_gpu.py " + " ".join(sys.argv[1:] if argv is None else argv)
    title = f"# Reading 16:32g / 16:32g8 splits back off the 8B preset's masks ({torch.cuda.get_device_name()})"
    text = "\n".join([title, "", environment_markdown(command, torch.device("cuda")), "", __doc__.split("\n\n")[1], "",
                      *lines])
    if args.out:
        write_report(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
