"""The greedy pick's cost: `torch.argmax` against the two-stage `two_stage_argmax` on logits rows, each captured in a
CUDA graph (as the engine's decode step is) and timed by replays, side by side in one process. The engine's
`argmax_rows` times the two the same way, once per vocabulary and dtype, and takes the faster.

    python benchmarks/argmax_bench.py --out benchmarks/results/argmax_h200.md

Vocabularies: Llama-3.1 (128,256) and Qwen2.5 (151,936); batch 1, 4, 16; bf16 (the engine's greedy logits) and
float32 (sampling adds Gumbel noise in float32). Every pair is checked for equal indices before it is timed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from sparsedecoding.engine.generate import two_stage_argmax
from sparsedecoding.kernels.autotune import replay_ms
from sparsedecoding.runenv import environment_markdown, write_report

VOCABULARIES = {"Llama-3.1": 128256, "Qwen2.5": 151936}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 4, 16])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if min(args.batches) < 1:
        parser.error(f"--batches {args.batches}: every batch needs at least one row")
    if not torch.cuda.is_available():
        print("error: argmax_bench times CUDA graphs and needs a CUDA GPU", file=sys.stderr)
        return 2
    generator = torch.Generator(device="cuda").manual_seed(0)
    rows = ["| vocabulary | batch | dtype | torch.argmax (us) | two stages (us) | two stages / argmax |",
            "|---|---|---|---|---|---|"]
    for name, vocab in VOCABULARIES.items():
        for batch in args.batches:
            for dtype in (torch.bfloat16, torch.float32):
                logits = [torch.randn(batch, vocab, device="cuda", generator=generator).to(dtype) for _ in range(4)]
                for scores in logits:  # equal indices, and a first call outside the capture
                    if not torch.equal(two_stage_argmax(scores), scores.argmax(-1)):
                        print(f"error: two_stage_argmax differs from torch.argmax on {name} batch {batch} {dtype}",
                              file=sys.stderr)
                        return 1
                plain = replay_ms(lambda scores: scores.argmax(-1), logits) * 1e3
                two_stage = replay_ms(two_stage_argmax, logits) * 1e3
                rows.append(f"| {name} ({vocab}) | {batch} | {str(dtype).split('.')[-1]} | {plain:.2f} | "
                            f"{two_stage:.2f} | {two_stage / plain:.2f}x |")
                print(rows[-1], flush=True)
    command = "python benchmarks/argmax_bench.py " + " ".join(argv if argv is not None else sys.argv[1:])
    text = ["# Greedy pick: torch.argmax vs two stages (two_stage_argmax)", "", environment_markdown(command).rstrip(), "",
            "Median microseconds per call over CUDA-graph replays (`kernels.autotune.replay_ms`, four logits tensors "
            "round-robin); each pair checked for equal indices first.", "", *rows]
    write_report(args.out, "\n".join(text) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
