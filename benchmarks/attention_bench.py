"""The fused decode attention's cost per layer against the fewest positions a program walks (`min_span`, the
engine's SPARSEDECODING_ATTENTION_MIN_SPAN), at the Llama-3.1-8B attention shape (32 query heads, 8 KV heads, head
size 128, bf16), several batches, cache lengths and positions. Each point is a CUDA graph of 32 launches, one per
layer with caches of its own (so that, as in a decode step, no layer finds its cache in L2), launched
programmatically as the engine does (with the reads ahead of the wait, `early`, as the engine's default
SPARSEDECODING_ATTENTION_EARLY_READS; `--compare-early` also times min_span 64 without them); median microseconds
per launch over replays. Every configuration's output is first checked against one program per (sequence, KV head)
with no splitting.

    python benchmarks/attention_bench.py --out benchmarks/results/attention_h200.md
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import torch

from sparsedecoding.kernels.triton_attention import choose_splits, counters_for, launch
from sparsedecoding.runenv import environment_markdown, write_report

HEADS, KV_HEADS, HEAD_DIM, LAYERS = 32, 8, 128, 32
POINTS = ((272, 135), (272, 271), (1024, 1023), (4096, 2047), (4096, 4095))  # (cache length, position)


def layers(batch: int, cache_len: int, pos: int, generator: torch.Generator) -> list[dict]:
    width = (HEADS + 2 * KV_HEADS) * HEAD_DIM
    angles = torch.outer(torch.arange(cache_len, device="cuda").float(),
                         1e4 ** (-torch.arange(0, HEAD_DIM, 2, device="cuda").float() / HEAD_DIM))
    angles = torch.cat([angles, angles], dim=-1)
    cos, sin = angles.cos().bfloat16(), angles.sin().bfloat16()
    shape = (batch, KV_HEADS, cache_len, HEAD_DIM)
    return [dict(qkv=torch.randn(batch, width, device="cuda", generator=generator).bfloat16(), cos=cos, sin=sin,
                 k_cache=torch.randn(shape, device="cuda", generator=generator).bfloat16(),
                 v_cache=torch.randn(shape, device="cuda", generator=generator).bfloat16(),
                 input_pos=torch.tensor([pos], device="cuda"), counters=counters_for(batch, KV_HEADS, "cuda"))
            for _ in range(LAYERS)]


def time_us(inputs: list[dict], min_span: int, splits: int | None = None, replays: int = 20,
            early: bool = True) -> float:
    """Median microseconds per launch of a CUDA graph with one launch per layer."""
    run = lambda: [launch(**layer, heads=HEADS, splits=splits, min_span=min_span, pdl=True,  # noqa: E731
                          early=early) for layer in inputs]
    run()  # compiles outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        run()
    graph.replay()
    times = []
    for _ in range(replays):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / len(inputs))
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--min-spans", type=int, nargs="+", default=[64, 128, 256, 512, 1024, 4096])
    parser.add_argument("--splits", type=int, nargs="*", default=[],
                        help="also time these split counts (min_span 64) beside `choose_splits`'")
    parser.add_argument("--compare-early", action="store_true",
                        help="also time min_span 64 with every read after the wait (early=False)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if any(count < 1 for count in args.splits):
        parser.error(f"--splits {args.splits}: each at least 1")
    if any(span < 64 or span % 64 for span in args.min_spans):
        parser.error(f"--min-spans {args.min_spans}: each a positive multiple of 64")
    if not torch.cuda.is_available():
        print("error: attention_bench times CUDA graphs and needs a CUDA GPU", file=sys.stderr)
        return 2
    generator = torch.Generator(device="cuda").manual_seed(0)
    head = "| batch | cache | position | splits | " + " | ".join(f"min_span {s} (us)" for s in args.min_spans)
    head += "".join(f" | {count} splits (us)" for count in args.splits)
    if args.compare_early:
        head += " | min_span 64, no early reads (us) | early / none"
    columns = 5 + len(args.min_spans) + len(args.splits) + 2 * args.compare_early
    rows = [head + " | fastest min_span |", "|---" * columns + "|"]
    for batch in args.batches:
        for cache_len, pos in POINTS:
            inputs = layers(batch, cache_len, pos, generator)
            first = {name: tensor.clone() for name, tensor in inputs[0].items()}
            reference = launch(**first, heads=HEADS, splits=1)
            for span in args.min_spans:
                check = {name: tensor.clone() for name, tensor in inputs[0].items()}
                error = float((launch(**check, heads=HEADS, min_span=span) - reference).abs().max())
                if error > 0.05:
                    print(f"error: min_span {span} differs from one program by {error:.3g} at batch {batch}, cache "
                          f"{cache_len}, position {pos}", file=sys.stderr)
                    return 1
            for count in args.splits:
                check = {name: tensor.clone() for name, tensor in inputs[0].items()}
                error = float((launch(**check, heads=HEADS, splits=count) - reference).abs().max())
                if error > 0.05:
                    print(f"error: {count} splits differ from one program by {error:.3g}", file=sys.stderr)
                    return 1
            times = [time_us(inputs, span) for span in args.min_spans]
            fastest = args.min_spans[times.index(min(times))]
            forced = [time_us(inputs, 64, count) for count in args.splits]
            splits = choose_splits(batch, KV_HEADS, cache_len, torch.device("cuda"))
            late = ""
            if args.compare_early:
                early, none = time_us(inputs, 64), time_us(inputs, 64, early=False)
                late = f" | {none:.2f} | {early / none:.3f}"
            rows.append(f"| {batch} | {cache_len} | {pos} | {splits} | " + " | ".join(f"{t:.2f}" for t in times)
                        + "".join(f" | {t:.2f}" for t in forced) + late + f" | {fastest} |")
            print(rows[-1], flush=True)
            del inputs
            torch.cuda.empty_cache()
    command = "python benchmarks/attention_bench.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = ["# Fused decode attention: cost per layer against min_span", "", environment_markdown(command).rstrip(), "",
            f"Llama-3.1-8B attention ({HEADS} query heads, {KV_HEADS} KV heads, head size {HEAD_DIM}, bf16); "
            f"`splits`: the programs per (sequence, KV head) `choose_splits` launches. Median microseconds per "
            f"launch over CUDA-graph replays of {LAYERS} programmatic launches, each on caches of its own.", "",
            *rows]
    write_report(args.out, "\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
