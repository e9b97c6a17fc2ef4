"""The dense int4 baseline's three kernels side by side: our `triton_w4` (tuned as the engine tunes it), the sparse
tensor-core kernel's dense mode (`sp24.tile_dense`, on its tuned launch) and PyTorch's tinygemm
`_weight_int4pack_mm`, against cuBLAS bf16 on the dense weight, on the Llama-3.1-8B and Qwen3-14B decoder shapes and
their lm_heads, batch 1 / 4 / 16, group size 128. Each time is the median per launch of CUDA-graph replays
round-robin over weight copies past the L2; the int4 kernels get the same codes and scales, and each output is
checked against a float64 product of them (`autotune.Float64Reference`).

    python benchmarks/w4_bench.py --out results/w4_h200.md
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

from sparsedecoding.engine.bench import copy_bandwidth
from sparsedecoding.engine.config import preset
from sparsedecoding.kernels.autotune import replay_ms, weight_copies
from sparsedecoding.kernels.op import DENSE_INT4_SETTING
from sparsedecoding.kernels.quantized import DenseQuantized
from sparsedecoding.kernels.sp24 import _copies, sp24_linear, tile_dense
from sparsedecoding.kernels.triton_w4 import (float64_reference, pack_w4, rejected_candidates, tuned_config,
                                              unpack_w4, w4_mm)
from sparsedecoding.runenv import environment_markdown, write_report
from sparsedecoding.solvers import QuantizedCodes

GROUP = 128


def shapes(name: str) -> dict[str, tuple[int, int]]:
    a = preset(name)
    qkv = (a.n_heads + 2 * a.n_kv_heads) * a.head_dim
    return {"qkv": (qkv, a.dim), "o": (a.dim, a.n_heads * a.head_dim), "gate_up": (2 * a.intermediate_size, a.dim),
            "down": (a.dim, a.intermediate_size), "lm_head": (a.vocab_size, a.dim)}


def copies(tensors: tuple[torch.Tensor, ...]) -> list[tuple[torch.Tensor, ...]]:
    """`tensors` and enough copies (at most 8, as when the committed reports ran) that a round reads twice the L2."""
    return weight_copies(tensors, 8)


def tinygemm_weight(grid: QuantizedCodes) -> DenseQuantized:
    """The codes in tinygemm's layout (SPARSEDECODING_DENSE_INT4=tinygemm while it is built)."""
    previous = os.environ.get(DENSE_INT4_SETTING)
    os.environ[DENSE_INT4_SETTING] = "tinygemm"
    try:
        return DenseQuantized.from_codes(grid, torch.bfloat16)
    finally:
        if previous is None:
            os.environ.pop(DENSE_INT4_SETTING)
        else:
            os.environ[DENSE_INT4_SETTING] = previous


