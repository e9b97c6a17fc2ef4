"""Where a decode step's GPU time goes: every kernel of the compiled, CUDA-graph-captured decode step of a preset
(random weights), dense and N:M, by kernel and by kind, per step.

    python benchmarks/step_profile.py --preset llama-3.1-8b --pattern 2:4 --batch 1 --out results/step_profile.md
    python benchmarks/step_profile.py --quantize int4 --head int8 --out results/step_profile_int4.md

With `--quantize`, both models' block linears hold int8 / int4 values (dense quantized and N:M quantized, as
`quant_e2e_bench.py` runs them); with `--head`, lm_head is dense int8 / int4 in both.

The profiler (CUPTI through torch.profiler) records the kernels that graph replays launch. Per step: the wall time
(what `bench` reports), the sum of kernel times, and the difference (launch gaps and idle SMs between kernels);
the block linears' bytes (`engine.bench.model_bytes`) and the time they take at this run's device-copy bandwidth,
and for the N:M model the share of that bandwidth its sparse kernels reach.
"""

from __future__ import annotations

import argparse
import sys
from collections import defaultdict
from pathlib import Path

import torch

from sparsedecoding.engine.bench import check_group_size, check_plan, copy_bandwidth, model_bytes, release_memory
from sparsedecoding.engine.config import preset
from sparsedecoding.engine.generate import Engine
from sparsedecoding.engine.loading import build_model, random_state
from sparsedecoding.errors import SparseDecodingError
from sparsedecoding.kernels.quantized import QUANTIZED_FORMATS
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.runenv import environment_markdown, write_report

KINDS = (  # first match wins: (kind, substrings of the kernel name); Inductor's kernels come before attention,
    # whose name some of them carry (`triton_poi_fused__scaled_dot_product_cudnn_attention_...`)
    ("sp24 (2:4 linears)", ("sp24",)),
    ("packed N:M linears", ("nm_", "spmv", "nmq")),
    ("dense quantized linears (int8 / int4)", ("w8", "int4pack", "tinygemm", "_weight_int")),
    ("Inductor (norms, rope, adds, ...)", ("triton",)),
    ("cuBLAS (dense linears)", ("gemv", "gemm", "nvjet", "cutlass", "xmma", "splitK")),
    ("attention", ("fmha", "attention", "flash", "efficient")),
)


def kind_of(name: str) -> str:
    for kind, keys in KINDS:
        if any(key in name for key in keys):
            return kind
    return "other"


def profile(model, batch: int, steps: int, prompt_tokens: int = 16) -> tuple[float, dict[str, tuple[int, float]]]:
    """(wall ms per step, {kernel name: (launches per step, us per step)}) over `steps` graph replays."""
    engine = Engine(model, batch, prompt_tokens + steps + 8, compile=True)
    prompt = torch.randint(model.args.vocab_size, (batch, prompt_tokens), generator=torch.Generator().manual_seed(0))
    engine.generate(prompt, 8)  # warm
    wall = engine.generate(prompt, steps + 1).decode_seconds / steps * 1e3
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        engine.generate(prompt, steps + 1)
    torch.cuda.synchronize()
    totals: dict[str, list[float]] = defaultdict(lambda: [0, 0.0])
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            entry = totals[event.name]
            entry[0] += 1
            entry[1] += event.time_range.elapsed_us()
    # the prefill and the first token's step ran too: count per decode step over the whole window, a small
    # overestimate of what one step launches (shown as launches per step)
    return wall, {name: (count / steps, us / steps) for name, (count, us) in totals.items()}


SPARSE_KINDS = ("sp24 (2:4 linears)", "packed N:M linears")  # kernels that run only block linears


def block_linear_bytes(model_args, pattern: SparsityPattern | None, quantize: str | None, group_size: int) -> int:
    """Bytes of a preset's block linears as the engine holds them (packed with `pattern`, codes with `quantize`)."""
    return (model_bytes(model_args, pattern, quantize=quantize, group_size=group_size, device="cuda")
            - model_bytes(model_args, pattern, quantize=quantize, group_size=group_size, block_linears=False,
                          device="cuda"))


