"""What the fiftieth session's code extraction (`evaluation.humaneval.build_program`: an indented fence dedented,
and where the program does not compile, `~~~` fences and the code lines of an unfenced answer) does to the
committed HumanEval answers (`benchmarks/results/**/*.records.jsonl` and `*.humaneval.jsonl`): how many answers get
another test program, and how those programs end in the sandbox under the old and the new extraction. The new one is
today's `build_program`; the committed report was made under harness version 3 (`fence_change_cpu.py` measures
version 4's change). Needs root (the sandbox). Writes a markdown report:

    PYTHONPATH=src python benchmarks/extraction_change_cpu.py --out benchmarks/results/extraction_change_cpu.md
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

from sparsedecoding.data import humaneval_problems
from sparsedecoding.evaluation.humaneval import _solution, build_program, extract_code
from sparsedecoding.evaluation.sandbox import SandboxLimits, run_many
from sparsedecoding.runenv import environment_markdown

RESULTS = Path(__file__).parent / "results"


def old_program(problem: dict, completion: str) -> str:
    """The test program as `build_program` made it before this change."""
    solution = _solution(problem, extract_code(completion, problem["entry_point"]))
    return f"{solution}\n\n{problem['test']}\n\ncheck({problem['entry_point']})\n"


def committed_answers(problems: dict[str, dict]) -> tuple[list[Path], list[tuple[Path, dict]]]:
    """(the committed answer files, (file, record) for every answer in them to a problem of `problems`)."""
    files = sorted({*RESULTS.glob("**/*.records.jsonl"), *RESULTS.glob("**/*.humaneval.jsonl")})
    answers = []
    for file in files:
        for line in file.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            if "completion" in record and record.get("task_id") in problems:
                answers.append((file, record))
    return files, answers


def run_changed(answers: list[tuple[Path, dict]], problems: dict[str, dict], old, new) -> tuple[list, list, list]:
    """The answers whose test program differs between `old` and `new` (each a function of the problem and the
    answer), and the sandbox runs of their old and of their new programs: ((file, record) list, old runs, new runs)."""
    changed = []
    for file, record in answers:
        problem = problems[record["task_id"]]
        before, after = old(problem, record["completion"]), new(problem, record["completion"])
        if before != after:
            changed.append((file, record, before, after))
    limits = SandboxLimits()
    before_runs = run_many([before for _, _, before, _ in changed], limits)
    after_runs = run_many([after for _, _, _, after in changed], limits)
    return [(file, record) for file, record, _, _ in changed], before_runs, after_runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the markdown report to write")
    args = parser.parse_args()
    problems = {problem["task_id"]: problem for problem in humaneval_problems("all")}
    files, answers = committed_answers(problems)
    records = len(answers)
    changed, before_runs, after_runs = run_changed(answers, problems, old_program, build_program)
    flips = Counter((old.passed, new.passed) for old, new in zip(before_runs, after_runs))
    agrees = sum(old.passed == bool(record.get("passed")) for (_, record), old in zip(changed, before_runs))
    rows = "".join(f"| {file.relative_to(RESULTS)} | {record['task_id']} | {record.get('wording', '')} | "
                   f"{record.get('passed')} | {old.passed} | {new.passed} |\n"
                   for (file, record), old, new in zip(changed, before_runs, after_runs))
    command = "PYTHONPATH=src python " + " ".join(["benchmarks/extraction_change_cpu.py", *sys.argv[1:]])
    args.out.write_text(
        "# Committed HumanEval answers under the fiftieth session's code extraction\n\n"
        f"{environment_markdown(command)}\n"
        "| what | count |\n|---|---|\n"
        f"| committed answers ({len(files)} record files) | {records} |\n"
        f"| whose test program changes | {len(changed)} |\n"
        f"| of those, the old program's outcome equal to the recorded one | {agrees} |\n"
        f"| failed before, pass now | {flips[(False, True)]} |\n"
        f"| passed before, fail now | {flips[(True, False)]} |\n"
        f"| failed both ways | {flips[(False, False)]} |\n"
        f"| passed both ways | {flips[(True, True)]} |\n\n"
        + ("| record file | task | wording | recorded | old program | new program |\n|---|---|---|---|---|---|\n"
           + rows if changed else ""))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
