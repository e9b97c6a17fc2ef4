"""Static cost of the tensor-core kernel's paths without a GPU: compile `csrc/nm_mma.cu` for sm_90 with the
machine's nvcc, disassemble it with the cuobjdump that Triton bundles, and count SASS instructions per kernel
instance (one n-tile, i.e. batch 1-8; two pipeline stages). Numbers in benchmarks/CUDA_KERNEL_NOTES.md ("Quantized
values").

For each instance the report gives the two longest backward-branch spans: the longest is the main loop over
pipeline stages (copies, barriers and compute of one stage, per warp), the second the loop's compute part after the
stage's barrier. Both count instructions, not cycles; they tell designs apart, they do not time them. `per word`
is the instruction distance between successive `mma.sp` of the sparse-tensor-core path (one per mask word). The
generic expansion (16-bit values of 4:8, 8:16, 16:32) is listed beside the 2:4 paths.

    PYTHONPATH=src python benchmarks/cuda_sass_count.py --out benchmarks/results/cuda_sass_sm90.md
    PYTHONPATH=src python benchmarks/cuda_sass_count.py --rev 5769ea3   # the source of a git revision
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton

from sparsedecoding.kernels.cuda_mma import SOURCE, _nvcc

CUOBJDUMP = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
INSTANCE = re.compile(r"nm_mma_kernelI(\w+?)Li(\d)ELb(\d)ELi(\d)ELi(\d)ELb(\d)ELi(\d)EE")
VALUES = {"0": "bf16", "8": "int8 codes", "4": "int4 codes"}


def sass_of_source(nvcc: str, rev: str | None = None) -> str:
    """SASS of nm_mma.cu as it is, or as it was at git revision `rev`."""
    with tempfile.TemporaryDirectory() as folder:
        library = Path(folder) / "nm_mma.so"
        source = SOURCE
        if rev is not None:
            source = Path(folder) / "nm_mma.cu"
            relative = SOURCE.resolve().relative_to(Path(__file__).resolve().parents[1])
            source.write_text(subprocess.run(["git", "show", f"{rev}:{relative.as_posix()}"], check=True,
                                             capture_output=True, text=True, cwd=Path(__file__).parent).stdout)
        subprocess.run([nvcc, "-O3", "-shared", "-Xcompiler", "-fPIC", "-std=c++17",
                        "-gencode=arch=compute_90,code=sm_90", "-o", str(library), str(source)], check=True,
                       capture_output=True)
        return subprocess.run([str(CUOBJDUMP), "-sass", str(library)], check=True, capture_output=True,
                              text=True).stdout


def instance_rows(sass: str) -> list[dict]:
    """One row per bf16, one-n-tile, two-stage instance: 2:4 (expansion or mma.sp, each value format) and the
    generic expansion."""
    rows = []
    for function in re.split(r"\n\s*Function : ", sass)[1:]:
        match = INSTANCE.search(function.split("\n", 1)[0])
        if not match or not match.group(1).endswith("bfloat16") or match.group(2) != "1" or match.group(4) != "2":
            continue
        lines = re.findall(r"/\*([0-9a-f]{4,5})\*/\s+([^;]*);", function)
        spans = []
        for address, text in lines:
            target = re.search(r"BRA\b.*?0x([0-9a-f]+)", text)
            if target and int(target.group(1), 16) < int(address, 16):
                spans.append((int(address, 16) - int(target.group(1), 16)) // 16)
        spans.sort(reverse=True)
        mma = [index for index, (_, text) in enumerate(lines) if "HMMA.SP" in text]
        per_word = [b - a for a, b in zip(mma, mma[1:])]
        path = "mma.sp" if match.group(6) == "1" else "expansion" if match.group(3) == "1" else \
            "generic expansion (4:8, 8:16, 16:32)"
        rows.append({"values": VALUES[match.group(5)], "path": path,
                     "group_words": match.group(7), "loop": spans[0] if spans else 0,
                     "compute": spans[1] if len(spans) > 1 else 0,
                     "per_word": f"{min(per_word)}-{max(per_word)}" if per_word else "-"})
    return sorted(rows, key=lambda row: (row["values"], row["path"], row["group_words"]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", help="count nm_mma.cu as it was at this git revision")
    parser.add_argument("--out", help="write the markdown report here too")
    args = parser.parse_args(argv)
    nvcc = _nvcc()
    if nvcc is None or not CUOBJDUMP.is_file():
        print("error: cuda_sass_count needs nvcc on PATH and Triton's bundled cuobjdump", file=sys.stderr)
        return 2
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    rows = instance_rows(sass_of_source(nvcc, args.rev))
    lines = ["# SASS instruction counts of the tensor-core kernel's paths (sm_90, offline)", "",
             f"- date: {datetime.date.today()}", f"- compiler: {version}; disassembler: Triton {triton.__version__}'s "
             "cuobjdump", f"- source: nm_mma.cu {'of the working tree' if args.rev is None else f'at {args.rev}'}",
             f"- command: `python {' '.join(['benchmarks/cuda_sass_count.py', *(argv or sys.argv[1:])])}`",
             "- instances: bf16 activations, one n-tile (batch 1-8), two pipeline stages; counts per warp", "",
             "| values | path | scale group (words, 0 = looked up per word) | main loop | compute part | per mask word "
             "(mma.sp) |", "|---|---|---|---|---|---|"]
    lines += [f"| {r['values']} | {r['path']} | {r['group_words']} | {r['loop']} | {r['compute']} | {r['per_word']} |"
              for r in rows]
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
