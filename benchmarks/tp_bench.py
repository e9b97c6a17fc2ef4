"""Tensor-parallel decode speed on two GPUs (issue 14), written to benchmarks/results/: Llama-3.3-70B dense and 2:4
at TP=2, batch 1 and 4 (the dense 70B does not fit one H200, so TP=2 is where its speedup can be measured), and
Llama-3.1-8B dense and 2:4 at TP=2 against TP=1 on one of the same GPUs (what the all-reduces cost).

Random weights (speed does not depend on values), the engine's compiled step captured in a CUDA graph with its
NCCL collectives. Run from the repository root under torchrun, one process per GPU:

    torchrun --nproc-per-node 2 benchmarks/tp_bench.py --out benchmarks/results/tp_h200x2.md    # both presets
    torchrun --nproc-per-node 2 benchmarks/tp_bench.py --preset llama-3.3-70b --out ...          # one of them

TP=1 rows run on rank 0 alone while the other rank waits. Weight bytes and bandwidth of TP=2 rows are per GPU.
NCCL's environment (NCCL_NVLS_ENABLE, TORCH_SYMM_MEM_DISABLE_MULTICAST) is used as the machine sets it and
recorded in the report."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from sparsedecoding.engine.bench import SpeedResult, bench_preset, copy_bandwidth, format_table
from sparsedecoding.engine.parallel import start_from_env
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.runenv import environment_markdown
from sparsedecoding.settings import add_all_reduce_option

DENSE = None
TWO_FOUR = SparsityPattern.parse("2:4")
# preset -> (runs at TP=2, runs at TP=1); a run is (pattern or DENSE, batch sizes)
PLAN = {
    "llama-3.3-70b": ([(DENSE, [1, 4]), (TWO_FOUR, [1, 4])], []),
    "llama-3.1-8b": ([(DENSE, [1, 4]), (TWO_FOUR, [1, 4])], [(DENSE, [1, 4]), (TWO_FOUR, [1, 4])]),
}
NCCL_ENVIRONMENT = ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")
ALL_REDUCE_NOTE = {"auto": "the one-shot symmetric-memory kernel for decode-step sizes, NCCL for prefill",
                   "nccl": "NCCL's all-reduce, captured in the CUDA graph",
                   "one-shot": "PyTorch's one-shot symmetric-memory kernel for decode-step sizes, NCCL for prefill"}


def target_lines(results: list) -> list[str]:
    """Issue 14's targets, checked against this run."""
    speed = {(r.model, r.weights, r.batch, r.gpus): r.tokens_per_second for r in results
             if isinstance(r, SpeedResult)}
    lines = ["## Targets", ""]
    dense70, sparse70 = speed.get(("llama-3.3-70b", "dense", 1, 2)), speed.get(("llama-3.3-70b", "2:4", 1, 2))
    if dense70:
        lines.append(f"- Llama-3.3-70B dense, TP=2, batch 1: {dense70:.1f} tok/s (target >= 40)")
    if dense70 and sparse70:
        lines.append(f"- Llama-3.3-70B 2:4 vs dense, TP=2, batch 1: {sparse70 / dense70:.3f}x (target >= 1.45; "
                     f"{sparse70:.1f} tok/s)")
    for weights in ("dense", "2:4"):
        for batch in (1, 4):
            one, two = speed.get(("llama-3.1-8b", weights, batch, 1)), speed.get(("llama-3.1-8b", weights, batch, 2))
            if one and two:
                lines.append(f"- Llama-3.1-8B {weights}, batch {batch}: TP=2 {two:.1f} vs TP=1 {one:.1f} tok/s "
                             f"({two / one:.2f}x; 2.00x would mean free all-reduces and perfect bandwidth scaling)")
    return lines + [""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", action="append", choices=list(PLAN),
                        help="run only these presets of the plan (repeatable; default: all)")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    add_all_reduce_option(parser)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "tp_h200x2.md")
    args = parser.parse_args()
    if int(os.environ.get("WORLD_SIZE", "1")) < 2 or not torch.cuda.is_available():
        print("error: run under `torchrun --nproc-per-node 2` on a machine with 2 GPUs", file=sys.stderr)
        return 2
    plan = {name: runs for name, runs in PLAN.items() if not args.preset or name in args.preset}
    with start_from_env(torch.device("cuda"), args.all_reduce) as (tp, device):
        first = tp.rank() == 0
        copy = copy_bandwidth(device)
        results = []
        for name, (parallel_runs, single_runs) in plan.items():
            results += bench_preset(name, parallel_runs, device, new_tokens=args.new_tokens, repeats=args.repeats,
                                    tp=tp)
            if single_runs and first:
                results += bench_preset(name, single_runs, device, new_tokens=args.new_tokens, repeats=args.repeats)
            dist.barrier()  # the other ranks wait here while rank 0 measures TP=1
            if first:
                print(format_table(results, copy), flush=True)
        if not first:
            return 0
        gpus = f"{tp.size()} × {torch.cuda.get_device_name(device)}"
        nccl = ".".join(map(str, torch.cuda.nccl.version()))
    command = "torchrun --nproc-per-node 2 " + " ".join(sys.argv)
    settings = ", ".join(f"{key}={os.environ.get(key, 'unset')}" for key in NCCL_ENVIRONMENT)
    lines = ["# Tensor-parallel decode speed (random weights, presets)", "", environment_markdown(command, device),
             f"- GPUs: {gpus}; NCCL {nccl}; {settings}",
             f"- all-reduce of the TP=2 rows: {args.all_reduce} ({ALL_REDUCE_NOTE[args.all_reduce]})", "",
             f"Decode steps only ({args.new_tokens - 1} per generation after a prefill of 16 random tokens), median "
             f"of {args.repeats}; ratio = sparse tok/s / dense tok/s at the same model, batch and GPU count. Copy "
             "bandwidth is one GPU's.", "", format_table(results, copy), *target_lines(results)]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
