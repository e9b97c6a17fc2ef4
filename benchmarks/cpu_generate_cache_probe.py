"""How long does transformers' `generate` take on the CPU for the default model, with its default (growing) KV cache
against `cache_implementation="static"`? A decode calibration on a 2-core CPU showed about 7 tok/s on its progress
bar at batch 32 (SmolLM2-135M, 512 new tokens, sampled), with most CPU time in the kernel. This times one greedy
batch each way, same prompts (random token ids), same number of steps, side by side in one run.

    PYTHONPATH=src python benchmarks/cpu_generate_cache_probe.py --out benchmarks/results/cpu_generate_cache_probe.md
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from transformers import GenerationConfig

from sparsedecoding.models import load_model
from sparsedecoding.runenv import environment_markdown


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=150)
    parser.add_argument("--new-tokens", type=int, default=128)
    args = parser.parse_args()
    if min(args.batch, args.prompt_tokens, args.new_tokens) < 1:
        parser.error("--batch, --prompt-tokens and --new-tokens must be positive")
    if not args.out.resolve().parent.is_dir():
        parser.error(f"--out {args.out}: its folder does not exist")
    model, _, _ = load_model("smollm2-135m", "cpu", torch.float32)
    model.eval()
    ids = torch.randint(100, 1000, (args.batch, args.prompt_tokens), generator=torch.Generator().manual_seed(0))
    rows = []
    for cache in ("default", "static"):
        config = GenerationConfig(max_new_tokens=args.new_tokens, min_new_tokens=args.new_tokens, do_sample=False,
                                  pad_token_id=0, **({"cache_implementation": cache} if cache != "default" else {}))
        model.generation_config = GenerationConfig()
        began = time.perf_counter()
        out = model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=config)
        seconds = time.perf_counter() - began
        tokens = args.batch * (out.shape[1] - args.prompt_tokens)
        rows.append(f"| {cache} | {seconds:.1f} | {tokens / seconds:.0f} |")
        print(rows[-1], flush=True)
    command = "PYTHONPATH=src python " + " ".join(["benchmarks/cpu_generate_cache_probe.py", *sys.argv[1:]])
    args.out.write_text(
        "# transformers' generate on the CPU: default KV cache against a static one\n\n"
        + environment_markdown(command, torch.device("cpu"))
        + f"\nSmolLM2-135M (float32), one greedy batch of {args.batch} prompts of {args.prompt_tokens} random token "
        f"ids, {args.new_tokens} new tokens each, both caches in this run.\n\n"
        "| cache | seconds | new tok/s |\n|---|---|---|\n"
        + "\n".join(rows) + "\n")
    print(args.out.read_text())


if __name__ == "__main__":
    main()
