"""What the 16:32g mask costs in quality, by the solver's own loss on Qwen2.5-Coder-1.5B's linears (CPU, no GPU).

16:32g keeps 16 of every 32 columns of a row, as 16:32 does, with one more rule: the 16 rows of each mma.sp tile share
a split of every 32-column word into eight groups of four (any columns), and each row keeps two of every group
(`solvers.grouped_keep_mask`; the sparse tensor-core kernel runs it as 2:4 in that order, `kernels.sp24.tile_grouped`).
Between 2:4 (fixed groups) and 16:32 (no groups), where does it fall, and against 16:32+2, the constrained 16:32 the
2:4 kernel runs today? Each linear of --layers is pruned by `solvers.sparsegpt` (its defaults) under 2:4, 16:32g,
16:32+2 and 16:32, on the decode-calibrated Hessians that `int4_rounding_linears_cpu.py --cache` saved (the
committed calibration set's decode positions), and scored by tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ) on the fitted Hessian and on
two no solve saw (later decode positions, Lee text). Rows: --blocks blocks of 128 contiguous rows of each linear at
fixed random offsets (a tile's rows are contiguous in the kernel). Position: log(P / 2:4) / log(16:32+2 / 2:4) on
the fitted loss, 0 = as bad as 2:4, 1 = as good as 16:32+2. A layer-loss proxy: no pass@1 is measured here.

    PYTHONPATH=src python benchmarks/grouped_quality_cpu.py --cache /tmp/sd/linears_cache.safetensors \\
        --out benchmarks/results/grouped_quality_cpu.md
    PYTHONPATH=src python benchmarks/grouped_quality_cpu.py --cache /tmp/sd/linears_cache.safetensors \\
        --solver admm --out benchmarks/results/grouped_quality_admm_cpu.md

`--split-rows 8 4` adds 16:32g with each word's split shared by 8 or 4 rows (`solvers.GROUPED_SPLIT_ROWS`): what
a kernel giving each half or quarter of an mma.sp tile its own split would keep. `--solver admm` prunes by
`solvers.admm` instead, and adds 16:32g with its split searched on |x| (the projection
`plan-grouped.json`'s q16g was pruned with) beside x² (`solvers.admm(split=)`, `prune --admm-split`).
`--solver admm --restarts R` replaces the |x| row by two that ask whether a better split search helps ADMM: the
first projection's split also searched from R random splits (the best kept word by word;
`grouped_split_limits_cpu.best_split`), and with `--every` every projection's so; `--linears` prunes only those of
each layer.
"""

from __future__ import annotations

import math
import sys
import time

import torch

from grouped_split_limits_cpu import best_split, words  # on sys.path
from int4_rounding_linears_cpu import WEIGHTS, module, parsed_arguments, sampled_problems
from permute_order_bench import save_report
from sparsedecoding import solvers
from sparsedecoding.models import load_model
from sparsedecoding.pipeline import relative_error

PATTERNS = ("2:4", "16:32g", "16:32+2", "16:32")
# with --solver admm also 16:32g with the split searched on |x| (admm's split "magnitude", the sixty-ninth
# session's projection) beside x² (the default); SparseGPT's split scores are its own saliencies, w² / [H⁻¹]²_qq
MAGNITUDE = "16:32g|x|"  # a key of the printed rows; `shown` writes it without pipes in the report's tables
# with --restarts R (admm): 16:32g with the first projection's split searched from the 2:4 groups and from R random
# splits, the best kept word by word (later ones start from the last, as always), and with every projection's so
RESTART_FIRST, RESTART_EVERY = "16:32g restarts first", "16:32g restarts every"


class Restarts:
    """While open, ADMM's 16:32g projections (`solvers.grouped_mask_and_split`) also search from `restarts` random
    splits, the best kept word by word: the first projection only (`every` False) or every one."""

    def __init__(self, restarts: int, every: bool, seed: int):
        self.restarts, self.every, self.generator = restarts, every, torch.Generator().manual_seed(seed)
        self.original = solvers.grouped_mask_and_split

    def split(self, score, pattern, start=None):
        if start is None or self.every:
            start = best_split(words(score.float(), solvers.split_rows_of(pattern)), self.restarts, self.generator,
                               start)
        return self.original(score, pattern, start)  # from a split no swap improves: the same split, its mask

    def __enter__(self):
        solvers.grouped_mask_and_split = self.split

    def __exit__(self, *_):
        solvers.grouped_mask_and_split = self.original


