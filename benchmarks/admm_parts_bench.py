"""Where ADMM's solver time goes (`solvers.admm_prune`) on the largest Llama-3.1-8B problems, random weights and
Hessians: the eigendecomposition of H + λI, one iteration's two products with its eigenvectors (float32, and with
TF32 allowed for comparison), the pattern's projection (`solvers.projection`) and the elementwise rest, each timed
alone.

    python benchmarks/admm_parts_bench.py --out benchmarks/results/admm_parts_h100.md
"""

from __future__ import annotations

import argparse
import time

import torch

from sparsedecoding import solvers
from sparsedecoding.patterns import SparsityPattern
from solver_bench import write_report  # benchmarks/ is on sys.path when this script runs

PROBLEMS = {  # name: (rows, columns): gate and up stacked; down_proj
    "8B gate_up": (2 * 14336, 4096),
    "8B down": (4096, 14336),
    "8B qkv": (6144, 4096),
}


def timed(function, repeats: int) -> float:
    """Milliseconds a call, after one warm-up call."""
    function()
    torch.cuda.synchronize()
    started = time.perf_counter()
    for _ in range(repeats):
        function()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) / repeats * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    rows = []
    for name, (out_features, in_features) in PROBLEMS.items():
        X = torch.randn(2 * in_features, in_features, device=device) * torch.rand(in_features, device=device).add(0.1)
        A = X.T @ X / X.shape[0]
        A.diagonal().add_(0.01 * float(A.diagonal().mean()))
        del X
        W = torch.randn(out_features, in_features, device=device)
        eigh_ms = timed(lambda: torch.linalg.eigh(A), 1)
        _, Q = torch.linalg.eigh(A)
        scale = torch.rand(in_features, device=device).add(1)

        def products() -> torch.Tensor:
            return (W @ Q).div_(scale) @ Q.T

        torch.backends.cuda.matmul.allow_tf32 = False
        fp32_ms = timed(products, args.repeats)
        torch.backends.cuda.matmul.allow_tf32 = True
        tf32_ms = timed(products, args.repeats)
        torch.backends.cuda.matmul.allow_tf32 = False
        masks = {text: timed(lambda: solvers.projection(W.abs(), SparsityPattern.parse(text)), args.repeats)
                 for text in ("2:4", "16:32")}
        V = torch.zeros_like(W)

        def rest() -> None:  # the iteration's elementwise work beside the products and the projection
            G = W + 0.5 * (W - V)
            D = W * (G > 0)
            V.copy_(W - D)

        rest_ms = timed(rest, args.repeats)
        per_iteration = {text: fp32_ms + ms + rest_ms for text, ms in masks.items()}
        rows.append(f"| {name} | {out_features}x{in_features} | {eigh_ms:.0f} | {fp32_ms:.1f} | {tf32_ms:.1f} | "
                    f"{masks['2:4']:.1f} | {masks['16:32']:.1f} | {rest_ms:.1f} | "
                    f"{(eigh_ms + 100 * per_iteration['2:4']) / 1e3:.2f} | "
                    f"{(eigh_ms + 100 * per_iteration['16:32']) / 1e3:.2f} |")
        print(rows[-1], flush=True)
        torch.cuda.empty_cache()
    write_report("ADMM's solver time by part, Llama-3.1-8B's largest problems, random weights",
                 ["- ms a call; products: both products of one iteration with the eigenvectors (float32 as the solver "
                  "runs them, and TF32 allowed for comparison); projection: `solvers.projection` (ADMM's) on the "
                  "magnitudes; rest: the elementwise updates; 100 iterations (s): eigh + 100 x (float32 products + "
                  "projection + rest)"],
                 ["| problem | rows x columns | eigh (ms) | products fp32 | products tf32 | projection 2:4 | "
                  "projection 16:32 | rest | 100 iterations 2:4 (s) | 100 iterations 16:32 (s) |",
                  "|---|---|---|---|---|---|---|---|---|---|", *rows], args.out)

if __name__ == "__main__":
    main()
