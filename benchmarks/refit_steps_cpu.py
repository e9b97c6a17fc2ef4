"""How many conjugate-gradient steps the refit (`--refit-steps`, `solvers.refit_kept`) needs: on real layer
Hessians of SmolLM2-135M, SparseGPT's loss, the exact refit (each row's kept weights solved directly in float64)
and the refit after 5-80 steps, per linear and pattern.

The Hessians come from the dense model reading the first 4096 tokens of the Lee background text (8 windows of 512),
teacher-forced: this measures the solver's convergence, not a calibration, so plain text serves. Layers 3, 15 and 27;
q_proj, o_proj, up_proj and down_proj (k/v share q's Hessian, gate shares up's). About 10 minutes on two cores.

    python benchmarks/refit_steps_cpu.py --out benchmarks/results/refit_steps_smollm2_cpu.md
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from pathlib import Path

import torch
import transformers

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from sparsedecoding import solvers  # noqa: E402
from sparsedecoding.data import lee_text  # noqa: E402
from sparsedecoding.models import load_model  # noqa: E402

LINEARS = ("self_attn.q_proj", "self_attn.o_proj", "mlp.up_proj", "mlp.down_proj")
STEPS = (5, 10, 20, 40, 80)


@torch.no_grad()
def layer_hessians(model, ids: torch.Tensor, layers: list[int]) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    """{name: (weight, H = 2·X·Xᵀ/N)} of the chosen linears over every token of `ids` [windows, length]."""
    sums, hooks, weights = {}, [], {}
    for index in layers:
        for name in LINEARS:
            module = model.model.layers[index].get_submodule(name)
            key = f"layers.{index}.{name}"
            weights[key] = module.weight.detach().float().clone()

            def hook(_, inputs, __, key=key):
                x = inputs[0].reshape(-1, inputs[0].shape[-1]).double()
                sums[key] = sums.get(key, 0) + x.T @ x
            hooks.append(module.register_forward_hook(hook))
    for window in ids:
        model(window[None])
    for hook in hooks:
        hook.remove()
    return {key: (weights[key], (2 * sums[key] / ids.numel()).float()) for key in weights}


def loss(W: torch.Tensor, new: torch.Tensor, H: torch.Tensor) -> float:
    """tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ) in float64."""
    delta, H, W = (W - new).double(), H.double(), W.double()
    return float(((delta @ H) * delta).sum() / ((W @ H) * W).sum())


def exact_refit(W: torch.Tensor, kept: torch.Tensor, H: torch.Tensor, percdamp: float) -> torch.Tensor:
    """Each row's kept entries solved directly in float64 against the solver's damped, normalized H."""
    Hn = solvers.normalized_hessian(H, torch.float64)
    A = Hn + percdamp * Hn.diagonal().mean() * torch.eye(Hn.shape[0], dtype=torch.float64)
    target = W.double() @ A
    X = torch.zeros(W.shape, dtype=torch.float64)
    for row in range(W.shape[0]):
        K = kept[row].nonzero().flatten()
        X[row, K] = torch.linalg.solve(A[K][:, K], target[row, K])
    return X


def arguments(description: str) -> argparse.Namespace:
    """The options this script and `admm_layers_cpu.py` share."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--layers", type=int, nargs="+", default=[3, 15, 27])
    parser.add_argument("--patterns", nargs="+", default=["2:4", "16:32"])
    parser.add_argument("--out", type=Path, required=True)
    return parser.parse_args()


def solver_cases(description: str):
    """This script's and the ADMM scripts' start: (the arguments, the start time, the model folder, the token
    windows, [(linear name, pattern, W, H)] for every chosen linear and pattern)."""
    args = arguments(description)
    started = time.perf_counter()
    folder, ids, problems = text_problems(args.model, args.layers)
    cases = [(key, pattern, W, H) for key, (W, H) in problems.items() for pattern in args.patterns]
    return args, started, folder, ids, cases


