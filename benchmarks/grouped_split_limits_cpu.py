"""How much of 16:32g's gap to 16:32 is its split search's, and how much the shared split's? (CPU, Qwen's weights)

16:32g keeps two of every group of four columns in a split of each 32-column word that the 16 rows of a kernel tile
share (`solvers.grouped_partition`: local search, best swap first, from the plain 2:4 groups). Held out it solved 62 of
164 problem-wordings against 16:32+2's 76 (`quality-grouped-qwen2.5-coder-1.5b/NOTES.md`). Two cheap changes could
narrow that without a new kernel: a better split (the search restarted from random splits, the best kept word by
word) and rows that agree sharing a tile (rows reordered so that each tile holds rows whose 16:32 masks are alike, as
a kernel writing its outputs through an index would allow). This script measures what each could gain before any
solver or GPU is spent on it.

Score of a weight: W_ij² · Σx_j², the diagonal of the layer loss (what ADMM's "squared" split searches on), with
Σx_j² over the first --tokens decode positions of the committed calibration set, teacher-forced. For each linear of
--layers, one block of --rows contiguous rows at a fixed random offset; reported is the share of the block's score a
mask prunes under 2:4, 16:32g (as the solvers search it), 16:32g with --restarts random starting splits beside it,
16:32g on rows regrouped (greedy: a tile takes the first row left and the 15 left whose 16:32 masks agree with it
most), 16:32g8 (a split for every 8 rows), 16:32+2 and 16:32, and where each falls between 2:4 (0) and 16:32 (1)
on a log scale. A mask proxy: no weights are refitted and no pass@1 is measured.

    PYTHONPATH=src python benchmarks/grouped_split_limits_cpu.py --out benchmarks/results/grouped_split_limits_cpu.md
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

import torch

from int4_rounding_linears_cpu import INPUTS, LINEARS, WEIGHTS, calibration_sequences, fitted_sequences, module
from permute_order_bench import save_report  # benchmarks/ is on sys.path when this script runs
from permute_search_qwen_cpu import CALIBRATION
from sparsedecoding import solvers
from sparsedecoding.calibration import CalibrationSet
from sparsedecoding.models import load_model
from sparsedecoding.patterns import SparsityPattern

TILE = 16
MASKS = ("2:4", "16:32g", "16:32g restarts", "16:32g rows regrouped", "16:32g8", "16:32+2", "16:32")


@torch.no_grad()
def input_energies(model, sequences: list, layers: list[int]) -> dict:
    """Σx_j² over each sequence's decode positions at each input of `INPUTS` of `layers`, keyed (layer, input)."""
    sums, hooks, current = {}, [], {}
    for layer in layers:
        for name in INPUTS:
            def hook(_module, args, key=(layer, name)):
                x = args[0][0][current["keep"]].double()
                sums[key] = sums.get(key, 0) + x.square().sum(0)
            hooks.append(module(model, layer, name).register_forward_pre_hook(hook))
    try:
        for ids, kinds in sequences:
            current["keep"] = kinds["decode"]
            model(ids.unsqueeze(0))
    finally:
        for handle in hooks:
            handle.remove()
    return {key: value.float() for key, value in sums.items()}


