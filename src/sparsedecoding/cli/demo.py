"""`sparsedecoding demo`: the whole idea in a few minutes on a CPU. Fetch SmolLM2-135M-Instruct, let it answer the
HumanEval calibration prompts, prune it to 2:4 with SparseGPT on Hessians from those decode steps only, prune it again
from the same number of fixed-text tokens (the baseline), and compare the three models on held-out prompts (on-policy
KL, the dense model's NLL of each model's own answers) and on held-out text (Lee corpus perplexity)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ..settings import CalibrationSettings, RunSettings, SolverSettings, add_arguments

DEMO_MARK = "demo.json"
# The demo's own defaults (small enough for a few CPU minutes); every other knob is prune's.
DEMO = {"model": "smollm2-135m", "out": "sparsedecoding-demo", "n_prompts": 12, "max_new_tokens": 96, "tokens": 1024,
        "gen_batch_size": 12}


def register(subparsers) -> None:
    parser = subparsers.add_parser("demo", help="prune the default model on CPU and print a before/after table",
                                   description=__doc__)
    add_arguments(parser, RunSettings, defaults=DEMO, skip=("overwrite",))
    parser.add_argument("--eval-prompts", type=int, default=6, help="held-out HumanEval prompts scored (default: 6)")
    parser.add_argument("--eval-new-tokens", type=int, default=64,
                        help="greedy new tokens per held-out answer (default: 64)")
    add_arguments(parser, SolverSettings, "solver", defaults=DEMO)
    add_arguments(parser, CalibrationSettings, "calibration", defaults=DEMO)
    parser.set_defaults(func=run)


def held_out_scores(dense, models: dict, tokenizer, prompts: list[str], new_tokens: int) -> dict:
    """Per model: on-policy KL(dense ‖ model) and dense NLL per token of the model's own greedy answers, the first
    answer, and Lee perplexity."""
    from ..data import chat_format, lee_text
    from ..evaluation.metrics import on_policy_scores, perplexity
    from ..generation import generate, tokenize_prompts

    prompt_ids = tokenize_prompts(tokenizer, chat_format(tokenizer, prompts))
    text_ids = tokenizer(lee_text("test"), add_special_tokens=False)["input_ids"][:4096]
    rows = {}
    for name, model in models.items():
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

    from ..data import humaneval_prompts
    from ..errors import OutputExistsError
    from ..models import load_model, resolve_model
    from ..pipeline import PRUNED_MANIFEST, prune
    from ..runenv import pick_device
    from .prune import config_from_args

    for calibration in ("decode", "text"):  # bad settings fail here, before anything is fetched or removed
        config_from_args(args, calibration=calibration, out=args.out).check_values()
    pick_device(args.device)
    out = Path(args.out)
    if out.exists():
        if not (out / DEMO_MARK).exists():
            raise OutputExistsError(f"{out} exists and is not an earlier demo; pass another --out")
        shutil.rmtree(out)
    print(f"[1/4] fetching {args.model}")
    folder = resolve_model(args.model)  # an offline name is fetched; a folder or .gguf is used as given
    print(f"      {folder}")
    args.model = str(folder)
    print(f"[2/4] pruning to {args.pattern}, Hessians from the model's own decode steps ({args.tokens} tokens)")
    decode_out = prune(config_from_args(args, calibration="decode", out=str(out / "decode")))
    tokens = json.loads((decode_out / PRUNED_MANIFEST).read_text())["calibration"]["tokens"]
    print(f"[3/4] pruning to {args.pattern}, Hessians from Lee news text (the same {tokens} tokens)")
    text_out = prune(config_from_args(args, calibration="text", tokens=tokens, out=str(out / "text")))
    (out / DEMO_MARK).write_text(json.dumps({"command": ["sparsedecoding", *sys.argv[1:]]}))

    print("[4/4] scoring the three models on held-out prompts and text")
    dense, tokenizer, _ = load_model(folder, "cpu" if args.device == "auto" else args.device)
    device = next(dense.parameters()).device
    models = {"dense": dense, "text": load_model(text_out, device)[0], "decode": load_model(decode_out, device)[0]}
    rows = held_out_scores(dense, models, tokenizer, humaneval_prompts("eval")[:args.eval_prompts],
                           args.eval_new_tokens)
    print()
    print("| model | KL(dense ‖ model) on its own answers | dense NLL of its answers | Lee perplexity |")
    print("|---|---|---|---|")
    labels = {"dense": "dense", "text": f"{args.pattern}, text-calibrated", "decode": f"{args.pattern}, decode-calibrated"}
    for name, row in rows.items():
        print(f"| {labels[name]} | {row['kl']:.4f} | {row['dense_nll']:.3f} | {row['ppl']:.2f} |")
    print()
    for name, row in rows.items():
        print(f"first held-out answer, {labels[name]}: {row['sample'][:120]!r}")
    print()
    print(f"calibration: {tokens} tokens per source; held-out: {args.eval_prompts} odd-index HumanEval prompts")
    print(f"pruned models saved to {(out / 'decode').resolve()} and {(out / 'text').resolve()} "
          f"(HF safetensors, zeros kept; details in {PRUNED_MANIFEST})")
    return 0