def text_problems(model_name: str, layers: list[int]):
    """(model folder, the token windows, {name: (weight, H)}): the chosen layers' linears over the first 4096 tokens
    of the Lee background text (8 windows of 512), teacher-forced."""
    model, tokenizer, folder = load_model(model_name, "cpu", torch.float32)
    model.eval()
    ids = tokenizer(lee_text("background"), return_tensors="pt").input_ids[0, :4096].view(8, 512)
    return folder, ids, layer_hessians(model, ids, layers)


def report_head(title: str, folder, ids: torch.Tensor, layers: list[int], use: str) -> list[str]:
    """A report's title and its command, date, machine, versions and Hessian source lines (this script's and
    `admm_layers_cpu.py`'s)."""
    return [
        title, "",
        f"- command: `python {' '.join(sys.argv)}`",
        f"- date: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC",
        f"- machine: CPU only ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads); "
        f"torch {torch.__version__}, transformers {transformers.__version__}, Python {platform.python_version()}",
        f"- model: {folder.name}; Hessians of layers {', '.join(map(str, layers))} from the first "
        f"{ids.numel()} tokens of the Lee background text (teacher-forced: {use}, not a calibration)",
    ]


def write_report(out: Path, lines: list[str], rows: list[dict]) -> None:
    """OUT (markdown) and OUT with .json beside it (the rows and the command), then the report on stdout."""
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text("\n".join(lines))
    out.with_suffix(".json").write_text(json.dumps({"rows": rows, "argv": sys.argv}, indent=1))
    print("\n".join(lines))


def main() -> int:
    args, started, folder, ids, cases = solver_cases(__doc__.split("\n\n")[0])
    rows = []
    for key, pattern, W, H in cases:
        plain = solvers.sparsegpt(W, H, pattern)
        base = loss(W, plain, H)
        exact = loss(W, exact_refit(W, plain != 0, H, 0.01), H)
        by_steps = {steps: loss(W, solvers.refit(W, plain, H, steps=steps), H) for steps in STEPS}
        rows.append({"linear": key, "pattern": pattern, "sparsegpt": base, "exact": exact, "steps": by_steps})
        print(f"{key} {pattern}: SparseGPT {base:.5f}, exact refit {exact / base:.3f}x, "
              + ", ".join(f"{steps} steps {value / base:.3f}x" for steps, value in by_steps.items()), flush=True)
    lines = [
        *report_head("# The refit's conjugate-gradient steps against the exact refit (CPU)", folder, ids, args.layers,
                     "a convergence test"),
        "- loss: tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ); SparseGPT left to right, damping 0.01, blocks of 128; the refit keeps "
        "SparseGPT's mask and re-solves the kept weights on the same damped H (exact: each row in float64 directly; "
        "N steps: `solvers.refit`, conjugate gradients preconditioned by the diagonal, from SparseGPT's weights)",
        f"- wall time: {time.perf_counter() - started:.0f} s", "",
        "| linear | pattern | SparseGPT loss | exact refit / SparseGPT | "
        + " | ".join(f"{steps} steps" for steps in STEPS) + " | 40 steps / exact |",
        "|---|---|---|---|" + "---|" * len(STEPS) + "---|",
    ]
    for row in rows:
        lines.append(f"| {row['linear']} | {row['pattern']} | {row['sparsegpt']:.5f} | "
                     f"{row['exact'] / row['sparsegpt']:.3f} | "
                     + " | ".join(f"{row['steps'][steps] / row['sparsegpt']:.3f}" for steps in STEPS)
                     + f" | {row['steps'][40] / row['exact']:.4f} |")
    worst = max(row["steps"][40] / row["exact"] for row in rows)
    ratios = [row["exact"] / row["sparsegpt"] for row in rows]
    lines += ["", f"40 steps end at most {100 * (worst - 1):.2f}% above the exact refit's loss; the exact refit is "
              f"{min(ratios):.3f}-{max(ratios):.3f}x SparseGPT's loss on these {len(rows)} problems.", ""]
    write_report(args.out, lines, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
