"""Summarize the per-linear rows that `grouped_quality_cpu.py --solver admm` prints (one dict a line), for a run that
was stopped before it wrote its report: geometric means of each pattern's loss against 16:32+2's on each Hessian,
16:32g's split on x² against |x|, and the mean positions.

    python benchmarks/grouped_quality_log_summary.py benchmarks/results/grouped_quality_admm_cpu_partial.log
"""

from __future__ import annotations

import ast
import math
import sys
from pathlib import Path

KINDS = ("fitted", "decode", "lee")


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def main() -> None:
    if len(sys.argv) != 2 or not Path(sys.argv[1]).is_file():
        raise SystemExit("usage: python benchmarks/grouped_quality_log_summary.py LOG (a file of printed rows)")
    rows = [ast.literal_eval(line) for line in Path(sys.argv[1]).read_text().splitlines() if line.startswith("{")]
    if not rows:
        raise SystemExit(f"error: {sys.argv[1]} holds no printed rows")
    print(f"{len(rows)} linears ({', '.join(sorted({str(r['layer']) for r in rows}, key=int))} of Qwen's layers)\n")
    print("| loss | " + " | ".join(KINDS) + " |\n|---|" + "---|" * len(KINDS))
    for label, a, b in (("16:32g (x² split) / 16:32g (abs(x) split)", "16:32g", "16:32g|x|"),
                        ("16:32g (x²) / 16:32+2", "16:32g", "16:32+2"), ("16:32g (abs(x)) / 16:32+2", "16:32g|x|", "16:32+2"),
                        ("2:4 / 16:32+2", "2:4", "16:32+2"), ("16:32 / 16:32+2", "16:32", "16:32+2")):
        print(f"| {label} | " + " | ".join(f"{geomean([r[f'{a} {k}'] / r[f'{b} {k}'] for r in rows]):.4f}"
                                            for k in KINDS) + " |")
    lower = sum(r["16:32g fitted"] < r["16:32g|x| fitted"] for r in rows)
    print(f"\nMean position (fitted; 2:4 = 0, 16:32+2 = 1): 16:32g x² {sum(r['16:32g position'] for r in rows) / len(rows):.3f}, "
          f"abs(x) {sum(r['16:32g|x| position'] for r in rows) / len(rows):.3f}, 16:32 "
          f"{sum(r['16:32 position'] for r in rows) / len(rows):.3f}. The x² split's fitted loss is lower on {lower} of "
          f"{len(rows)} linears.")


if __name__ == "__main__":
    main()
