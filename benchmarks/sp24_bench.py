"""The tiled 2:4 sparse tensor-core kernel (`sp24_mm`, csrc/sp24.cu) vs cuBLAS on the dense pruned weight and vs
what the op dispatches today (`nm_spmv`: the Triton kernel at batch 1, nm_mma.cu from batch 2), on the decoder
linears of Llama-3.1-8B and Qwen3-14B, batch 1, 2, 4, 8, 16; the same kernel with int8 and int4 (128 columns a
scale) kept values. Needs a CUDA GPU (compute capability 9.0) and nvcc.

Every output (each split setting timed) is first checked against a float64 product; a failure is marked FAIL and
the script exits 1. Times are medians of CUDA-graph replays over enough weight copies to rotate past the L2
(kernel_bench's helpers); bandwidth = bytes that must move / time, against a device copy measured in the same
run. Issue 12's targets (2:4 bf16 vs cuBLAS, geomean over the 8 shapes: >= 1.60x at batch 1, >= 1.30x at 2-8,
>= 1.10x at 16, never below 1.0x) and issue 13's (batch 1: int8 >= 2.6x, int4 >= 3.8x) are tabled first.

    PYTHONPATH=src python benchmarks/sp24_bench.py --out benchmarks/results/sp24_h200.md
"""

from __future__ import annotations

import argparse
import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from kernel_bench import L2_ROTATION_BYTES, geomean, linear_shapes, random_nm_weight, time_rotated
from quant_kernel_bench import grid_weight
from cuda_kernel_bench import environment, write_report
from sparsedecoding.engine.bench import copy_bandwidth
from sparsedecoding.errors import KernelInputError, SparseDecodingError
from sparsedecoding.kernels.autotune import Float64Reference
from sparsedecoding.kernels import nm_spmv
from sparsedecoding.kernels.format import pack_nm
from sparsedecoding.kernels import op
from sparsedecoding.kernels.op import sp24_pdl_setting
from sparsedecoding.kernels.quantized import pack_nm_quantized
from sparsedecoding.kernels.sp24 import (Sp24Launch, Sp24Weight, default_splits, launch_label, min_splits, tile,
                                         tiled_to_dense, tuned_launch)

MODELS = ["llama-3.1-8b", "qwen3-14b"]
SHAPES = ["qkv", "o", "gate_up", "down"]
BATCHES = [1, 2, 4, 8, 16]
KINDS = ["bf16", "int8", "int4"]
SPLIT_CHOICES = [1, 2, 4, 8, 16]  # tried besides the default
GROUP_SIZE = 128
TARGETS_12 = {1: 1.60, 2: 1.30, 4: 1.30, 8: 1.30, 16: 1.10}
TARGETS_13 = {"int8": 2.6, "int4": 3.8}


@dataclass
class Row:
    model: str
    shape: str
    out: int
    in_features: int
    batch: int
    dense_s: float
    times: dict[str, float] = field(default_factory=dict)  # "bf16" / "int8" / "int4" (default split), "op"
    best: dict[str, tuple[float, int]] = field(default_factory=dict)  # kind -> (seconds, splits)
    baseline: dict[str, tuple[float, str]] = field(default_factory=dict)  # kind -> (seconds, launch) under --baseline
    tuned: dict[str, tuple[float, int]] = field(default_factory=dict)  # the engine's tuner pick, timed again
    splits: dict[str, int] = field(default_factory=dict)
    bytes: dict[str, int] = field(default_factory=dict)
    checks: dict[str, float] = field(default_factory=dict)  # worst error / bound per kind, <= 1 passes


def float64_error(y: torch.Tensor, x: torch.Tensor, weight64: torch.Tensor) -> float:
    """y's largest error over the float64 bound the engine's tuner uses (`autotune.Float64Reference`); ≤ 1 passes."""
    return Float64Reference.of_rows(x, weight64.shape[0], lambda r0, r1: weight64[r0:r1]).error(y)


def copies(w: Sp24Weight) -> list[Sp24Weight]:
    return [w] + [w.clone() for _ in range(math.ceil(L2_ROTATION_BYTES / w.nbytes))]


