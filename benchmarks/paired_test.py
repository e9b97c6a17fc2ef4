"""Paired comparison of two configurations on the same HumanEval problems: how many each solves, how many only
one solves, and the exact two-sided McNemar p-value (binomial test on the discordant problems).

    python benchmarks/paired_test.py A.humaneval.jsonl B.humaneval.jsonl [C.humaneval.jsonl D.humaneval.jsonl ...]

Files are the per-problem records `compare` writes (configs/NAME.humaneval.jsonl); arguments pair up in order."""

from __future__ import annotations

import json
import sys
from math import comb
from pathlib import Path


def passed(path: Path) -> dict[str, bool]:
    return {record["task_id"]: bool(record["passed"]) for record in map(json.loads, path.read_text().splitlines())}


def mcnemar(only_a: int, only_b: int) -> float:
    """Exact two-sided p-value of the discordant counts under H0: either side equally likely."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2**n
    return min(1.0, 2 * tail)


def compare(a: Path, b: Path) -> str:
    first, second = passed(a), passed(b)
    if first.keys() != second.keys():
        raise SystemExit(f"error: {a} and {b} hold different problems")
    only_a = sum(first[task] and not second[task] for task in first)
    only_b = sum(second[task] and not first[task] for task in first)
    return (f"| {a.parent.parent.name}/{a.name.split('.')[0]} | {b.parent.parent.name}/{b.name.split('.')[0]} | "
            f"{sum(first.values())} | {sum(second.values())} | {only_a} | {only_b} | {mcnemar(only_a, only_b):.2g} |")


def main() -> None:
    paths = [Path(arg) for arg in sys.argv[1:]]
    if not paths or len(paths) % 2:
        raise SystemExit("error: give pairs of .humaneval.jsonl files")
    print("| A | B | pass A | pass B | only A | only B | p |\n|---|---|---|---|---|---|---|")
    for a, b in zip(paths[::2], paths[1::2]):
        print(compare(a, b))


if __name__ == "__main__":
    main()
