"""ADMM with TF32 products (`--admm-products tf32`) against float32 on real layer Hessians of SmolLM2-135M: each
iteration's two products with the eigenvectors take operands rounded to 10 mantissa bits (on this CPU emulated by
`solvers.tf32_round`, as the GPU's tensor cores would read them). Per linear and pattern: the layer loss of each
(as a ratio to SparseGPT's, and TF32's to float32's) and the share of mask decisions they make alike.

The Hessians are `refit_steps_cpu.py`'s (the first 4096 tokens of the Lee background text, teacher-forced: a solver
comparison, not a calibration). About 5 minutes on two cores.

    python benchmarks/admm_tf32_cpu.py --layers 3 15 27 29 --out benchmarks/results/admm_tf32_smollm2_cpu.md
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from refit_steps_cpu import loss, report_head, solver_cases, write_report  # noqa: E402
from sparsedecoding import solvers  # noqa: E402


def main() -> int:
    args, started, folder, ids, cases = solver_cases(__doc__.split("\n\n")[0])
    rows = []
    for key, pattern, W, H in cases:
        base = loss(W, solvers.sparsegpt(W, H, pattern), H)
        exact = solvers.admm(W, H, pattern)
        fast = solvers.admm(W, H, pattern, products="tf32")
        rows.append({"linear": key, "pattern": pattern, "sparsegpt": base, "float32": loss(W, exact, H),
                     "tf32": loss(W, fast, H), "same_mask": float(((exact != 0) == (fast != 0)).float().mean())})
        row = rows[-1]
        print(f"{key} {pattern}: float32 {row['float32'] / base:.4f}x, tf32 {row['tf32'] / base:.4f}x SparseGPT, "
              f"same mask {100 * row['same_mask']:.2f}%", flush=True)
    lines = [
        *report_head("# ADMM with TF32 products against float32 on SmolLM2-135M's layer Hessians (CPU, emulated)",
                     folder, ids, args.layers, "a solver comparison"),
        "- loss: tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ); ADMM 100 iterations, damping 0.01, W and H in float32; tf32: both "
        "operands of each iteration's two products with the eigenvectors rounded to 10 mantissa bits "
        "(`solvers.tf32_round`), float32 accumulation; same mask: the share of entries kept or pruned alike",
        f"- wall time: {time.perf_counter() - started:.0f} s", "",
        "| linear | pattern | ADMM float32 / SparseGPT | ADMM tf32 / SparseGPT | tf32 / float32 | same mask |",
        "|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(f"| {row['linear']} | {row['pattern']} | {row['float32'] / row['sparsegpt']:.4f} | "
                     f"{row['tf32'] / row['sparsegpt']:.4f} | {row['tf32'] / row['float32']:.4f} | "
                     f"{100 * row['same_mask']:.2f}% |")
    lines.append("")
    for pattern in args.patterns:
        chosen = [row for row in rows if row["pattern"] == pattern]
        ratios = [row["tf32"] / row["float32"] for row in chosen]
        geomean = math.exp(sum(math.log(value) for value in ratios) / len(ratios))
        same = [100 * row["same_mask"] for row in chosen]
        lines.append(f"- {pattern}, {len(chosen)} linears: TF32's loss / float32's, geometric mean {geomean:.4f} "
                     f"(range {min(ratios):.4f}-{max(ratios):.4f}); same mask {min(same):.2f}-{max(same):.2f}%.")
    lines.append("")
    write_report(args.out, lines, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
