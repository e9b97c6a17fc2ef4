"""`sparsedecoding demo`: the whole idea in two minutes on a CPU. Fetch SmolLM2-135M-Instruct, let it answer the
HumanEval calibration prompts, prune it to 2:4 with SparseGPT on Hessians from those decode steps only, and compare
dense and pruned on held-out prompts (on-policy KL, the dense model's NLL of the pruned model's answers) and on
held-out text (Lee corpus perplexity)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

DEMO_MARK = "demo.json"


def register(subparsers) -> None:
    from .prune import add_calibration_arguments

    parser = subparsers.add_parser("demo", help="prune the default model on CPU and print a before/after table",
                                   description=__doc__)
    parser.add_argument("--model", default="smollm2-135m", help="model to prune (default smollm2-135m)")
    parser.add_argument("--out", default="sparsedecoding-demo",
                        help="output folder (default ./sparsedecoding-demo; an earlier demo there is replaced)")
    parser.add_argument("--pattern", default="2:4")
    parser.add_argument("--eval-prompts", type=int, default=8, help="held-out HumanEval prompts scored (default 8)")
    parser.add_argument("--eval-new-tokens", type=int, default=96)
    parser.add_argument("--device", default="auto")
    add_calibration_arguments(parser)
    parser.set_defaults(func=run, n_prompts=16, max_new_tokens=128, tokens=2048, gen_batch_size=16)


def held_out_scores(dense, pruned, tokenizer, prompts: list[str], new_tokens: int) -> dict:
    """On-policy KL(dense ‖ pruned) and dense NLL per token of the pruned model's greedy answers; Lee perplexity."""
    from ..data import chat_format, lee_text
    from ..evaluation.metrics import on_policy_scores, perplexity
    from ..generation import generate, tokenize_prompts

    prompt_ids = tokenize_prompts(tokenizer, chat_format(tokenizer, prompts))
    text_ids = tokenizer(lee_text("test"), add_special_tokens=False)["input_ids"][:4096]
    rows = {}
    for name, model in (("dense", dense), ("pruned", pruned)):
        generations = generate(model, tokenizer, prompt_ids, new_tokens, batch_size=len(prompt_ids), progress=False)
        scores = on_policy_scores(dense, model, generations, tokenizer.pad_token_id)
        tokens = sum(score.tokens for score in scores)
        rows[name] = {
            "kl": sum(score.kl for score in scores) / tokens,
            "dense_nll": sum(score.dense_nll for score in scores) / tokens,
            "ppl": perplexity(model, text_ids)[0],
            "sample": tokenizer.decode(generations[0].new_ids, skip_special_tokens=True).strip(),
        }
    return rows


def run(args) -> int:
    import shutil

    from ..models import fetch, load_model
    from ..pipeline import MANIFEST, prune
    from .prune import config_from_args

    out = Path(args.out)
    if out.exists():
        if not (out / DEMO_MARK).exists():
            from ..errors import OutputExistsError

            raise OutputExistsError(f"{out} exists and is not an earlier demo; pass another --out")
        shutil.rmtree(out)
    print(f"[1/3] fetching {args.model}")
    folder = fetch(args.model) if "/" not in args.model else args.model
    print(f"      {folder}")
    print(f"[2/3] pruning to {args.pattern} with {args.calibration} calibration ({args.tokens} tokens)")
    args.model, args.solver, args.propagation = str(folder), "sparsegpt", "dense"
    args.blocksize, args.percdamp, args.hessian_dtype, args.batch_size, args.seed = 128, 0.01, "float32", 8, 0
    args.overwrite = False
    config = config_from_args(args)
    prune(config)
    (out / DEMO_MARK).write_text(json.dumps({"command": ["sparsedecoding", *sys.argv[1:]]}))

    print("[3/3] scoring dense and pruned on held-out prompts and text")
    from ..data import humaneval_prompts

    dense, tokenizer, _ = load_model(folder, config.device if config.device != "auto" else "cpu")
    pruned, _, _ = load_model(out, next(dense.parameters()).device)
    rows = held_out_scores(dense, pruned, tokenizer, humaneval_prompts("eval")[:args.eval_prompts],
                           args.eval_new_tokens)
    manifest = json.loads((out / MANIFEST).read_text())
    sparsity = sum(item["sparsity"] for item in manifest["layers"].values()) / len(manifest["layers"])
    print()
    print(f"| model | linear sparsity | KL(dense‖model) on its answers | dense NLL of its answers | Lee ppl |")
    print("|---|---|---|---|---|")
    print(f"| dense | 0.000 | {rows['dense']['kl']:.4f} | {rows['dense']['dense_nll']:.3f} | {rows['dense']['ppl']:.2f} |")
    print(f"| {args.pattern} ({args.calibration}-calibrated) | {sparsity:.3f} | {rows['pruned']['kl']:.4f} | "
          f"{rows['pruned']['dense_nll']:.3f} | {rows['pruned']['ppl']:.2f} |")
    print()
    print(f"held-out prompt 1, dense answer:  {rows['dense']['sample'][:160]!r}")
    print(f"held-out prompt 1, pruned answer: {rows['pruned']['sample'][:160]!r}")
    print()
    print(f"calibration: {manifest['calibration']['tokens']} decode tokens from "
          f"{manifest['calibration']['sequences']} sequences; solver time {manifest['timing']['solver_seconds_this_run']} s")
    print(f"pruned model saved to {out.resolve()} (HF safetensors, zeros kept; details in {MANIFEST})")
    return 0
