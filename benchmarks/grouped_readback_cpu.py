"""How long reading a 16:32g / 16:32g8 split back off a mask takes (CPU), with and without the exact cover.

The engine tiles a grouped linear by reading each tile word's split off its nonzeros (`kernels.sp24.grouped_split`,
`solvers.grouped_order_of`). Its first, greedy pass dead-ends on most words of a split shared by 8 rows (many
groups fit them), and until the seventy-second session each such word was searched one by one
(`solvers._order_by_search`, tens of milliseconds a word), the likely reason why an 8B preset's 16:32g8 decode ran
into its 420 s limit on an H100 with nothing printed (no log was kept). Each side reads back random masks of the
presets' kind (`engine.loading.random_bitmask`, split shared by 16 rows and by 8, one seed for each): "cover" as the
library does now (greedy, then `_orders_by_cover`, again with more pairs a number for the few words it leaves since
the seventy-third session, then the search for what is left), "search" with the cover left out (what it did before)
on fewer rows (--search-rows), so that it ends. Every split found is checked: each row
keeps two of every group of four. Then the cost of turning down a 16:32+2 and a plain 16:32 weight, which the engine
tries as 16:32g and 16:32g8 first (`grouped_split`): its quick look now, against the first 256 words read back
with the one-by-one search, as before.

    PYTHONPATH=src python benchmarks/grouped_readback_cpu.py --out benchmarks/results/grouped_readback_cpu.md
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from sparsedecoding import solvers
from sparsedecoding.engine.loading import random_bitmask
from sparsedecoding.runenv import environment_markdown, write_report


def tile_words(rows: int, columns: int, split_rows: int, seed: int) -> torch.Tensor:
    """A random grouped mask's words [rows / split_rows · columns / 32, split_rows, 32] (bool), as the kernel's
    tiling reads them."""
    words = random_bitmask(rows, columns, 16, 32, "cpu", torch.Generator().manual_seed(seed), placement="groups",
                           split_rows=split_rows)
    kept = ((words.unsqueeze(-1) >> torch.arange(32)) & 1).bool().view(rows, columns)
    return kept.view(rows // split_rows, split_rows, columns // 32, 32).transpose(1, 2).reshape(-1, split_rows, 32)


def read_back(kept: torch.Tensor, cover: bool) -> dict:
    """Seconds, words searched one by one and words solved, reading `kept`'s splits back (`cover` False: with
    `_orders_by_cover` finding nothing, as before it existed)."""
    searched = []
    search, covering = solvers._order_by_search, solvers._orders_by_cover
    solvers._order_by_search = lambda word: searched.append(1) or search(word)
    if not cover:
        solvers._orders_by_cover = lambda words, *_: (torch.zeros(len(words), 32, dtype=torch.int64),
                                                      torch.zeros(len(words), dtype=torch.bool))
    try:
        start = time.perf_counter()
        order, found = solvers.grouped_order_of(kept)
        seconds = time.perf_counter() - start
    finally:
        solvers._order_by_search, solvers._orders_by_cover = search, covering
    rows = kept.shape[1]
    grouped = kept[found].gather(2, order[found].unsqueeze(1).expand(-1, rows, -1)).view(-1, rows, 8, 4).sum(-1)
    if not bool((grouped == 2).all()):
        raise RuntimeError("a split read back does not keep two of every group in every row")
    return {"seconds": seconds, "searched": len(searched), "found": int(found.sum()), "words": len(kept)}


def turn_down(weight: torch.Tensor, split_rows: int, quick: bool) -> tuple[float, bool]:
    """Seconds `sp24.grouped_split` takes on `weight`, and whether it found a split: `quick` as the library does now
    (the first words looked at without the one-by-one search), else as before (the first words read back with it,
    every one of them to be solved)."""
    from sparsedecoding.kernels import sp24

    share, reader = sp24.QUICK_LOOK_SHARE, solvers.grouped_order_of
    if not quick:
        sp24.QUICK_LOOK_SHARE = 1.0
        solvers.grouped_order_of = lambda kept, search=True, **options: reader(kept, **options)
    try:
        start = time.perf_counter()
        order = sp24.grouped_split(weight, split_rows=split_rows)
        return time.perf_counter() - start, order is not None
    finally:
        sp24.QUICK_LOOK_SHARE, solvers.grouped_order_of = share, reader


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", type=int, default=4096, help="the mask's rows (default: %(default)s)")
    parser.add_argument("--columns", type=int, default=4096, help="its columns (default: %(default)s)")
    parser.add_argument("--search-rows", type=int, default=256,
                        help="rows of the masks the 'search' side reads, so that it ends (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads (default: %(default)s)")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    for name in ("rows", "search_rows"):
        if getattr(args, name) <= 0 or getattr(args, name) % 16:
            parser.error(f"--{name.replace('_', '-')} {getattr(args, name)}: a positive multiple of 16")
    if args.columns <= 0 or args.columns % 32:
        parser.error(f"--columns {args.columns}: a positive multiple of 32")
    if args.out and not args.out.parent.is_dir():
        parser.error(f"--out {args.out}: {args.out.parent} is not a folder")
    torch.set_num_threads(args.threads)
    lines = ["| split shared by | side | mask | words | searched one by one | solved | s | us a word |",
             "|---|---|---|---|---|---|---|---|"]
    for split_rows in (16, 8):
        for side, rows in (("cover", args.rows), ("search", args.search_rows)):
            result = read_back(tile_words(rows, args.columns, split_rows, seed=split_rows), cover=side == "cover")
            line = (f"| {split_rows} rows | {side} | {rows}x{args.columns} | {result['words']} | {result['searched']} "
                    f"| {result['found']} | {result['seconds']:.2f} | "
                    f"{1e6 * result['seconds'] / result['words']:.0f} |")
            print(line, flush=True)
            lines.append(line)
    lines += ["", "Turning down weights that are not grouped (the engine tries every 16:32 linear as 16:32g, then as "
              "16:32g8, before its overflow slots), one weight of --rows x --columns each:", "",
              "| mask | split shared by | quick look (now): s | first words with the search (as before, the cover "
              "now in front of it): s | found (now / before) |",
              "|---|---|---|---|---|"]
    for name, pattern in (("16:32+2", {"overflow": 2}), ("16:32", {})):
        words = random_bitmask(args.rows, args.columns, 16, 32, "cpu", torch.Generator().manual_seed(5), **pattern)
        weight = ((words.unsqueeze(-1) >> torch.arange(32)) & 1).view(args.rows, args.columns).to(torch.bfloat16)
        for split_rows in (16, 8):
            (now, found_now), (before, found_before) = (turn_down(weight, split_rows, quick) for quick in (True, False))
            line = (f"| {name} | {split_rows} rows | {now:.2f} | {before:.2f} | "
                    f"{'yes' if found_now else 'no'} / {'yes' if found_before else 'no'} |")
            print(line, flush=True)
            lines.append(line)
    command = "python benchmarks/grouped_readback_cpu.py " + " ".join(sys.argv[1:])
    text = "\n".join(["# Reading 16:32g / 16:32g8 splits back off masks (CPU)", "",
                      environment_markdown(command, torch.device("cpu")), "", __doc__.split("\n\n")[1], "",
                      *lines, ""])
    if args.out:
        write_report(args.out, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
