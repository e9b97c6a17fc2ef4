"""Does a longer column-order search (`prune --permute-channels`) drop less saliency on Qwen2.5-Coder-1.5B's real
weights? The saliency is what the prune balances, W² times the Hessian diagonal. The diagonal comes from a
teacher-forced pass over the first tokens of a committed calibration set (decode tokens of the dense model, as the
quality rounds prune from), hooked at the inputs of down and o. For a few layers, `solvers.balanced_column_order`
runs with its defaults (60 rounds, 16 candidate swaps a group pair) and with 4x the rounds or the candidates, at 2:4
and 16:32, on down and on o's columns stacked per KV head, as `pipeline.permute_layer` calls it. The dropped saliency
of the search's order is reported over that of the weight's own order. Writes a markdown report and its JSON:

    PYTHONPATH=src python benchmarks/permute_search_qwen_cpu.py --out benchmarks/results/permute_search_qwen_cpu.md
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

from permute_order_bench import save_report  # benchmarks/ is on sys.path when this script runs
from sparsedecoding import solvers
from sparsedecoding.calibration import CalibrationSet
from sparsedecoding.models import load_model
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.pipeline import kv_head_columns, saliency

CALIBRATION = "benchmarks/results/quality-admm2-qwen2.5-coder-1.5b/data/humaneval_fit-32768-4.safetensors"
SEARCHES = {"default": {}, "4x rounds": {"rounds": 240}, "4x candidates": {"options": 64}}


@torch.no_grad()
def input_energy(model, calibration: CalibrationSet, rows: int, layers: list[int]) -> dict[str, torch.Tensor]:
    """Per layer, the sum over the kept (decode) positions of each input column's square at down and o: the
    Hessians' diagonals. Each sequence runs alone, its left padding cut off."""
    sums, hooks, current = {}, [], {}
    for index in layers:
        block = model.model.layers[index]
        for name, linear in (("down", block.mlp.down_proj), ("o", block.self_attn.o_proj)):
            key = f"{index}.{name}"

            def hook(_module, args, key=key):
                x = args[0].float()[0][current["keep"]]
                sums[key] = sums.get(key, 0) + (x ** 2).sum(0)
            hooks.append(linear.register_forward_pre_hook(hook))
    replay(model, calibration, rows, hooks, current)
    return sums


def replay(model, calibration: CalibrationSet, rows: int, hooks: list, current: dict, start: int = 0) -> None:
    """Run sequences `start` to `rows` - 1 (default: the first `rows`) one at a time, left padding cut off, with
    current["keep"] set to each one's kept (decode) positions for the hooks to read; the hooks are removed at the
    end."""
    try:
        for row in range(start, rows):
            real = calibration.attention_mask[row].bool()
            current["keep"] = calibration.keep[row][real]
            model(input_ids=calibration.input_ids[row][real][None])
    finally:
        for handle in hooks:
            handle.remove()


def stacked_o(S: torch.Tensor, heads: int, kv_heads: int, head_dim: int) -> list[torch.Tensor]:
    """o's saliency columns for each KV head's value channels, every query head reading it stacked as rows (as
    `pipeline.permute_layer` stacks them)."""
    return [torch.cat([S[:, c] for c in columns], 0) for columns in kv_head_columns(heads, kv_heads, head_dim)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, nargs="+", default=[3, 20])
    parser.add_argument("--tokens", type=int, default=1024, help="teacher-forced calibration tokens")
    args = parser.parse_args()
    model, _, _ = load_model("qwen2.5-coder-1.5b", "cpu", torch.float32)
    model.eval()
    calibration = CalibrationSet.load(Path(CALIBRATION))
    kept = calibration.keep.sum(1).cumsum(0)
    rows = min(int((kept < args.tokens).sum()) + 1, len(calibration))
    started = time.perf_counter()
    energy = input_energy(model, calibration, rows, args.layers)
    forward_s = time.perf_counter() - started
    config = model.config
    heads, kv_heads = config.num_attention_heads, config.num_key_value_heads
    head_dim = config.hidden_size // heads
    results = []
    for index in args.layers:
        block = model.model.layers[index]
        for name, linear in (("down", block.mlp.down_proj), ("o", block.self_attn.o_proj)):
            S = saliency(linear.weight, torch.diag(energy[f"{index}.{name}"]))
            parts = [S] if name == "down" else stacked_o(S, heads, kv_heads, head_dim)
            for pattern_name in ("2:4", "16:32"):
                pattern = SparsityPattern.parse(pattern_name)
                width, drop = solvers.permutation_groups(pattern)
                own = sum(float(solvers.dropped_saliency(part, width, drop).sum()) for part in parts)
                for search, options in SEARCHES.items():
                    if pattern_name == "2:4" and search == "4x candidates":
                        continue  # 2:4 already tries all 16 swaps of a group pair
                    began = time.perf_counter()
                    dropped = sum(float(solvers.dropped_saliency(part[:, solvers.balanced_column_order(
                        part, pattern, **options)], width, drop).sum()) for part in parts)
                    results.append({"layer": index, "linear": name, "pattern": pattern_name, "search": search,
                                    "ratio": dropped / own, "seconds": time.perf_counter() - began})
                    print(results[-1], flush=True)
    save_report(
        args.out, "benchmarks/permute_search_qwen_cpu.py", results,
        "`--permute-channels`: a longer column-order search on Qwen2.5-Coder-1.5B's real saliency (CPU)",
        torch.device("cpu"),
        f"Hessian diagonals from the {int(calibration.keep[:rows].sum())} decode positions of the first {rows} "
        f"sequences of `{CALIBRATION}`, teacher-forced ({forward_s:.0f} s). Ratio: dropped saliency under the "
        "search's order over that under the weight's own order (lower is better; o: summed over its two KV heads' "
        "stacks). Seconds: one run, two CPU cores.\n\n| layer | linear | pattern | search | dropped ratio | seconds |\n"
        "|---|---|---|---|---|---|\n"
        + "".join(f"| {r['layer']} | {r['linear']} | {r['pattern']} | {r['search']} | {r['ratio']:.4f} | "
                  f"{r['seconds']:.1f} |\n" for r in results))


if __name__ == "__main__":
    main()
