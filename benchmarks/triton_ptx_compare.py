"""Whether a change to `kernels/triton_spmv.py` changed what `nm_spmv_kernel` compiles to: compile the working tree's
and a git revision's kernel offline for sm_90 (Triton's ASTSource; no GPU needed) at a few split-K settings, and
compare their PTX with debug sections, debug labels and register numbers left out. Prints, per setting, whether
the two are identical and how many lines differ. The counterpart of `sass_compare.py` for sp24.cu.

    python benchmarks/triton_ptx_compare.py --rev HEAD
"""

from __future__ import annotations

import argparse
import difflib
import importlib.util
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

REPO = Path(__file__).resolve().parents[1]
FILE = "src/sparsedecoding/kernels/triton_spmv.py"
# (split_k, batch block, x's pointer type): one row of x (bf16, as the caller passes it) and batches of float32 x
SETTINGS = ((1, 1, "*bf16"), (2, 1, "*bf16"), (3, 16, "*fp32"), (4, 8, "*fp32"))


def module_at(path: Path, name: str):
    """The file at `path` imported as sparsedecoding.kernels.NAME (so that its relative imports resolve)."""
    spec = importlib.util.spec_from_file_location(f"sparsedecoding.kernels.{name}", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def ptx_lines(module, split_k: int, batch_block: int, x_type: str) -> list[str]:
    """nm_spmv_kernel's PTX for a 16:32 weight at this setting, without debug sections, labels or register numbers."""
    signature = {"x_ptr": x_type, "pairs_ptr": "*i32", "bitmask_ptr": "*i32", "y_ptr": "*bf16",
                 "partial_ptr": "*fp32", "arrivals_ptr": "*i32", "out_features": "i32", "words": "i32", "batch": "i32"}
    constants = dict(N=16, M=32, BATCH_BLOCK=batch_block, BLOCK_ROWS=16, BLOCK_WORDS=16, SPLIT_K=split_k,
                     WORD_LANES=1, WARP_WORDS=1, EVEN_ROWS=True, EVEN_WORDS=True, EVEN_BATCH=True, FAST_SCAN=True)
    signature.update({name: "constexpr" for name in constants})
    names = list(signature)
    source = ASTSource(fn=module.nm_spmv_kernel, signature=signature,
                       constexprs={(names.index(name),): value for name, value in constants.items()})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 1})
    text = re.split(r"\.section\s+\.debug", compiled.asm["ptx"])[0]
    lines = [line.split("//")[0].strip() for line in text.splitlines()]
    lines = [line for line in lines if line and not line.startswith((".file", ".loc"))
             and not re.fullmatch(r"\$L__tmp\d+:", line)]
    return [re.sub(r"%[a-z]+\d+", "%R", re.sub(r"\$L__tmp\d+", "$T", line)) for line in lines]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rev", required=True, help="the git revision to compare the working tree with")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO / "src"))
    old_text = subprocess.run(["git", "show", f"{args.rev}:{FILE}"], cwd=REPO, capture_output=True, text=True)
    if old_text.returncode:
        parser.error(f"cannot read {FILE} at {args.rev}: {old_text.stderr.strip()}")
    with tempfile.TemporaryDirectory() as folder:
        old_path = Path(folder) / "triton_spmv_at_rev.py"
        old_path.write_text(old_text.stdout)
        old = module_at(old_path, "triton_spmv_at_rev")
        new = module_at(REPO / FILE, "triton_spmv")
        print(f"{FILE}: nm_spmv_kernel, working tree against {args.rev}, PTX for sm_90 (triton {triton.__version__})")
        for split_k, batch_block, x_type in SETTINGS:
            before, after = ptx_lines(old, split_k, batch_block, x_type), ptx_lines(new, split_k, batch_block, x_type)
            differing = sum(line[:1] in "+-" and line[:3] not in ("+++", "---")
                            for line in difflib.unified_diff(before, after, lineterm="", n=0))
            print(f"- split_k {split_k}, batch block {batch_block}, x {x_type}: {len(before)} / {len(after)} lines, "
                  + ("identical" if before == after else f"{differing} lines differ"))
    return 0


if __name__ == "__main__":
    sys.exit(main())
