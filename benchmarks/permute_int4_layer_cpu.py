"""What does `prune --permute-channels` do to 2:4 with int4 values, layer by layer? On Qwen2.5-Coder-1.5B's real
weights, down's full Hessian X·Xᵀ comes from a teacher-forced pass over a committed calibration set's first tokens
(decode positions only, as the quality rounds prune from). For each layer, a fixed sample of down's rows is solved
three ways: ADMM (as `prune --solver admm`, 100 iterations) at 2:4 with bf16 values, the same with int4 values (128
columns a scale), and GPTQ at int4 without pruning. Each runs in three column orders: the weight's own, the order
`--permute-scope layer` chooses (`solvers.balanced_column_order` on W²·diag(H)) and the one `--permute-scope group`
chooses (`solvers.grouped_column_order`, the same search within each scale group). The layer loss
tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ) is reported for each; rows are solved independently under one H, so a row sample
estimates the whole layer's loss. Writes a markdown report and its JSON:

    PYTHONPATH=src python benchmarks/permute_int4_layer_cpu.py --out benchmarks/results/permute_int4_layer_cpu.md
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from permute_order_bench import save_report  # benchmarks/ is on sys.path when this script runs
from permute_search_qwen_cpu import CALIBRATION, replay
from sparsedecoding import solvers
from sparsedecoding.calibration import CalibrationSet
from sparsedecoding.models import load_model
from sparsedecoding.pipeline import relative_error, saliency

VALUES = ("2:4 bf16", "2:4 int4", "int4 unpruned")


@torch.no_grad()
def down_hessians(model, calibration: CalibrationSet, rows: int, layers: list[int],
                  start: int = 0) -> dict[int, torch.Tensor]:
    """Per layer, X·Xᵀ over the kept (decode) positions of sequences `start` to `rows` - 1 (default: the first
    `rows`) at down's input (float64). Each sequence runs alone, its left padding cut off."""
    sums, hooks, current = {}, [], {}
    for index in layers:
        def hook(_module, args, index=index):
            x = args[0][0][current["keep"]].double()
            sums[index] = sums.get(index, 0) + x.T @ x
        hooks.append(model.model.layers[index].mlp.down_proj.register_forward_pre_hook(hook))
    replay(model, calibration, rows, hooks, current, start)
    return sums


def qwen_down_hessians(tokens: int, layers: list[int], held_out: int = 0) -> tuple[torch.nn.Module, dict, str]:
    """Qwen2.5-Coder-1.5B on the CPU, down's Hessians of `layers` (`down_hessians`) over the first sequences of the
    calibration set that hold `tokens` decode tokens, and a sentence saying where the Hessians came from. With
    `held_out` > 0 the dict's values are pairs: that Hessian and a second one over the next sequences, which hold
    `held_out` more decode tokens (never seen by the first)."""
    model, _, _ = load_model("qwen2.5-coder-1.5b", "cpu", torch.float32)
    model.eval()
    calibration = CalibrationSet.load(Path(CALIBRATION))
    kept = calibration.keep.sum(1).cumsum(0)
    sequences = min(int((kept < tokens).sum()) + 1, len(calibration))
    positions = int(calibration.keep[:sequences].sum())
    started = time.perf_counter()
    hessians = down_hessians(model, calibration, sequences, layers)
    source = (f"Hessians X·Xᵀ from the {positions} decode positions of the first {sequences} sequences of "
              f"`{CALIBRATION}`, teacher-forced ({time.perf_counter() - started:.0f} s)")
    if held_out:
        end = min(int((kept < positions + held_out).sum()) + 1, len(calibration))
        if end <= sequences:
            raise SystemExit("error: the calibration set holds no sequences beyond the fitted ones")
        started = time.perf_counter()
        test = down_hessians(model, calibration, end, layers, start=sequences)
        hessians = {index: (hessians[index], test[index]) for index in layers}
        source += (f"; held-out Hessians from the next {int(calibration.keep[sequences:end].sum())} decode positions "
                   f"(sequences {sequences}-{end - 1}, {time.perf_counter() - started:.0f} s)")
    return model, hessians, source


def layer_parser(description: str, rows: int) -> argparse.ArgumentParser:
    """The arguments the layer scripts on down's Hessians share: --out, --layers, --tokens and --rows."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, nargs="+", default=[3, 20])
    parser.add_argument("--tokens", type=int, default=4096, help="teacher-forced calibration tokens")
    parser.add_argument("--rows", type=int, default=rows, help="down's rows solved a layer (a fixed random sample)")
    return parser


def main() -> None:
    parser = layer_parser(__doc__.split("\n\n")[0], 128)
    args = parser.parse_args()
    if args.rows < 1 or args.tokens < 1:
        parser.error("--rows and --tokens must be positive")
    model, hessians, source = qwen_down_hessians(args.tokens, args.layers)
    results = []
    for index in args.layers:
        W = model.model.layers[index].mlp.down_proj.weight.detach().double()
        H = hessians[index]
        S = saliency(W, H)
        orders = {"own": torch.arange(W.shape[1]), "searched": solvers.balanced_column_order(S, "2:4"),
                  "grouped": solvers.grouped_column_order(S, "2:4", 128)}
        sample = torch.randperm(W.shape[0], generator=torch.Generator().manual_seed(index))[:args.rows]
        for order_name, columns in orders.items():
            Wp, Hp = W[sample][:, columns].float(), H[columns][:, columns].float()
            for values in VALUES:
                began = time.perf_counter()
                if values == "int4 unpruned":  # GPTQ alone: what the order does to the rounding without pruning
                    pruned = solvers.gptq(Wp, Hp, "int4", group_size=128)
                else:
                    pruned = solvers.admm(Wp, Hp, "2:4", quantize=None if values == "2:4 bf16" else "int4",
                                          group_size=128)
                results.append({"layer": index, "order": order_name, "values": values,
                                "loss": relative_error(Wp, pruned, Hp), "seconds": time.perf_counter() - began})
                print(results[-1], flush=True)
    by = {(r["layer"], r["order"], r["values"]): r["loss"] for r in results}
    table = "".join(
        f"| {layer} | {values} | {by[layer, 'own', values]:.4g} | "
        + " | ".join(f"{by[layer, name, values]:.4g} ({by[layer, name, values] / by[layer, 'own', values]:.3f})"
                     for name in ("searched", "grouped")) + " |\n"
        for layer in args.layers for values in VALUES)
    save_report(
        args.out, "benchmarks/permute_int4_layer_cpu.py", results,
        "`--permute-channels` with and without int4 values: down's layer loss on Qwen2.5-Coder-1.5B (CPU)",
        torch.device("cpu"),
        f"{source}; {args.rows} of down's rows a layer. ADMM, 100 "
        "iterations, 1% damping; int4: 128 columns a scale, the kept weights rounded by SparseGPT's loop with ADMM's "
        "mask fixed; int4 unpruned: GPTQ alone. Orders: searched as `--permute-scope layer`, searched in scale "
        "groups as `--permute-scope group`. Loss: tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ) (lower is better).\n\n"
        "| layer | solve | loss, own order | searched order (/ own) | searched in scale groups (/ own) |\n"
        "|---|---|---|---|---|\n"
        + table)


if __name__ == "__main__":
    main()
