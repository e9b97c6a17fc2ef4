"""Summarize the per-linear rows that `grouped_quality_cpu.py --solver admm` prints (one dict a line), for a run that
was stopped before it wrote its report: geometric means of each pattern's loss against 16:32+2's on each Hessian,
16:32g's split on x² against abs(x), and the mean positions.

    PYTHONPATH=src python benchmarks/grouped_quality_log_summary.py \\
        benchmarks/results/grouped_quality_admm_cpu_partial.log \\
        --out benchmarks/results/grouped_quality_admm_cpu_partial.md
"""

from __future__ import annotations

import argparse
import ast
import math
from pathlib import Path

import torch

from permute_order_bench import save_report  # benchmarks/ is on sys.path when this script runs

KINDS = ("fitted", "decode", "lee")
ABS = "16:32g|x|"  # grouped_quality_cpu.py's key for 16:32g with the split searched on abs(x)
RATIOS = (("16:32g (x² split) / 16:32g (abs(x) split)", "16:32g", ABS),
          ("16:32g (x²) / 16:32+2", "16:32g", "16:32+2"), ("16:32g (abs(x)) / 16:32+2", ABS, "16:32+2"),
          ("2:4 / 16:32+2", "2:4", "16:32+2"), ("16:32 / 16:32+2", "16:32", "16:32+2"))


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("log", type=Path, help="the printed rows (lines starting with '{'; others are skipped)")
    parser.add_argument("--out", type=Path, required=True, help="the report (.md; its .json twin beside it)")
    args = parser.parse_args()
    if not args.log.is_file():
        parser.error(f"{args.log} is not a file")
    rows = [ast.literal_eval(line) for line in args.log.read_text().splitlines() if line.startswith("{")]
    missing = {f"{p} {k}" for _, a, b in RATIOS for p in (a, b) for k in KINDS} - set(rows[0]) if rows else set()
    if not rows or missing:
        parser.error(f"{args.log} holds no rows of grouped_quality_cpu.py --solver admm"
                     + (f" (missing {', '.join(sorted(missing))})" if missing else ""))
    lines = ["| loss | " + " | ".join(KINDS) + " |", "|---|" + "---|" * len(KINDS)]
    for label, a, b in RATIOS:
        lines.append(f"| {label} | " + " | ".join(
            f"{geomean([r[f'{a} {k}'] / r[f'{b} {k}'] for r in rows]):.4f}" for k in KINDS) + " |")
    lower = sum(r["16:32g fitted"] < r[f"{ABS} fitted"] for r in rows)

    def position(pattern: str) -> float:
        return sum(r[f"{pattern} position"] for r in rows) / len(rows)

    layers = ", ".join(sorted({str(r["layer"]) for r in rows}, key=int))
    body = (f"The rows `grouped_quality_cpu.py --solver admm` printed in `{args.log.name}` (its header says how that "
            f"run went): {len(rows)} linears of Qwen's layers {layers}. Geometric means of the loss ratios on each "
            "Hessian:\n\n" + "\n".join(lines) + f"\n\nMean position (fitted; 2:4 = 0, 16:32+2 = 1): 16:32g x² "
            f"{position('16:32g'):.3f}, abs(x) {position(ABS):.3f}, 16:32 {position('16:32'):.3f}. The x² split's "
            f"fitted loss is lower on {lower} of {len(rows)} linears.\n")
    save_report(args.out, "benchmarks/grouped_quality_log_summary.py", rows,
                "ADMM's 16:32g split on x² against abs(x): layer loss on Qwen's linears (CPU, from a run's printed "
                "rows)", torch.device("cpu"), body)


if __name__ == "__main__":
    main()
