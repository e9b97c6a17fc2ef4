"""Sparse N:M kernel (`nm_spmv`) vs cuBLAS dense (`F.linear`) vs PyTorch's 2:4 semi-structured path, on the
linear shapes of the engine presets llama-3.1-8b, qwen3-14b, qwen3-32b and llama-3.3-70b (fused qkv and gate_up, as
the engine runs them), batch 1..16, the kernel patterns 2:4, 4:8, 8:16, 16:32. Needs a CUDA GPU.

It measures the Triton kernel (it sets SPARSEDECODING_KERNEL=triton); `cuda_kernel_bench.py --dispatch` measures
what the op dispatches.

Every output is first checked against a float64 product with the autotuner's bound (`kernels.autotune.output_error`:
output rounding plus the worst case of an fp32 sum). Times are medians over repeated replays of a CUDA graph that calls the op on enough weight copies to rotate
past the L2 cache; bandwidth = bytes that must move (weights as stored, x, y) / time, next to the bandwidth of a
large device-to-device copy (bytes read + written) measured in the same run. The autotuner's timings of every
candidate configuration are listed too (graph replays over rotated weight copies, like the table's). Examples:

    python benchmarks/kernel_bench.py --quick --out benchmarks/results/kernel_h200_quick.md
    python benchmarks/kernel_bench.py --out benchmarks/results/kernel_h200.md
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import time
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

from sparsedecoding.engine.bench import copy_bandwidth
from sparsedecoding.engine.config import preset
from sparsedecoding.kernels import PackedNM, nm_spmv, pack_nm
from sparsedecoding.kernels.autotune import output_error, problem_key, rejected_candidates, tuning_results
from sparsedecoding.kernels.op import KERNEL_SETTING, MAX_BATCH
from sparsedecoding.patterns import KERNEL_PATTERNS
from sparsedecoding.runenv import environment_markdown

MODELS = ["llama-3.1-8b", "qwen3-14b", "qwen3-32b", "llama-3.3-70b"]  # engine presets
PATTERNS = [f"{n}:{m}" for n, m in KERNEL_PATTERNS]
BATCHES = [batch for batch in (1, 2, 4, 8, 16) if batch <= MAX_BATCH]
L2_ROTATION_BYTES = 3 * 60 * 2**20  # weight copies per graph replay add up to three H200 L2 caches
TARGETS_BS1_MODELS = ("llama-3.1-8b", "qwen3-14b")


def linear_shapes(model: str, unfused: bool) -> dict[str, tuple[int, int]]:
    """[out, in] of the decoder linears: fused qkv and gate_up (what the engine runs), o and down."""
    args = preset(model)
    hidden, inter = args.dim, args.intermediate_size
    q, kv = args.n_heads * args.head_dim, args.n_kv_heads * args.head_dim
    shapes = {"qkv": (q + 2 * kv, hidden), "o": (hidden, q), "gate_up": (2 * inter, hidden), "down": (hidden, inter)}
    if unfused:
        shapes.update({"q": (q, hidden), "k/v": (kv, hidden), "gate/up": (inter, hidden)})
    return shapes


def quick_plan() -> list[tuple[str, str, str, list[int]]]:
    """(model, shape, pattern, batches): the bs-1 and bs-8 targets on 2:4, pattern spread on two shapes."""
    plan = [(model, shape, "2:4", [1, 8]) for model in TARGETS_BS1_MODELS for shape in ("qkv", "o", "gate_up", "down")]
    plan += [("qwen3-32b", "gate_up", "2:4", [1, 8]), ("llama-3.3-70b", "gate_up", "2:4", [1, 8]),
             ("llama-3.3-70b", "down", "2:4", [1, 8])]
    plan += [("llama-3.1-8b", shape, pattern, [1, 8]) for shape in ("qkv", "gate_up") for pattern in PATTERNS[1:]]
    return plan


def full_plan(models, patterns, batches, unfused) -> list[tuple[str, str, str, list[int]]]:
    return [(model, shape, pattern, batches) for model in models for shape in linear_shapes(model, unfused)
            for pattern in patterns]


def random_nm_weight(out: int, in_features: int, n: int, m: int, generator: torch.Generator) -> torch.Tensor:
    """bf16 [out, in] with n random nonzeros (standard normal) in every group of m, built in row slices."""
    weight = torch.empty(out, in_features, dtype=torch.bfloat16, device="cuda")
    step = max(1, (1 << 26) // in_features)
    for r0 in range(0, out, step):
        rows = min(step, out - r0)
        keys = torch.rand(rows, in_features // m, m, device="cuda", generator=generator)
        kept = keys.argsort(-1).argsort(-1) < n
        values = torch.randn(rows, in_features, device="cuda", generator=generator).view(rows, -1, m)
        weight[r0:r0 + rows] = (values * kept).view(rows, in_features).bfloat16()
    return weight


@dataclass
class RotatedWeights:
    """A random N:M weight dense and packed, each with enough copies that a round over them reads past the L2."""
    weight: torch.Tensor
    packed: PackedNM
    dense_copies: list[torch.Tensor]
    sparse_copies: list[PackedNM]
    weight_bytes: int  # dense bf16
    packed_bytes: int  # values + bitmask


def rotated_weights(out: int, in_features: int, n: int, m: int, generator: torch.Generator) -> RotatedWeights:
    weight = random_nm_weight(out, in_features, n, m, generator)
    packed = pack_nm(weight, n, m)
    weight_bytes = weight.numel() * 2
    packed_bytes = packed.values.numel() * 2 + packed.bitmask.numel() * 4
    dense_copies = [weight] + [weight.clone() for _ in range(math.ceil(L2_ROTATION_BYTES / weight_bytes))]
    sparse_copies = [packed] + [PackedNM(packed.values.clone(), packed.bitmask.clone(), n, m, packed.shape)
                                for _ in range(math.ceil(L2_ROTATION_BYTES / packed_bytes))]
    return RotatedWeights(weight, packed, dense_copies, sparse_copies, weight_bytes, packed_bytes)


def time_rotated(calls: list, reps: int) -> tuple[float, str]:
    """Median seconds per call of a CUDA graph replaying `calls` round-robin (each call on its own weight copy),
    at least 24 calls per replay; ("eager") timing of the same sequence if the op cannot be captured."""
    sequence = [calls[i % len(calls)] for i in range(max(24, len(calls)))]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for call in calls * 2:
            call()
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    try:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for call in sequence:
                call()
        run, method = graph.replay, "graph"
    except RuntimeError:
        torch.cuda.synchronize()

        def run():
            for call in sequence:
                call()
        method = "eager"
    times = []
    for _ in range(reps + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / len(sequence))
    return statistics.median(times[1:]), method


@dataclass
class Problem:
    """One timed problem: a decoder linear of a preset, its pattern and the batch (the key of every kernel
    benchmark's rows)."""

    model: str
    shape: str
    out: int
    in_features: int
    pattern: str
    batch: int


@dataclass
class Row(Problem):
    sparse_s: float
    dense_s: float
    sparse_bytes: int
    dense_bytes: int
    check: float
    config: str
    semi_s: float | None = None
    semi_note: str = ""
    notes: list[str] = field(default_factory=list)


def bench_shape(model: str, shape: str, pattern: str, batches: list[int], reps: int, generator) -> list[Row]:
    out, in_features = linear_shapes(model, unfused=True)[shape]
    n, m = (int(v) for v in pattern.split(":"))
    rotated = rotated_weights(out, in_features, n, m, generator)
    weight, packed, dense_copies, sparse_copies = (rotated.weight, rotated.packed, rotated.dense_copies,
                                                   rotated.sparse_copies)
    weight_bytes, packed_bytes = rotated.weight_bytes, rotated.packed_bytes
    semi_copies, semi_note = [], ""
    if pattern == "2:4":
        try:
            from torch.sparse import to_sparse_semi_structured

            semi_copies = [to_sparse_semi_structured(w) for w in dense_copies]
        except (RuntimeError, ValueError, NotImplementedError) as exc:
            semi_note = f"n/a: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
    rows = []
    for batch in batches:
        x = torch.randn(batch, in_features, device="cuda", generator=generator).bfloat16()
        key = problem_key(x, packed.bitmask, n, m)
        newly_tuned = key not in tuning_results()
        start = time.perf_counter()
        y = nm_spmv(x, packed)  # tunes this problem on first use: compiles, checks and times every candidate
        torch.cuda.synchronize()
        first_call_s = time.perf_counter() - start
        check = output_error(y, x, packed.values, packed.bitmask)
        sparse_s, method = time_rotated([lambda p=p: nm_spmv(x, p) for p in sparse_copies], reps)
        dense_s, dense_method = time_rotated([lambda w=w: F.linear(x, w) for w in dense_copies], reps)
        io_bytes = 2 * batch * (in_features + out)
        config = tuning_results()[key][0]
        row = Row(model, shape, out, in_features, pattern, batch, sparse_s, dense_s, packed_bytes + io_bytes,
                  weight_bytes + io_bytes, check, str(config), semi_note=semi_note)
        row.notes.append(f"{'tuned' if newly_tuned else 'first call'} in {first_call_s:.1f} s")
        if method != "graph" or dense_method != "graph":
            row.notes.append(f"timed {method}/{dense_method}")
        if semi_copies:
            try:
                semi_check = (F.linear(x, semi_copies[0]).float() - F.linear(x, weight).float()).abs().max()
                row.semi_s, semi_method = time_rotated([lambda w=w: F.linear(x, w) for w in semi_copies], reps)
                row.semi_note = f"{semi_method}, max diff to dense {float(semi_check):.2g}"
            except (RuntimeError, ValueError, NotImplementedError) as exc:
                row.semi_note = f"n/a: {type(exc).__name__}: {str(exc).splitlines()[0][:80]}"
        rows.append(row)
        print(f"{model} {shape} {out}x{in_features} {pattern} b{batch}: sparse {sparse_s * 1e6:.1f} us, cuBLAS "
              f"{dense_s * 1e6:.1f} us, x{dense_s / sparse_s:.2f}, check {check:.2f}, {config}", flush=True)
    del rotated, dense_copies, sparse_copies, semi_copies
    torch.cuda.empty_cache()
    return rows


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def results_table(rows: list[Row], copy_bw: float) -> str:
    lines = ["| model | linear | out x in | pattern | batch | sparse us | cuBLAS us | 2:4 semi us | speedup | "
             "sparse TB/s (% copy) | cuBLAS TB/s (% copy) | float64 check | config | notes |",
             "|" + "---|" * 14]
    for r in rows:
        sparse_bw, dense_bw = r.sparse_bytes / r.sparse_s, r.dense_bytes / r.dense_s
        semi = f"{r.semi_s * 1e6:.1f}" if r.semi_s else "-"
        notes = "; ".join(r.notes + ([f"2:4 semi: {r.semi_note}"] if r.semi_note else []))
        lines.append(f"| {r.model} | {r.shape} | {r.out}x{r.in_features} | {r.pattern} | {r.batch} | "
                     f"{r.sparse_s * 1e6:.1f} | {r.dense_s * 1e6:.1f} | {semi} | {r.dense_s / r.sparse_s:.2f} | "
                     f"{sparse_bw / 1e12:.2f} ({100 * sparse_bw / copy_bw:.0f}%) | {dense_bw / 1e12:.2f} "
                     f"({100 * dense_bw / copy_bw:.0f}%) | {'ok' if r.check <= 1 else 'FAIL'} ({r.check:.2f}) | "
                     f"{r.config} | {notes} |")
    return "\n".join(lines) + "\n"


def targets_table(rows: list[Row], copy_bw: float) -> str:
    """The issue's targets, each with the measured value and met / missed by how much."""
    def verdict(value, goal, higher_is_better=True):
        if math.isnan(value):
            return "not measured"
        met = value >= goal if higher_is_better else value <= goal
        return "met" if met else f"missed by {abs(value - goal) / goal * 100:.0f}%"

    two_four = [r for r in rows if r.pattern == "2:4"]
    bs1 = [r.dense_s / r.sparse_s for r in two_four if r.batch == 1 and r.model in TARGETS_BS1_MODELS]
    largest = sorted({(r.out * r.in_features, r.model, r.shape) for r in two_four if r.batch == 1}, reverse=True)[:3]
    largest_bw = [r.sparse_bytes / r.sparse_s / copy_bw for r in two_four if r.batch == 1
                  and (r.out * r.in_features, r.model, r.shape) in largest]
    bs8 = [r.dense_s / r.sparse_s for r in two_four if r.batch == 8]
    spreads = {}
    for r in rows:
        spreads.setdefault((r.model, r.shape, r.batch), []).append(r.sparse_s)
    spread = max((max(t) / min(t) - 1 for t in spreads.values() if len(t) > 1), default=float("nan"))
    largest_names = ", ".join(f"{model} {shape}" for _, model, shape in largest)
    items = [
        ("bs 1: geomean speedup over cuBLAS, 8B + 14B shapes (2:4)", geomean(bs1), 1.8, True, "x"),
        (f"bs 1: min % of copy bandwidth, three largest ({largest_names})", min(largest_bw, default=float("nan")),
         0.85, True, "%"),
        ("bs 8: min speedup over cuBLAS (2:4)", min(bs8, default=float("nan")), 1.5, True, "x"),
        ("bs 8: geomean speedup over cuBLAS (2:4)", geomean(bs8), 1.5, True, "x"),
        ("patterns: largest spread of sparse time at one shape and batch", spread, 0.05, False, "%"),
    ]
    lines = ["| target | measured | goal | verdict |", "|---|---|---|---|"]
    for name, value, goal, higher, unit in items:
        shown = (f"{value * 100:.1f}%", f"{goal * 100:.0f}%") if unit == "%" else (f"{value:.2f}x", f"{goal:.1f}x")
        lines.append(f"| {name} | {shown[0]} | {shown[1]} | {verdict(value, goal, higher)} |")
    return "\n".join(lines) + "\n"


def variants_table() -> str:
    """Every candidate configuration the autotuner timed, per problem, fastest first; then any candidate that
    failed to compile or to match the tuner's float64 check (a kernel bug: it was never used)."""
    lines = ["| problem (device, out, words, batch, values/word, dtype) | config | us (graph replay median) | vs best |",
             "|---|---|---|---|"]
    for key, (_, timings) in tuning_results().items():
        best = min(timings.values())
        for config, ms in sorted(timings.items(), key=lambda item: item[1]):
            lines.append(f"| {key[1:5]} | {config} | {ms * 1e3:.1f} | {ms / best:.2f} |")
    rejected = rejected_candidates()
    lines += ["", f"Candidates that failed to compile or to match float64: {sum(len(r) for r in rejected.values())}",
              ""]
    for key, failures in rejected.items():
        lines += [f"- {key[1:5]}: {config}: {reason}" for config, reason in failures.items()]
    return "\n".join(lines) + "\n"


def environment(copy_bw: float) -> str:
    props = torch.cuda.get_device_properties(0)
    return (environment_markdown(" ".join(["python", *sys.argv]), torch.device("cuda"))
            + f"- GPU: {props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB\n"
            + f"- copy bandwidth (1 GiB device-to-device, read + written): {copy_bw / 1e12:.2f} TB/s\n")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true",
                        help="8B and 14B shapes plus the three largest at batch 1 and 8 on 2:4, and two shapes on "
                             "all patterns (at most 3 minutes on an H200 including tuning)")
    parser.add_argument("--models", nargs="+", default=MODELS, choices=MODELS, help="engine presets (default: all)")
    parser.add_argument("--patterns", nargs="+", default=PATTERNS, help="N:M patterns (default: %(default)s)")
    parser.add_argument("--batches", nargs="+", type=int, default=BATCHES, help="batch sizes (default: %(default)s)")
    parser.add_argument("--unfused", action="store_true", help="also the separate q, k/v and gate/up shapes")
    parser.add_argument("--reps", type=int, default=10,
                        help="timed graph replays per measurement, median (default: %(default)s)")
    parser.add_argument("--out", default=None, help="write the markdown report here too (default: print only)")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("kernel_bench needs a CUDA GPU", file=sys.stderr)
        return 2
    # This report is the Triton kernel's and its tuner's; what the dispatched op runs is cuda_kernel_bench's.
    os.environ[KERNEL_SETTING] = "triton"
    started = time.perf_counter()
    plan = quick_plan() if args.quick else full_plan(args.models, args.patterns, args.batches, args.unfused)
    generator = torch.Generator(device="cuda").manual_seed(0)
    copy_bw = copy_bandwidth(torch.device("cuda"), nbytes=2**30, repeats=20)
    rows = []
    for model, shape, pattern, batches in plan:
        rows += bench_shape(model, shape, pattern, batches, args.reps, generator)
    targets = targets_table(rows, copy_bw)
    report = "\n".join([
        "# Sparse N:M kernel vs cuBLAS dense vs PyTorch 2:4 semi-structured", "", environment(copy_bw),
        "## Targets", "", targets, "## All measurements", "",
        "Speedup = cuBLAS time / sparse time. Bytes: sparse = values + bitmask + x + y; dense = W + x + y.", "",
        results_table(rows, copy_bw), "## Autotuner candidates", "", variants_table(),
        f"Whole run (tuning and Triton compiles included): {time.perf_counter() - started:.0f} s", ""])
    print(report)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(report)
    print(targets)
    return 0 if all(r.check <= 1 for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
