"""`sparsedecoding eval`: pass@1 (sandboxed), on-policy KL and dense NLL, repetition and perplexity of one model."""

from __future__ import annotations

from ..settings import METRICS, EvalSettings, RunSettings, add_arguments, from_args

# Where `add_arguments` puts the evaluation values on args, apart from the other groups' (both have max_new_tokens).
EVAL_PREFIX = "eval_"


def eval_settings_from_args(args, metrics: tuple[str, ...]) -> EvalSettings:
    return EvalSettings(**from_args(EvalSettings, args, EVAL_PREFIX, metrics=metrics))


def register(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a (pruned) model: pass@1, on-policy KL, perplexity",
                                   description=__doc__)
    parser.add_argument("--model", required=True, help="HF model folder, .gguf file, or offline model name")
    parser.add_argument("--reference", default=None,
                        help="the dense model, for on-policy KL and dense NLL (default: none)")
    parser.add_argument("--metrics", default=None,
                        help=f"comma-separated subset of {','.join(METRICS)} (default: all; kl only with --reference)")
    parser.add_argument("--out", required=True, help="output folder: metrics.json and humaneval.jsonl")
    add_arguments(parser, RunSettings, skip=("model", "out", "seed", "recipe"))
    add_arguments(parser, EvalSettings, "evaluation", prefix=EVAL_PREFIX)
    parser.set_defaults(func=run_eval_command)


def run_eval_command(args) -> int:
    import json

    from ..evaluation.suite import run_eval

    if args.metrics is None:
        metrics = tuple(name for name in METRICS if name != "kl" or args.reference)
    else:
        metrics = tuple(name.strip() for name in args.metrics.split(",") if name.strip())
    out = run_eval(args.model, args.out, eval_settings_from_args(args, metrics), reference=args.reference,
                   device=args.device, overwrite=args.overwrite)
    results = json.loads((out / "metrics.json").read_text())["metrics"]
    shown = {key: value for key, value in results.items() if isinstance(value, (int, float))}
    print(" ".join(f"{key}={value:.4g}" for key, value in shown.items()))
    print(f"written to {out}")
    return 0