def words(score: torch.Tensor, rows: int) -> torch.Tensor:
    """[R, C] -> [R / rows · C / 32, rows, 32]: each `rows`-row tile's 32-column words, tile by tile."""
    R, C = score.shape
    return score.reshape(R // rows, rows, C // 32, 32).transpose(1, 2).reshape(-1, rows, 32)


def best_split(tiles: torch.Tensor, restarts: int, generator: torch.Generator,
               start: torch.Tensor | None = None) -> torch.Tensor:
    """`solvers.grouped_partition` of `tiles` [W, rows, 32] from `start` (the 2:4 groups if None) and from
    `restarts` random splits, the best fit kept word by word -> order [W, 32]."""
    best = solvers.grouped_partition(tiles, start=start)
    fit = solvers.grouped_fit(tiles, best)
    for _ in range(restarts):
        order = solvers.grouped_partition(tiles, start=torch.rand(tiles.shape[0], 32, generator=generator).argsort(1)
                                          .to(tiles.device))
        better = solvers.grouped_fit(tiles, order) > fit
        best[better], fit = order[better], torch.maximum(fit, solvers.grouped_fit(tiles, order))
    return best


def grouped_pruned(score: torch.Tensor, rows: int = TILE, restarts: int = 0, seed: int = 0) -> float:
    """The score a 16:32g mask prunes when `rows` rows share each split: the search from the 2:4 groups and, with
    `restarts`, from that many random splits too, the best fit kept word by word."""
    tiles = words(score, rows)
    order = best_split(tiles, restarts, torch.Generator().manual_seed(seed))
    return float(score.sum() - solvers.grouped_fit(tiles, order).sum())


def regrouped(score: torch.Tensor) -> torch.Tensor:
    """The rows of `score` reordered so that each tile of 16 holds rows whose 16:32 masks agree: the first row left
    and the 15 others left whose masks share the most kept positions with it."""
    kept = solvers.keep_mask(score, SparsityPattern.parse("16:32")).float()
    agree = kept @ kept.T
    left = torch.ones(score.shape[0], dtype=torch.bool)
    order = []
    while bool(left.any()):
        seed = int(left.nonzero()[0])
        pick = agree[seed].masked_fill(~left, -1).topk(TILE).indices
        left[pick] = False
        order.append(pick)
    return score[torch.cat(order)]


def pruned_shares(score: torch.Tensor, restarts: int) -> dict[str, float]:
    total = float(score.sum())
    pruned = {name: float((score * ~solvers.keep_mask(score, SparsityPattern.parse(name))).sum())
              for name in ("2:4", "16:32+2", "16:32", "16:32g8")}
    pruned["16:32g"] = grouped_pruned(score)
    pruned["16:32g restarts"] = grouped_pruned(score, restarts=restarts)
    pruned["16:32g rows regrouped"] = grouped_pruned(regrouped(score))
    return {name: pruned[name] / total for name in MASKS}


def position(value: float, low: float, high: float) -> float:
    return math.log(value / low) / math.log(high / low)


def report(results: list[dict], restarts: int, source: str, seconds: float) -> str:
    lines = [f"Scores W_ij² · Σx_j² with Σx_j² from {source}. Each cell: the share of the block's score the mask "
             f"prunes (lower is better). Position: log(mask / 2:4) / log(16:32 / 2:4), 2:4 = 0, 16:32 = 1. "
             f"Restarts: the search from the 2:4 groups and from {restarts} random splits, the best kept word by "
             f"word. Rows regrouped: a mask the kernels do not run (outputs would have to be written through an "
             f"index). A mask proxy: no weights refitted, no pass@1.", "",
             "| mask | geomean share pruned | geomean / 16:32g | mean position |", "|---|---|---|---|"]
    geomean = {name: math.exp(sum(math.log(r[name]) for r in results) / len(results)) for name in MASKS}
    for name in MASKS:
        where = sum(position(r[name], r["2:4"], r["16:32"]) for r in results) / len(results)
        lines.append(f"| {name} | {geomean[name]:.4f} | {geomean[name] / geomean['16:32g']:.3f} | {where:.3f} |")
    lines += ["", "Each linear:", "", "| layer | linear | rows x columns | " + " | ".join(MASKS) + " | seconds |",
              "|---|---|---|" + "---|" * (len(MASKS) + 1)]
    for r in results:
        lines.append(f"| {r['layer']} | {r['linear']} | {r['rows']} x {r['columns']} | "
                     + " | ".join(f"{r[name]:.4f}" for name in MASKS) + f" | {r['seconds']:.1f} |")
    return "\n".join(lines) + f"\n\nWhole run: {seconds:.0f} s\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, nargs="+", default=[1, 3, 14, 27])
    parser.add_argument("--tokens", type=int, default=2048, help="decode positions whose Σx² weigh the scores")
    parser.add_argument("--rows", type=int, default=512, help="contiguous rows a linear (a multiple of 16)")
    parser.add_argument("--restarts", type=int, default=8, help="random starting splits beside the 2:4 groups")
    args = parser.parse_args()
    if args.rows < TILE or args.rows % TILE or args.tokens < 1 or args.restarts < 0:
        parser.error("--rows must be a positive multiple of 16, --tokens positive, --restarts at least 0")
    if any(not 0 <= layer < 28 for layer in args.layers):
        parser.error("--layers must lie in 0-27 (Qwen2.5-Coder-1.5B's 28 layers)")
    began = time.perf_counter()
    model, _, _ = load_model("qwen2.5-coder-1.5b", "cpu", torch.float32)
    model.eval()
    calibration = CalibrationSet.load(Path(CALIBRATION))
    fitted = fitted_sequences(calibration, args.tokens)
    energies = input_energies(model, calibration_sequences(calibration, 0, fitted, False), args.layers)
    source = (f"the {int(calibration.keep[:fitted].sum())} decode positions of the first {fitted} sequences of "
              f"`{CALIBRATION}`, teacher-forced ({time.perf_counter() - began:.0f} s with the model's load)")
    results = []
    for layer in args.layers:
        for number, (linear, name) in enumerate(WEIGHTS.items()):
            W = module(model, layer, name).weight.detach().float()
            blocks = W.shape[0] // args.rows
            start = args.rows * int(torch.randint(max(blocks, 1), (1,),
                                                  generator=torch.Generator().manual_seed(100 * layer + number)))
            W = W[start:start + args.rows]
            score = W.square() * energies[layer, LINEARS[linear]]
            clock = time.perf_counter()
            row = {"layer": layer, "linear": linear, "rows": W.shape[0], "columns": W.shape[1]}
            row.update(pruned_shares(score, args.restarts), seconds=time.perf_counter() - clock)
            print(row, flush=True)
            results.append(row)
    body = report(results, args.restarts, source, time.perf_counter() - began)
    save_report(args.out, "benchmarks/grouped_split_limits_cpu.py", results,
                "16:32g's gap to 16:32: the split search's or the shared split's? (Qwen's weights, CPU)",
                torch.device("cpu"), body)


if __name__ == "__main__":
    main()
