"""Time the SparseGPT solver pass for a model's linear shapes with random weights and Hessians (values do not change
the solver's work), with and without the CUDA-graph block loop.

    python benchmarks/solver_bench.py --layers 28 --out benchmarks/results/solver.md
"""

from __future__ import annotations

import argparse
import datetime
import sys
import time

import torch

from sparsedecoding import solvers

SHAPES = {  # (hidden, intermediate, q rows, kv rows, layers)
    "qwen2.5-coder-1.5b": (1536, 8960, 1536, 256, 28),
    "llama-3.1-8b": (4096, 14336, 4096, 1024, 32),
}


def random_hessian(dim: int, device) -> torch.Tensor:
    X = torch.randn(4 * dim, dim, device=device) * torch.rand(dim, device=device).add(0.1)
    return 2 * X.T @ X / X.shape[0]


def layer_problems(name: str, device):
    hidden, intermediate, q_rows, kv_rows, _ = SHAPES[name]
    H_hidden, H_inter = random_hessian(hidden, device), random_hessian(intermediate, device)

    def w(rows, cols):
        return torch.randn(rows, cols, device=device, dtype=torch.bfloat16)

    return [([w(q_rows, hidden), w(kv_rows, hidden), w(kv_rows, hidden)], H_hidden), ([w(hidden, hidden)], H_hidden),
            ([w(intermediate, hidden), w(intermediate, hidden)], H_hidden), ([w(hidden, intermediate)], H_inter)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", choices=sorted(SHAPES))
    parser.add_argument("--layers", type=int, default=None, help="layers to solve (default: all of the model)")
    parser.add_argument("--patterns", default="2:4,50%")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    device = torch.device("cuda")
    layers = args.layers or SHAPES[args.model][4]
    problems = layer_problems(args.model, device)
    rows = []
    for pattern in args.patterns.split(","):
        for graph in (True, False):
            solvers.sparsegpt_shared(*problems[0], pattern, cuda_graph=graph)  # warm-up (and capture)
            torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(layers):
                for weights, hessian in problems:
                    solvers.sparsegpt_shared(weights, hessian, pattern, cuda_graph=graph)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - started
            rows.append(f"| {pattern} | {'graph' if graph else 'eager'} | {layers} | {seconds:.2f} |")
            print(rows[-1], flush=True)
    report = "\n".join([
        f"# SparseGPT solver time, {args.model} shapes, random weights",
        "",
        f"- date: {datetime.date.today()}, GPU: {torch.cuda.get_device_name()}, torch {torch.version.__version__}",
        f"- command: `python {' '.join(sys.argv)}`",
        "",
        "| pattern | block loop | layers | seconds |",
        "|---|---|---|---|",
        *rows, ""])
    print(report)
    if args.out:
        with open(args.out, "w") as handle:
            handle.write(report)


if __name__ == "__main__":
    main()