@contextlib.contextmanager
def environment_set(values: dict[str, str]):
    """The environment with `values` set, as it was afterwards."""
    before = {name: os.environ.get(name) for name in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def baseline_settings(parser: argparse.ArgumentParser, items: list[str]) -> dict[str, str]:
    """--baseline's NAME=VALUE items as a dict, each name a kernel setting (op.SETTINGS) and each value one it
    accepts; anything else ends the run through `parser.error` (one line, exit 2) before any GPU work."""
    baseline = {}
    for item in items:
        name, _, value = item.partition("=")
        if name not in op.SETTINGS or not value:
            parser.error(f"--baseline {item!r}: use NAME=VALUE with NAME one of {', '.join(op.SETTINGS)}")
        baseline[name] = value
    with environment_set(baseline):
        try:
            op.settings()
        except SparseDecodingError as exc:  # a bad value: its own one-line message
            parser.error(f"--baseline: {exc}")
    return baseline


def bench_kind(kind: str, w: Sp24Weight, weight64: torch.Tensor, rows: dict[int, Row], reps: int, sms: int,
               sweep: bool = True, baseline: dict[str, str] | None = None, base_w: Sp24Weight | None = None) -> None:
    """`base_w`: the weight as tiled under the baseline settings, where they change the tiled layout (int8 steps);
    None: `w` itself."""
    rotation = copies(w)
    base_rotation = rotation if base_w is None else copies(base_w)
    base_w = w if base_w is None else base_w
    for batch, row in rows.items():
        x = torch.randn(batch, w.shape[1], device="cuda").to(w.dtype)
        default = default_splits(w, batch, sms)
        results = {}
        for splits in sorted({default, *SPLIT_CHOICES}) if sweep else [default]:
            if splits < min_splits(w, batch) or splits > w.steps:
                continue
            launch = Sp24Launch(x, w, splits)
            row.checks[kind] = max(row.checks.get(kind, 0.0), float64_error(launch(x, w), x, weight64))
            results[splits] = time_rotated([lambda c=c: launch(x, c) for c in rotation], reps)[0]
        row.times[kind], row.splits[kind] = results[default], default
        row.best[kind] = min((s, k) for k, s in results.items())
        tuned = tuned_launch(x, w)  # the engine's choice: its own float64 checks and timings, then timed here again
        choice = launch_label(tuned)
        row.tuned[kind] = (time_rotated([lambda c=c: tuned(x, c) for c in rotation], reps)[0], choice)
        if baseline:  # the tuner's pick under the baseline settings (tuned anew: they are part of its key)
            with environment_set(baseline):
                base = tuned_launch(x, base_w)
                row.checks[kind] = max(row.checks[kind], float64_error(base(x, base_w), x, weight64))
                row.baseline[kind] = (time_rotated([lambda c=c: base(x, c) for c in base_rotation], reps)[0],
                                      launch_label(base))
        row.bytes[kind] = w.nbytes + 2 * batch * sum(w.shape)
        print(f"{row.model} {row.shape} b{batch} {kind}: {results[default] * 1e6:.1f} us (splits {default}; best "
              f"{row.best[kind][0] * 1e6:.1f} at {row.best[kind][1]}), cuBLAS {row.dense_s * 1e6:.1f}, "
              f"x{row.dense_s / results[default]:.2f}, check {row.checks[kind]:.2f}", flush=True)
    del rotation, base_rotation
    torch.cuda.empty_cache()


def bench_shape(model: str, shape: str, batches: list[int], kinds: list[str], reps: int, generator,
                sms: int, sweep: bool = True, baseline: dict[str, str] | None = None) -> list[Row]:
    out, in_features = linear_shapes(model, unfused=False)[shape]
    weight = random_nm_weight(out, in_features, 2, 4, generator)
    dense = [weight] + [weight.clone() for _ in range(math.ceil(L2_ROTATION_BYTES / (weight.numel() * 2)))]
    rows = {}
    for batch in batches:
        x = torch.randn(batch, in_features, device="cuda").bfloat16()
        dense_s = time_rotated([lambda d=d: F.linear(x, d) for d in dense], reps)[0]
        rows[batch] = Row(model, shape, out, in_features, batch, dense_s)
    del dense
    packed = pack_nm(weight, 2, 4)
    if "bf16" in kinds:
        op_copies = [packed] + [type(packed)(packed.values.clone(), packed.bitmask.clone(), 2, 4, packed.shape)
                                for _ in range(math.ceil(L2_ROTATION_BYTES / (packed.values.numel() * 2)))]
        for batch, row in rows.items():
            x = torch.randn(batch, in_features, device="cuda").bfloat16()
            row.times["op"] = time_rotated([lambda p=p: nm_spmv(x, p) for p in op_copies], reps)[0]
        del op_copies
        bench_kind("bf16", tile(packed), weight.double(), rows, reps, sms, sweep, baseline)
    del packed
    for kind in [k for k in kinds if k != "bf16"]:
        group = in_features if kind == "int8" else GROUP_SIZE
        quantized = pack_nm_quantized(grid_weight(out, in_features, 2, 4, kind, generator), 2, 4, kind, group)
        w = tile(quantized)
        base_w = None
        step_setting = op.SP24_INT8_STEP_SETTING if kind == "int8" else op.SP24_INT4_STEP_SETTING
        if step_setting in (baseline or {}):  # a layout of its own
            with environment_set(baseline):
                base_w = tile(quantized)
        weight64 = quantized.to_dense(torch.float64)
        del quantized
        bench_kind(kind, w, weight64, rows, reps, sms, sweep, baseline, base_w)
        del w, base_w, weight64
    torch.cuda.empty_cache()
    return list(rows.values())


def pct(nbytes: int, seconds: float, copy_bw: float) -> str:
    return f"{nbytes / seconds / copy_bw * 100:.0f}%"


def summary(rows: list[Row], kinds: list[str], baseline: bool = False) -> str:
    lines = ["| values | batch | geomean vs cuBLAS, tuned (as the engine runs it) | min | geomean, default splits | "
             "geomean, fastest split tried | target | verdict |"
             + (" geomean, tuned under the baseline settings (min) | tuned vs baseline, geomean of time ratios |"
                if baseline else ""), "|---|---|---|---|---|---|---|---|" + ("---|---|" if baseline else "")]
    batches = sorted({r.batch for r in rows})
    for kind in kinds:
        for batch in batches:
            sel = [r for r in rows if r.batch == batch and kind in r.times]
            if not sel:
                continue
            ratios = [r.dense_s / r.tuned[kind][0] for r in sel]
            default = [r.dense_s / r.times[kind] for r in sel]
            best = [r.dense_s / r.best[kind][0] for r in sel]
            target = TARGETS_12.get(batch) if kind == "bf16" else (TARGETS_13[kind] if batch == 1 else None)
            verdict = "-"
            if target is not None:
                g = geomean(ratios)
                ok = g >= target and (kind != "bf16" or min(ratios) >= 1.0)
                verdict = "met" if ok else f"missed ({g:.2f}x vs {target:.2f}x" + (
                    f", min {min(ratios):.2f}x" if kind == "bf16" else "") + ")"
            extra = ""
            if baseline:
                base = [r.dense_s / r.baseline[kind][0] for r in sel]
                extra = (f" {geomean(base):.2f}x ({min(base):.2f}x) | "
                         f"{geomean([r.baseline[kind][0] / r.tuned[kind][0] for r in sel]):.3f}x |")
            lines.append(f"| {kind} | {batch} | {geomean(ratios):.2f}x | {min(ratios):.2f}x | "
                         f"{geomean(default):.2f}x | {geomean(best):.2f}x | "
                         f"{'-' if target is None else f'{target:.2f}x'} | {verdict} |{extra}")
        if kind == "bf16":
            for batch in batches:
                sel = [r for r in rows if r.batch == batch and "op" in r.times]
                lines.append(f"| bf16, today's op (nm_spmv) | {batch} | "
                             f"{geomean([r.dense_s / r.times['op'] for r in sel]):.2f}x | "
                             f"{min(r.dense_s / r.times['op'] for r in sel):.2f}x | - | - | - | for comparison |"
                             + (" - | - |" if baseline else ""))
    return "\n".join(lines)


def details(rows: list[Row], kinds: list[str], copy_bw: float, baseline: bool = False) -> str:
    header = ["model", "linear", "out x in", "batch", "cuBLAS us (% copy)", "op us (x)"]
    for kind in kinds:
        header += [f"{kind} tuned us (splits; x cuBLAS; % copy)", f"{kind} default us (splits)",
                   f"{kind} fastest tried us (splits)", f"{kind} float64"]
        if baseline:
            header.append(f"{kind} baseline tuned us (splits; x cuBLAS)")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for r in rows:
        cells = [r.model, r.shape, f"{r.out}x{r.in_features}", str(r.batch),
                 f"{r.dense_s * 1e6:.1f} ({pct(2 * r.out * r.in_features, r.dense_s, copy_bw)})",
                 f"{r.times['op'] * 1e6:.1f} (x{r.dense_s / r.times['op']:.2f})" if "op" in r.times else "-"]
        for kind in kinds:
            if kind not in r.times:
                cells += ["-"] * (5 if baseline else 4)
                continue
            s, splits = r.tuned[kind]
            cells += [f"{s * 1e6:.1f} ({splits}; x{r.dense_s / s:.2f}; {pct(r.bytes[kind], s, copy_bw)})",
                      f"{r.times[kind] * 1e6:.1f} ({r.splits[kind]})",
                      f"{r.best[kind][0] * 1e6:.1f} ({r.best[kind][1]})",
                      "ok" if r.checks[kind] <= 1 else "FAIL" + f" ({r.checks[kind]:.2f})"]
            if baseline:
                b, label = r.baseline[kind]
                cells.append(f"{b * 1e6:.1f} ({label}; x{r.dense_s / b:.2f})")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def gpu_start(name: str) -> tuple[float, torch.Generator, float] | None:
    """A kernel bench's start on the GPU: (its start time, a CUDA generator seeded 0, the device's copy bandwidth);
    None, after one error line, without a CUDA GPU."""
    if not torch.cuda.is_available():
        print(f"error: {name} needs a CUDA GPU", file=sys.stderr)
        return None
    started = time.perf_counter()
    return started, torch.Generator(device="cuda").manual_seed(0), copy_bandwidth(torch.device("cuda"))


def shape_arguments(parser: argparse.ArgumentParser, models: list[str]) -> None:
    """--models (default `models`), --shapes, --batches, --reps and --out: what the sp24 benches share."""
    parser.add_argument("--models", nargs="+", default=models, choices=MODELS,
                        help="engine presets (default: %(default)s)")
    parser.add_argument("--shapes", nargs="+", default=SHAPES, choices=SHAPES, help="linears (default: all)")
    parser.add_argument("--batches", nargs="+", type=int, default=BATCHES, choices=range(1, 17),
                        metavar="B", help="batch sizes 1..16 (default: %(default)s)")
    parser.add_argument("--reps", type=int, default=5, help="timed graph replays, median (default: %(default)s)")
    parser.add_argument("--out", help="write the markdown report here too (default: print only)")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    shape_arguments(parser, MODELS)
    parser.add_argument("--kinds", nargs="+", default=KINDS, choices=KINDS,
                        help="kept values: bf16, int8 (a scale a row), int4 (128 columns a scale) (default: all)")
    parser.add_argument("--no-sweep", action="store_true",
                        help="time only the default split besides the tuned launch (a quicker run: the 'fastest "
                             "split tried' column is then the default)")
    parser.add_argument("--baseline", nargs="+", default=[], metavar="NAME=VALUE",
                        help="kernel settings (op.SETTINGS) under which the tuned launch is also timed, side by side, "
                             "e.g. SPARSEDECODING_SP24_HALF_META=0 SPARSEDECODING_SP24_BUFFERS=2")
    args = parser.parse_args(argv)
    baseline = baseline_settings(parser, args.baseline)
    start = gpu_start("sp24_bench")
    if start is None:
        return 2
    started, generator, copy_bw = start
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    build_start = time.perf_counter()
    probe = tile(pack_nm(random_nm_weight(128, 256, 2, 4, generator), 2, 4))
    x = torch.randn(1, 256, device="cuda").bfloat16()
    check = float64_error(Sp24Launch(x, probe)(x, probe), x, tiled_to_dense(probe).cuda())
    build_s = time.perf_counter() - build_start
    if check > 1:
        print(f"error: the probe fails its float64 check ({check:.2f})", file=sys.stderr)
        return 1
    rows: list[Row] = []
    for model in args.models:
        for shape in args.shapes:
            try:
                rows += bench_shape(model, shape, args.batches, args.kinds, args.reps, generator, sms,
                                    not args.no_sweep, baseline)
            except KernelInputError as exc:
                print(f"error: {model} {shape}: {exc}", file=sys.stderr)
                return 2
    failures = sum(1 for r in rows for v in r.checks.values() if v > 1)
    report = ("# Tiled 2:4 sparse tensor-core kernel (sp24) vs cuBLAS and today's op\n\n"
              + environment(copy_bw, build_s)
              + f"- sp24 launches: {'programmatic' if sp24_pdl_setting() else 'plain'} (SPARSEDECODING_SP24_PDL; "
              + "programmatic launches of consecutive sp24 kernels overlap one's start with the last one's tail, "
              + "as in the decoder; cuBLAS launches are plain)\n"
              + ("- baseline settings (each tuned launch also timed under them, side by side; the int8 / int4 "
                 + "weights tiled anew under them where they set SPARSEDECODING_SP24_INT8_STEP / _INT4_STEP): "
                 + ", ".join(f"{k}={v}" for k, v in baseline.items()) + "\n" if baseline else "")
              + f"- {op.settings_line()}\n"
              + "\n## Targets (geomean over the shapes, speedup vs cuBLAS bf16 on the dense pruned weight)\n\n"
              + summary(rows, args.kinds, bool(baseline)) + "\n\n## All measurements\n\n"
              + "Tuned = the launch `sp24.tuned_launch` picks (what the engine runs: its own float64 checks and "
              + "graph-replay timings), timed again here: its split count, and `/Ns` when N warps share each row "
              + "tile inside a CTA (slices); default = `sp24.default_splits`, one slice; fastest tried = the "
              + "fastest of "
              + ("1, 2, 4, 8, 16 splits and the default" if not args.no_sweep else "the default split alone "
                 "(--no-sweep)")
              + ", one slice, each checked against float64 (a "
              + "minimum over several timings, so slightly optimistic). Bytes: tiled weight (values or codes, "
              + "metadata, scales) + x + y. "
              + "op = `nm_spmv` as dispatched today (bf16).\n\n"
              + details(rows, args.kinds, copy_bw, bool(baseline))
              + f"\n\nfloat64 failures: {failures}. Whole run: {time.perf_counter() - started:.0f} s\n")
    write_report(report, args.out)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
