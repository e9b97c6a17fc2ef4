"""Time the solver pass for a model's linear shapes with random weights and Hessians (values do not change the
solver's work): SparseGPT with and without the CUDA-graph block loop, and ADMM (`--solvers sparsegpt,admm`), whose
time is its eigendecomposition and its iterations' products, no column loop.

    python benchmarks/solver_bench.py --layers 28 --out benchmarks/results/solver.md
    python benchmarks/solver_bench.py --model llama-3.1-8b --layers 1 --solvers sparsegpt,admm --patterns 2:4
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
    parser.add_argument("--solvers", default="sparsegpt", help="comma-separated: sparsegpt, admm")
    parser.add_argument("--admm-iterations", type=int, default=100)
    parser.add_argument("--admm-products", default="float32",
                        help="comma-separated: float32, tf32 (each a row of its own)")
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    names = args.solvers.split(",")
    if not names or any(name not in ("sparsegpt", "admm") for name in names):
        parser.error(f"--solvers {args.solvers!r}: a comma-separated list of sparsegpt and admm")
    products = args.admm_products.split(",")
    if any(value not in solvers.ADMM_PRODUCTS for value in products):
        parser.error(f"--admm-products {args.admm_products!r}: a comma-separated list of float32 and tf32")
    device = torch.device("cuda")
    layers = args.layers or SHAPES[args.model][4]
    problems = layer_problems(args.model, device)
    rows = []
    # (solver, the block loop's graph for SparseGPT / ADMM's products)
    runs = [(name, option) for name in names for option in ((True, False) if name == "sparsegpt" else products)]
    for pattern in args.patterns.split(","):
        for name, option in runs:
            def solve(weights, hessian):
                if name == "admm":
                    return solvers.admm_shared(weights, hessian, pattern, iterations=args.admm_iterations,
                                               products=option)
                return solvers.sparsegpt_shared(weights, hessian, pattern, cuda_graph=option)

            solve(*problems[0])  # warm-up (and capture)
            torch.cuda.synchronize()
            started = time.perf_counter()
            for _ in range(layers):
                for weights, hessian in problems:
                    solve(weights, hessian)
            torch.cuda.synchronize()
            seconds = time.perf_counter() - started
            loop = "-" if name == "admm" else "graph" if option else "eager"
            label = f"admm ({args.admm_iterations} iterations, {option})" if name == "admm" else name
            whole = seconds / layers * SHAPES[args.model][4]
            rows.append(f"| {pattern} | {label} | {loop} | {layers} | {seconds:.2f} | {seconds / layers:.2f} | "
                        f"{whole:.0f} |")
            print(rows[-1], flush=True)
    write_report(f"Solver time, {args.model} shapes, random weights",
                 ["", f"- the whole model's solver time: per layer x {SHAPES[args.model][4]} layers (calibration, "
                  f"Hessians and loading not included)"],
                 ["| pattern | solver | block loop | layers | seconds | s / layer | whole model (s) |",
                  "|---|---|---|---|---|---|---|", *rows], args.out)


def write_report(title: str, notes: list[str], table: list[str], out: str | None) -> None:
    """A GPU report: the title, date, GPU, torch and command, `notes` (lines), then `table`; printed, and written to
    `out` if given."""
    report = "\n".join([
        f"# {title}",
        "",
        f"- date: {datetime.date.today()}, GPU: {torch.cuda.get_device_name()}, torch {torch.version.__version__}",
        f"- command: `python {' '.join(sys.argv)}`",
        *notes,
        "",
        *table, ""])
    print(report)
    if out:
        with open(out, "w") as handle:
            handle.write(report)

if __name__ == "__main__":
    main()
