"""One engine setting, A/B, side by side in one process: the preset's dense model once, then its N:M model built
under each value of the setting (read when the engine builds a model), every one measured like `sparsedecoding
bench` (random weights, decode steps compiled and captured in a CUDA graph, median of the repeats).

    python benchmarks/setting_ab_bench.py --setting SPARSEDECODING_FUSE_NORM --values 0 1 \\
        --preset llama-3.1-8b --batch 1 4 --out results/fuse_norm_h200_8b.md

With `--quantize`, the kept values are int8 / int4; `--head` quantizes lm_head too; `--quantized-dense` also runs
the dense weight-only quantized model under each value (for settings of the dense-quantized path, such as
SPARSEDECODING_DENSE_INT4). Under SPARSEDECODING_STEP_TUNE the report also lists what the step tuning of each
value's engines tried and kept (its log lines).
"""

from __future__ import annotations

import argparse
import dataclasses
import logging
import os
import sys
from pathlib import Path

import torch

from sparsedecoding.engine.bench import SpeedResult, bench_preset, check_group_size, copy_bandwidth, format_table
from sparsedecoding.engine.config import preset
from sparsedecoding.kernels.quantized import QUANTIZED_FORMATS
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.runenv import environment_markdown, write_report


class StepTuningLines(logging.Handler):
    """Collects the engine's "step tuning: ..." log lines (`engine.generate`, one per problem, whole-build move or
    pair of problems the step tuning decided)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("step tuning: "):
            self.lines.append(message.removeprefix("step tuning: "))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--setting", required=True, help="an environment variable the engine reads")
    parser.add_argument("--values", nargs="+", required=True)
    parser.add_argument("--preset", default="llama-3.1-8b")
    parser.add_argument("--pattern", type=SparsityPattern.parse, default=SparsityPattern.parse("2:4"))
    parser.add_argument("--batch", nargs="+", type=int, default=[1])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--new-tokens", type=int, default=256,
                        help="tokens a generation writes after its 16-token prompt; the KV cache holds both "
                             "(default: %(default)s)")
    parser.add_argument("--quantize", choices=QUANTIZED_FORMATS,
                        help="quantize the N:M model's kept values (the dense baseline stays bf16)")
    parser.add_argument("--group-size", type=int, default=128, help="int4: columns a scale (default: 128)")
    parser.add_argument("--head", choices=QUANTIZED_FORMATS, help="with --quantize: lm_head dense int8 / int4 too")
    parser.add_argument("--quantized-dense", action="store_true",
                        help="with --quantize: the dense quantized model under each value too")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    from sparsedecoding.errors import SparseDecodingError
    from sparsedecoding.kernels import op, sp24

    if args.new_tokens < 2:
        parser.error(f"--new-tokens {args.new_tokens}: a generation needs at least 2 (one decode step timed)")
    if (args.head or args.quantized_dense) and not args.quantize:
        parser.error("--head and --quantized-dense go with --quantize")
    known = op.SETTINGS
    if args.setting not in known:
        parser.error(f"--setting {args.setting}: not a setting the engine reads; use one of {', '.join(known)}")

    try:  # the group size too, before the first model is built
        check_group_size(preset(args.preset), args.quantize, args.group_size, args.head)
    except SparseDecodingError as exc:
        parser.error(str(exc))
    original = os.environ.get(args.setting)

    def restore() -> None:  # the setting as the caller had it: for the dense model and the report's settings line
        if original is None:
            os.environ.pop(args.setting, None)
        else:
            os.environ[args.setting] = original

    for value in args.values:  # every value checked before the first model is built
        os.environ[args.setting] = value
        try:
            op.settings()
        except SparseDecodingError as exc:
            parser.error(str(exc))
    restore()
    if not torch.cuda.is_available():
        print("error: setting_ab_bench needs a CUDA GPU", file=sys.stderr)
        return 2

    device = torch.device("cuda")
    copy = copy_bandwidth(device)
    results = bench_preset(args.preset, [(None, args.batch)], device, new_tokens=args.new_tokens,
                           repeats=args.repeats)
    kept_launches = []  # per value: the sp24 launch each 2:4 problem kept (the tuner's, or the step tuner's pick)
    step_lines = StepTuningLines()
    engine_log = logging.getLogger("sparsedecoding.engine.generate")
    engine_log.addHandler(step_lines)
    engine_log.setLevel(logging.INFO)
    step_tuning = []  # per value: what the step tuning tried and kept
    for value in args.values:
        os.environ[args.setting] = value
        kept_before = {key: choice for key, (choice, _) in sp24.tuning_results().items()}
        torch._dynamo.reset()  # no compiled block reused from the previous value: each is compiled under its own
        op.clear_runners()  # nor a kernel runner built under it
        plan = ([(None, args.batch)] if args.quantized_dense else []) + [(args.pattern, args.batch)]
        runs = bench_preset(args.preset, plan, device, new_tokens=args.new_tokens, repeats=args.repeats,
                            quantize=args.quantize, group_size=args.group_size, head=args.head)
        results += [dataclasses.replace(r, weights=f"{r.weights}, {args.setting}={value}")
                    if isinstance(r, SpeedResult) else r for r in runs]
        print(format_table(results, copy), flush=True)
        step_tuning += [f"- {args.setting}={value}: {line}" for line in step_lines.lines]
        step_lines.lines.clear()
        kept_launches += [f"- {args.setting}={value}: {sp24.problem_text(key)}: {sp24.choice_label(choice)}"
                          + ("" if key not in kept_before else
                             f" (moved from {sp24.choice_label(kept_before[key])}, the earlier value's)")
                          for key, (choice, _) in sp24.tuning_results().items()
                          if kept_before.get(key) != choice]
    restore()
    kept = f" + {args.quantize}" if args.quantize else ""
    kept += f", {args.head} lm_head" if args.head else ""
    kept += ", and dense quantized" if args.quantized_dense else ""
    lines = [f"# {args.setting} A/B: {args.preset}, {args.pattern}{kept}, side by side", "",
             environment_markdown("python " + " ".join(sys.argv), device), "",
             f"Kernel settings outside the A/B (the dense model ran under these): {op.settings_line()}", "",
             "One process: dense once, then the N:M model (and with --quantized-dense the dense quantized one) built "
             "under each value; decode steps compiled and captured "
             f"in a CUDA graph ({args.new_tokens - 1} a generation after a 16-token prompt, a KV cache of "
             f"{-(-(16 + args.new_tokens) // 16) * 16} positions), median of {args.repeats}; ratio = tok/s / dense "
             "tok/s at the same batch.", "",
             format_table(results, copy), ""]
    if kept_launches:
        lines += ["## The sp24 launches kept", "",
                  "Per value, each 2:4 problem's launch after tuning (splits, `/Ns` slices, `+e` the early-trigger "
                  "build where SPARSEDECODING_SP24_EARLY_TRIGGER=timed chose it; with SPARSEDECODING_STEP_TUNE the "
                  "step tuner's pick); where a setting leaves the problems as they were (not part of a problem's "
                  "key), a later value lists only the launches its tuning moved, the rest kept from the value "
                  "before:", "", *kept_launches, ""]
    if step_tuning:
        lines += ["## What the step tuning tried", "",
                  "Per value, in order, each engine's (one per batch) moves: the whole-build move, each problem's "
                  "candidates, then with SPARSEDECODING_STEP_TUNE_PAIRS each pair's pairings, with the median "
                  "decode-step time of each:", "", *step_tuning, ""]
    write_report(args.out, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