def shown(pattern: str) -> str:
    return pattern.replace("|x|", " abs(x)")
SCORED = ("fitted", "decode", "lee")  # the cache's held-out kinds used here, after the fitted one
ROW_BLOCK = 128


def rows_of(weight: torch.Tensor, blocks: int, seed: int) -> torch.Tensor:
    """`blocks` blocks of ROW_BLOCK contiguous rows at fixed random block offsets (all rows if it has fewer)."""
    count = weight.shape[0] // ROW_BLOCK
    picked = torch.randperm(count, generator=torch.Generator().manual_seed(seed))[:blocks].sort().values
    return torch.cat([weight[ROW_BLOCK * int(b):ROW_BLOCK * (int(b) + 1)] for b in picked]).float().contiguous()


def position(loss: float, low: float, high: float) -> float:
    return math.log(loss / low) / math.log(high / low)


def main() -> None:
    def extra(parser) -> None:
        parser.add_argument("--blocks", type=int, default=2, choices=range(1, 13),
                            help="blocks of 128 contiguous rows a linear (default 2)")
        parser.add_argument("--solver", choices=("sparsegpt", "admm"), default="sparsegpt",
                            help="sparsegpt (its defaults) or admm (100 iterations; 16:32g also with the split "
                                 "searched on |x|, the earlier projection)")
        parser.add_argument("--split-rows", type=int, nargs="+", choices=(4, 8), default=[],
                            help="also 16:32g with each word's split shared by this many rows instead of the "
                                 "tile's 16 (patterns 16:32g/8, 16:32g/4; a mask the kernel does not run)")
        parser.add_argument("--restarts", type=int, default=0, choices=range(0, 65), metavar="R",
                            help="with --solver admm: instead of the |x| split, 16:32g with the first projection's "
                                 "split also searched from R random splits, and with every projection's (default 0)")
        parser.add_argument("--every", action="store_true",
                            help="with --restarts: also every projection's split restarted (on one 256 x 1536 "
                                 "block its prune took 417 s against 9 s for the plain 16:32g)")
        parser.add_argument("--linears", nargs="+", choices=tuple(WEIGHTS), default=list(WEIGHTS),
                            help="the linears of each layer to prune (default: all seven)")
    args = parsed_arguments(__doc__.split("\n\n")[0], cache_required=True, extra=extra)
    if (args.restarts and args.solver != "admm") or (args.every and not args.restarts):
        print("error: --restarts is for --solver admm, and --every needs --restarts", file=sys.stderr)
        sys.exit(2)
    grouped = ((RESTART_FIRST, RESTART_EVERY) if args.every else (RESTART_FIRST,)) if args.restarts else (MAGNITUDE,)
    patterns = PATTERNS if args.solver == "sparsegpt" else ("2:4", "16:32g", *grouped, "16:32+2", "16:32")
    patterns += tuple(f"16:32g/{rows}" for rows in args.split_rows)
    began = time.perf_counter()
    problems, source = sampled_problems(args)
    model, _, _ = load_model("qwen2.5-coder-1.5b", "cpu", torch.float32)
    results = []
    for number, ((layer, linear), (_, H, decode, _first, _prompt, lee)) in enumerate(problems.items()):
        if linear not in args.linears:
            continue
        W = rows_of(module(model, layer, WEIGHTS[linear]).weight.detach(), args.blocks, 100 * layer + number)
        row = {"layer": layer, "linear": linear, "rows": W.shape[0], "columns": W.shape[1]}
        for pattern in patterns:
            started = time.perf_counter()
            if "/" in pattern:  # 16:32g/R: the split shared by R rows
                solvers.GROUPED_SPLIT_ROWS = int(pattern.split("/")[1])
                try:
                    pruned = (solvers.sparsegpt if args.solver == "sparsegpt" else solvers.admm)(W, H, "16:32g")
                finally:
                    solvers.GROUPED_SPLIT_ROWS = solvers.PLACED_TILE_ROWS
            elif args.solver == "sparsegpt":
                pruned = solvers.sparsegpt(W, H, pattern)
            elif pattern in (RESTART_FIRST, RESTART_EVERY):
                with Restarts(args.restarts, pattern == RESTART_EVERY, 100 * layer + number):
                    pruned = solvers.admm(W, H, "16:32g")
            else:
                pruned = solvers.admm(W, H, "16:32g" if pattern == MAGNITUDE else pattern,
                                      split="magnitude" if pattern == MAGNITUDE else "squared")
            for kind, hessian in zip(SCORED, (H, decode, lee)):
                row[f"{pattern} {kind}"] = relative_error(W, pruned, hessian)
            row[f"{pattern} seconds"] = time.perf_counter() - started
        for pattern in patterns[1:]:
            row[f"{pattern} position"] = position(row[f"{pattern} fitted"], row["2:4 fitted"], row["16:32+2 fitted"])
        results.append(row)
        print({k: (round(v, 5) if isinstance(v, float) else v) for k, v in row.items()}, flush=True)
    del model
    lines = ["| layer | linear | rows x columns | " + " | ".join(f"{shown(p)} fitted / decode / lee" for p in patterns)
             + " | position 16:32g | position 16:32 | 16:32g s |", "|---|---|---|" + "---|" * (len(patterns) + 3)]
    for r in results:
        lines.append(f"| {r['layer']} | {r['linear']} | {r['rows']} x {r['columns']} | "
                     + " | ".join(" / ".join(f"{r[f'{p} {k}']:.4g}" for k in SCORED) for p in patterns)
                     + f" | {r['16:32g position']:.2f} | {r['16:32 position']:.2f} | {r['16:32g seconds']:.0f} |")

    def mean(key: str) -> float:
        return sum(r[key] for r in results) / len(results)

    def ratio(pattern: str, kind: str) -> float:  # geometric mean of the loss against 16:32+2's
        return math.exp(sum(math.log(r[f"{pattern} {kind}"] / r[f"16:32+2 {kind}"]) for r in results) / len(results))

    summary = ["| pattern | mean position (fitted) | " + " | ".join(f"{k}: geomean / 16:32+2" for k in SCORED) + " |",
               "|---|---|" + "---|" * len(SCORED)]
    for pattern in patterns:
        where = "0 (by definition)" if pattern == "2:4" else "1 (by definition)" if pattern == "16:32+2" \
            else f"{mean(f'{pattern} position'):.2f}"
        summary.append(f"| {shown(pattern)} | {where} | "
                       + " | ".join(f"{ratio(pattern, k):.3f}" for k in SCORED) + " |")
    how = ("`solvers.sparsegpt` (1% damping, blocks of 128 columns, mask from the updated weights as the loop "
           "reaches each group)") if args.solver == "sparsegpt" else (
           "`solvers.admm` (100 iterations, 1% damping, float32 products; 16:32g's split searched on x², the "
           + (f"Euclidean projection; `{RESTART_FIRST}`: the first projection's split also searched from "
              f"{args.restarts} random splits, the best kept word by word, later ones from the last as always"
              + (f"; `{RESTART_EVERY}`: every projection's so)" if args.every else ")") if args.restarts else
              f"Euclidean projection, and as `{MAGNITUDE}` on |x|, the earlier projection)"))
    body = (f"{source}. {args.blocks} blocks of {ROW_BLOCK} contiguous rows of each linear (all rows where it has "
            f"fewer), pruned in float32 by {how} under each pattern. Loss: tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ) on "
            "the fitted Hessian and on later decode positions and Lee text (held out). Position: where the fitted "
            "loss falls between 2:4 (0) and 16:32+2 (1) on a log scale. A layer-loss proxy: no pass@1 was measured."
            "\n\n" + "\n".join(summary) + "\n\nEach linear (losses fitted / decode / lee):\n\n" + "\n".join(lines)
            + f"\n\nWhole run: {time.perf_counter() - began:.0f} s\n")
    save_report(args.out, "benchmarks/grouped_quality_cpu.py", results,
                "The 16:32g mask against 2:4, 16:32+2 and 16:32: "
                f"{'SparseGPT' if args.solver == 'sparsegpt' else 'ADMM'}'s layer loss on Qwen's linears (CPU)",
                torch.device("cpu"), body)


if __name__ == "__main__":
    main()
