"""`sparsedecoding compare`: the quality grid (dense vs text- vs decode-calibrated pruning) written as one report."""

from __future__ import annotations

from dataclasses import asdict

from ..invocation import command
from ..settings import METRICS, CompareSettings, EvalSettings, add_arguments, from_args
from .evaluate import EVAL_PREFIX, eval_settings_from_args


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "compare", help="the quality grid: dense vs text- vs decode-calibrated pruning, one markdown report",
        description="Prune and evaluate the grid of configurations (see `--list`) and write OUT/quality.md. "
                    "Finished configurations are skipped, so runs can be split with --configs and resumed.")
    parser.add_argument("--configs", default=None,
                        help="comma-separated name globs, e.g. 'dense,*-sparsegpt-2of4' (default: all)")
    parser.add_argument("--list", action="store_true", help="print the configuration names and exit (default: off)")
    add_arguments(parser, CompareSettings)
    add_arguments(parser, EvalSettings, "evaluation", defaults=asdict(CompareSettings().evaluation),
                  prefix=EVAL_PREFIX)
    parser.set_defaults(func=run_compare_command)


def run_compare_command(args) -> int:
    from ..compare import grid, run_compare

    if args.list:
        print("\n".join(config.name for config in grid()))
        return 0
    settings = CompareSettings(**from_args(CompareSettings, args, evaluation=eval_settings_from_args(args, METRICS),
                                           command=command()))
    # An empty selection ("" or ",") is a list with nothing in it, which run_compare refuses; only no --configs is all.
    patterns = None if args.configs is None else [part.strip() for part in args.configs.split(",") if part.strip()]
    report = run_compare(settings, patterns)
    text = report.read_text(encoding="utf-8")
    print(text[text.index("## "):text.index("## Runs")])
    return 0
