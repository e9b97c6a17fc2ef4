"""`sparsedecoding eval`: pass@1 (sandboxed), on-policy KL and dense NLL, repetition and perplexity of one model.
`sparsedecoding compare`: the quality grid (dense vs text- vs decode-calibrated pruning) written as a report."""

from __future__ import annotations


def add_eval_arguments(parser) -> None:
    """Evaluation options shared by `eval` and `compare`."""
    group = parser.add_argument_group("evaluation")
    group.add_argument("--split", default="eval", choices=["calib", "eval", "all"],
                       help="HumanEval half for pass@1 (default eval: the odd, held-out half)")
    group.add_argument("--prompts", default=None,
                       help="prompts for kl/repetition: a .jsonl/.txt file or humaneval:SPLIT (default: the --split)")
    group.add_argument("--limit", type=int, default=None, help="only the first N problems/prompts (smoke tests)")
    group.add_argument("--max-new-tokens", type=int, default=512, help="greedy new tokens per prompt (default 512)")
    group.add_argument("--eval-batch-size", type=int, default=32, help="prompts per generation batch (default 32)")
    group.add_argument("--score-batch-size", type=int, default=8,
                       help="sequences per teacher-forced scoring pass (default 8)")
    group.add_argument("--ppl-window", type=int, default=512, help="tokens per perplexity window (default 512)")
    group.add_argument("--timeout", type=float, default=10.0, help="sandbox wall/CPU seconds per problem (default 10)")
    group.add_argument("--memory-mb", type=int, default=1024, help="sandbox address-space limit (default 1024)")
    group.add_argument("--workers", type=int, default=None, help="parallel sandboxes (default: CPU count)")


def settings_from_args(args, metrics: tuple[str, ...]):
    from ..evaluation.suite import EvalSettings

    return EvalSettings(metrics=metrics, split=args.split, prompts=args.prompts, limit=args.limit,
                        max_new_tokens=args.max_new_tokens, gen_batch_size=args.eval_batch_size,
                        score_batch_size=args.score_batch_size, ppl_window=args.ppl_window, timeout_s=args.timeout,
                        memory_mb=args.memory_mb, workers=args.workers)


def register(subparsers) -> None:
    parser = subparsers.add_parser("eval", help="evaluate a (pruned) model: pass@1, on-policy KL, perplexity",
                                   description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="HF model folder, .gguf file, or offline model name")
    parser.add_argument("--reference", default=None, help="the dense model, for on-policy KL and dense NLL")
    parser.add_argument("--metrics", default=None,
                        help="comma-separated subset of pass@1,kl,repetition,ppl (default: all; kl only with "
                             "--reference)")
    parser.add_argument("--out", required=True, help="output folder: metrics.json and humaneval.jsonl")
    add_eval_arguments(parser)
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ... (default auto)")
    parser.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    parser.set_defaults(func=run_eval_command)


def run_eval_command(args) -> int:
    import json

    from ..evaluation.suite import METRICS, run_eval

    if args.metrics is None:
        metrics = tuple(name for name in METRICS if name != "kl" or args.reference)
    else:
        metrics = tuple(name.strip() for name in args.metrics.split(",") if name.strip())
    out = run_eval(args.model, args.out, settings_from_args(args, metrics), reference=args.reference,
                   device=args.device, overwrite=args.overwrite)
    results = json.loads((out / "metrics.json").read_text())["metrics"]
    shown = {key: value for key, value in results.items() if isinstance(value, (int, float))}
    print(" ".join(f"{key}={value:.4g}" for key, value in shown.items()))
    print(f"written to {out}")
    return 0
