"""Host (Python) cost of one eager `nm_spmv` / `PackedLinear` call with the kernel launch itself stubbed out, on
CPU: what an eager call spends before and around the launch, the part `eager_bench.py` cannot separate from the
kernel on a GPU.

The cached Triton runner (`op._TritonRunner`) is built here without CUDA: its attributes are set as a 4096-row
problem's would be and its compiled launcher is a Python function that does nothing, so every call runs the real
`PackedLinear.forward`, `spmv`, `_run` (signature lookup, layout checks) and runner body (alignment check, output
allocation, x transposed for batch > 1) and stops where Triton's C launcher would start. x and the weight are CPU
tensors, so allocations cost what the CPU allocator costs, not CUDA's caching allocator. Times are the best of
`--repeats` runs of `--calls` calls, one torch thread. Absolute numbers depend on the host: the H200 machine's
host ran F.linear's issue path at about 27 us a call (results/eager_h200.md), several times a desktop CPU. Example:

    PYTHONPATH=src python benchmarks/eager_overhead_cpu.py
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from collections.abc import Callable

import torch

from sparsedecoding.kernels import PackedLinear, nm_spmv, op
from sparsedecoding.runenv import environment_markdown


def stub_runner(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int) -> op.Runner:
    """A `_TritonRunner` for this problem whose launch does nothing (batch block and constants as a tuned
    split-1 tile would have them)."""
    runner = object.__new__(op._TritonRunner)
    runner.vector = x.dim() == 1
    runner.n, runner.m, runner.config = n, m, None
    runner.batch, runner.in_features = (1, x.shape[0]) if runner.vector else x.shape
    runner.out_features, runner.words = bitmask.shape
    runner.batch_block = 1 if runner.batch == 1 else max(8, runner.batch)
    runner.split_k, runner.x_dtype, runner.arrivals = 1, x.dtype, None
    runner.constants = (1,) * 12
    runner.launcher = lambda *arguments: None
    runner.grid, runner.device_index = (512, 1, 1), 0
    runner.current_stream = lambda device_index: 0
    runner.function, runner.packed_metadata = 0, None
    return runner


def best_us(call: Callable[[], object], calls: int, repeats: int) -> float:
    for _ in range(calls // 10):
        call()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for _ in range(calls):
            call()
        best = min(best, (time.perf_counter() - start) / calls * 1e6)
    return best


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4])
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=9)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    op._make_runner = stub_runner
    out_features = in_features = 4096
    weight = torch.randn(out_features, in_features)
    weight = weight * (weight.view(-1, 4).abs().argsort(-1) >= 2).view_as(weight)  # 2:4: the 2 largest of 4
    layer = PackedLinear.from_dense(weight.bfloat16(), 2, 4)
    packed = layer.packed
    nm_op = torch.ops.sparsedecoding.nm_spmv
    print(f"# eager host cost per call, kernel launch stubbed ({platform.processor() or platform.machine()}, "
          f"torch {torch.__version__}, Python {platform.python_version()})\n")
    command = "python benchmarks/eager_overhead_cpu.py " + " ".join(sys.argv[1:] if argv is None else argv)
    print(environment_markdown(command.strip(), torch.device("cpu")))
    print("| batch | runner alone us | nm_spmv us | PackedLinear [b, in] us | PackedLinear [b, 1, in] us | op us |")
    print("|---|---|---|---|---|---|")
    for batch in args.batches:
        x = torch.randn(batch, in_features).bfloat16()
        x3 = x.view(batch, 1, in_features)
        calls = {
            "nm_spmv": lambda: nm_spmv(x, packed),
            "PackedLinear": lambda: layer(x),
            "PackedLinear 3-D": lambda: layer(x3),
            "op": lambda: nm_op(x, packed.values, packed.bitmask, 2, 4),
        }
        for call in calls.values():
            call()  # builds the stub runner
        runner = stub_runner(x, packed.values, packed.bitmask, 2, 4)
        times = [best_us(lambda: runner(x, packed.values, packed.bitmask), args.calls, args.repeats)]
        times += [best_us(call, args.calls, args.repeats) for call in calls.values()]
        print(f"| {batch} | " + " | ".join(f"{t:.2f}" for t in times) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
