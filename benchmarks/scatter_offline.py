"""What the scatter kernel (`csrc/nm_scatter.cu`) should cost, read offline (no GPU): ptxas' registers and spills of
every build, the main loop's SASS instructions per step and weight (the loop is unrolled over two steps: from its
first 16-bit shared store to the last MMA before the 65th store), and the shared-memory wavefronts of a step, with
the scatter's bank conflicts simulated on random masks as the kernel's lanes store them (wavefronts of one 16-bit
store instruction: the most distinct 4-byte words any bank gets). Needs nvcc and cuobjdump (Triton's copy will do).

    python benchmarks/scatter_offline.py --out benchmarks/results/scatter_offline_cpu.md
"""

from __future__ import annotations

import argparse
import datetime
import random
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from pathlib import Path

from sass_loop_count import ADDRESS, cuobjdump

REPO = Path(__file__).resolve().parents[1]
SOURCE = REPO / "src" / "sparsedecoding" / "kernels" / "csrc" / "nm_scatter.cu"
BUILDS = {"default (8 warps)": (), "probe (no expansion)": ("-DNM_SCATTER_NO_EXPAND",),
          "4 warps": ("-DNM_SCATTER_WARPS=4",), "16 warps": ("-DNM_SCATTER_WARPS=16",)}
STEP_WEIGHTS = 16 * 128  # a warp's step: 16 rows x 128 columns
TILE_ROW_BYTES, STEP_WORDS = 4 * 64 + 16, 4


def compile_build(nvcc: str, dump: str, defines: tuple[str, ...], work: Path) -> tuple[str, str]:
    """(ptxas' report, SASS) of one build."""
    cubin = work / "k.cubin"
    built = subprocess.run([nvcc, "-O3", "-std=c++17", "-gencode=arch=compute_90,code=sm_90", *defines,
                            "--ptxas-options=-v", "-cubin", "-o", str(cubin), str(SOURCE)], capture_output=True,
                           text=True)
    if built.returncode:
        raise RuntimeError(built.stderr.strip().splitlines()[-1])
    sass = subprocess.run([dump, "-sass", str(cubin)], capture_output=True, text=True, check=True).stdout
    return built.stderr + built.stdout, sass


def resources(report: str) -> list[str]:
    """'NT=n dtype: R registers, S bytes spilled' per kernel instance of a ptxas -v report."""
    rows = []
    for match in re.finditer(r"nm_scatter_kernelI(\w+?)Li(\d)E.*?\n.*?(\d+) bytes spill stores.*?\n.*?Used (\d+) "
                             r"registers", report):
        dtype = "bf16" if "bfloat16" in match.group(1) else "fp16"
        rows.append(f"NT={match.group(2)} {dtype}: {match.group(4)} registers, {match.group(3)} bytes spilled")
    return rows


def loop_counts(sass: str) -> dict[int, tuple[float, Counter]]:
    """Per NT (bf16 instances): (instructions a step, opcode counts of the two-step span)."""
    counts = {}
    for function in re.split(r"\n\s*Function : ", sass)[1:]:
        name = function.split("\n", 1)[0]
        match = re.search(r"nm_scatter_kernelI13__nv_bfloat16Li(\d)E", name)
        if not match:
            continue
        ops = []
        for line in function.split("\n"):
            if ADDRESS.search(line):
                op = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
                if op:
                    ops.append(op.group(1))
        # the loop's two unrolled steps: from the first 16-bit shared store to the last MMA before the 65th (32 kept
        # values a lane and step), which starts the code after the loop (an odd last step, then the block's epilogue)
        stores = [i for i, op in enumerate(ops) if op.startswith("STS.U16")]
        if len(stores) < 64:
            continue
        end = stores[64] if len(stores) > 64 else len(ops)
        last = max(i for i, op in enumerate(ops[:end]) if op.startswith("HMMA"))
        span = ops[stores[0]:last + 1]
        counts[int(match.group(1))] = (len(span) / 2, Counter(op.split(".")[0] for op in span))
    return counts


