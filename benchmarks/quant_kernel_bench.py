"""Quantized sparse N:M kernel (`nmq_spmv`, int8 and int4 kept values) vs cuBLAS bf16 (`F.linear`) vs the dense
weight-only int8 / int4 baselines (our `triton_w8` int8 kernel, which `dense_quantized_mm` runs; PyTorch's
`_weight_int4pack_mm`; PyTorch's `_weight_int8pack_mm` beside ours), on the decoder linear shapes
of the engine presets llama-3.1-8b and qwen3-14b (fused qkv and gate_up, as the engine runs them). Needs a CUDA GPU.

Weights are random codes on the grid (random N:M mask, random bf16-exact scales: one per row for int8, one per row
and 128 columns for int4), packed by `pack_nm_quantized`. Every kernel's output is first checked against a float64
product of its dequantized weight with the autotuner's bound (output rounding plus the worst case of an fp32 sum);
a failing check is reported and makes the script exit 1. Times are medians of CUDA-graph replays that call the
kernel round-robin on enough weight copies to rotate past the L2 cache (`kernel_bench.time_rotated`); every
candidate configuration of the quantized Triton kernel (bit scan, and from batch 2 the dense tile,
`triton_nmq_tile`) is timed that way and the fastest is reported, and for 2:4 the tensor-core kernel on the same
codes (`cuda_mma.nmq_mm_cuda`: default split and split 1, each with expansion and with mma.sp); the notes list the
tuner's own pick (timed by `do_bench`), the fastest configuration of each design, and any candidate the tuner
rejected (compile failure or float64 mismatch).
Bandwidth = bytes that must move / time, next to a large device-to-device copy measured in the same run. Examples:

    PYTHONPATH=src python benchmarks/quant_kernel_bench.py --out benchmarks/results/quant_kernel_h200.md
    PYTHONPATH=src python benchmarks/quant_kernel_bench.py --batches 1 2 4 8 16 --out ...
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kernel_bench import L2_ROTATION_BYTES, Problem, environment, geomean, linear_shapes, time_rotated
from sparsedecoding import solvers
from sparsedecoding.engine.bench import copy_bandwidth
from sparsedecoding.kernels.autotune import output_error
from sparsedecoding.kernels.quantized import DenseQuantized, PackedNMQ, pack_nm_quantized
from sparsedecoding.kernels.triton_nmq import (NmqConfig, candidate_configs, nmq_spmv_triton, rejected_candidates,
                                              tuned_config, tuner_key)

MODELS = ["llama-3.1-8b", "qwen3-14b"]  # the targets' shapes (the default)
MORE_MODELS = ["qwen2.5-coder-1.5b"]  # small shapes, by --models only
SHAPES = ["qkv", "o", "gate_up", "down"]
GROUP_SIZE = 128
TARGETS = {"int8": 2.6, "int4": 3.8}  # issue 13: geomean speedup over cuBLAS bf16 at batch 1, 8B + 14B shapes


def grid_weight(out: int, in_features: int, n: int, m: int, quantize: str, generator) -> torch.Tensor:
    """bf16 [out, in] on the `quantize` grid: random codes, n random kept columns in every m (m = 1 for dense)."""
    low, high = solvers.CODE_RANGES[quantize]
    group = in_features if quantize == "int8" else GROUP_SIZE
    codes = torch.randint(low, high + 1, (out, in_features), device="cuda", generator=generator, dtype=torch.int8)
    if m > 1:
        keys = torch.rand(out, in_features // m, m, device="cuda", generator=generator)
        codes *= (keys.argsort(-1).argsort(-1) < n).view(out, in_features)
    absmax = torch.rand(out, in_features // group, device="cuda", generator=generator) * 0.1 + 0.01
    scales = solvers.grid_scale(absmax, quantize)
    return (codes.float() * scales.repeat_interleave(group, dim=1)).bfloat16()


def full_mask(out: int, in_features: int) -> torch.Tensor:
    return torch.full((out, in_features // 32), -1, dtype=torch.int32, device="cuda")


def weight_bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


def rotation(first, make, nbytes: int) -> list:
    """`first` and enough copies from `make()` that a round over them moves more than L2_ROTATION_BYTES."""
    return [first] + [make() for _ in range(math.ceil(L2_ROTATION_BYTES / nbytes))]


@dataclass
class Row(Problem):
    dense_s: float
    times: dict[str, float] = field(default_factory=dict)  # kernel name -> seconds
    bytes: dict[str, int] = field(default_factory=dict)
    checks: dict[str, float] = field(default_factory=dict)  # error / bound, <= 1 passes
    notes: list[str] = field(default_factory=list)


def bench_sparse(quantize: str, weight: torch.Tensor, n: int, m: int, batches: list[int], reps: int,
                 rows: dict[int, Row]) -> None:
    packed = pack_nm_quantized(weight, n, m, quantize, GROUP_SIZE)
    del weight
    nbytes = weight_bytes(packed.codes, packed.scales, packed.bitmask)
    weights = rotation(packed, lambda: PackedNMQ(packed.codes.clone(), packed.scales.clone(), packed.bitmask.clone(),
                                                 n, m, packed.shape, quantize, packed.group_size), nbytes)
    kept = packed.kept_values()
    name = f"N:M+{quantize}"
    for batch in batches:
        row = rows[batch]
        x = torch.randn(batch, packed.shape[1], device="cuda").bfloat16()
        start = time.perf_counter()
        tuned = tuned_config(x, packed)
        tune_s = time.perf_counter() - start
        rejected = rejected_candidates().get(tuner_key(x, packed), {})
        fastest: dict[str, tuple[float, NmqConfig]] = {}  # per design
        for config in candidate_configs(*packed.bitmask.shape, batch):
            if config in rejected:
                row.notes.append(f"{name} {config} rejected by the tuner: {rejected[config]}")
                continue
            row.checks[f"{name} {config}"] = output_error(nmq_spmv_triton(x, packed, config), x, kept, packed.bitmask)
            seconds, method = time_rotated([lambda p=p, c=config: nmq_spmv_triton(x, p, c) for p in weights], reps)
            fastest[config.design] = min(fastest.get(config.design, (math.inf, config)), (seconds, config),
                                         key=lambda pair: pair[0])
            if config == tuned:
                row.notes.append(f"{name} tuner pick {config}: {seconds * 1e6:.1f} us ({method}; tuned in "
                                 f"{tune_s:.1f} s)")
        best_s, best = min(fastest.values(), key=lambda pair: pair[0])
        row.times[name], row.bytes[name] = best_s, nbytes + 2 * batch * sum(packed.shape)
        row.notes.append(f"{name} fastest {best}; per design: " + ", ".join(
            f"{design} {seconds * 1e6:.1f} us ({config})" for design, (seconds, config) in sorted(fastest.items())))
        print(f"  {name} b{batch}: {best_s * 1e6:.1f} us ({best}), x{row.dense_s / best_s:.2f} vs cuBLAS", flush=True)
        if (n, m) == (2, 4):
            bench_cuda_codes(name, packed, weights, kept, x, reps, row)
    del weights, kept
    torch.cuda.empty_cache()


def bench_cuda_codes(name: str, packed: PackedNMQ, weights: list[PackedNMQ], kept: torch.Tensor, x: torch.Tensor,
                     reps: int, row: Row) -> None:
    """The tensor-core kernel on the same 2:4 codes (`cuda_mma.nmq_mm_cuda`), its default split and split 1, the
    faster one reported; n/a with the reason where it cannot build or run here."""
    from sparsedecoding.errors import KernelInputError
    from sparsedecoding.kernels.cuda_mma import CudaKernelUnavailableError, nmq_mm_cuda

    cuda_name = f"{name} CUDA"
    timed = {}
    for splits in (None, 1):
        for sparse_mma in (False, True):
            setting = f"split {splits or 'default'}{', mma.sp' if sparse_mma else ''}"
            try:
                error = output_error(nmq_mm_cuda(x, packed, splits=splits, sparse_mma=sparse_mma), x, kept,
                                     packed.bitmask)
                row.checks[f"{cuda_name} {setting}"] = error
                if not error <= 1:  # counted as a failure, never timed as the best
                    row.notes.append(f"{cuda_name} {setting}: float64 check FAILED ({error:.3g} x the bound)")
                    continue
                timed[setting], _ = time_rotated(
                    [lambda p=p, s=splits, sp=sparse_mma: nmq_mm_cuda(x, p, splits=s, sparse_mma=sp) for p in weights],
                    reps)
            except (CudaKernelUnavailableError, KernelInputError, RuntimeError) as exc:
                row.notes.append(f"{cuda_name} {setting} n/a: {type(exc).__name__}: {str(exc).splitlines()[0][:120]}")
                print(f"  {cuda_name} {setting}: n/a ({exc})", flush=True)
    if not timed:
        return
    best = min(timed, key=timed.get)
    row.times[cuda_name], row.bytes[cuda_name] = timed[best], row.bytes[name]
    row.notes.append(f"{cuda_name}: " + ", ".join(f"{k} {v * 1e6:.1f} us" for k, v in timed.items()))
    print(f"  {cuda_name} b{x.shape[0]}: {timed[best] * 1e6:.1f} us ({best}), x{row.dense_s / timed[best]:.2f} vs "
          "cuBLAS", flush=True)


def bench_dense_quantized(quantize: str, weight: torch.Tensor, batches: list[int], reps: int,
                          rows: dict[int, Row]) -> None:
    name = f"dense {quantize}"
    grid = solvers.quantization_codes(weight, quantize, GROUP_SIZE)
    try:
        dense = DenseQuantized.from_codes(grid)
        nbytes = weight_bytes(dense.weight, dense.scales)
        weights = rotation(dense, lambda: DenseQuantized(dense.weight.clone(), dense.scales.clone(), quantize,
                                                         dense.group_size, dense.shape), nbytes)
        values = weight.float()
        for batch in batches:
            row = rows[batch]
            x = torch.randn(batch, weight.shape[1], device="cuda").bfloat16()
            row.checks[name] = output_error(dense(x), x, values, full_mask(*weight.shape))
            row.times[name], _ = time_rotated([lambda d=d: d(x) for d in weights], reps)
            row.bytes[name] = nbytes + 2 * batch * sum(weight.shape)
            print(f"  {name} b{batch}: {row.times[name] * 1e6:.1f} us", flush=True)
            if quantize == "int8":  # PyTorch's own int8 kernel beside ours, which dense_quantized_mm runs
                torch_name = "dense int8 PyTorch"
                row.checks[torch_name] = output_error(torch.ops.aten._weight_int8pack_mm(x, dense.weight, dense.scales),
                                                      x, values, full_mask(*weight.shape))
                row.times[torch_name], _ = time_rotated(
                    [lambda d=d: torch.ops.aten._weight_int8pack_mm(x, d.weight, d.scales) for d in weights], reps)
                row.bytes[torch_name] = row.bytes[name]
                print(f"  {torch_name} b{batch}: {row.times[torch_name] * 1e6:.1f} us", flush=True)
    except (RuntimeError, NotImplementedError) as exc:  # e.g. no CUDA kernel for the op in this torch build
        for row in rows.values():
            row.notes.append(f"{name} n/a: {type(exc).__name__}: {str(exc).splitlines()[0][:100]}")
        print(f"  {name}: n/a ({exc})", flush=True)
    torch.cuda.empty_cache()


def bench_shape(model: str, shape: str, pattern: str, batches: list[int], reps: int, generator) -> list[Row]:
    out, in_features = linear_shapes(model, unfused=False)[shape]
    n, m = (int(v) for v in pattern.split(":"))
    print(f"{model} {shape} {out}x{in_features} {pattern}", flush=True)
    dense = torch.randn(out, in_features, device="cuda", generator=generator).bfloat16()
    weights = rotation(dense, dense.clone, weight_bytes(dense))
    rows = {}
    for batch in batches:
        x = torch.randn(batch, in_features, device="cuda", generator=generator).bfloat16()
        dense_s, _ = time_rotated([lambda w=w: F.linear(x, w) for w in weights], reps)
        rows[batch] = Row(model, shape, out, in_features, pattern, batch, dense_s)
        rows[batch].bytes["cuBLAS bf16"] = weight_bytes(dense) + 2 * batch * (out + in_features)
        print(f"  cuBLAS b{batch}: {dense_s * 1e6:.1f} us", flush=True)
    del weights, dense
    for quantize in ("int8", "int4"):
        bench_sparse(quantize, grid_weight(out, in_features, n, m, quantize, generator), n, m, batches, reps, rows)
        bench_dense_quantized(quantize, grid_weight(out, in_features, 1, 1, quantize, generator), batches, reps,
                              rows)
    return list(rows.values())


KERNELS = ["N:M+int8", "N:M+int4", "N:M+int8 CUDA", "N:M+int4 CUDA", "dense int8", "dense int4",
           "dense int8 PyTorch"]


def results_table(rows: list[Row], copy_bw: float) -> str:
    header = " | ".join(f"{k} us (x cuBLAS, % copy bw)" for k in KERNELS)
    lines = [f"| model | linear | out x in | pattern | batch | cuBLAS bf16 us (% copy bw) | {header} | float64 checks |"
             " notes |", "|" + "---|" * (8 + len(KERNELS))]
    for r in rows:
        def cell(name, seconds):
            if name not in r.times and name != "cuBLAS bf16":
                return "n/a"
            bandwidth = r.bytes[name] / seconds / copy_bw * 100
            speedup = "" if name == "cuBLAS bf16" else f"x{r.dense_s / seconds:.2f}, "
            return f"{seconds * 1e6:.1f} ({speedup}{bandwidth:.0f}%)"

        worst = max(r.checks.values(), default=float("nan"))
        check = f"{'ok' if worst <= 1 else 'FAIL'} (worst {worst:.2f} of bound, {len(r.checks)} outputs)"
        cells = " | ".join(cell(k, r.times.get(k, 0.0)) for k in KERNELS)
        lines.append(f"| {r.model} | {r.shape} | {r.out}x{r.in_features} | {r.pattern} | {r.batch} | "
                     f"{cell('cuBLAS bf16', r.dense_s)} | {cells} | {check} | {'; '.join(r.notes)} |")
    return "\n".join(lines) + "\n"


def targets_table(rows: list[Row]) -> str:
    lines = ["| kernel | geomean speedup vs cuBLAS bf16, batch 1, 8B + 14B shapes | goal | verdict |",
             "|---|---|---|---|"]
    two_four = [r for r in rows if r.batch == 1 and r.pattern == "2:4"]
    for quantize, goal in TARGETS.items():
        for kernel, suffix in (("Triton", ""), ("CUDA tensor-core", " CUDA")):
            name = f"N:M+{quantize}{suffix}"
            value = geomean([r.dense_s / r.times[name] for r in two_four if name in r.times])
            verdict = "not measured" if math.isnan(value) else "met" if value >= goal else \
                f"missed by {(goal - value) / goal * 100:.0f}%"
            lines.append(f"| 2:4 + {quantize} ({kernel}) | {value:.2f}x | {goal:.1f}x | {verdict} |")
    for name, label in (("dense int8", "dense int8 (ours, triton_w8)"), ("dense int4", "dense int4 (PyTorch tinygemm)"),
                        ("dense int8 PyTorch", "dense int8 (PyTorch `_weight_int8pack_mm`)")):
        value = geomean([r.dense_s / r.times[name] for r in two_four if name in r.times])
        lines.append(f"| {label} | {value:.2f}x | - | for comparison |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS + MORE_MODELS,
                        help="engine presets (default: %(default)s)")
    parser.add_argument("--shapes", nargs="+", default=SHAPES, choices=SHAPES, help="linears (default: all)")
    parser.add_argument("--patterns", nargs="+", default=["2:4"], help="N:M patterns (default: %(default)s)")
    parser.add_argument("--batches", nargs="+", type=int, default=[1], help="batch sizes 1..16 (default: 1)")
    parser.add_argument("--reps", type=int, default=10, help="timed graph replays, median (default: %(default)s)")
    parser.add_argument("--out", default=None, help="write the markdown report here too (default: print only)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("quant_kernel_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.perf_counter()
    generator = torch.Generator(device="cuda").manual_seed(0)
    copy_bw = copy_bandwidth(torch.device("cuda"), nbytes=2**30, repeats=20)
    rows = []
    for model in args.models:
        for shape in args.shapes:
            for pattern in args.patterns:
                rows += bench_shape(model, shape, pattern, args.batches, args.reps, generator)
    failed = [r for r in rows if any(v > 1 or math.isnan(v) for v in r.checks.values())]
    report = "\n".join([
        "# Quantized sparse N:M kernel vs cuBLAS bf16 vs dense int8 / int4", "", environment(copy_bw),
        f"- int4 group size {GROUP_SIZE}; scales bf16; float64 checks failed in {len(failed)} of {len(rows)} rows",
        "", "## Targets", "", targets_table(rows), "## All measurements", "",
        "Sparse time = the fastest candidate configuration by graph-replay timing. Bytes: N:M = codes + scales + "
        "bitmask + x + y; dense int = codes + scales + x + y; cuBLAS = bf16 W + x + y.", "",
        results_table(rows, copy_bw),
        f"Whole run (tuning and Triton compiles included): {time.perf_counter() - started:.0f} s", ""])
    print(report)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(report)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
