"""What a sandbox change does to real answers (written for the fifty-third session's hardening of
`evaluation/sandbox.py`, used again for the eighty-second's seccomp additions): every distinct test program of the
committed HumanEval answers (`benchmarks/results/**/*.records.jsonl` and `*.humaneval.jsonl`, built by today's
`build_program`) runs in the sandbox before the change (the module at git revision `--before`) and after it (the
working tree's), with the evaluation's default limits, and the outcomes are compared; a program whose outcome
differs runs RECHECKS more times in each, to tell a sandbox's effect from a test's own randomness. Needs root (the
sandbox). Writes a markdown report:

    PYTHONPATH=src python benchmarks/sandbox_change_cpu.py --before 1d72b6f \
        --out benchmarks/results/sandbox_change_cpu.md
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from extraction_change_cpu import committed_answers
from sparsedecoding.data import humaneval_problems
from sparsedecoding.evaluation import sandbox
from sparsedecoding.evaluation.humaneval import build_program
from sparsedecoding.runenv import environment_markdown

ROOT = Path(__file__).resolve().parent.parent
RECHECKS = 8


def sandbox_at(revision: str):
    """The sandbox module as it was at `revision`, imported beside today's (its relative imports resolve in the
    same package)."""
    source = subprocess.run(["git", "show", f"{revision}:src/sparsedecoding/evaluation/sandbox.py"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout
    path = Path(tempfile.mkdtemp(prefix="sandbox-before-")) / "sandbox_before.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location("sparsedecoding.evaluation.sandbox_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True, help="git revision of the sandbox before the change")
    parser.add_argument("--out", type=Path, required=True, help="the markdown report to write")
    parser.add_argument("--workers", type=int, default=None, help="parallel sandboxes (default: CPU count)")
    args = parser.parse_args()
    before_module = sandbox_at(args.before)
    problems = {problem["task_id"]: problem for problem in humaneval_problems("all")}
    files, found = committed_answers(problems)
    answers, programs = len(found), {}
    for _, record in found:
        programs.setdefault(build_program(problems[record["task_id"]], record["completion"]), record["task_id"])
    sources = list(programs)
    print(f"{answers} answers, {len(sources)} distinct programs; running each in both sandboxes", flush=True)
    before = before_module.run_many(sources, before_module.SandboxLimits(), args.workers)
    after = sandbox.run_many(sources, sandbox.SandboxLimits(), args.workers)
    outcomes = Counter((old.outcome, new.outcome) for old, new in zip(before, after))
    differ = [(source, old, new) for source, old, new in zip(sources, before, after)
              if (old.outcome, old.error) != (new.outcome, new.error)]
    # A differing program runs RECHECKS more times in each sandbox: whether its outcome varies within one sandbox
    # (HumanEval tests that draw random inputs) or follows the sandbox
    seen = []
    for source, _, _ in differ:
        old_runs = before_module.run_many([source] * RECHECKS, before_module.SandboxLimits(), args.workers)
        new_runs = sandbox.run_many([source] * RECHECKS, sandbox.SandboxLimits(), args.workers)
        seen.append(tuple(", ".join(sorted({f"{run.outcome} ({run.error})" for run in runs}))
                          for runs in (old_runs, new_runs)))
    rows = "".join(f"| {programs[source]} | {old.outcome} ({old.error}) | {new.outcome} ({new.error}) | {again[0]} | "
                   f"{again[1]} |\n" for (source, old, new), again in zip(differ, seen))
    command = "PYTHONPATH=src python " + " ".join(["benchmarks/sandbox_change_cpu.py", *sys.argv[1:]])
    report = (
        f"# Committed HumanEval answers in the sandbox at {args.before} and in the working tree's\n\n"
        f"{environment_markdown(command)}\n"
        f"{answers} committed answers ({len(files)} files) make {len(sources)} distinct test programs; each ran once "
        f"in the sandbox at {args.before} and once in today's, with the evaluation's default limits "
        f"({sandbox.SandboxLimits()}).\n\n"
        "| before | after | programs |\n|---|---|---|\n"
        + "".join(f"| {old} | {new} | {count} |\n" for (old, new), count in sorted(outcomes.items()))
        + f"\nPrograms whose outcome or error differs: {len(differ)}\n\n"
        + (f"| task | before | after | before, {RECHECKS} more runs | after, {RECHECKS} more runs |\n"
           "|---|---|---|---|---|\n" + rows if differ else ""))
    args.out.write_text(report)
    print(report)


if __name__ == "__main__":
    main()
