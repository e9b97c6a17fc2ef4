"""Tensor-core kernel (`nm_mm_cuda`, csrc/nm_mma.cu) vs the Triton kernel (`nm_spmv`) vs cuBLAS (`F.linear` on the
dense pruned weight), on the Llama-3.1-8B and Qwen3-14B decoder linears (fused qkv and gate_up, o, down), 2:4 and
16:32, batch 1, 2, 3, 4, 8, 16. Needs a CUDA GPU and nvcc.

Every output of the tensor-core kernel (each split-K setting timed) is first checked against a float64 product;
any failure is marked FAIL and the script exits 1. Times are medians of CUDA-graph replays over enough weight
copies to rotate past the L2 (kernel_bench's helpers); bandwidth = bytes that must move (packed weight, x, y) /
time, against a 1 GiB device copy measured in the same run. Examples:

    PYTHONPATH=src python benchmarks/cuda_kernel_bench.py --quick
    PYTHONPATH=src python benchmarks/cuda_kernel_bench.py --out benchmarks/results/cuda_kernel_h200.md
"""

from __future__ import annotations

import argparse
import math
import subprocess
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernel_bench import L2_ROTATION_BYTES, geomean, linear_shapes, random_nm_weight, time_rotated
from sparsedecoding.engine.bench import copy_bandwidth
from sparsedecoding.kernels import PackedNM, cuda_mma, nm_spmv, pack_nm
from sparsedecoding.kernels.autotune import output_error
from sparsedecoding.runenv import environment_markdown

MODELS = ["llama-3.1-8b", "qwen3-14b"]
SHAPES = ["qkv", "o", "gate_up", "down"]
PATTERNS = ["2:4", "16:32"]
BATCHES = [1, 2, 3, 4, 8, 16]
SPLIT_CHOICES = [1, 4, 8]  # tried besides the default split-K, unless --no-sweep


@dataclass
class Row:
    model: str
    shape: str
    out: int
    in_features: int
    pattern: str
    batch: int
    cuda_s: float
    default_splits: int
    best_s: float
    best: str
    triton_s: float
    dense_s: float
    sparse_bytes: int
    check: float


