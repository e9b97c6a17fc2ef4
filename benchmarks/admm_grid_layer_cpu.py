"""Can ADMM round to int4 itself instead of handing its mask to SparseGPT's loop? With int4 values, 2:4's layer loss
on Qwen2.5-Coder-1.5B's down is 4.4-5.8x the bf16 loss (`benchmarks/results/permute_int4_layer_cpu.md`): the
rounding, done today by SparseGPT's loop with ADMM's mask fixed, dominates. Here ADMM's projection also rounds each
group of 128 columns to its int4 grid from iteration K on (`solvers.admm_prune(grid=solvers.group_grid(...))`), so
that the mask and the rounded weights are chosen together. Same Hessians, rows and layers as
`permute_int4_layer_cpu.py`; the layer loss tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ) of each result is reported. Writes a markdown
report and its JSON:

    PYTHONPATH=src python benchmarks/admm_grid_layer_cpu.py --out benchmarks/results/admm_grid_layer_cpu.md
"""

from __future__ import annotations

import time

import torch

from permute_int4_layer_cpu import layer_parser, qwen_down_hessians  # benchmarks/ is on sys.path here
from permute_order_bench import save_report
from sparsedecoding import solvers
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.pipeline import relative_error

GROUP = 128


def on_grid_and_pattern(D: torch.Tensor) -> bool:
    """Every group of four holds at most two nonzeros and every group of 128 at most 16 levels (int4 codes)."""
    sparse = bool(((D != 0).view(D.shape[0], -1, 4).sum(-1) <= 2).all())
    return sparse and all(len(torch.unique(group)) <= 16 for group in D.view(-1, GROUP))


def main() -> None:
    parser = layer_parser(__doc__.split("\n\n")[0], 64)
    parser.add_argument("--grid-from", type=int, nargs="+", default=[80, 95, 100],
                        help="ADMM iterations (of 100) from which its projection rounds")
    args = parser.parse_args()
    if args.rows < 1 or args.tokens < 1 or not all(1 <= k <= 100 for k in args.grid_from):
        parser.error("--rows and --tokens must be positive and --grid-from within 1-100")
    model, hessians, source = qwen_down_hessians(args.tokens, args.layers)
    pattern = SparsityPattern.parse("2:4")
    results = []
    for index in args.layers:
        W = model.model.layers[index].mlp.down_proj.weight.detach().double()
        sample = torch.randperm(W.shape[0], generator=torch.Generator().manual_seed(index))[:args.rows]
        Wp, Hp = W[sample].float(), hessians[index].float()
        Hn = solvers.normalized_hessian(Hp, torch.float32)
        _, damping = solvers.damped_factor(Hn, 0.01, inverse=False)
        solves = {"ADMM, then SparseGPT's loop rounds (today)":
                  lambda: solvers.admm(Wp, Hp, pattern, quantize="int4", group_size=GROUP)}
        for k in args.grid_from:
            solves[f"ADMM rounding from iteration {k}"] = lambda k=k: solvers.admm_prune(
                Wp, Hn, damping, pattern, 100, grid=solvers.group_grid("int4", GROUP), grid_from=k)[0]
        for name, solve in solves.items():
            began = time.perf_counter()
            D = solve()
            results.append({"layer": index, "solve": name, "loss": relative_error(Wp, D, Hp),
                            "feasible": on_grid_and_pattern(D), "seconds": time.perf_counter() - began})
            print(results[-1], flush=True)
    save_report(
        args.out, "benchmarks/admm_grid_layer_cpu.py", results,
        "ADMM that rounds to int4 itself, against ADMM then SparseGPT's loop: down's 2:4 + int4 layer loss on "
        "Qwen2.5-Coder-1.5B (CPU)", torch.device("cpu"),
        f"{source}; {args.rows} of down's rows a layer, in the weight's "
        "own column order. ADMM: 100 iterations, 1% damping, 2:4; int4 with 128 columns a scale. Loss: "
        "tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ) (lower is better); feasible: 2:4 and at most 16 levels a group.\n\n"
        "| layer | solve | loss | feasible | seconds |\n|---|---|---|---|---|\n"
        + "".join(f"| {r['layer']} | {r['solve']} | {r['loss']:.4g} | {'yes' if r['feasible'] else 'no'} | "
                  f"{r['seconds']:.0f} |\n" for r in results))


if __name__ == "__main__":
    main()
