"""ADMM pruning (`--solver admm`, `solvers.admm`) against SparseGPT on real layer Hessians of SmolLM2-135M: the layer
loss of SparseGPT, of SparseGPT's mask refit exactly (the best its mask allows), and of ADMM after 50, 100 and 200
iterations, per linear and pattern, with each solver's time.

The Hessians are the ones of `refit_steps_cpu.py`: the dense model reading the first 4096 tokens of the Lee
background text, teacher-forced (a solver comparison, not a calibration). Layers 3, 15 and 27; q_proj, o_proj, up_proj
and down_proj. About 6 minutes on two cores.

    python benchmarks/admm_layers_cpu.py --out benchmarks/results/admm_layers_smollm2_cpu.md
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from refit_steps_cpu import exact_refit, loss, report_head, solver_cases, write_report  # noqa: E402
from sparsedecoding import solvers  # noqa: E402

ITERATIONS = (50, 100, 200)


def timed(function, *args, **kwargs):
    started = time.perf_counter()
    result = function(*args, **kwargs)
    return result, time.perf_counter() - started


def main() -> int:
    args, started, folder, ids, cases = solver_cases(__doc__.split("\n\n")[0])
    rows = []
    for key, pattern, W, H in cases:
        plain, plain_s = timed(solvers.sparsegpt, W, H, pattern)
        base = loss(W, plain, H)
        row = {"linear": key, "pattern": pattern, "sparsegpt": base, "sparsegpt_s": plain_s,
               "sparsegpt_exact_refit": loss(W, exact_refit(W, plain != 0, H, 0.01), H), "admm": {}}
        for iterations in ITERATIONS:
            result, seconds = timed(solvers.admm, W, H, pattern, iterations=iterations)
            row["admm"][iterations] = {"loss": loss(W, result, H), "seconds": seconds,
                                       "kept_as_sparsegpt": float(((result != 0) == (plain != 0)).float().mean())}
        rows.append(row)
        refit = row["sparsegpt_exact_refit"] / base
        print(f"{key} {pattern}: SparseGPT {base:.5f}, its exact refit {refit:.3f}x, "
              + ", ".join(f"ADMM {n} {item['loss'] / base:.3f}x" for n, item in row["admm"].items()), flush=True)
    lines = [
        *report_head("# ADMM pruning against SparseGPT on SmolLM2-135M's layer Hessians (CPU)", folder, ids,
                     args.layers, "a solver comparison"),
        "- loss: tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ), shown as a ratio to SparseGPT's; SparseGPT left to right, damping 0.01, "
        "blocks of 128; its exact refit: SparseGPT's mask with each row's kept weights solved in float64 on the same "
        "damped H; ADMM: `solvers.admm` (same damping, float32), N iterations; same mask: the share of entries kept "
        "or pruned alike by ADMM (100) and SparseGPT",
        f"- wall time: {time.perf_counter() - started:.0f} s", "",
        "| linear | pattern | SparseGPT loss | SparseGPT refit exactly | "
        + " | ".join(f"ADMM {n}" for n in ITERATIONS) + " | same mask | SparseGPT s | ADMM 100 s |",
        "|---|---|---|---|" + "---|" * len(ITERATIONS) + "---|---|---|",
    ]
    for row in rows:
        base = row["sparsegpt"]
        lines.append(f"| {row['linear']} | {row['pattern']} | {base:.5f} | {row['sparsegpt_exact_refit'] / base:.3f} | "
                     + " | ".join(f"{row['admm'][n]['loss'] / base:.3f}" for n in ITERATIONS)
                     + f" | {100 * row['admm'][100]['kept_as_sparsegpt']:.1f}% | {row['sparsegpt_s']:.2f} | "
                     f"{row['admm'][100]['seconds']:.2f} |")
    lines.append("")
    for pattern in args.patterns:
        chosen = [row for row in rows if row["pattern"] == pattern]

        def geomean(values):
            return math.exp(sum(math.log(value) for value in values) / len(values))
        refit = geomean([row["sparsegpt_exact_refit"] / row["sparsegpt"] for row in chosen])
        admm = {n: geomean([row["admm"][n]["loss"] / row["sparsegpt"] for row in chosen]) for n in ITERATIONS}
        lines.append(f"- {pattern}, geometric mean over {len(chosen)} linears: SparseGPT's mask refit exactly "
                     f"{refit:.3f}x SparseGPT's loss; ADMM " + ", ".join(f"{n}: {value:.3f}x" for n, value in
                                                                          admm.items()) + ".")
    lines.append("")
    write_report(args.out, lines, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
