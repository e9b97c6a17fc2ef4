"""The dense int8 baseline's two kernels side by side: our `triton_w8` (tuned as the engine tunes it) and the sparse
tensor-core kernel's dense mode (`sp24.tile_dense`, on its tuned launch), against cuBLAS bf16 on the dense weight,
on the Llama-3.1-8B and Qwen3-14B decoder shapes and their lm_heads, batch 1 / 4 / 16, one scale a row. Timed as
`w4_bench.py` times (median per launch of CUDA-graph replays round-robin over weight copies past the L2); both
kernels get the same codes and scales, and each output is checked against a float64 product of them.

    python benchmarks/w8_bench.py --out results/w8_h200.md
"""

from __future__ import annotations

import statistics
import sys

import torch

from sparsedecoding.kernels.autotune import replay_ms
from sparsedecoding.kernels.sp24 import _copies, sp24_linear, tile_dense
from sparsedecoding.kernels.triton_w8 import float64_reference, tuned_config, w8_mm
from sparsedecoding.runenv import environment_markdown, write_report

from w4_bench import copies, setup, shapes


def main() -> int:
    args, device, copy_bw, generator = setup(__doc__, "w8_bench")
    rows, ratios, fails = [], {b: [] for b in args.batches}, 0
    for model in args.models:
        for name, (out, in_features) in shapes(model).items():
            codes = torch.randint(-128, 128, (out, in_features), device=device, generator=generator,
                                  dtype=torch.int8)
            scales = (torch.rand(out, device=device, generator=generator) * 0.01 + 1e-3).bfloat16()
            tiled = tile_dense(codes, scales[:, None].float(), "int8", in_features)
            dense = codes.bfloat16() * scales[:, None]
            w8_bytes = codes.numel() + 2 * out
            for batch in args.batches:
                x = torch.randn(batch, in_features, device=device, generator=generator).bfloat16()
                config = tuned_config(x, codes, scales)
                reference = float64_reference(x, codes, scales)
                errors = (reference.error(w8_mm(x, codes, scales, config)), reference.error(sp24_linear(x, tiled)))
                fails += sum(not e <= 1 for e in errors)
                ours = replay_ms(lambda w: w8_mm(x, w[0], w[1], config), copies((codes, scales)))
                tensor_cores = replay_ms(lambda w: sp24_linear(x, w), _copies(tiled))
                cublas = replay_ms(lambda w: torch.nn.functional.linear(x, w[0]), copies((dense,)))
                ratios[batch].append(ours / tensor_cores)
                moved = (w8_bytes + 2 * batch * (in_features + out)) / copy_bw * 1e3  # ms at copy bandwidth
                rows.append(f"| {model} | {name} | {out}x{in_features} | {batch} | {cublas * 1e3:.1f} | "
                            f"{ours * 1e3:.1f} ({cublas / ours:.2f}x, {moved / ours:.0%}) | "
                            f"{tensor_cores * 1e3:.1f} ({cublas / tensor_cores:.2f}x, {moved / tensor_cores:.0%}) | "
                            f"{ours / tensor_cores:.2f}x | {config} | {errors[0]:.2f} / {errors[1]:.2f} |")
                print(rows[-1], flush=True)
            del codes, scales, tiled, dense
            torch.cuda.empty_cache()
    summary = [f"| {b} | {statistics.geometric_mean(r):.2f}x | {min(r):.2f}x | {max(r):.2f}x |"
               for b, r in ratios.items()]
    lines = ["# Dense int8: triton_w8 and sp24's dense mode against cuBLAS bf16", "",
             environment_markdown("python " + " ".join(sys.argv), device),
             f"- copy bandwidth (device-to-device, read + written): {copy_bw / 1e12:.2f} TB/s", "",
             "One bf16 scale a row, bf16 activations, random codes. us per launch (x cuBLAS, % of copy bandwidth for "
             "the int8 bytes: codes, scales, x and y). float64 checks (error / bound, <= 1 passes), triton_w8 / "
             f"sp24 dense; failed: {fails}.", "",
             "## sp24's dense mode against triton_w8 (time ratio, > 1: sp24 faster), over all shapes", "",
             "| batch | geomean | min | max |", "|---|---|---|---|", *summary, "",
             "## Every shape", "",
             "| model | linear | out x in | batch | cuBLAS bf16 us | triton_w8 us | sp24 dense us | "
             "triton_w8 / sp24 | triton_w8 config | float64 |", "|---|---|---|---|---|---|---|---|---|---|", *rows, ""]
    write_report(args.out, "\n".join(lines))
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
