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
    register_compare(subparsers)


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


def register_compare(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare", help="the quality grid: dense vs text- vs decode-calibrated pruning, one markdown report",
        description="Prune and evaluate the grid of configurations (see `--list`) and write OUT/quality.md. "
                    "Finished configurations are skipped, so runs can be split with --configs and resumed.")
    parser.add_argument("--model", default="qwen2.5-coder-1.5b", help="main model (default qwen2.5-coder-1.5b)")
    parser.add_argument("--small-model", default="smollm2-135m",
                        help="model of the cross-model ablation (default smollm2-135m)")
    parser.add_argument("--out", default="benchmarks/results/quality", help="report folder")
    parser.add_argument("--configs", default=None,
                        help="comma-separated name globs, e.g. 'dense,*-sparsegpt-2of4' (default: all)")
    parser.add_argument("--list", action="store_true", help="print the configuration names and exit")
    parser.add_argument("--calib-prompts", default="humaneval:calib", help="decode calibration prompts")
    parser.add_argument("--text", default=None, help="natural text file of the text source (default: Lee corpus)")
    parser.add_argument("--tokens", type=int, default=16384, help="calibration tokens per source (default 16384)")
    parser.add_argument("--calib-new-tokens", type=int, default=512,
                        help="new tokens per calibration prompt (default 512)")
    parser.add_argument("--samples-per-prompt", type=int, default=1,
                        help="sampled calibration continuations per prompt (default 1: greedy)")
    parser.add_argument("--temperature", type=float, default=1.0, help="calibration sampling temperature")
    parser.add_argument("--top-p", type=float, default=1.0, help="calibration sampling top-p")
    parser.add_argument("--percdamp", type=float, default=0.01, help="SparseGPT relative damping (default 0.01)")
    parser.add_argument("--refine-steps", type=int, default=0,
                        help="block-wise refinement steps per layer after SparseGPT (default 0: off; see prune)")
    parser.add_argument("--refine-lr", type=float, default=1e-5, help="refinement learning rate (default 1e-5)")
    parser.add_argument("--mix-ratio", type=float, default=0.5, help="decode share of the mix source (default 0.5)")
    parser.add_argument("--gen-batch-size", type=int, default=82, help="prompts per calibration generation batch")
    parser.add_argument("--batch-size", type=int, default=8, help="sequences per pruning replay batch")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:1 ... (default auto)")
    parser.add_argument("--seed", type=int, default=0)
    add_eval_arguments(parser)
    parser.set_defaults(func=run_compare_command, eval_batch_size=82, score_batch_size=16)


def run_compare_command(args) -> int:
    import sys

    from ..compare import CompareSettings, grid, run_compare
    from ..evaluation.suite import METRICS

    if args.list:
        print("\n".join(config.name for config in grid()))
        return 0
    settings = CompareSettings(
        model=args.model, small_model=args.small_model, out=args.out, calib_prompts=args.calib_prompts,
        text=args.text, tokens=args.tokens, max_new_tokens=args.calib_new_tokens,
        samples_per_prompt=args.samples_per_prompt, temperature=args.temperature, top_p=args.top_p,
        percdamp=args.percdamp, refine_steps=args.refine_steps, refine_lr=args.refine_lr, mix_ratio=args.mix_ratio,
        gen_batch_size=args.gen_batch_size, batch_size=args.batch_size, device=args.device, seed=args.seed,
        evaluation=settings_from_args(args, METRICS),
        command=["sparsedecoding", *sys.argv[1:]])
    patterns = [part.strip() for part in args.configs.split(",") if part.strip()] if args.configs else None
    report = run_compare(settings, patterns)
    text = report.read_text(encoding="utf-8")
    print(text[text.index("## "):text.index("## Runs")])
    return 0
