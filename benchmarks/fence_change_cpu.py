"""What harness version 4 (the sixty-third session: a block whose last line is one or two backticks, a closing fence
short of a backtick, is read without that line where it does not compile otherwise) does to the committed HumanEval
answers (`benchmarks/results/**/*.records.jsonl` and `*.humaneval.jsonl`). Every answer's test program is built
under version 3 and version 4; those that differ run in the sandbox both ways. The report gives the totals, each
record file's passes by wording as recorded and under version 4, and every answer whose outcome changes. Needs root
(the sandbox). Writes a markdown report and its JSON beside it:

    PYTHONPATH=src python benchmarks/fence_change_cpu.py --out benchmarks/results/fence_change_cpu.md
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path
from unittest import mock

from extraction_change_cpu import RESULTS, committed_answers, run_changed

from sparsedecoding.data import humaneval_problems
from sparsedecoding.evaluation import humaneval
from sparsedecoding.runenv import environment_markdown


def version3_program(problem: dict, completion: str) -> str:
    """The test program as harness version 3 built it: no reading without a short closing fence."""
    with mock.patch.object(humaneval, "short_fence_readings", lambda code: []):
        return humaneval.build_program(problem, completion)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the markdown report to write (and .json beside it)")
    args = parser.parse_args()
    if args.out.suffix != ".md":
        raise SystemExit(f"error: --out {args.out} must end in .md (the JSON goes beside it)")
    problems = {problem["task_id"]: problem for problem in humaneval_problems("all")}
    files, answers = committed_answers(problems)
    changed, before_runs, after_runs = run_changed(answers, problems, version3_program, humaneval.build_program)
    flips = Counter((old.passed, new.passed) for old, new in zip(before_runs, after_runs))
    agrees = sum(old.passed == bool(record.get("passed")) for (_, record), old in zip(changed, before_runs))

    # Per record file and wording: answers, passed as recorded, and passed under version 4 (recorded + gains - losses,
    # counted where version 3's program ended as recorded).
    table: dict[tuple[str, str], Counter] = defaultdict(Counter)
    for file, record in answers:
        key = (str(file.relative_to(RESULTS)), record.get("wording", ""))
        table[key]["answers"] += 1
        table[key]["recorded"] += bool(record.get("passed"))
    touched = set()
    for (file, record), new in zip(changed, after_runs):
        key = (str(file.relative_to(RESULTS)), record.get("wording", ""))
        touched.add(key)
        table[key]["short_fence"] += 1
        table[key]["delta"] += int(new.passed) - int(bool(record.get("passed")))
    rows = [{"file": file, "wording": wording, "answers": c["answers"], "short_fence": c["short_fence"],
             "passed_recorded": c["recorded"], "passed_v4": c["recorded"] + c["delta"]}
            for (file, wording), c in sorted(table.items()) if (file, wording) in touched]
    flipped = [{"file": str(file.relative_to(RESULTS)), "task_id": record["task_id"],
                "wording": record.get("wording", ""), "recorded": bool(record.get("passed")), "v3": old.passed,
                "v4": new.passed}
               for (file, record), old, new in zip(changed, before_runs, after_runs) if old.passed != new.passed]
    command = "PYTHONPATH=src python " + " ".join(["benchmarks/fence_change_cpu.py", *sys.argv[1:]])
    totals = {"record_files": len(files), "answers": len(answers), "programs_changed": len(changed),
              "v3_outcome_as_recorded": agrees, "failed_then_pass": flips[(False, True)],
              "passed_then_fail": flips[(True, False)], "failed_both": flips[(False, False)],
              "passed_both": flips[(True, True)]}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps({"command": command, "totals": totals, "files": rows,
                                                         "flips": flipped}, indent=1) + "\n")
    args.out.write_text(
        "# Committed HumanEval answers under harness version 4 (a closing fence short of a backtick)\n\n"
        f"{environment_markdown(command)}\n"
        "| what | count |\n|---|---|\n"
        f"| committed answers ({len(files)} record files) | {len(answers)} |\n"
        f"| whose test program changes (a block ending in a line of one or two backticks) | {len(changed)} |\n"
        f"| of those, version 3's outcome equal to the recorded one | {agrees} |\n"
        f"| failed under version 3, pass under version 4 | {flips[(False, True)]} |\n"
        f"| passed under version 3, fail under version 4 | {flips[(True, False)]} |\n"
        f"| failed both ways | {flips[(False, False)]} |\n"
        f"| passed both ways | {flips[(True, True)]} |\n\n"
        "Record files with such answers, by wording (passes of all the file's answers of that wording):\n\n"
        "| record file | wording | answers | short fence | passed as recorded | passed under version 4 |\n"
        "|---|---|---|---|---|---|\n"
        + "".join(f"| {r['file']} | {r['wording']} | {r['answers']} | {r['short_fence']} | {r['passed_recorded']} | "
                  f"{r['passed_v4']} |\n" for r in rows)
        + "\nAnswers whose outcome changes:\n\n| record file | task | wording | recorded | version 3 | version 4 |\n"
        "|---|---|---|---|---|---|\n"
        + "".join(f"| {f['file']} | {f['task_id']} | {f['wording']} | {f['recorded']} | {f['v3']} | {f['v4']} |\n"
                  for f in flipped))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