def setup(doc: str, name: str) -> tuple[argparse.Namespace, torch.device, float, torch.Generator]:
    """The arguments (--models, --batches, --out; checked), the GPU, its copy bandwidth and a seeded generator;
    exit 2 without a GPU."""
    parser = argparse.ArgumentParser(description=doc.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["llama-3.1-8b", "qwen3-14b"])
    parser.add_argument("--batches", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    if not all(1 <= b <= 16 for b in args.batches):
        parser.error("--batches: each 1-16")
    if not torch.cuda.is_available():
        parser.exit(2, f"error: {name} times CUDA kernels and needs a CUDA GPU\n")
    device = torch.device("cuda")
    return args, device, copy_bandwidth(device), torch.Generator(device="cuda").manual_seed(0)


def main() -> int:
    args, device, copy_bw, generator = setup(__doc__, "w4_bench")
    rows, ratios, fails = [], {b: [] for b in args.batches}, 0
    sp24_ratios = {b: [] for b in args.batches}
    for model in args.models:
        for name, (out, in_features) in shapes(model).items():
            codes = torch.randint(-8, 8, (out, in_features), device=device, generator=generator, dtype=torch.int8)
            scales = (torch.rand(out, in_features // GROUP, device=device, generator=generator) * 0.01 + 1e-3)
            scales = scales.bfloat16().float()
            weight, packed_scales = pack_w4(codes, scales, torch.bfloat16)
            with torch.no_grad():
                tiny = tinygemm_weight(QuantizedCodes(codes, scales, "int4", GROUP))
                dense = unpack_w4(weight, packed_scales, torch.bfloat16)
                tiled = tile_dense(codes, scales, "int4", GROUP)
            w4_bytes = weight.numel() + packed_scales.numel() * 2
            for batch in args.batches:
                x = torch.randn(batch, in_features, device=device, generator=generator).bfloat16()
                config = tuned_config(x, weight, packed_scales)
                reference = float64_reference(x, weight, packed_scales)
                errors = (reference.error(w4_mm(x, weight, packed_scales, config)), reference.error(tiny(x)),
                          reference.error(sp24_linear(x, tiled)))
                fails += sum(not e <= 1 for e in errors)
                ours = replay_ms(lambda w: w4_mm(x, w[0], w[1], config), copies((weight, packed_scales)))
                theirs = replay_ms(lambda w: torch.ops.aten._weight_int4pack_mm(x, w[0], GROUP, w[1]),
                                   copies((tiny.weight, tiny.scales)))
                cublas = replay_ms(lambda w: torch.nn.functional.linear(x, w[0]), copies((dense,)))
                tensor_cores = replay_ms(lambda w: sp24_linear(x, w), _copies(tiled))
                ratios[batch].append(theirs / ours)
                sp24_ratios[batch].append(theirs / tensor_cores)
                moved = (w4_bytes + 2 * batch * (in_features + out)) / copy_bw * 1e3  # ms at copy bandwidth
                rows.append(f"| {model} | {name} | {out}x{in_features} | {batch} | {cublas * 1e3:.1f} | "
                            f"{ours * 1e3:.1f} ({cublas / ours:.2f}x, {moved / ours:.0%}) | "
                            f"{theirs * 1e3:.1f} ({cublas / theirs:.2f}x, {moved / theirs:.0%}) | "
                            f"{tensor_cores * 1e3:.1f} ({cublas / tensor_cores:.2f}x, {moved / tensor_cores:.0%}) | "
                            f"{theirs / ours:.2f}x | {theirs / tensor_cores:.2f}x | {config} | "
                            f"{errors[0]:.2f} / {errors[1]:.2f} / {errors[2]:.2f} |")
                print(rows[-1], flush=True)
            del weight, packed_scales, tiny, dense, codes, scales, tiled
            torch.cuda.empty_cache()
    rejected = [f"- {key}: {config}: {why}" for key, failed in rejected_candidates().items()
                for config, why in failed.items()]
    summary = [f"| {b} | {statistics.geometric_mean(r):.2f}x | {min(r):.2f}x | {max(r):.2f}x | "
               f"{statistics.geometric_mean(sp24_ratios[b]):.2f}x | {min(sp24_ratios[b]):.2f}x | "
               f"{max(sp24_ratios[b]):.2f}x |" for b, r in ratios.items()]
    lines = ["# Dense int4: triton_w4 and sp24's dense mode against tinygemm and cuBLAS bf16", "",
             environment_markdown("python " + " ".join(sys.argv), device),
             f"- copy bandwidth (device-to-device, read + written): {copy_bw / 1e12:.2f} TB/s", "",
             f"Group size {GROUP}, bf16 scales and activations, random codes. us per launch (x cuBLAS, % of copy "
             "bandwidth for the int4 bytes: codes, scales, x and y). float64 checks (error / bound, <= 1 passes), "
             f"triton_w4 / tinygemm / sp24 dense; failed: {fails}.", "",
             "## Ours against tinygemm (time ratio, > 1: ours faster), over all shapes", "",
             "| batch | triton_w4 geomean | min | max | sp24 dense geomean | min | max |",
             "|---|---|---|---|---|---|---|", *summary, "",
             "## Tuner candidates that failed to compile or to match float64 (never used)", "",
             *(rejected or ["none"]), "",
             "## Every shape", "",
             "| model | linear | out x in | batch | cuBLAS bf16 us | triton_w4 us | tinygemm us | sp24 dense us | "
             "tinygemm / triton_w4 | tinygemm / sp24 | triton_w4 config | float64 |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|", *rows, ""]
    write_report(args.out, "\n".join(lines))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
