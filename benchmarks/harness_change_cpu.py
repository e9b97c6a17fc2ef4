"""What the forty-ninth session's evaluation and selfdata changes do to the committed records, counted on the CPU:
how many committed HumanEval answers (`benchmarks/results/**/*.records.jsonl`) hold an `if __name__` block, which
ran before the tests while answers ran as `__main__` and no longer runs under `__sandbox__`; and how many committed
self-written prompts and replies (`selfdata` shards and plans) the held-out markers flag matched exactly (before)
and with whitespace ignored (now). Writes a markdown report:

    PYTHONPATH=src python benchmarks/harness_change_cpu.py --out benchmarks/results/harness_change_cpu.md
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sparsedecoding.runenv import environment_markdown
from sparsedecoding.selfdata import find_heldout, heldout_markers

RESULTS = Path(__file__).parent / "results"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True, help="the markdown report to write")
    args = parser.parse_args()

    records = main_blocks = failed_with_block = 0
    files = sorted(RESULTS.glob("**/*.records.jsonl"))
    for file in files:
        for line in file.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            records += 1
            if "__main__" in record.get("completion", ""):
                main_blocks += 1
                failed_with_block += not record.get("passed")

    markers = heldout_markers()
    texts = exact = squeezed = 0
    shards = sorted({*RESULTS.glob("**/selfdata/**/*.jsonl"), *RESULTS.glob("**/plan.jsonl")})
    for file in shards:
        for line in file.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            for key in ("prompt", "reply"):
                if isinstance(record.get(key), str):
                    texts += 1
                    exact += any(marker in record[key] for marker in markers)
                    squeezed += find_heldout(record[key], markers) is not None
    command = "PYTHONPATH=src python " + " ".join(["benchmarks/harness_change_cpu.py", *sys.argv[1:]])
    args.out.write_text(
        "# Committed records under the forty-ninth session's evaluation and selfdata changes\n\n"
        f"{environment_markdown(command)}\n"
        "| what | count |\n|---|---|\n"
        f"| committed HumanEval answers ({len(files)} record files) | {records} |\n"
        f"| of them holding `__main__` (ran before the tests until this change) | {main_blocks} |\n"
        f"| of those, failed | {failed_with_block} |\n"
        f"| committed self-written prompts and replies ({len(shards)} files) | {texts} |\n"
        f"| flagged by the held-out markers, exact match (before) | {exact} |\n"
        f"| flagged with whitespace ignored (now) | {squeezed} |\n")
    print(args.out.read_text())


if __name__ == "__main__":
    main()
