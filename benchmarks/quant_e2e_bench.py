"""End-to-end decode speed of quantized weights (issue 13's engine targets), written to benchmarks/results/.

One process, random weights of one preset (speed does not depend on values), every model built on the GPU, measured
and freed before the next: dense bf16 (the baseline of every ratio), N:M bf16, then for int8 and int4 the dense
weight-only quantized model (SPARSEDECODING_DENSE_INT8 / _INT4: by default the sparse tensor-core kernel's dense
mode on a GPU where it runs) and the N:M
quantized model (`nmq_spmv`), each with its decode step compiled and captured in a CUDA graph (`sparsedecoding
bench`'s engine). The report names the kernel settings it ran under (SPARSEDECODING_KERNEL, SPARSEDECODING_SPARSE_MMA).
The report checks the targets at batch 1: N:M+int8 >= 2.3x and N:M+int4 >= 3.0x dense bf16, each faster than the
dense int4 model.

    python benchmarks/quant_e2e_bench.py                         # Llama-3.1-8B, 2:4, batch 1, about 3 minutes
    python benchmarks/quant_e2e_bench.py --batch 1 2 4 --pattern 2:4 16:32
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from sparsedecoding.engine.bench import (SpeedResult, bench_preset, check_group_size, check_plan, copy_bandwidth,
                                         format_table, run_label)
from sparsedecoding.engine.config import preset
from sparsedecoding.errors import SparseDecodingError
from sparsedecoding.kernels.op import (DENSE_INT4_SETTING, DENSE_INT8_SETTING, KERNEL_SETTING, SP24_SLOTS_SETTING,
                                       SPARSE_MMA_SETTING, dense_int4_setting, dense_int8_setting, settings,
                                       settings_line)
from sparsedecoding.kernels.quantized import QUANTIZED_FORMATS
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.runenv import environment_markdown

# issue 13: N:M + quantized values vs our dense bf16 engine at batch 1
TARGETS = {"int8": 2.3, "int4": 3.0}


def target_lines(results: list, name: str, patterns: list[SparsityPattern], group_size: int,
                 head: str | None = None) -> list[str]:
    """The issue's targets at batch 1, checked against what this run measured (met / missed, or not measured); with
    a quantized `head`, the rows whose lm_head is quantized, against dense int4 with the same head."""
    speed = {r.weights: r.tokens_per_second for r in results
             if isinstance(r, SpeedResult) and r.model == name and r.batch == 1}
    dense_int4 = speed.get(run_label(None, quantize="int4", group_size=group_size, head=head))
    lines = [f"## Targets ({name} preset, batch 1, vs our dense bf16)", ""]
    if "dense" not in speed:
        return lines + ["- dense bf16 was not measured at batch 1: no ratio to check", ""]
    for quantize, target in TARGETS.items():
        for pattern in patterns:
            label = run_label(pattern, quantize=quantize, group_size=group_size, head=head)
            if label not in speed:
                lines.append(f"- {label}: not measured")
                continue
            ratio = speed[label] / speed["dense"]
            verdict = "met" if ratio >= target else "missed"
            line = f"- {label}: {ratio:.3f}x dense bf16 (target >= {target}: {verdict})"
            if dense_int4 is not None:
                faster = "faster" if speed[label] > dense_int4 else "NOT faster"
                line += f"; {speed[label] / dense_int4:.3f}x dense int4 ({faster} than our dense int4 path)"
            lines.append(line)
    return lines + [""]


def head_lines(results: list, name: str, patterns: list[SparsityPattern], group_size: int, head: str) -> list[str]:
    """What the quantized `head` gave against the bf16 head, each pair of rows from this run at batch 1."""
    speed = {r.weights: r for r in results if isinstance(r, SpeedResult) and r.model == name and r.batch == 1}
    lines = [f"## lm_head {head} against bf16 ({name} preset, batch 1, both rows of this run)", ""]
    for quantize in TARGETS:
        for pattern in [None, *patterns]:
            plain = speed.get(run_label(pattern, quantize=quantize, group_size=group_size))
            quantized = speed.get(run_label(pattern, quantize=quantize, group_size=group_size, head=head))
            if plain is None or quantized is None:
                lines.append(f"- {run_label(pattern, quantize=quantize, group_size=group_size)}: not measured")
                continue
            lines.append(f"- {plain.weights}: {plain.step_ms:.3f} -> {quantized.step_ms:.3f} ms a step, "
                         f"{quantized.tokens_per_second / plain.tokens_per_second:.3f}x")
    return lines + [""]


def measure(groups: list, run_group, budget: float | None, clock=time.monotonic) -> tuple[list, list]:
    """Run the groups in order (`run_group(group)` returns its results) until `budget` seconds have passed since the
    first began; a group already started runs to its end. Returns the results and the groups never started."""
    started = clock()
    results = []
    for index, group in enumerate(groups):
        if budget is not None and clock() - started >= budget:
            return results, groups[index:]
        results += run_group(group)
    return results, []


def group_name(quantize: str | None, head: str | None) -> str:
    return ("bf16 values" if quantize is None else f"{quantize} values") + (f", {head} head" if head else "")


DENSE_KERNELS = {"tinygemm": "PyTorch's `_weight_int4pack_mm` (tinygemm)", "triton": "our Triton kernel",
                 "sp24": "the sparse tensor-core kernel's dense mode (`sp24.tile_dense`)",
                 "auto": "`auto`: the sparse tensor-core kernel's dense mode (`sp24.tile_dense`) where that kernel "
                         "loads, else tinygemm (int4) / `triton_w8` (int8)"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="llama-3.1-8b")
    parser.add_argument("--pattern", nargs="+", type=SparsityPattern.parse, default=[SparsityPattern.parse("2:4")])
    parser.add_argument("--batch", nargs="+", type=int, default=[1])
    parser.add_argument("--group-size", type=int, default=128, help="int4 columns per scale (default: 128)")
    parser.add_argument("--quantize", nargs="+", choices=QUANTIZED_FORMATS, default=list(QUANTIZED_FORMATS),
                        help="the quantized groups to run after the bf16 one (default: %(default)s)")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--head", choices=QUANTIZED_FORMATS,
                        help="also run the int8 and int4 rows with lm_head quantized, dense and N:M alike (as "
                             "prune --quantize-head makes it), beside the same rows with a bf16 head")
    parser.add_argument("--time-budget", type=float, metavar="S",
                        help="start no further group of models (values x head) once S seconds have passed; the report "
                             "then says which groups did not run (default: no limit)")
    parser.add_argument("--out", type=Path, help="default: benchmarks/results/quant_e2e_PRESET.md")
    args = parser.parse_args()
    if args.time_budget is not None and not args.time_budget > 0:
        parser.error(f"--time-budget must be a positive number of seconds, not {args.time_budget:g}")
    out = args.out or Path(__file__).parent / "results" / f"quant_e2e_{args.preset}.md"
    try:  # every run's settings and the kernel settings, before the first model is built
        settings()
        for quantize in args.quantize:
            check_plan(runs := [(None, args.batch)] + [(pattern, args.batch) for pattern in args.pattern],
                       args.new_tokens, quantize, args.group_size, args.head)
            check_group_size(preset(args.preset), quantize, args.group_size, args.head)
    except SparseDecodingError as exc:
        parser.error(str(exc))
    if not torch.cuda.is_available():
        parser.error("the engine's speed runs need a CUDA GPU")

    device = torch.device("cuda")
    copy = copy_bandwidth(device)
    groups = [(quantize, head) for quantize in (None, *args.quantize)
              for head in ([None] if quantize is None or args.head is None else [None, args.head])]
    done: list = []

    def run_group(group: tuple[str | None, str | None]) -> list:
        quantize, head = group
        rows = bench_preset(args.preset, runs, device, new_tokens=args.new_tokens, repeats=args.repeats,
                            quantize=quantize, group_size=args.group_size, head=head)
        done.extend(rows)
        print(format_table(done, copy), flush=True)
        return rows

    results, skipped = measure(groups, run_group, args.time_budget)
    stopped = [f"Stopped at --time-budget {args.time_budget:g} s: the {', '.join(group_name(*g) for g in skipped)} "
               "rows did not run; they are missing from the table, and the targets call them not measured.", ""] \
        if skipped else []
    if skipped:
        print(stopped[0], flush=True)
    command = "python " + " ".join(sys.argv)
    lines = ["# End-to-end decode speed of quantized weights (random weights, one preset)"
             + (" (incomplete)" if skipped else ""), "",
             environment_markdown(command, device), *stopped,
             f"Decode steps only ({args.new_tokens - 1} per generation after a prefill of 16 random tokens), compiled "
             f"and captured in a CUDA graph, median of {args.repeats}; ratio = tok/s / dense bf16 tok/s at the same "
             f"batch. int8: one scale per output row; int4: one per {args.group_size} input columns. Dense int8 "
             f"(and an int8 lm_head) runs {DENSE_KERNELS[dense_int8_setting()]} ({DENSE_INT8_SETTING}; reports "
             f"before 2026-12-01 ran PyTorch's `_weight_int8pack_mm`, before 2026-12-02 `triton_w8`), dense int4 (and "
             f"an int4 lm_head) {DENSE_KERNELS[dense_int4_setting()]} ({DENSE_INT4_SETTING}; before 2026-12-02 "
             "tinygemm); 2:4 ones the sparse tensor-core kernel `sp24` under "
             f"{KERNEL_SETTING}=auto (the engine tiles them, `kernels/sp24_linear.py`), and so do 16:32+2 ones (random "
             "16:32 masks that fit 16:32+2) as their 2:4 part plus two overflow slots a row and word "
             f"({SP24_SLOTS_SETTING}=1; the weight GB column counts the slots); other N:M "
             "patterns and the other settings run the quantized Triton kernel `nmq_spmv`.", "",
             settings_line() + f" ({KERNEL_SETTING}=cuda with {SPARSE_MMA_SETTING}=1: every 2:4 linear on sparse "
             "tensor cores through the older kernel.)", "",
             *([f"lm_head: bf16, and dense {args.head} in the rows marked so (dense and N:M alike; "
                f"{'one scale a row' if args.head == 'int8' else f'one scale per {args.group_size} columns'}), "
                "as `prune --quantize-head` makes it (random weights, like every row).", ""]
               if args.head else []),
             format_table(results, copy), *target_lines(results, args.preset, args.pattern, args.group_size,
                                                        args.head),
             *(head_lines(results, args.preset, args.pattern, args.group_size, args.head) if args.head else [])]
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
