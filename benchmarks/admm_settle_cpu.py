"""ADMM stopped once its mask has settled (`solvers.admm(settle=K)`, `--admm-settle K`) against ADMM run to the end,
on real layer Hessians of SmolLM2-135M: the iterations each ran, the layer loss (as a ratio to SparseGPT's and to
100 full iterations'), the share of mask entries alike with 100 full iterations, and the wall time.

The Hessians are the ones of `refit_steps_cpu.py` and `admm_layers_cpu.py`: the dense model reading the first 4096
tokens of the Lee background text, teacher-forced (a solver comparison, not a calibration). About 15 minutes on two
idle cores for four layers.

    python benchmarks/admm_settle_cpu.py --layers 3 15 27 29 --out benchmarks/results/admm_settle_smollm2_cpu.md
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from refit_steps_cpu import loss, report_head, solver_cases, write_report  # noqa: E402
from sparsedecoding import solvers  # noqa: E402

# (label, solvers.admm keywords); the first is the reference the others are compared with
VARIANTS = (
    ("100", {"iterations": 100}),
    ("100 + refit 10", {"iterations": 100, "refit_steps": 10}),
    ("200", {"iterations": 200}),
    ("100, settle 5", {"iterations": 100, "settle": 5}),
    ("100, settle 10", {"iterations": 100, "settle": 10}),
    ("200, settle 5", {"iterations": 200, "settle": 5}),
)


class CountedIterations:
    """`solvers.admm_prune` wrapped to remember how many iterations its last call ran (its third value)."""

    def __init__(self):
        self.inner = solvers.admm_prune
        self.last = 0

    def __call__(self, *args, **kwargs):
        result = self.inner(*args, **kwargs)
        self.last = result[2]
        return result


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(value) for value in values) / len(values))


def main() -> int:
    args, started, folder, ids, cases = solver_cases(__doc__.split("\n\n")[0])
    counted = CountedIterations()
    solvers.admm_prune = counted
    rows = []
    for key, pattern, W, H in cases:
        base = loss(W, solvers.sparsegpt(W, H, pattern), H)
        row = {"linear": key, "pattern": pattern, "sparsegpt": base, "admm": {}}
        reference = None
        for label, options in VARIANTS:
            begun = time.perf_counter()
            result = solvers.admm(W, H, pattern, **options)
            seconds = time.perf_counter() - begun
            reference = result if reference is None else reference
            row["admm"][label] = {"loss": loss(W, result, H), "iterations": counted.last, "seconds": seconds,
                                  "same_mask": float(((result != 0) == (reference != 0)).float().mean())}
        rows.append(row)
        print(f"{key} {pattern}: " + ", ".join(f"{label} {item['loss'] / base:.3f}x ({item['iterations']})"
                                               for label, item in row["admm"].items()), flush=True)
    labels = [label for label, _ in VARIANTS]
    lines = [
        *report_head("# ADMM stopped when its mask settles, on SmolLM2-135M's layer Hessians (CPU)", folder, ids,
                     args.layers, "a solver comparison"),
        "- loss: tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ); each cell: the ratio to SparseGPT's loss (left to right, damping 0.01, "
        "blocks of 128), then the iterations run; `settle K`: stop once the mask came out the same K iterations in a "
        f"row, then {solvers.ADMM_SETTLED_REFIT} conjugate-gradient steps on the kept weights; the penalty's "
        "schedule always spans the nominal iterations (100 or 200)",
        f"- wall time: {time.perf_counter() - started:.0f} s (the time columns: seconds for one linear and pattern; "
        "the machine was shared with other work, so they are rough)", "",
        "| linear | pattern | " + " | ".join(f"ADMM {label}" for label in labels) + " | same mask as 100: "
        + " / ".join(labels[3:]) + " | s: " + " / ".join(labels) + " |",
        "|---|---|" + "---|" * len(labels) + "---|---|",
    ]
    for row in rows:
        items = row["admm"]
        lines.append(f"| {row['linear']} | {row['pattern']} | "
                     + " | ".join(f"{items[label]['loss'] / row['sparsegpt']:.3f} ({items[label]['iterations']})"
                                  for label in labels)
                     + " | " + " / ".join(f"{100 * items[label]['same_mask']:.2f}%" for label in labels[3:])
                     + " | " + " / ".join(f"{items[label]['seconds']:.1f}" for label in labels) + " |")
    lines.append("")
    for pattern in args.patterns:
        chosen = [row for row in rows if row["pattern"] == pattern]
        parts = []
        for label in labels:
            ratio = geomean([row["admm"][label]["loss"] / row["sparsegpt"] for row in chosen])
            to_full = geomean([row["admm"][label]["loss"] / row["admm"][labels[0]]["loss"] for row in chosen])
            iterations = sum(row["admm"][label]["iterations"] for row in chosen) / len(chosen)
            seconds = sum(row["admm"][label]["seconds"] for row in chosen)
            parts.append(f"{label}: {ratio:.4f}x SparseGPT, {to_full:.4f}x ADMM 100, {iterations:.1f} iterations, "
                         f"{seconds:.0f} s")
        lines.append(f"- {pattern}, geometric means over {len(chosen)} linears (iterations: the mean; s: the sum): "
                     + "; ".join(parts) + ".")
    lines.append("")
    write_report(args.out, lines, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
