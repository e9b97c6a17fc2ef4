"""Paired comparison of two configurations on the same HumanEval problems: how many each solves, how many only
one solves, and the exact two-sided McNemar p-value (binomial test on the discordant problems).

    python benchmarks/paired_test.py A.humaneval.jsonl B.humaneval.jsonl [C.humaneval.jsonl D.humaneval.jsonl ...]
    python benchmarks/paired_test.py --wording fenced dev/A.records.jsonl dev/B.records.jsonl

Files are the per-problem records `compare` writes (configs/NAME.humaneval.jsonl) or `quality_recipes.py` writes
(dev/NAME.records.jsonl, both wordings in one file: `--wording` picks one); arguments pair up in order. With
`--recheck`, every record's answer is checked again in the sandbox under today's harness
(`evaluation.suite.HARNESS_VERSION`) instead of taking its recorded outcome (needs the records' answers, HumanEval and
root for the sandbox)."""

from __future__ import annotations

import argparse
import datetime
import json
import sys
from math import comb
from pathlib import Path


def passed(path: Path, wording: str | None = None, recheck: bool = False) -> dict[str, bool]:
    """task_id -> passed; with `wording`, only the records of that instruction wording; with `recheck`, each answer
    checked again under today's harness."""
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    if wording is not None:
        records = [record for record in records if record.get("wording") == wording]
        if not records:
            raise SystemExit(f"error: {path} holds no records of wording {wording!r}")
    tasks = [record["task_id"] for record in records]
    if len(set(tasks)) < len(tasks):  # both wordings in one file: a dict would keep whichever came last
        raise SystemExit(f"error: {path} holds several records of one problem (both instruction wordings?); pick "
                         f"one with --wording fenced or --wording plain")
    if not recheck:
        return {record["task_id"]: bool(record["passed"]) for record in records}
    if any("completion" not in record for record in records):
        raise SystemExit(f"error: {path} holds records without their answers; --recheck needs them")
    from sparsedecoding.data import humaneval_problems
    from sparsedecoding.evaluation.humaneval import check_completions

    problems = {problem["task_id"]: problem for problem in humaneval_problems("all")}
    checked = check_completions([problems[record["task_id"]] for record in records],
                                [record["completion"] for record in records])
    return {record["task_id"]: item.passed for record, item in zip(records, checked)}


def mcnemar(only_a: int, only_b: int) -> float:
    """Exact two-sided p-value of the discordant counts under H0: either side equally likely."""
    n = only_a + only_b
    if n == 0:
        return 1.0
    tail = sum(comb(n, i) for i in range(min(only_a, only_b) + 1)) / 2**n
    return min(1.0, 2 * tail)


def compare(a: Path, b: Path, wording: str | None = None, recheck: bool = False) -> str:
    first, second = passed(a, wording, recheck), passed(b, wording, recheck)
    if first.keys() != second.keys():
        raise SystemExit(f"error: {a} and {b} hold different problems")
    only_a = sum(first[task] and not second[task] for task in first)
    only_b = sum(second[task] and not first[task] for task in first)
    return (f"| {a.parent.parent.name}/{a.name.split('.')[0]} | {b.parent.parent.name}/{b.name.split('.')[0]} | "
            f"{sum(first.values())} | {sum(second.values())} | {only_a} | {only_b} | {mcnemar(only_a, only_b):.2g} |")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wording", help="only the records of this instruction wording (fenced, plain)")
    parser.add_argument("--recheck", action="store_true",
                        help="check every answer again under today's harness instead of reading its recorded outcome")
    parser.add_argument("paths", nargs="+", type=Path, help="record files, paired in order")
    args = parser.parse_args(argv)
    if len(args.paths) % 2:
        parser.error("give pairs of record files")
    command = " ".join(["python benchmarks/paired_test.py", *(sys.argv[1:] if argv is None else argv)])
    harness = ""
    if args.recheck:
        from sparsedecoding.evaluation.suite import HARNESS_VERSION

        harness = f"\n- answers checked again under harness version {HARNESS_VERSION}"
    print(f"- date: {datetime.date.today().isoformat()}\n- command: `{command}`{harness}\n")
    print("| A | B | pass A | pass B | only A | only B | p |\n|---|---|---|---|---|---|---|")
    for a, b in zip(args.paths[::2], args.paths[1::2]):
        print(compare(a, b, args.wording, args.recheck))


if __name__ == "__main__":
    main()
