"""Static cost of the quantized kernel's two designs, without a GPU: compile `nmq_spmv_kernel` (bit scan) and
`nmq_tile_kernel` (dense tile) for sm_90 with Triton's bundled ptxas, disassemble with its nvdisasm, and count the
SASS instructions of the main loop (the innermost backward branch). Reported per (row, mask word) pair as warp
instructions: loop instructions × warps / (rows × words per step), the issue-slot cost that a word costs an SM.
Registers and local memory (spills) come from cuobjdump. Numbers in benchmarks/KERNEL_NOTES.md ("Dense tile
design"). Example:

    TRITON_DEFAULT_FP_FUSION=1 PYTHONPATH=src python benchmarks/nmq_sass_count.py
"""

from __future__ import annotations

import collections
import datetime
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from sparsedecoding.kernels.triton_nmq import nmq_spmv_kernel
from sparsedecoding.kernels.triton_nmq_tile import nmq_tile_kernel

TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
# (design, bits, n, m, rows, words, warps, batch block): the H200's usual tuner picks of the scan design and the
# tile design's candidates, 2:4 int4 and int8 at batch 1, one wide batch
CASES = [("scan", 4, 2, 4, 4, 32, 4, 1), ("scan", 8, 2, 4, 4, 32, 4, 1), ("tile", 4, 2, 4, 16, 8, 4, 1),
         ("tile", 8, 2, 4, 16, 8, 4, 1), ("tile", 4, 2, 4, 8, 4, 1, 1), ("tile", 4, 2, 4, 16, 8, 4, 16)]


def compile_cubin(design: str, bits: int, n: int, m: int, rows: int, words: int, warps: int, batch_block: int):
    kernel = nmq_spmv_kernel if design == "scan" else nmq_tile_kernel
    signature = {"x_ptr": "*bf16" if batch_block == 1 else "*fp32", "codes_ptr": "*i32", "scales_ptr": "*bf16",
                 "bitmask_ptr": "*i32", "y_ptr": "*bf16", "out_features": "i32", "words": "i32", "batch": "i32",
                 "groups": "i32"}
    constants = dict(N=n, M=m, BITS=bits, WORDS_PER_GROUP=4, BATCH_BLOCK=batch_block, BLOCK_ROWS=rows,
                     BLOCK_WORDS=words, SPLIT_K=1, EVEN_WORDS=True)
    if design == "scan":
        constants["FAST_SCAN"] = True
    signature.update({name: "constexpr" for name in constants})
    names = list(signature)
    source = ASTSource(kernel, signature, constexprs={(names.index(k),): v for k, v in constants.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": warps,
                                                                                  "num_stages": 1})
    return compiled.asm["cubin"]


def loop_opcodes(sass: str) -> collections.Counter:
    """Opcodes of the instructions from the innermost backward branch's target to the branch."""
    instructions, labels, loops = [], {}, []
    for line in sass.splitlines():
        label = re.match(r"^(\.L\w+):", line.strip())
        if label:
            labels[label.group(1)] = len(instructions)
        match = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.*?);", line)
        if match:
            text = re.sub(r"^@!?U?P\w+\s+", "", match.group(1).strip())
            branch = re.search(r"BRA\s+(?:`\()?(\.L\w+)", text)
            if branch and labels.get(branch.group(1), len(instructions) + 1) <= len(instructions):
                loops.append((labels[branch.group(1)], len(instructions)))
            instructions.append(text.split()[0].split(".")[0])
    start, end = max(loops, key=lambda loop: loop[1] - loop[0])
    return collections.Counter(instructions[start:end + 1])


def main() -> int:
    ptxas = subprocess.run([TOOLS / "ptxas", "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    print(f"- date: {datetime.date.today().isoformat()}\n- device: none (offline compile for sm_90)\n"
          f"- software: triton {triton.__version__}, ptxas {ptxas[-1] if ptxas else 'not found'}\n"
          f"- command: `python benchmarks/nmq_sass_count.py`\n")
    print("| design | code | rows x words, warps | batch | registers | spill bytes | loop instructions | "
          "warp instructions per (row, word) | most frequent |")
    print("|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for design, bits, n, m, rows, words, warps, batch_block in CASES:
            path = Path(folder) / "kernel.cubin"
            path.write_bytes(compile_cubin(design, bits, n, m, rows, words, warps, batch_block))
            usage = subprocess.run([TOOLS / "cuobjdump", "--dump-resource-usage", path], capture_output=True,
                                   text=True, check=True).stdout
            registers, local = re.search(r"REG:(\d+)", usage).group(1), re.search(r"LOCAL:(\d+)", usage).group(1)
            sass = subprocess.run([TOOLS / "nvdisasm", "-c", path], capture_output=True, text=True, check=True).stdout
            opcodes = loop_opcodes(sass)
            total = sum(opcodes.values())
            top = ", ".join(f"{op} {count}" for op, count in opcodes.most_common(6))
            print(f"| {design} | {n}:{m} int{bits} | {rows}x{words}, {warps} | {batch_block} | {registers} | {local} | "
                  f"{total} | {total * warps / (rows * words):.1f} | {top} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
