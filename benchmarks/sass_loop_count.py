"""Instructions in the main loop of each sp24 kernel variant, read from the SASS of an offline compile (no GPU
needed): nvcc builds `kernels/csrc/sp24.cu` (or the file of a given git revision) for sm_90, cuobjdump disassembles
it, and for every `sp24_kernel` instantiation the instructions from its first to its last sparse MMA are counted.
Within that span each MMA is one k-tile for one group of 8 rows of x, so "per MMA" is the main loop's cost per
k-tile at 1-8 rows of x (NT = 1). Register spills and shared-memory loads inside the span are counted too. The span
also holds the loads issued between the MMAs, so the counts are an upper bound of the issue a k-tile needs. Kernels
with overflow slots (16:32+2) show their slot-loop order; `--define=-DSP24_COLUMNS` compiles the build that also
holds the columns order.

    python benchmarks/sass_loop_count.py --out benchmarks/results/sass_sp24.md
    python benchmarks/sass_loop_count.py --rev ad13af8 --out benchmarks/results/sass_sp24_ad13af8.md
    python benchmarks/sass_loop_count.py --define=-DSP24_COLUMNS --out benchmarks/results/sass_sp24_slots.md
"""

from __future__ import annotations

import argparse
import datetime
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SOURCE = "src/sparsedecoding/kernels/csrc/sp24.cu"
CODES = {"0": "16-bit values", "8": "int8 codes", "4": "int4 codes"}
VARIANT = re.compile(r"sp24_kernelI(\w+?)Li(\d+)ELi(\d+)ELi(\d+)ELb([01])(?:ELi(\d))?")
OVER_LOOPS = {0: "-", 1: "rows", 2: "slots", 3: "columns", 4: "mma"}  # sp24.cu's OVER: the slot-loop order (0: none)
ADDRESS = re.compile(r"/\*[0-9a-f]{4,6}\*/")


def cuobjdump() -> str | None:
    """cuobjdump from PATH, or the copy Triton ships."""
    found = shutil.which("cuobjdump")
    if found:
        return found
    try:
        import triton
    except ImportError:
        return None
    bundled = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(bundled) if bundled.is_file() else None


def loop_counts(sass: str) -> list[dict]:
    """One row per sp24_kernel instantiation in the disassembly."""
    rows = []
    for function in re.split(r"\n\s*Function : ", sass)[1:]:
        match = VARIANT.search(function.split("\n", 1)[0])
        if not match:
            continue
        dtype, nt, code, sps, norm, over = match.groups()
        lines = [line for line in function.split("\n") if ADDRESS.search(line)]
        mma = [i for i, line in enumerate(lines) if "HMMA" in line]
        span = lines[mma[0]:mma[-1] + 1] if mma else []
        rows.append({"dtype": "bf16" if "bfloat16" in dtype else "fp16", "nt": int(nt), "code": code,
                     "sps": int(sps), "norm": norm == "1", "instructions": len(lines), "span": len(span),
                     "mma": len(mma), "spills": sum("LDL" in line or "STL" in line for line in span),
                     "over": int(over or 0), "shared_loads": sum("LDS" in line for line in span)})
    return rows


def source_at(rev: str) -> str | None:
    """sp24.cu as it was at git revision `rev`, or None."""
    shown = subprocess.run(["git", "-C", str(REPO), "show", f"{rev}:{SOURCE}"], capture_output=True, text=True)
    return None if shown.returncode else shown.stdout


def compile_sass(text: str, arch: str = "sm_90", defines: tuple[str, ...] = ()) -> tuple[str, str]:
    """(SASS, nvcc's version line) of sp24.cu's source `text`, compiled offline as cuda_mma builds it (-O3, with
    `defines`); RuntimeError with nvcc's last line if it fails. Needs nvcc and cuobjdump."""
    nvcc, dump = shutil.which("nvcc"), cuobjdump()
    if nvcc is None or dump is None:
        raise RuntimeError("needs nvcc and cuobjdump (on PATH, or Triton's bundled cuobjdump)")
    with tempfile.TemporaryDirectory() as work:
        source, obj = Path(work) / "sp24.cu", Path(work) / "sp24.o"
        source.write_text(text)
        number = arch.removeprefix("sm_")
        built = subprocess.run([nvcc, "-O3", "-std=c++17", f"-gencode=arch=compute_{number},code={arch}", *defines,
                                "-c", str(source), "-o", str(obj)], capture_output=True, text=True)
        if built.returncode:
            raise RuntimeError((built.stderr.strip().splitlines() or ["no output"])[-1])
        sass = subprocess.run([dump, "-sass", str(obj)], check=True, capture_output=True, text=True).stdout
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    return sass, version


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rev", help="read sp24.cu from this git revision (default: the working tree)")
    parser.add_argument("--arch", default="sm_90", help="GPU architecture to compile for (default: sm_90)")
    parser.add_argument("--define", action="append", default=[], help="an nvcc -D flag, e.g. --define=-DSP24_COLUMNS")
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    args = parser.parse_args()
    if shutil.which("nvcc") is None or cuobjdump() is None:
        print("error: needs nvcc and cuobjdump (on PATH, or Triton's bundled cuobjdump)", file=sys.stderr)
        return 2
    if args.rev:
        text = source_at(args.rev)
        if text is None:
            print(f"error: no {SOURCE} at revision {args.rev}", file=sys.stderr)
            return 2
    else:
        text = (REPO / SOURCE).read_text()
    try:
        sass, version = compile_sass(text, args.arch, tuple(args.define))
    except RuntimeError as exc:
        print(f"error: nvcc could not build {args.rev or 'the working tree'}'s sp24.cu for {args.arch}: {exc}",
              file=sys.stderr)
        return 1
    rows = sorted(loop_counts(sass), key=lambda r: (r["code"], r["over"], r["norm"], r["nt"], r["sps"], r["dtype"]))
    lines = [f"# sp24 main loop, SASS instruction counts ({args.rev or 'working tree'})", "",
             f"- date: {datetime.date.today().isoformat()}", f"- command: `python {' '.join(sys.argv)}`",
             f"- compiler: {version}, {args.arch}, -O3 {' '.join(args.define)}(an offline compile: no GPU runs "
             "here)", "",
             "Span = first to last sparse MMA of the kernel; per MMA = span / MMAs (for 1-8 rows of x, one MMA a "
             "k-tile). int4 scale loads per step: 16 / 2^gk_shift groups, 4 for 128 columns a scale.", "",
             "| values | x dtype | rows of x | int4 scale loads a step | fused RMSNorm | slot loop | "
             "instructions | span | MMAs | per MMA | spills in span | shared loads in span |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        per = f"{r['span'] / r['mma']:.1f}" if r["mma"] else "-"
        lines.append(f"| {CODES[r['code']]} | {r['dtype']} | {'1-8' if r['nt'] == 1 else '9-16'} | "
                     f"{r['sps'] if r['code'] == '4' else '-'} | {'yes' if r['norm'] else 'no'} | "
                     f"{OVER_LOOPS[r['over']]} | {r['instructions']} | {r['span']} | {r['mma']} | {per} | "
                     f"{r['spills']} | {r['shared_loads']} |")
    report = "\n".join(lines) + "\n"
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
