"""How much of a 16:32 mask a 2:4 layout cannot hold: per group of 4 columns, the kept weights beyond two.

A design question for 16:32 on sparse tensor cores (`CUDA_KERNEL_NOTES.md`, fourteenth session): W = W24 + W_over,
where W24 takes at most two kept weights of each group of four (a 2:4 weight, as sp24 runs it) and W_over the rest.
This counts W_over on a model's decoder linears under magnitude 16:32 masks (top 16 |w| of each 32 columns of a
row), and on random 16:32 masks for comparison. CPU only; reads the model's safetensors folder.

    python benchmarks/mask_overflow.py ~/.cache/sparsedecoding/models/qwen2.5-coder-1.5b \\
        --out benchmarks/results/mask_overflow_qwen2.5-coder-1.5b.md
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from sparsedecoding.runenv import environment_markdown, print_report


def kept_per_group(kept: torch.Tensor) -> torch.Tensor:
    """[rows, columns] bool mask -> kept count of every group of 4 columns."""
    rows, columns = kept.shape
    return kept.view(rows, columns // 4, 4).sum(-1)


def overflow(counts: torch.Tensor) -> int:
    """Kept weights beyond two in their group of 4, summed, from `kept_per_group` counts."""
    return int((counts - 2).clamp_min(0).sum())


def magnitude_mask(weight: torch.Tensor) -> torch.Tensor:
    """The top 16 |w| of every 32 columns of each row."""
    rows, columns = weight.shape
    groups = weight.abs().float().view(rows, columns // 32, 32)
    kept = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, groups.topk(16, dim=-1).indices, True)
    return kept.view(rows, columns)


def random_mask(rows: int, columns: int, generator: torch.Generator) -> torch.Tensor:
    keys = torch.rand(rows, columns // 32, 32, generator=generator)
    kept = torch.zeros_like(keys, dtype=torch.bool).scatter_(-1, keys.topk(16, dim=-1).indices, True)
    return kept.view(rows, columns)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path, help="a transformers folder with safetensors weights")
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    args = parser.parse_args(argv)
    files = sorted(args.model.glob("*.safetensors"))
    if not files:
        print(f"error: no .safetensors files in {args.model}", file=sys.stderr)
        return 2
    from safetensors import safe_open

    by_kind: dict[str, list[int]] = {}  # kind -> [kept, overflow]
    histogram = torch.zeros(5, dtype=torch.float64)
    for path in files:
        with safe_open(str(path), "pt") as handle:
            for name in handle.keys():
                if "layers." not in name or not name.endswith("proj.weight"):
                    continue
                weight = handle.get_tensor(name)
                if weight.shape[1] % 32:
                    continue
                counts = kept_per_group(magnitude_mask(weight))
                histogram += torch.bincount(counts.flatten(), minlength=5).double()
                totals = by_kind.setdefault(name.split(".")[-2], [0, 0])
                totals[0] += int(counts.sum())
                totals[1] += overflow(counts)
    if not by_kind:
        print(f"error: no decoder linears (layers.*proj.weight) in {args.model}", file=sys.stderr)
        return 2
    kept, over = (sum(v[i] for v in by_kind.values()) for i in (0, 1))
    random_counts = kept_per_group(random_mask(4096, 4096, torch.Generator().manual_seed(0)))
    random_over = overflow(random_counts) / int(random_counts.sum())
    shares = histogram / histogram.sum()
    lines = ["# 16:32 masks: kept weights beyond two in a group of four", "",
             environment_markdown("python " + " ".join(sys.argv), torch.device("cpu")), "",
             f"Model: `{args.model.name}`, every decoder linear (`layers.*proj.weight`), magnitude 16:32 masks.", "",
             f"- overflow: {over / kept:.4f} of the kept weights ({over / (2 * kept):.4f} of all weights)",
             f"- random 16:32 masks (4096 x 4096, seed 0): {random_over:.4f} of the kept weights",
             "- groups of four keeping 0 / 1 / 2 / 3 / 4: " + " / ".join(f"{v:.3f}" for v in shares.tolist()), "",
             "| linear | kept | overflow | share |", "|---|---|---|---|"]
    lines += [f"| {kind} | {k} | {o} | {o / k:.4f} |" for kind, (k, o) in sorted(by_kind.items())]
    print_report("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
