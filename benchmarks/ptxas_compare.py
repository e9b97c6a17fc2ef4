"""Register and spill counts of sp24.cu's kernels across builds, from ptxas's own report.

Each input is what `nvcc ... -Xptxas -v sp24.cu` printed for one build (the command is the report's to state).
Writes a markdown table of the kernels whose counts differ between the builds: stack frame / spill stores / spill
loads (bytes) / registers, each kernel named by its template arguments.

    python ptxas_compare.py --logs "before=ptxas_old.txt" "after=ptxas_new.txt" --command "nvcc ..." --out table.md
"""

from __future__ import annotations

import argparse
import datetime
import re
import sys
from pathlib import Path

_ENTRY = re.compile(r"Function properties for (\S+)\n\s+(\d+) bytes stack frame, (\d+) bytes spill stores, "
                    r"(\d+) bytes spill loads\nptxas info\s+: Used (\d+) registers")
_KERNEL = re.compile(r"\d(sp24_[a-z_]*kernel)I(\d+)(__nv_bfloat16|__half)(.*?)EEEv")


def kernel_name(symbol: str) -> str:
    """`sp24_kernel<T, NT, CODE, SPS, NORM, OVER, DENSE, STREAM>` as 'bf16 NT=1 CODE=4 ...' (other kernels by their
    mangled template arguments); the anonymous namespace's hash left out, so builds of different sources compare."""
    m = _KERNEL.search(symbol)
    if not m:
        return symbol
    kernel, _, t, rest = m.groups()
    values = re.findall(r"L[ib](\d+)E", rest + "E")
    dtype = "bf16" if "bfloat" in t else "fp16"
    if kernel == "sp24_kernel" and len(values) == 7:
        fields = ("NT", "CODE", "SPS", "NORM", "OVER", "DENSE", "STREAM")
        return f"{dtype} " + " ".join(f"{k}={v}" for k, v in zip(fields, values))
    return f"{kernel} {dtype} " + " ".join(values)


def counts(text: str) -> dict[str, tuple[int, int, int, int]]:
    """Kernel name -> (stack frame, spill stores, spill loads, registers) from one ptxas -v report."""
    return {kernel_name(symbol): tuple(int(v) for v in numbers)
            for symbol, *numbers in _ENTRY.findall(text)}


def table(builds: dict[str, dict[str, tuple[int, int, int, int]]]) -> list[str]:
    """Markdown rows for the kernels whose counts differ between the builds (in the first build's order)."""
    names = list(builds)
    rows = [f"| kernel | {' | '.join(names)} |", "|---" * (len(names) + 1) + "|"]
    first = builds[names[0]]
    for kernel in first:
        seen = [builds[n].get(kernel) for n in names]
        if len(set(seen)) > 1:
            cells = ["-" if c is None else " / ".join(map(str, c)) for c in seen]
            rows.append(f"| {kernel} | {' | '.join(cells)} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--logs", nargs="+", required=True, metavar="NAME=FILE",
                        help="one ptxas -v report per build, named")
    parser.add_argument("--command", required=True, help="the nvcc command that printed the reports (for the header)")
    parser.add_argument("--title", default="ptxas register and spill counts of sp24.cu's kernels")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    builds = {}
    for item in args.logs:
        name, sep, path = item.rpartition("=")  # a name may hold "="; a path does not
        if not sep or not name or not Path(path).is_file():
            parser.error(f"--logs {item!r}: use NAME=FILE with FILE an existing ptxas -v report")
        found = counts(Path(path).read_text())
        if not found:
            parser.error(f"--logs {item!r}: no 'Function properties' entries in {path}")
        builds[name] = found
    lines = [f"# {args.title}", "", f"- date: {datetime.date.today()} (offline, no GPU)",
             f"- command: `{args.command}`",
             "- columns: stack frame / spill stores / spill loads (bytes) / registers; only kernels whose counts differ",
             f"- builds: {', '.join(f'{n} ({len(c)} kernels)' for n, c in builds.items())}", "", *table(builds)]
    args.out.write_text("\n".join(lines) + "\n")
    print(f"{len(lines) - 9} kernels differ; wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
