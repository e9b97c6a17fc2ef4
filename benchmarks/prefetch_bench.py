"""L2 prefetch of the next linear, in isolation: the four decoder linears of Llama-3.1-8B (qkv, o, gate_up, down)
over distinct layers (enough weight to rotate past the L2), each linear preceded by an idle gap that stands for
the kernels between linears in a decode step (attention before o, norms and the activation elsewhere; a spin
kernel that reads no memory), captured in one CUDA graph and replayed. Every linear runs as the engine runs it:
2:4 on sp24 (the tuner's split) and dense on cuBLAS (`F.linear`); with a budget, each prefetches that many bytes
of the next linear's tensors into L2 (sp24 inside its kernel; dense through `PrefetchingLinear`'s extra launch).
Reported: microseconds per layer, for each gap setting and budget, and the gain against no prefetch. Outputs are
checked to equal the unprefetched ones bit for bit.

Then a probe of whether prefetched bytes are found in L2 at all: one 2:4 o weight (4096 x 4096) at a time, over 16
copies: [prefetch the whole weight] -> [idle gap] -> [sp24 on it], against the same without the prefetch, and the
prefetch + gap alone; the difference is what the kernel takes after the prefetch. Four ways to prefetch: bulk
(cp.async.bulk.prefetch.L2), a line per thread (prefetch.global.L2, and with evict_last), and L2-only loads.

    PYTHONPATH=src python benchmarks/prefetch_bench.py --out benchmarks/results/prefetch_h200.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from kernel_bench import environment, linear_shapes, random_nm_weight
from sparsedecoding.engine.bench import copy_bandwidth
from sparsedecoding.kernels import prefetch
from sparsedecoding.kernels.format import pack_nm
from sparsedecoding.kernels.prefetch import NO_PREFETCH, L2Prefetch
from sparsedecoding.kernels.sp24 import tile, tuned_launch

SHAPES = ["qkv", "o", "gate_up", "down"]
GAPS = {"no gaps": (0, 0, 0, 0), "decode-like gaps (3, 12, 3, 2 us)": (3, 12, 3, 2)}  # before qkv, o, gate_up, down
BUDGETS_MIB = [0, 8, 16, 32]
REPLAYS = 20


def spin_cycles_per_us() -> float:
    """Clock cycles of `torch.cuda._sleep` per microsecond, measured."""
    cycles = 1_000_000
    torch.cuda._sleep(cycles)  # warm-up
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(cycles)
    end.record()
    end.synchronize()
    return cycles / (start.elapsed_time(end) * 1000)


def layer_time_us(calls: list, layers: int) -> float:
    """Median microseconds per layer of a graph running `calls` (closures) in order."""
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for call in calls:
            call()
    times = []
    for _ in range(REPLAYS + 1):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000 / layers)
    return statistics.median(times[1:])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=8, help="distinct layers of weights (default: 8)")
    parser.add_argument("--batch", type=int, nargs="+", default=[1, 4], help="batch sizes (default: 1 4)")
    parser.add_argument("--out", help="markdown report path")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print("error: needs a CUDA GPU", file=sys.stderr)
        return 2
    started = time.time()
    if args.layers < 2 or not all(1 <= batch <= 16 for batch in args.batch):
        print("error: --layers must be at least 2 and --batch within 1..16", file=sys.stderr)
        return 2
    shapes = linear_shapes("llama-3.1-8b", unfused=False)
    order = [shapes[name] for name in SHAPES]
    generator = torch.Generator("cuda").manual_seed(0)
    sparse, dense = [], []
    for _ in range(args.layers):
        for out, in_features in order:
            weight = random_nm_weight(out, in_features, 2, 4, generator)
            sparse.append(tile(pack_nm(weight, 2, 4)))
            dense.append(weight)
    per_us = spin_cycles_per_us()
    copy_bw = copy_bandwidth(torch.device("cuda"))
    lines = [f"- spin kernel: {per_us:.0f} cycles per us", f"- layers: {args.layers} distinct, "
             f"{sum(w.nbytes for w in sparse) / 1e9:.2f} GB tiled 2:4, {sum(w.nbytes for w in dense) / 1e9:.2f} GB "
             f"dense (the L2 holds {torch.cuda.get_device_properties(0).L2_cache_size / 1e6:.0f} MB)", "",
             "| batch | gaps | weights | no prefetch us/layer | "
             + " | ".join(f"{mib} MiB us/layer (gain)" for mib in BUDGETS_MIB[1:]) + " |",
             "|---|---|---|---|" + "---|" * (len(BUDGETS_MIB) - 1)]
    mismatches = 0
    for batch in args.batch:
        xs = [torch.randn(batch, in_features, device="cuda").bfloat16() for _, in_features in order]
        launches = [tuned_launch(xs[i % 4], sparse[i]) for i in range(4)]
        for gap_name, gaps in GAPS.items():
            for kind, weights in (("2:4 sp24", sparse), ("dense cuBLAS", dense)):
                row = []
                reference = None
                for mib in BUDGETS_MIB:
                    plans = [L2Prefetch(_tensors(weights[(i + 1) % len(weights)]), mib << 20) if mib else NO_PREFETCH
                             for i in range(len(weights))]
                    outputs = [None] * len(weights)

                    def call(i, plan=None):
                        def run():
                            if gaps[i % 4]:
                                torch.cuda._sleep(int(gaps[i % 4] * per_us))
                            x = xs[i % 4]
                            if kind == "2:4 sp24":
                                outputs[i] = launches[i % 4](x, weights[i], plan)
                            else:
                                outputs[i] = F.linear(x, weights[i])
                                prefetch.launch(plan, x.device)
                        return run
                    row.append(layer_time_us([call(i, plans[i]) for i in range(len(weights))], args.layers))
                    torch.cuda.synchronize()
                    if reference is None:
                        reference = [o.clone() for o in outputs]
                    else:
                        mismatches += sum(not torch.equal(a, b) for a, b in zip(reference, outputs))
                cells = " | ".join(f"{t:.1f} ({row[0] / t:.3f}x)" for t in row[1:])
                lines.append(f"| {batch} | {gap_name} | {kind} | {row[0]:.1f} | {cells} |")
                print(lines[-1], flush=True)
    lines += ["", f"outputs differing from the unprefetched run: {mismatches}", ""] + probe(per_us)
    lines += ["", f"Whole run: {time.time() - started:.0f} s"]
    report = "\n".join(["# L2 prefetch of the next linear: Llama-3.1-8B decoder linears with idle gaps", "",
                         environment(copy_bw)] + lines) + "\n"
    print(report)
    if args.out:
        with open(args.out, "w", encoding="utf-8") as handle:
            handle.write(report)
    return 1 if mismatches else 0


PROBE_MODES = {0: "bulk prefetch", 1: "prefetch.global.L2", 2: "prefetch.global.L2::evict_last", 3: "ld.global.cg"}
PROBE_GAPS = [0, 10, 30]


def probe(per_us: float, copies: int = 16) -> list[str]:
    """Per copy of one tiled 2:4 o weight: the kernel's time cold and after each way of prefetching it whole."""
    out, in_features = linear_shapes("llama-3.1-8b", unfused=False)["o"]
    generator = torch.Generator("cuda").manual_seed(1)
    weights = [tile(pack_nm(random_nm_weight(out, in_features, 2, 4, generator), 2, 4)) for _ in range(copies)]
    x = torch.randn(1, in_features, device="cuda").bfloat16()
    run = tuned_launch(x, weights[0])
    plans = [L2Prefetch(_tensors(w), w.nbytes) for w in weights]

    def timed(with_prefetch: int | None, with_kernel: bool, gap: int) -> float:
        def one(i):
            def call():
                if with_prefetch is not None:
                    prefetch.launch(plans[i], x.device, with_prefetch)
                if gap:
                    torch.cuda._sleep(int(gap * per_us))
                if with_kernel:
                    run(x, weights[i])
            return call
        return layer_time_us([one(i) for i in range(copies)], copies)

    lines = [f"Probe: {copies} copies of the 8B o weight tiled 2:4 ({weights[0].nbytes / 1e6:.1f} MB each), batch 1; "
             "us per copy", "",
             "| gap us | gap alone | gap + kernel (kernel cold) | way | prefetch + gap | prefetch + gap + kernel | "
             "kernel after the prefetch |", "|---|---|---|---|---|---|---|"]
    for gap in PROBE_GAPS:
        alone = timed(None, False, gap) if gap else 0.0
        cold = timed(None, True, gap)
        for mode, name in PROBE_MODES.items():
            only = timed(mode, False, gap)
            both = timed(mode, True, gap)
            lines.append(f"| {gap} | {alone:.1f} | {cold:.1f} ({cold - alone:.1f}) | {name} | {only:.1f} | {both:.1f} | "
                         f"{both - only:.1f} |")
            print(lines[-1], flush=True)
    return lines


def _tensors(weight) -> list[torch.Tensor]:
    if isinstance(weight, torch.Tensor):
        return [weight]
    return [t for t in (weight.a, weight.meta, weight.scales) if t is not None]


if __name__ == "__main__":
    sys.exit(main())
