"""ADMM at 16:32g with its split search in torch against the one-kernel search (SPARSEDECODING_GROUPED_SEARCH), side by
side on Qwen2.5-Coder-1.5B's linear shapes, on a GPU.

plan-grouped.json's q16g (ADMM 16:32g, 100 iterations) took 396 s to prune on an H100 against 195 s for the same ADMM
at 16:32+2 (quality-grouped-qwen2.5-coder-1.5b/NOTES.md): the difference is the split search each projection runs.
For each shape this times `solvers.admm_prune` (100 iterations, the |x| split q16g used, float32 products) under both
searches on the same synthetic layer (W ~ N(0, 0.02²); H from 4096 inputs with log-normal column scales, the
outlier-heavy shape of decode activations), once each after a warm-up, and reports the seconds, the share of mask
entries that agree and each mask's layer loss (W − D)·(H + λI)·(W − D)ᵀ. The model row weights each shape by its
count in one of the 28 layers (q, o; k, v; gate, up; down). The searches do the same swaps on the same sums except
for the order of the sums over rows and groups, so the masks may part where two swaps' gains are within rounding.

    PYTHONPATH=src python benchmarks/grouped_search_bench.py --out benchmarks/results/grouped_search_h100.md
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import torch

from permute_order_bench import save_report  # benchmarks/ is on sys.path when this script runs
from sparsedecoding import solvers
from sparsedecoding.patterns import SparsityPattern

# (name, rows, columns, count in a layer) of Qwen2.5-Coder-1.5B (hidden 1536, 2 KV heads of 128, MLP 8960)
SHAPES = [("q / o", 1536, 1536, 2), ("k / v", 256, 1536, 2), ("gate / up", 8960, 1536, 2), ("down", 1536, 8960, 1)]
LAYERS = 28
SEARCHES = ("torch", "triton")


def layer(rows: int, columns: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    W = torch.randn(rows, columns, generator=generator) * 0.02
    X = torch.randn(4096, columns, generator=generator) * torch.randn(columns, generator=generator).exp()
    return W.cuda(), (X.T @ X / X.shape[0]).cuda()


def loss(W: torch.Tensor, D: torch.Tensor, H: torch.Tensor, damping: float) -> float:
    E = (W - D).double()
    return float(((E @ H.double()) * E).sum() + damping * (E * E).sum())


def timed_admm(W, H, damping, pattern, iterations, search):
    os.environ[solvers.GROUPED_SEARCH_SETTING] = search
    torch.cuda.synchronize()
    started = time.perf_counter()
    D, kept, _ = solvers.admm_prune(W, H, damping, pattern, iterations, split="magnitude")
    torch.cuda.synchronize()
    return time.perf_counter() - started, D, kept


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--iterations", type=int, default=100, help="ADMM iterations (default: %(default)s, q16g's)")
    parser.add_argument("--out", type=Path, required=True, help="the markdown report (a .json twin beside it)")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: grouped_search_bench.py times GPU searches and needs a CUDA GPU", file=sys.stderr)
        return 2
    solvers.check_admm_iterations(args.iterations)
    pattern = SparsityPattern.parse("16:32g")
    rows_out = []
    warm_W, warm_H = layer(256, 1536, seed=99)
    for search in SEARCHES:  # compile the kernel and warm both paths before any timing
        timed_admm(warm_W, warm_H, 0.01, pattern, 3, search)
    for index, (name, rows, columns, count) in enumerate(SHAPES):
        W, H = layer(rows, columns, seed=index)
        damping = 0.01 * float(H.diagonal().mean())
        result = {"linear": name, "rows": rows, "columns": columns, "per_layer": count}
        masks = {}
        for search in SEARCHES:
            seconds, D, kept = timed_admm(W, H, damping, pattern, args.iterations, search)
            result[f"seconds_{search}"] = round(seconds, 3)
            result[f"loss_{search}"] = loss(W, D, H, damping)
            masks[search] = kept
        result["mask_agreement"] = float((masks["torch"] == masks["triton"]).float().mean())
        rows_out.append(result)
        print(result, flush=True)
    model = {search: LAYERS * sum(r["per_layer"] * r[f"seconds_{search}"] for r in rows_out) for search in SEARCHES}
    lines = ["| linear | rows x columns | a layer | torch search, s | one kernel, s | x faster | mask entries agreeing "
             "| layer loss, kernel / torch |", "|---|---|---|---|---|---|---|---|"]
    for r in rows_out:
        lines.append(f"| {r['linear']} | {r['rows']} x {r['columns']} | {r['per_layer']} | {r['seconds_torch']:.3f} | "
                     f"{r['seconds_triton']:.3f} | {r['seconds_torch'] / r['seconds_triton']:.2f} | "
                     f"{r['mask_agreement']:.5f} | {r['loss_triton'] / r['loss_torch']:.5f} |")
    lines.append(f"| **the model's 28 layers (ADMM only)** | | | {model['torch']:.1f} | {model['triton']:.1f} | "
                 f"{model['torch'] / model['triton']:.2f} | | |")
    body = (f"ADMM {args.iterations} iterations at 16:32g, |x| split, float32 products; one run each after a warm-up."
            "\n\n" + "\n".join(lines) + "\n")
    save_report(args.out, "benchmarks/grouped_search_bench.py", rows_out,
                "ADMM 16:32g: the split search in torch against one kernel", torch.device("cuda"), body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
