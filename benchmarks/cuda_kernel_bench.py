"""Tensor-core kernel (`nm_mm_cuda`, csrc/nm_mma.cu) vs the Triton kernel (`nm_spmv`) vs cuBLAS (`F.linear` on the
dense pruned weight), on the Llama-3.1-8B and Qwen3-14B decoder linears (fused qkv and gate_up, o, down), 2:4 and
16:32, batch 1, 2, 3, 4, 8, 16. Needs a CUDA GPU and nvcc.

Every output of the tensor-core kernel (each split-K setting timed) is first checked against a float64 product;
any failure is marked FAIL and the script exits 1. Times are medians of CUDA-graph replays over enough weight
copies to rotate past the L2 (kernel_bench's helpers); bandwidth = bytes that must move (packed weight, x, y) /
time, against a 1 GiB device copy measured in the same run. Examples:

    PYTHONPATH=src python benchmarks/cuda_kernel_bench.py --quick
    PYTHONPATH=src python benchmarks/cuda_kernel_bench.py --out benchmarks/results/cuda_kernel_h200.md

--dispatch measures what the engine runs instead: `nm_spmv` (the op, with the kernel `op.choose_kernel` picks under
SPARSEDECODING_KERNEL=auto) next to the Triton runner, the tensor-core kernel and cuBLAS, at every batch 1..16, and
prints per pattern the CUDA_FROM_BATCH threshold these measurements give:

    PYTHONPATH=src python benchmarks/cuda_kernel_bench.py --dispatch --out benchmarks/results/cuda_dispatch_h200.md
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from kernel_bench import Problem, geomean, linear_shapes, rotated_weights, time_rotated
from sparsedecoding.engine.bench import copy_bandwidth
from sparsedecoding.kernels import cuda_mma, nm_spmv, op
from sparsedecoding.errors import KernelInputError
from sparsedecoding.kernels.op import KernelChoiceError
from sparsedecoding.kernels.autotune import output_error
from sparsedecoding.runenv import environment_markdown

MODELS = ["llama-3.1-8b", "qwen3-14b"]
SHAPES = ["qkv", "o", "gate_up", "down"]
PATTERNS = ["2:4", "16:32"]
BATCHES = [1, 2, 3, 4, 8, 16]
SPLIT_CHOICES = [1, 4, 8]  # tried besides the default split-K, unless --no-sweep


@dataclass
class Row(Problem):
    cuda_s: float
    default_splits: int
    best_s: float
    best: str
    triton_s: float
    dense_s: float
    sparse_bytes: int
    check: float
    sp_s: float = float("nan")  # 2:4 on sparse tensor cores (sparse_mma, default split, 2 stages); NaN otherwise


def bench_shape(model, shape, pattern, batches, reps, generator, sweep, stages) -> list[Row]:
    out, in_features = linear_shapes(model, unfused=False)[shape]
    n, m = (int(v) for v in pattern.split(":"))
    rotated = rotated_weights(out, in_features, n, m, generator)
    packed, dense_copies, sparse_copies = rotated.packed, rotated.dense_copies, rotated.sparse_copies
    packed_bytes = rotated.packed_bytes
    chunks = -(-in_features // 128)
    rows = []
    for batch in batches:
        x = torch.randn(batch, in_features, device="cuda", generator=generator).bfloat16()
        # the split-K `nm_mm_cuda` picks itself: its library's geometry and CTAs a multiprocessor at this batch
        default = cuda_mma.Launch(x, packed, stages=stages[0]).splits
        splits_tried = sorted({default, *(s for s in SPLIT_CHOICES if s <= chunks)}) if sweep else [default]
        choices = [(s, st, False) for s in splits_tried for st in stages]
        if (n, m) == (2, 4):  # mma.sp: two stages only
            choices += [(s, 2, True) for s in splits_tried]
        check, times = 0.0, {}
        for splits, st, sp in choices:
            try:
                y = cuda_mma.nm_mm_cuda(x, packed, splits=splits, stages=st, sparse_mma=sp)
            except (KernelInputError, RuntimeError) as exc:  # reported, not timed; the expansion must run, so a
                # failure of it counts as a failed check, while mma.sp (new, untested on this GPU) may be n/a
                print(f"  splits {splits}, stages {st}, mma.sp {sp}: n/a ({type(exc).__name__}: {exc})", flush=True)
                if not sp:
                    check = float("inf")
                continue
            error = output_error(y, x, packed.values, packed.bitmask)
            check = max(check, error)
            if not error <= 1:  # a wrong setting is counted as a failure and never the best
                continue
            times[splits, st, sp], _ = time_rotated(
                [lambda p=p, s=splits, st=st, sp=sp: cuda_mma.nm_mm_cuda(x, p, s, st, sp) for p in sparse_copies],
                reps)
        try:
            nm_spmv(x, packed)  # the Triton kernel tunes this problem on first use
            triton_s, _ = time_rotated([lambda p=p: nm_spmv(x, p) for p in sparse_copies], reps)
        except Exception as exc:  # reported in the table; the CUDA kernel's numbers still stand
            print(f"triton nm_spmv failed: {type(exc).__name__}: {exc}", flush=True)
            triton_s = float("nan")
        dense_s, _ = time_rotated([lambda w=w: F.linear(x, w) for w in dense_copies], reps)
        best = min(times, key=times.get) if times else (default, stages[0], False)
        times.setdefault(best, float("nan"))
        io_bytes = 2 * batch * (in_features + out)
        row = Row(model, shape, out, in_features, pattern, batch,
                  times.get((default, stages[0], False), float("nan")), default,
                  times[best], f"{best[0]} splits, {best[1]} stages{', mma.sp' if best[2] else ''}", triton_s,
                  dense_s, packed_bytes + io_bytes, check, times.get((default, 2, True), float("nan")))
        rows.append(row)
        print(f"{model} {shape} {out}x{in_features} {pattern} b{batch}: cuda {row.cuda_s * 1e6:.1f} us "
              f"(splits {default}; best {row.best_s * 1e6:.1f} at {row.best}), triton {triton_s * 1e6:.1f}, cuBLAS "
              f"{dense_s * 1e6:.1f}, x{dense_s / row.cuda_s:.2f} vs cuBLAS, check {check:.2f}"
              f"{'' if check <= 1 else ' FAIL'}", flush=True)
    del rotated, dense_copies, sparse_copies
    torch.cuda.empty_cache()
    return rows


@dataclass
class DispatchRow(Problem):
    kernel: str  # what the op dispatched
    op_s: float
    triton_s: float
    cuda_s: float
    dense_s: float
    sparse_bytes: int
    check: float  # worst of the op, Triton and tensor-core outputs
    timing: str  # "graph", or how a kernel had to be timed otherwise


def bench_dispatch(model, shape, pattern, batches, reps, generator) -> list[DispatchRow]:
    """The op as dispatched, the Triton runner, the tensor-core kernel (default split-K and stages) and cuBLAS on
    one linear shape, every output checked against float64."""
    out, in_features = linear_shapes(model, unfused=False)[shape]
    n, m = (int(v) for v in pattern.split(":"))
    rotated = rotated_weights(out, in_features, n, m, generator)
    packed, dense_copies, sparse_copies = rotated.packed, rotated.dense_copies, rotated.sparse_copies
    packed_bytes = rotated.packed_bytes
    rows = []
    for batch in batches:
        x = torch.randn(batch, in_features, device="cuda", generator=generator).bfloat16()
        kernel, fallback = op.choose_kernel(n, m, batch, op.kernel_setting(), op._cuda_problem)
        triton = op._TritonRunner(x, packed.values, packed.bitmask, n, m)
        outputs = {"op": nm_spmv(x, packed), "triton": triton(x, packed.values, packed.bitmask),
                   "cuda": cuda_mma.nm_mm_cuda(x, packed)}
        check = max(output_error(y, x, packed.values, packed.bitmask) for y in outputs.values())
        times, methods = {}, {}
        for name, call in (("op", lambda p: nm_spmv(x, p)), ("triton", lambda p: triton(x, p.values, p.bitmask)),
                           ("cuda", lambda p: cuda_mma.nm_mm_cuda(x, p)),
                           ("cuBLAS", lambda w: F.linear(x, w))):
            copies = dense_copies if name == "cuBLAS" else sparse_copies
            times[name], methods[name] = time_rotated([lambda c=c, call=call: call(c) for c in copies], reps)
        odd = [f"{name} {method}" for name, method in methods.items() if method != "graph"]
        row = DispatchRow(model, shape, out, in_features, pattern, batch, kernel + (" (fallback)" if fallback else ""),
                          times["op"], times["triton"], times["cuda"], times["cuBLAS"],
                          packed_bytes + 2 * batch * (in_features + out), check, ", ".join(odd) or "graph")
        rows.append(row)
        print(f"{model} {shape} {out}x{in_features} {pattern} b{batch}: op ({row.kernel}) {row.op_s * 1e6:.1f} us, "
              f"triton {row.triton_s * 1e6:.1f}, cuda {row.cuda_s * 1e6:.1f}, cuBLAS {row.dense_s * 1e6:.1f}, "
              f"op x{row.dense_s / row.op_s:.2f} vs cuBLAS, check {check:.2f}{'' if check <= 1 else ' FAIL'}",
              flush=True)
    del rotated, dense_copies, sparse_copies
    torch.cuda.empty_cache()
    return rows


def markdown_table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(cells) + " |" for cells in rows]) + "\n"


def check_cell(error: float) -> str:
    return f"{'ok' if error <= 1 else 'FAIL'} ({error:.2f})"


def bandwidth_cell(nbytes: int, seconds: float, copy_bw: float) -> str:
    return f"{nbytes / seconds / 1e12:.2f} ({100 * nbytes / seconds / copy_bw:.0f}%)"


def by_pattern_and_batch(rows: list) -> list[tuple[str, int, list]]:
    return [(pattern, batch, [r for r in rows if r.pattern == pattern and r.batch == batch])
            for pattern in sorted({r.pattern for r in rows}) for batch in sorted({r.batch for r in rows})]


def dispatch_summary(rows: list[DispatchRow]) -> str:
    """Per pattern and batch, geomean speedups over cuBLAS: each kernel and the op; the kernels the op ran."""
    cells = []
    for pattern, batch, rs in by_pattern_and_batch(rows):
        op_speed = [r.dense_s / r.op_s for r in rs]
        cells.append([pattern, str(batch), f"{geomean([r.dense_s / r.cuda_s for r in rs]):.2f}x",
                      f"{geomean([r.dense_s / r.triton_s for r in rs]):.2f}x", f"{geomean(op_speed):.2f}x",
                      f"{min(op_speed):.2f}x", ", ".join(sorted({r.kernel for r in rs}))])
    return markdown_table(["pattern", "batch", "cuda geomean", "triton geomean", "op geomean", "op min", "op kernel"],
                          cells)


def thresholds(rows: list[DispatchRow]) -> str:
    """Per pattern, the CUDA_FROM_BATCH entry these rows give (the rule stated in kernels/op.py): the smallest batch
    from which the tensor-core kernel's geomean beats Triton's at every measured batch; next to the one in use."""
    lines = []
    for pattern in sorted({r.pattern for r in rows}):
        n, m = (int(v) for v in pattern.split(":"))
        batches = sorted({r.batch for r in rows if r.pattern == pattern})
        wins = {b: geomean([r.triton_s / r.cuda_s for r in rows if r.pattern == pattern and r.batch == b]) > 1
                for b in batches}
        first = next((b for b in batches if all(wins[c] for c in batches if c >= b)), None)
        lines.append(f"- {pattern}: tensor-core kernel from batch {first if first is not None else 'none (never)'}"
                     f"; op.CUDA_FROM_BATCH has {op.CUDA_FROM_BATCH.get((n, m), 'no entry (Triton)')}")
    return "\n".join(lines) + "\n"


def dispatch_table(rows: list[DispatchRow], copy_bw: float) -> str:
    header = ["model", "linear", "out x in", "pattern", "batch", "op kernel", "op us", "triton us", "cuda us",
              "cuBLAS us", "op vs cuBLAS", "triton vs cuBLAS", "cuda vs cuBLAS", "op TB/s (% copy)", "float64 check",
              "timing"]
    return markdown_table(header, [
        [r.model, r.shape, f"{r.out}x{r.in_features}", r.pattern, str(r.batch), r.kernel,
         *(f"{t * 1e6:.1f}" for t in (r.op_s, r.triton_s, r.cuda_s, r.dense_s)),
         *(f"{r.dense_s / t:.2f}" for t in (r.op_s, r.triton_s, r.cuda_s)),
         bandwidth_cell(r.sparse_bytes, r.op_s, copy_bw), check_cell(r.check), r.timing] for r in rows])


def results_table(rows: list[Row], copy_bw: float) -> str:
    header = ["model", "linear", "out x in", "pattern", "batch", "cuda us (splits)", "mma.sp us", "best us (setting)",
              "triton us", "cuBLAS us", "cuda vs cuBLAS", "mma.sp vs cuBLAS", "best vs cuBLAS", "triton vs cuBLAS",
              "cuda TB/s (% copy)", "float64 check"]
    return markdown_table(header, [
        [r.model, r.shape, f"{r.out}x{r.in_features}", r.pattern, str(r.batch),
         f"{r.cuda_s * 1e6:.1f} ({r.default_splits})", f"{r.sp_s * 1e6:.1f}", f"{r.best_s * 1e6:.1f} ({r.best})",
         f"{r.triton_s * 1e6:.1f}", f"{r.dense_s * 1e6:.1f}",
         *(f"{r.dense_s / t:.2f}" for t in (r.cuda_s, r.sp_s, r.best_s, r.triton_s)),
         bandwidth_cell(r.sparse_bytes, r.cuda_s, copy_bw), check_cell(r.check)] for r in rows])


def summary_table(rows: list[Row]) -> str:
    """Per pattern and batch: geomean and minimum speedup over cuBLAS of each kernel, and of the faster of the two."""
    cells = []
    for pattern, batch, rs in by_pattern_and_batch(rows):
        cuda = [r.dense_s / r.cuda_s for r in rs]
        cells.append([pattern, str(batch), f"{geomean(cuda):.2f}x", f"{min(cuda):.2f}x",
                      f"{geomean([r.dense_s / r.sp_s for r in rs]):.2f}x" if pattern == "2:4" else "-",
                      f"{geomean([r.dense_s / r.best_s for r in rs]):.2f}x",
                      f"{geomean([r.dense_s / r.triton_s for r in rs]):.2f}x",
                      f"{geomean([r.dense_s / min(r.cuda_s, r.triton_s) for r in rs]):.2f}x"])
    return markdown_table(["pattern", "batch", "cuda geomean", "cuda min", "mma.sp geomean", "best-setting geomean",
                           "triton geomean", "max(cuda, triton) geomean"], cells)


def environment(copy_bw: float, build_s: float) -> str:
    props = torch.cuda.get_device_properties(0)
    version = subprocess.run([cuda_mma._nvcc(), "--version"], capture_output=True, text=True).stdout.strip()
    return (environment_markdown(" ".join(["python", *sys.argv]), torch.device("cuda"))
            + f"- GPU: {props.multi_processor_count} SMs, compute capability {props.major}.{props.minor}\n"
            + f"- nvcc: {version.splitlines()[-1] if version else 'unknown'}\n"
            + f"- copy bandwidth (device-to-device, read + written): {copy_bw / 1e12:.2f} TB/s\n"
            + f"- kernel build (or cache load) at first use: {build_s:.1f} s\n"
            + geometry_line())


def geometry_line() -> str:
    """The tensor-core kernel's CTA geometry, set or default, with the CTAs a multiprocessor holds by shared memory
    (two stages; one n-tile for batch 1-8, two for 9-16)."""
    rows, words = cuda_mma.geometry()
    fits = cuda_mma._load().nm_mma_ctas_per_sm
    setting = os.environ.get(cuda_mma.GEOMETRY_SETTING, "").strip() or "unset (default)"
    return (f"- tensor-core kernel geometry ({cuda_mma.GEOMETRY_SETTING}={setting}): {rows} rows a CTA, {words} mask "
            f"words a stage; {fits(1, 2)} CTAs a multiprocessor at batch 1-8, {fits(2, 2)} at 9-16 (two stages)\n")


def write_report(report: str, out: str | None) -> None:
    print(report)
    if out:
        with open(out, "w", encoding="utf-8") as handle:
            handle.write(report)


def dispatch_main(args, started: float, copy_bw: float, build_s: float, generator: torch.Generator) -> int:
    rows = []
    for model in args.models:
        for shape in SHAPES:
            for pattern in args.patterns:
                rows += bench_dispatch(model, shape, pattern, args.batches, args.reps, generator)
    failures = [r for r in rows if r.check > 1]
    setting = os.environ.get(op.KERNEL_SETTING, "")
    report = "\n".join([
        "# nm_spmv as dispatched vs its two kernels vs cuBLAS", "", environment(copy_bw, build_s)
        + f"- {op.KERNEL_SETTING}: {setting or 'unset (auto)'}\n",
        "## Speedup over cuBLAS per pattern and batch (geomean over shapes)", "", dispatch_summary(rows),
        "## Thresholds these measurements give (rule in kernels/op.py, CUDA_FROM_BATCH)", "", thresholds(rows),
        "## All measurements", "",
        "op = `nm_spmv` (the cached runner the engine calls; kernel chosen by `op.choose_kernel`); triton = the "
        "Triton runner built for the problem (tuned); cuda = `nm_mm_cuda` with its default split-K and stages. "
        "Times: median per call of CUDA-graph replays over weight copies rotating past the L2. Bytes: packed values "
        "+ bitmask + x + y. float64 check = worst output error / bound of the three sparse outputs (<= 1 passes).",
        "", dispatch_table(rows, copy_bw),
        f"float64 failures: {len(failures)}. Whole run: {time.perf_counter() - started:.0f} s", ""])
    write_report(report, args.out)
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="Llama-3.1-8B shapes, batch 1, 4, 8, 16, 2:4 only")
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS)
    parser.add_argument("--patterns", nargs="+", default=PATTERNS)
    parser.add_argument("--batches", nargs="+", type=int, default=None,
                        help=f"default {BATCHES}, with --dispatch 1..16")
    parser.add_argument("--dispatch", action="store_true",
                        help="time the dispatched op (what the engine runs) next to both kernels and cuBLAS")
    parser.add_argument("--no-sweep", action="store_true", help="time only the default split-K setting")
    parser.add_argument("--stages", nargs="+", type=int, default=[cuda_mma.DEFAULT_STAGES],
                        help="pipeline depths to time; the first is the one in the cuda column")
    parser.add_argument("--reps", type=int, default=10, help="timed graph replays per measurement (median)")
    parser.add_argument("--out", default=None, help="write the markdown report here too")
    args = parser.parse_args(argv)
    try:
        cuda_mma.geometry_setting()
    except KernelChoiceError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    if not cuda_mma.available():
        print("cuda_kernel_bench needs a CUDA GPU and nvcc", file=sys.stderr)
        return 2
    if args.batches is None:
        args.batches = list(range(1, op.MAX_BATCH + 1)) if args.dispatch else BATCHES
    if args.quick:
        args.models, args.batches, args.patterns = ["llama-3.1-8b"], [1, 4, 8, 16], ["2:4"]
    started = time.perf_counter()
    try:
        cuda_mma.load()  # the library of SPARSEDECODING_NM_MMA_GEOMETRY (default: unset)
    except cuda_mma.CudaKernelUnavailableError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    build_s = time.perf_counter() - started
    print(f"built in {build_s:.1f} s\n{cuda_mma.compile_log()}", flush=True)
    generator = torch.Generator(device="cuda").manual_seed(0)
    copy_bw = copy_bandwidth(torch.device("cuda"))
    if args.dispatch:
        return dispatch_main(args, started, copy_bw, build_s, generator)
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
        "cuda = `nm_mm_cuda` with its default split-K and the first --stages; mma.sp = the same on sparse tensor "
        "cores (`sparse_mma=True`, 2:4 only, 2 stages); best = fastest of the split-K, pipeline and mma.sp settings "
        "tried (each checked against float64). Bytes: packed values + bitmask + x + y.", "",
        results_table(rows, copy_bw),
        f"float64 failures: {len(failures)}. Whole run: {time.perf_counter() - started:.0f} s", ""])
    write_report(report, args.out)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
