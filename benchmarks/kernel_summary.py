"""Per-batch summary of a `kernel_bench.py` report: geometric-mean speedup over cuBLAS per pattern, the largest and
median spread between the four patterns' times at one shape, and the range of PyTorch's 2:4 semi-structured path
relative to cuBLAS. Reads the report's "All measurements" table; measures nothing.

    python benchmarks/kernel_summary.py benchmarks/results/kernel_h200_full.md
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import defaultdict
from pathlib import Path

PATTERNS = ("2:4", "4:8", "8:16", "16:32")


def rows(report: Path) -> list[list[str]]:
    """Cells of the measurement table's rows (model, linear, shape, pattern, batch, sparse us, cuBLAS us, semi us, ...)."""
    table = []
    for line in report.read_text().splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) > 8 and cells[3] in PATTERNS and cells[4].isdigit():
            table.append(cells)
    if not table:
        raise SystemExit(f"error: {report} has no kernel_bench measurement table")
    return table


def main() -> None:
    if len(sys.argv) != 2:
        raise SystemExit("error: usage: kernel_summary.py REPORT.md")
    times, speedups, semi = defaultdict(dict), defaultdict(list), defaultdict(list)
    for model, linear, _, pattern, batch, sparse, cublas, semi_us, *_ in rows(Path(sys.argv[1])):
        batch, sparse, cublas = int(batch), float(sparse), float(cublas)
        times[model, linear, batch][pattern] = sparse
        speedups[batch, pattern].append(cublas / sparse)
        if semi_us not in ("-", ""):
            semi[batch].append(cublas / float(semi_us))
    print("| batch | " + " | ".join(PATTERNS) + " | largest pattern spread (median) | 2:4 semi-structured vs cuBLAS |")
    print("|---" * (len(PATTERNS) + 3) + "|")
    for batch in sorted({key[2] for key in times}):
        spreads = [max(t.values()) / min(t.values()) - 1 for key, t in times.items()
                   if key[2] == batch and len(t) == len(PATTERNS)]
        geomeans = [math.exp(statistics.fmean(map(math.log, speedups[batch, p]))) for p in PATTERNS]
        print(f"| {batch} | " + " | ".join(f"{g:.2f}x" for g in geomeans)
              + f" | {100 * max(spreads):.1f}% ({100 * statistics.median(spreads):.1f}%)"
              + f" | {min(semi[batch]):.2f}-{max(semi[batch]):.2f}x |")


if __name__ == "__main__":
    main()
