"""Host (Python) cost of one eager sp24 call on CPU, the library replaced by a C function that returns at once:
reading the kernel settings through `os.environ.get` (and through `op.settings_fingerprint`, where the package has
it), `problem_key`, the cached launch's call and `sp24_linear` (both together) at batch 1 on a 4096x4096 2:4 weight,
what an eager `Sp24Linear` spends before the kernel starts. The CUDA queries (device, capability, stream) are
stood in for, so no GPU is needed; the stand-in library keeps ctypes' argument conversion, the part a Python no-op
would hide: gcc builds two stubs, one with `sp24_launch`'s 33 arguments and one with `sp24_call`'s one pointer.
The package is whichever PYTHONPATH gives (another tree's, e.g. an older commit's from `git archive COMMIT src | tar
-x -C /tmp/old`, so that two versions compare on one host). Best of `--repeats` runs of `--calls` calls, one torch
thread:

    PYTHONPATH=src python benchmarks/sp24_host_cost_cpu.py
    PYTHONPATH=/tmp/old/src python benchmarks/sp24_host_cost_cpu.py
"""

from __future__ import annotations

import argparse
import ctypes
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace

import torch

import sparsedecoding
import sparsedecoding.kernels.sp24 as sp24
from eager_overhead_cpu import best_us
from sparsedecoding.kernels import cuda_mma, op
from sparsedecoding.kernels.format import pack_nm
from sparsedecoding.runenv import environment_markdown
from sparsedecoding.solvers import magnitude

STUBS = {"launch": "int sp24_launch(" + ", ".join(
    ["void* p%d" % i for i in range(8)] + ["int i%d" % i for i in range(11)] + ["void* q%d" % i for i in range(4)]
    + ["float eps", "int pdl"] + ["void* r%d" % i for i in range(3)] + ["int j%d" % i for i in range(3)]
    + ["void* hand", "int heavy"]) + ") { return 0; }\n", "call": "int sp24_call(void* c) { return 0; }\n"}


def build_stubs(folder: Path) -> ctypes.CDLL:
    source = folder / "stubs.c"
    source.write_text("".join(STUBS.values()), encoding="utf-8")
    subprocess.run(["gcc", "-O2", "-shared", "-fPIC", str(source), "-o", str(folder / "stubs.so")], check=True)
    return ctypes.CDLL(str(folder / "stubs.so"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    if shutil.which("gcc") is None:
        print("error: sp24_host_cost_cpu needs gcc for its stub library", file=sys.stderr)
        return 2
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as folder:
        stubs = build_stubs(Path(folder))
        library = SimpleNamespace(sp24_launch=stubs.sp24_launch, sp24_call=stubs.sp24_call,
                                  sp24_dense_launch=SimpleNamespace(), sp24_error_string=SimpleNamespace(),
                                  sp24_rows_per_block=lambda: sp24.ROWS_PER_BLOCK,
                                  sp24_max_smem=lambda: sp24.MAX_SMEM)
        cuda_mma.open_library = lambda source, min_major, defines: library
        sp24.load = lambda: None
        sp24.check_inputs = lambda x, w: None
        torch.cuda.current_device = lambda: 0
        torch.cuda.get_device_capability = lambda device=None: (9, 0)
        torch.cuda.get_device_properties = lambda device=None: SimpleNamespace(multi_processor_count=132)
        torch.cuda.is_current_stream_capturing = lambda: False
        cuda_mma._current_raw_stream = lambda index: 0
        torch.manual_seed(0)
        w = sp24.tile(pack_nm(magnitude(torch.randn(4096, 4096), None, "2:4").bfloat16(), 2, 4))
        x = torch.randn(1, 4096).bfloat16()
        launch = sp24._launches[sp24.problem_key(x, w)] = sp24.Sp24Launch(x, w, 1, 4)
        unset = [name for name in op.SETTINGS if name not in os.environ]
        times = {f"the {len(op.SETTINGS)} settings through os.environ.get ({len(unset)} unset)":
                 best_us(lambda: tuple(map(os.environ.get, op.SETTINGS)), args.calls, args.repeats)}
        if hasattr(op, "settings_fingerprint"):
            times["op.settings_fingerprint"] = best_us(op.settings_fingerprint, args.calls, args.repeats)
        times |= {"problem_key": best_us(lambda: sp24.problem_key(x, w), args.calls, args.repeats),
                 "launch call": best_us(lambda: launch(x, w), args.calls, args.repeats),
                 "sp24_linear": best_us(lambda: sp24.sp24_linear(x, w), args.calls, args.repeats)}
    print(f"# sp24 eager host cost per call, library stubbed ({platform.processor() or platform.machine()}, torch "
          f"{torch.__version__}, Python {platform.python_version()}, package from "
          f"{Path(sparsedecoding.__file__).parents[1]})\n")
    command = "python benchmarks/sp24_host_cost_cpu.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(environment_markdown(command.strip(), torch.device("cpu")))
    print("| " + " | ".join(f"{name} us" for name in times) + " |")
    print("|" + "---|" * len(times))
    print("| " + " | ".join(f"{t:.2f}" for t in times.values()) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