def bandwidth_line(nbytes: int, copy_bw: float, by_kind: dict[str, list[float]], sparse: bool) -> str:
    """The block linears' bytes, their time at `copy_bw` (bytes read + written a second), and for an N:M model the
    share of that bandwidth its sparse kernels (SPARSE_KINDS, us per step in `by_kind`) reach."""
    at_copy = nbytes / copy_bw * 1e3
    line = (f"- block linears: {nbytes / 1e9:.3f} GB a step, {at_copy:.3f} ms at this run's copy bandwidth "
            f"({copy_bw / 1e12:.2f} TB/s)")
    if sparse:
        sparse_ms = sum(by_kind[kind][1] for kind in SPARSE_KINDS if kind in by_kind) / 1e3
        if sparse_ms > 0:
            line += f"; the sparse kernels take {sparse_ms:.3f} ms of kernel time, {at_copy / sparse_ms:.0%} of it"
    return line


def section(title: str, wall: float, kernels: dict[str, tuple[float, float]], nbytes: int, copy_bw: float,
            sparse: bool) -> list[str]:
    busy = sum(us for _, us in kernels.values()) / 1e3
    by_kind: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    for name, (count, us) in kernels.items():
        by_kind[kind_of(name)][0] += count
        by_kind[kind_of(name)][1] += us
    lines = [f"## {title}", "", f"- wall time per step: {wall:.3f} ms; kernel time per step: {busy:.3f} ms; "
             f"between kernels: {wall - busy:.3f} ms ({(wall - busy) / wall:.0%})",
             bandwidth_line(nbytes, copy_bw, by_kind, sparse), "",
             "| kind | launches per step | us per step | share of wall |", "|---|---|---|---|"]
    for kind, (count, us) in sorted(by_kind.items(), key=lambda item: -item[1][1]):
        lines.append(f"| {kind} | {count:.1f} | {us:.1f} | {us / 1e3 / wall:.1%} |")
    lines += ["", "| kernel | launches per step | us per step | us per launch |", "|---|---|---|---|"]
    for name, (count, us) in sorted(kernels.items(), key=lambda item: -item[1][1])[:25]:
        short = name if len(name) <= 110 else name[:107] + "..."
        lines.append(f"| `{short}` | {count:.1f} | {us:.1f} | {us / count:.2f} |")
    return lines + [""]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--preset", default="llama-3.1-8b")
    parser.add_argument("--pattern", type=SparsityPattern.parse, default=SparsityPattern.parse("2:4"))
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--quantize", choices=QUANTIZED_FORMATS, help="block linears' values (both models)")
    parser.add_argument("--group-size", type=int, default=128, help="int4: input columns a scale")
    parser.add_argument("--head", choices=QUANTIZED_FORMATS, help="lm_head as a dense quantized weight (both models)")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not 1 <= args.batch <= 16 or args.steps < 1:
        parser.error(f"--batch {args.batch} --steps {args.steps}: the engine runs batch 1-16, and at least one step")
    device = torch.device("cuda")
    model_args = preset(args.preset)
    try:  # one error line, before any model is built
        check_plan([(None, [args.batch]), (args.pattern, [args.batch])], 2, args.quantize, args.group_size, args.head)
        check_group_size(model_args, args.quantize, args.group_size, args.head)
    except SparseDecodingError as exc:
        parser.exit(2, f"error: {exc}\n")
    formats = (f", {args.quantize} values" if args.quantize else "") + (f", {args.head} lm_head" if args.head else "")
    lines = [f"# Decode-step profile: {args.preset}, batch {args.batch}{formats}", "",
             environment_markdown("python " + " ".join(sys.argv), device), __doc__.split("\n\n")[2].strip(), ""]
    copy_bw = copy_bandwidth(device)
    for pattern in (None, args.pattern):
        model = build_model(model_args, random_state(model_args, pattern, device=device, quantize=args.quantize,
                                                     group_size=args.group_size, head=args.head))
        wall, kernels = profile(model, args.batch, args.steps)
        nbytes = block_linear_bytes(model_args, pattern, args.quantize, args.group_size)
        lines += section(("dense" if pattern is None else str(pattern)) + formats, wall, kernels, nbytes, copy_bw,
                         pattern is not None)
        print("\n".join(lines[-40:]), flush=True)
        del model
        release_memory()
    write_report(args.out, "\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
