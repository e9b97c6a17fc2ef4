"""What the overflow limit of an N:M+K pattern costs, on a CPU: SmolLM2-135M pruned to 2:4, 16:32+K and 16:32.

A first look at the question in `CUDA_KERNEL_NOTES.md` (fourteenth session): 16:32 keeps more quality than 2:4 but
runs slowly from batch 3. A 2:4 weight plus a few entries a word (16:32+K) could run at nearly 2:4's speed. How much
of 16:32's quality does such a mask keep? Each pattern is pruned with SparseGPT on Hessians from the dense model's
own greedy answers to the `fit` quarter of HumanEval. Scoring uses the `dev` quarter (no held-out problem) and the
demo's measures: agreement with and KL from the dense model along its own answers, distinct 4-grams, and Lee
perplexity. On a 135M model these are proxies, not pass@1.

    python benchmarks/overflow_cap_cpu.py --patterns 2:4 16:32+2 16:32+4 16:32 \\
        --out benchmarks/results/overflow_cap_smollm2_cpu.md
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

from sparsedecoding.cli.demo import held_out_scores
from sparsedecoding.data import humaneval_prompts
from sparsedecoding.errors import SparseDecodingError
from sparsedecoding.models import load_model, resolve_model
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.pipeline import prune
from sparsedecoding.runenv import environment_markdown, print_report
from sparsedecoding.settings import PruneConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--patterns", nargs="+", default=["2:4", "16:32+2", "16:32+4", "16:32"])
    parser.add_argument("--tokens", type=int, default=4096, help="calibration decode tokens (default: 4096)")
    parser.add_argument("--eval-prompts", type=int, default=16, help="dev-quarter prompts scored (default: 16)")
    parser.add_argument("--eval-new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, help="also write the markdown report here")
    args = parser.parse_args(argv)
    if args.eval_prompts < 1 or args.eval_new_tokens < 1:
        parser.error("--eval-prompts and --eval-new-tokens must be at least 1")

    def config(pattern: str, model: str, work: str) -> PruneConfig:
        return PruneConfig(model=model, out=str(Path(work) / pattern.replace(":", "of")), pattern=pattern,
                           prompts="humaneval:fit", tokens=args.tokens, max_new_tokens=128, gen_batch_size=12,
                           device="cpu", solver="sparsegpt")  # as its committed report

    try:  # every setting checked before the model is fetched or anything is pruned
        patterns = [str(SparsityPattern.parse(text)) for text in args.patterns]
        for pattern in patterns:
            config(pattern, args.model, "unused").check_values()
    except SparseDecodingError as exc:
        parser.error(str(exc))
    started = time.perf_counter()
    folder = resolve_model(args.model)
    dense, tokenizer, _ = load_model(folder, "cpu")
    models = {"dense": dense}
    with tempfile.TemporaryDirectory() as work:
        for pattern in patterns:
            print(f"pruning to {pattern}", flush=True)
            models[pattern] = load_model(prune(config(pattern, str(folder), work)), "cpu")[0]
        rows = held_out_scores(dense, models, tokenizer, humaneval_prompts("dev")[:args.eval_prompts],
                               args.eval_new_tokens)
    torch.set_printoptions(precision=4)
    lines = ["# N:M+K on SmolLM2-135M (CPU): what the overflow limit costs", "",
             environment_markdown("python " + " ".join(sys.argv), torch.device("cpu")), "",
             f"Model `{folder.name}`; SparseGPT on {args.tokens} greedy decode tokens of the dense model's answers to "
             f"HumanEval's fit quarter; scored on the first {args.eval_prompts} prompts of the dev quarter "
             f"({args.eval_new_tokens} greedy tokens each) and 2048 tokens of the Lee test text. 16:32+K: at most K "
             "kept weights beyond two in a group of four, per 32 columns (16:32+0 is 2:4's mask, 16:32+8 16:32's). "
             f"Run time {time.perf_counter() - started:.0f} s.", "",
             "| pattern | picks dense's next token ↑ | KL(dense ‖ model) ↓ | distinct 4-grams ↑ | Lee perplexity ↓ |",
             "|---|---|---|---|---|"]
    lines += [f"| {name} | {row['agree']:.1%} | {row['kl']:.3f} | {row['distinct_4']:.2f} | {row['ppl']:.1f} |"
              for name, row in rows.items()]
    print_report("\n".join(lines) + "\n", args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