def scatter_wavefronts(n: int, m: int, trials: int, seed: int) -> float:
    """Mean wavefronts of one scatter store instruction: lane l stores the i-th kept value (from the top) of word
    l & 3 of tile row l >> 2 at byte row·TILE_ROW_BYTES + 64·word + 2·column, masks drawn N:M at random."""
    rng = random.Random(seed)
    total = count = 0
    for _ in range(trials):
        columns = []
        for _lane in range(32):
            kept = []
            for group in range(32 // m):
                kept += [group * m + c for c in rng.sample(range(m), n)]
            columns.append(sorted(kept))
        for i in range(15, -1, -1):
            banks: dict[int, set[int]] = {}
            for lane in range(32):
                address = (lane >> 2) * TILE_ROW_BYTES + (lane & 3) * 64 + 2 * columns[lane][i]
                banks.setdefault(address // 4 % 32, set()).add(address // 4)
            total += max(len(words) for words in banks.values())
            count += 1
    return total / count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--trials", type=int, default=400, help="random warps of masks in the bank simulation")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    if args.trials < 1:
        parser.error("--trials must be at least 1")
    nvcc, dump = shutil.which("nvcc"), cuobjdump()
    if nvcc is None or dump is None:
        print("error: needs nvcc and cuobjdump (on PATH, or Triton's bundled cuobjdump)", file=sys.stderr)
        return 2
    version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-1]
    lines = ["# The scatter kernel offline: registers, main-loop instructions, shared-memory wavefronts", "",
             f"- date: {datetime.date.today().isoformat()}", f"- command: `python {' '.join(sys.argv)}`",
             f"- compiler: {version}, sm_90, -O3 (an offline compile: no GPU runs here; estimates, not timings)", ""]
    with tempfile.TemporaryDirectory() as work:
        sass_default = ""
        lines += ["## ptxas, every build", ""]
        for label, defines in BUILDS.items():
            report, sass = compile_build(nvcc, dump, defines, Path(work))
            lines.append(f"- {label}: " + "; ".join(resources(report)))
            if not defines:
                sass_default = sass
    lines += ["", "## Main loop (default build, bf16)", "",
              "| n-tiles | instructions a step | a weight | HMMA | LDSM | STS | FLO | LDG |", "|---" * 8 + "|"]
    loops = loop_counts(sass_default)
    for nt, (per_step, ops) in sorted(loops.items()):
        steps = 2  # the loop is unrolled over two steps
        lines.append(f"| {nt} | {per_step:.0f} | {per_step / STEP_WEIGHTS:.3f} | {ops['HMMA'] / steps:.0f} | "
                     f"{ops['LDSM'] / steps:.0f} | {ops['STS'] / steps:.0f} | {ops['FLO'] / steps:.0f} | "
                     f"{ops['LDG'] / steps:.0f} |")
    lines += ["", "## Shared-memory wavefronts a step (16 rows x 128 columns)", "",
              "Zeroing: 8 16-byte stores, 4 wavefronts each (conflict-free); scatter: 32 16-bit stores at the "
              "simulated wavefronts each; ldmatrix: 8 for A and 4 a n-tile for B, 4 wavefronts each (conflict-free, "
              "`tests/test_nm_scatter.py`).", "",
              "| masks | wavefronts a scatter store | a step, 1 n-tile | a step, 2 n-tiles |", "|---|---|---|---|"]
    for n, m in ((16, 32), (2, 4)):
        per_store = scatter_wavefronts(n, m, args.trials, seed=n * 100 + m)
        one, two = (32 + 32 * per_store + 4 * (8 + 4 * nt) for nt in (1, 2))
        lines.append(f"| {n}:{m}, random | {per_store:.2f} | {one:.0f} | {two:.0f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        args.out.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