def bench_shape(model, shape, pattern, batches, reps, generator, sweep, stages) -> list[Row]:
    out, in_features = linear_shapes(model, unfused=False)[shape]
    n, m = (int(v) for v in pattern.split(":"))
    weight = random_nm_weight(out, in_features, n, m, generator)
    packed = pack_nm(weight, n, m)
    weight_bytes = weight.numel() * 2
    packed_bytes = packed.values.numel() * 2 + packed.bitmask.numel() * 4
    dense_copies = [weight] + [weight.clone() for _ in range(math.ceil(L2_ROTATION_BYTES / weight_bytes))]
    sparse_copies = [packed] + [PackedNM(packed.values.clone(), packed.bitmask.clone(), n, m, packed.shape)
                                for _ in range(math.ceil(L2_ROTATION_BYTES / packed_bytes))]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    default = cuda_mma.default_splits(out, in_features // 32, sms)
    chunks = -(-in_features // 128)
    splits_tried = sorted({default, *(s for s in SPLIT_CHOICES if s <= chunks)}) if sweep else [default]
    choices = [(s, st) for s in splits_tried for st in stages]
    rows = []
    for batch in batches:
        x = torch.randn(batch, in_features, device="cuda", generator=generator).bfloat16()
        check, times = 0.0, {}
        for splits, st in choices:
            y = cuda_mma.nm_mm_cuda(x, packed, splits=splits, stages=st)
            check = max(check, output_error(y, x, packed.values, packed.bitmask))
            times[splits, st], _ = time_rotated([lambda p=p, s=splits, st=st: cuda_mma.nm_mm_cuda(x, p, s, st)
                                                 for p in sparse_copies], reps)
        try:
            nm_spmv(x, packed)  # the Triton kernel tunes this problem on first use
            triton_s, _ = time_rotated([lambda p=p: nm_spmv(x, p) for p in sparse_copies], reps)
        except Exception as exc:  # reported in the table; the CUDA kernel's numbers still stand
            print(f"triton nm_spmv failed: {type(exc).__name__}: {exc}", flush=True)
            triton_s = float("nan")
        dense_s, _ = time_rotated([lambda w=w: F.linear(x, w) for w in dense_copies], reps)
        best = min(times, key=times.get)
        io_bytes = 2 * batch * (in_features + out)
        row = Row(model, shape, out, in_features, pattern, batch, times[default, stages[0]], default, times[best],
                  f"{best[0]} splits, {best[1]} stages", triton_s, dense_s, packed_bytes + io_bytes, check)
        rows.append(row)
        print(f"{model} {shape} {out}x{in_features} {pattern} b{batch}: cuda {row.cuda_s * 1e6:.1f} us "
              f"(splits {default}; best {row.best_s * 1e6:.1f} at {row.best}), triton {triton_s * 1e6:.1f}, cuBLAS "
              f"{dense_s * 1e6:.1f}, x{dense_s / row.cuda_s:.2f} vs cuBLAS, check {check:.2f}"
              f"{'' if check <= 1 else ' FAIL'}", flush=True)
    del dense_copies, sparse_copies
    torch.cuda.empty_cache()
    return rows


def results_table(rows: list[Row], copy_bw: float) -> str:
    lines = ["| model | linear | out x in | pattern | batch | cuda us (splits) | best us (setting) | triton us | "
             "cuBLAS us | cuda vs cuBLAS | best vs cuBLAS | triton vs cuBLAS | cuda TB/s (% copy) | float64 check |",
             "|" + "---|" * 14]
    for r in rows:
        bw = r.sparse_bytes / r.cuda_s
        lines.append(f"| {r.model} | {r.shape} | {r.out}x{r.in_features} | {r.pattern} | {r.batch} | "
                     f"{r.cuda_s * 1e6:.1f} ({r.default_splits}) | {r.best_s * 1e6:.1f} ({r.best}) | "
                     f"{r.triton_s * 1e6:.1f} | {r.dense_s * 1e6:.1f} | {r.dense_s / r.cuda_s:.2f} | "
                     f"{r.dense_s / r.best_s:.2f} | {r.dense_s / r.triton_s:.2f} | {bw / 1e12:.2f} "
                     f"({100 * bw / copy_bw:.0f}%) | {'ok' if r.check <= 1 else 'FAIL'} ({r.check:.2f}) |")
    return "\n".join(lines) + "\n"


def summary_table(rows: list[Row]) -> str:
    """Per pattern and batch: geomean and minimum speedup over cuBLAS of each kernel, and of the faster of the two."""
    lines = ["| pattern | batch | cuda geomean | cuda min | best-setting geomean | triton geomean | "
             "max(cuda, triton) geomean |", "|---|---|---|---|---|---|---|"]
    for pattern in sorted({r.pattern for r in rows}):
        for batch in sorted({r.batch for r in rows}):
            rs = [r for r in rows if r.batch == batch and r.pattern == pattern]
            cuda = [r.dense_s / r.cuda_s for r in rs]
            lines.append(f"| {pattern} | {batch} | {geomean(cuda):.2f}x | {min(cuda):.2f}x | "
                         f"{geomean([r.dense_s / r.best_s for r in rs]):.2f}x | "
                         f"{geomean([r.dense_s / r.triton_s for r in rs]):.2f}x | "
                         f"{geomean([r.dense_s / min(r.cuda_s, r.triton_s) for r in rs]):.2f}x |")
    return "\n".join(lines) + "\n"


def environment(copy_bw: float, build_s: float) -> str:
    props = torch.cuda.get_device_properties(0)
    version = subprocess.run([cuda_mma._nvcc(), "--version"], capture_output=True, text=True).stdout.strip()
    return (environment_markdown(" ".join(["python", *sys.argv]), torch.device("cuda"))
            + f"- GPU: {props.multi_processor_count} SMs, compute capability {props.major}.{props.minor}\n"
            + f"- nvcc: {version.splitlines()[-1] if version else 'unknown'}\n"
            + f"- copy bandwidth (device-to-device, read + written): {copy_bw / 1e12:.2f} TB/s\n"
            + f"- kernel build (or cache load) at first use: {build_s:.1f} s\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="Llama-3.1-8B shapes, batch 1, 4, 8, 16, 2:4 only")
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    parser.add_argument("--patterns", nargs="+", default=PATTERNS)
    parser.add_argument("--batches", nargs="+", type=int, default=BATCHES)
    parser.add_argument("--no-sweep", action="store_true", help="time only the default split-K setting")
    parser.add_argument("--stages", nargs="+", type=int, default=[cuda_mma.DEFAULT_STAGES],
                        help="pipeline depths to time; the first is the one in the cuda column")
    parser.add_argument("--reps", type=int, default=10, help="timed graph replays per measurement (median)")
    parser.add_argument("--out", default=None, help="write the markdown report here too")
    args = parser.parse_args(argv)
    if not cuda_mma.available():
        print("cuda_kernel_bench needs a CUDA GPU and nvcc", file=sys.stderr)
        return 2
    if args.quick:
        args.models, args.batches, args.patterns = ["llama-3.1-8b"], [1, 4, 8, 16], ["2:4"]
    started = time.perf_counter()
    try:
        cuda_mma.build()
    except cuda_mma.CudaKernelUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    build_s = time.perf_counter() - started
    print(f"built in {build_s:.1f} s\n{cuda_mma.compile_log()}", flush=True)
    generator = torch.Generator(device="cuda").manual_seed(0)
    copy_bw = copy_bandwidth(torch.device("cuda"))
    rows = []
    for model in args.models:
        for shape in SHAPES:
            for pattern in args.patterns:
                rows += bench_shape(model, shape, pattern, args.batches, args.reps, generator, not args.no_sweep,
                                    args.stages)
    failures = [r for r in rows if r.check > 1]
    report = "\n".join([
        "# Tensor-core N:M kernel (CUDA) vs Triton nm_spmv vs cuBLAS", "", environment(copy_bw, build_s),
        "## Speedup over cuBLAS per pattern and batch (geomean over shapes)", "", summary_table(rows),
        "## All measurements", "",
        "cuda = `nm_mm_cuda` with its default split-K and the first --stages; best = fastest of the split-K and "
        "pipeline settings tried (each checked against float64). Bytes: packed values + bitmask + x + y.", "",
        results_table(rows, copy_bw),
        f"float64 failures: {len(failures)}. Whole run: {time.perf_counter() - started:.0f} s", ""])
    print(report)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(report)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
