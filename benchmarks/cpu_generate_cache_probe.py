"""How long does transformers' `generate` take on the CPU for the default model, with its default (growing) KV cache
against `cache_implementation="static"`? A decode calibration on a 2-core CPU showed about 7 tok/s on its progress
bar at batch 32 (SmolLM2-135M, 512 new tokens, sampled), with most CPU time in the kernel. This times one greedy
batch each way, same prompts (random token ids), same number of steps, side by side in one run. `--rows padded` adds
the default cache on the same prompts left-padded (each row's first 0-80% of positions masked, as a calibration
batch of prompts of unequal length is), `padded-gqa` the same through `generation.cpu_gqa_attention` (the key-value
heads shared in SDPA, as `generation.generate` runs on the CPU), and `--rows` picks the rows; each row also gives
the process's user and system CPU seconds.

    PYTHONPATH=src python benchmarks/cpu_generate_cache_probe.py --out benchmarks/results/cpu_generate_cache_probe.md
    PYTHONPATH=src python benchmarks/cpu_generate_cache_probe.py --rows default padded padded-gqa \
        --prompt-tokens 300 --out benchmarks/results/cpu_generate_padding_gqa_probe.md
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from transformers import GenerationConfig

from sparsedecoding.generation import cpu_gqa_attention
from sparsedecoding.models import load_model
from sparsedecoding.runenv import environment_markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=150)
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--rows", nargs="+", choices=("default", "static", "padded", "padded-gqa"),
                        default=["default", "static"],
                        help="default and static: the two caches on unpadded prompts; padded: the default cache on "
                        "the same prompts left-padded; padded-gqa: that through generation.cpu_gqa_attention "
                        "(default: default static)")
    args = parser.parse_args()
    if min(args.batch, args.prompt_tokens, args.new_tokens) < 1:
        parser.error("--batch, --prompt-tokens and --new-tokens must be positive")
    if not args.out.resolve().parent.is_dir():
        parser.error(f"--out {args.out}: its folder does not exist")
    model, _, _ = load_model("smollm2-135m", "cpu", torch.float32)
    model.eval()
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(100, 1000, (args.batch, args.prompt_tokens), generator=generator)
    padded = torch.ones_like(ids)
    for row in range(args.batch):  # 0-80% of each row's positions masked, the same draw every run
        padded[row, :int(torch.randint(0, int(0.8 * args.prompt_tokens) + 1, (1,), generator=generator))] = 0
    rows, outputs = [], {}
    for name in args.rows:
        cache = "static" if name == "static" else "default"
        mask = padded if name.startswith("padded") else torch.ones_like(ids)
        config = GenerationConfig(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                                  pad_token_id=0, **({"cache_implementation": cache} if cache != "default" else {}))
        model.generation_config = GenerationConfig()
        began, times = time.perf_counter(), os.times()
        with cpu_gqa_attention(model, "cpu") if name == "padded-gqa" else nullcontext():
            out = model.generate(input_ids=ids.masked_fill(mask == 0, 0), attention_mask=mask,
                                 generation_config=config)
        seconds, spent = time.perf_counter() - began, os.times()
        outputs[name] = out
        tokens = args.batch * (out.shape[1] - args.prompt_tokens)
        padding = f"left-padded, {int((mask == 0).sum())} pad" if name.startswith("padded") else "no"
        rows.append(f"| {cache}{', grouped heads' if name == 'padded-gqa' else ''} | {padding} | {seconds:.1f} | "
                    f"{tokens / seconds:.0f} | {spent.user - times.user:.1f} | "
                    f"{spent.system - times.system:.1f} |")
        print(rows[-1], flush=True)
    command = "PYTHONPATH=src python " + " ".join(["benchmarks/cpu_generate_cache_probe.py", *sys.argv[1:]])
    args.out.write_text(
        "# transformers' generate on the CPU: " + ", ".join(args.rows) + "\n\n"
        + environment_markdown(command, torch.device("cpu"))
        + f"\nSmolLM2-135M (float32), one greedy batch of {args.batch} prompts of {args.prompt_tokens} random token "
        f"ids, {args.new_tokens} new tokens each, every row in this run (padded: the same ids, each row's first "
        "positions masked).\n\n| cache | padding | seconds | new tok/s | user CPU s | system CPU s |\n"
        "|---|---|---|---|---|---|\n"
        + "\n".join(rows) + "\n"
        + ("" if not {"padded", "padded-gqa"} <= set(outputs) else "\nGrouped heads against the plain padded row: "
           + ("the same tokens" if torch.equal(outputs["padded"], outputs["padded-gqa"]) else "different tokens")
           + ".\n"))
    print(args.out.read_text())


if __name__ == "__main__":
    main()
