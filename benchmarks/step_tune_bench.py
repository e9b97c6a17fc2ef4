"""Decode-step tuning of the 2:4 launches (`engine.step_tune`, SPARSEDECODING_STEP_TUNE) against the kernel tuner's
picks, side by side on one engine: the preset's dense bf16 model once per batch, then for each run its 2:4 model
(random weights) in a compiled engine built with the tuner's picks, step-tuned, then timed with the tuner's and the
step-tuned launches alternately (each a fresh capture of the decode step), median of the rounds.

    python benchmarks/step_tune_bench.py --runs bf16:1,4,8,16 int8:1 int4:1 --head int8 \\
        --out results/step_tune_h200_8b.md

A run is VALUES:BATCHES, VALUES one of bf16 (the kept values as they are), int8 or int4 (group size 128); `--head`
makes the quantized runs' lm_head dense int8 / int4 (both models' at that batch: the dense model is measured with
it too). The engines are built under SPARSEDECODING_STEP_TUNE=0 (the tuner's picks), whatever the caller set, and
step-tuned by the bench itself.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

from sparsedecoding.engine.bench import bench_preset, check_group_size, check_plan, release_memory
from sparsedecoding.engine.config import preset
from sparsedecoding.engine.generate import Engine
from sparsedecoding.engine.loading import build_model, random_state
from sparsedecoding.engine.step_tune import BuildChoice, tune_step
from sparsedecoding.errors import SparseDecodingError
from sparsedecoding.kernels import op, sp24
from sparsedecoding.kernels.quantized import QUANTIZED_FORMATS
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.runenv import environment_markdown, write_report

PROMPT = 16


def parse_run(text: str) -> tuple[str, list[int]]:
    values, _, batches = text.partition(":")
    if values not in ("bf16", *QUANTIZED_FORMATS) or not batches:
        raise argparse.ArgumentTypeError(f"{text!r}: use VALUES:BATCHES, VALUES bf16, int8 or int4, e.g. int4:1,4")
    try:
        numbers = [int(b) for b in batches.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: batches are integers separated by commas") from None
    if not all(1 <= b <= 16 for b in numbers):
        raise argparse.ArgumentTypeError(f"{text!r}: the engine runs batch 1-16")
    return values, numbers


def step_ms(engine: Engine, prompt: torch.Tensor, new_tokens: int, repeats: int) -> float:
    """Median decode-step milliseconds of `repeats` generations, as `engine.bench.measure` times them."""
    return 1e3 * statistics.median(engine.generate(prompt, new_tokens).decode_seconds
                                   for _ in range(repeats)) / (new_tokens - 1)


def apply(choices: dict[tuple, sp24.Choice], engine: Engine) -> None:
    for key, choice in choices.items():
        sp24.choose_launch(key, choice)
    engine.graph = engine.capture()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="llama-3.1-8b")
    parser.add_argument("--runs", nargs="+", type=parse_run, default=[("bf16", [1, 4, 8, 16])])
    parser.add_argument("--head", choices=QUANTIZED_FORMATS, help="lm_head of the quantized runs (and their dense)")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3, help="generations a timing, their median")
    parser.add_argument("--rounds", type=int, default=3, help="alternations of tuner and step-tuned launches")
    parser.add_argument("--top", type=int, default=4, help="candidates step tuning tries a problem (engine: 4)")
    parser.add_argument("--within", type=float, default=1.5,
                        help="... each at most this many times the tuner's fastest alone (engine: 1.5)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if args.new_tokens < 2 or args.repeats < 1 or args.rounds < 1 or args.top < 2 or args.within < 1:
        parser.error("--new-tokens and --top at least 2, --repeats and --rounds at least 1, --within at least 1")
    os.environ[op.STEP_TUNE_SETTING] = "0"  # the engines are built with the tuner's picks and step-tuned here
    model_args = preset(args.preset)
    pattern = SparsityPattern.parse("2:4")
    try:  # one error line before any model is built
        for values, batches in args.runs:
            quantize = None if values == "bf16" else values
            head = args.head if quantize else None
            check_plan([(pattern, batches)], args.new_tokens, quantize, 128, head)
            check_group_size(model_args, quantize, 128, head)
    except SparseDecodingError as exc:
        parser.exit(2, f"error: {exc}\n")
    if not torch.cuda.is_available():
        parser.exit(2, "error: step_tune_bench times CUDA graphs and needs a CUDA GPU\n")
    device = torch.device("cuda")
    dense: dict[tuple[str | None, int], float] = {}
    for head in {args.head if values != "bf16" else None for values, _ in args.runs}:
        batches = sorted({b for values, bs in args.runs for b in bs if (args.head if values != "bf16" else None)
                          == head})
        for result in bench_preset(args.preset, [(None, batches)], device, new_tokens=args.new_tokens,
                                   repeats=args.repeats, head=head):
            dense[(head, result.batch)] = 1e3 * result.seconds / result.decode_steps
    rows, details = [], []
    for values, batches in args.runs:
        quantize = None if values == "bf16" else values
        head = args.head if quantize else None
        model = build_model(model_args, random_state(model_args, pattern, device=device, quantize=quantize,
                                                     head=head))
        for batch in batches:
            engine = Engine(model, batch, PROMPT + args.new_tokens, compile=True)
            generator = torch.Generator().manual_seed(batch)
            prompt = torch.randint(model_args.vocab_size, (batch, PROMPT), generator=generator)
            engine.generate(prompt, 16)
            outcomes = tune_step(engine, top=args.top, within=args.within)
            # the tuner's launches (before any move) and the kept ones; under SPARSEDECODING_SP24_EARLY_TRIGGER=timed
            # the whole-build move comes first and may have moved problems that have no outcome of their own
            before, after = {}, {}
            for o in outcomes:
                if isinstance(o, BuildChoice):
                    before.update(o.picks["tuner"])
                    after.update(o.picks[o.chosen])
                else:
                    before.setdefault(o.key, o.before)
                    after[o.key] = o.chosen
            times = {"tuner": [], "step": []}
            for _ in range(args.rounds):
                for name, choices in (("tuner", before), ("step", after)):
                    apply(choices, engine)
                    times[name].append(step_ms(engine, prompt, args.new_tokens, args.repeats))
            tuner, step = statistics.median(times["tuner"]), statistics.median(times["step"])
            base = dense[(head, batch)]
            label = f"2:4 {values}" + (f", {head} head" if head else "")
            rows.append(f"| {label} | {batch} | {base:.3f} | {tuner:.3f} ({base / tuner:.3f}x) | "
                        f"{step:.3f} ({base / step:.3f}x) | {tuner / step:.3f}x |")
            print(rows[-1], flush=True)
            details += [f"- {label}, batch {batch}: " + o.line() for o in outcomes]
            details += [f"- {label}, batch {batch}: rounds, tuner " + ", ".join(f"{t:.3f}" for t in times["tuner"])
                        + " ms; step-tuned " + ", ".join(f"{t:.3f}" for t in times["step"]) + " ms"]
            del engine
        del model
        release_memory()
    lines = [f"# Decode-step tuning of the 2:4 launches: {args.preset}", "",
             environment_markdown("python " + " ".join(sys.argv), device), "", op.settings_line(), "",
             f"Random weights; decode steps compiled and captured in a CUDA graph ({args.new_tokens - 1} a generation "
             f"after a {PROMPT}-token prompt), median of {args.repeats} generations a timing, the tuner's and the "
             f"step-tuned launches alternated {args.rounds} times on the same engine (median of the rounds). Step "
             f"tuning tried up to {args.top} candidates a problem, each at most {args.within}x the tuner's fastest. "
             "Dense: our dense bf16 model (with the run's lm_head) in the same process.", "",
             "| weights | batch | dense ms/step | tuner's launches ms/step (vs dense) | step-tuned ms/step (vs dense) "
             "| step-tuned vs tuner |", "|---|---|---|---|---|---|", *rows, "",
             "## What step tuning tried (decode-step ms with each candidate launch, (splits, slices) as split/slices)",
             "", *details, ""]
    write_report(args.out, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
