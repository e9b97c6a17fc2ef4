"""How much of 2:4 + int4's layer loss can a better rounding take back? On Qwen2.5-Coder-1.5B's down the rounding of
ADMM's pruned weight is 77-83% of the layer loss (`benchmarks/results/permute_int4_layer_cpu.md`). Here ADMM's mask
and weights are computed once a layer (`solvers.admm_prune`, as `prune --solver admm`) and then rounded to int4
several ways, each against the same H:
- `loop`: today's rounding, SparseGPT's column loop with ADMM's mask fixed, each group's scale from its largest
  magnitude when its block starts (checked here to give `solvers.admm(quantize="int4")`'s weight);
- `clip`: the same loop, each group's scale chosen among shrunk largest magnitudes for the least error the loop
  charges for the group's rounding (Σ ((w − q)/[U]ᵢᵢ)² over its kept weights, as GPTQ's and AWQ's clipping do);
- `refit`: after each block of 128 columns is rounded, the later columns' kept weights re-solved for the loss by
  conjugate gradients with the rounded ones held (the loop's own update treats the later pruned weights as free);
- `cd K`: the loop's result, then K sweeps of coordinate descent over the kept weights, each moved to the grid point
  nearest its exact one-dimensional minimiser (the loss cannot rise; QuantEase, Behdin et al. 2023, does this for
  dense quantization);
- the same with 64 columns a scale (twice the scales' bytes: 0.031 instead of 0.016 a weight);
- `hessian order`: `solvers.admm(order="hessian")`, the loop visiting heavy inputs first with scales fixed up front;
- `solvers.admm` with `scale_search=True, rounding_sweeps=3` (the solver's own implementation of `clip + cd 3`), in
  either order (these rows include ADMM's seconds).
The layer loss tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ) is reported for each, with 2:4 in bf16 (ADMM's weight unrounded) and GPTQ
int4 without pruning beside them. Hessians as in `permute_int4_layer_cpu.py` (cached with `--cache`, safetensors).
With `--held-out-tokens N` every loss is also measured on the Hessian of the next N calibration tokens, which no
solve saw: each method here minimises the fitted Hessian's loss, and a lower loss there need not carry over.

    PYTHONPATH=src python benchmarks/int4_rounding_layer_cpu.py --out benchmarks/results/int4_rounding_layer_cpu.md
    PYTHONPATH=src python benchmarks/int4_rounding_layer_cpu.py --out benchmarks/results/int4_rounding_heldout_cpu.md \
        --tokens 8192 --held-out-tokens 4096 --groups 128 --refit-steps 0
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from permute_int4_layer_cpu import layer_parser, qwen_down_hessians  # benchmarks/ is on sys.path here
from permute_order_bench import save_report
from sparsedecoding import solvers
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.pipeline import relative_error

SHRINKS = torch.arange(1.0, 0.549, -0.025).tolist()  # clip search: the largest magnitude times each of these


def clipped_scales(W: torch.Tensor, d: torch.Tensor, kept: torch.Tensor, group: int) -> torch.Tensor:
    """Per row of W [rows, group], the grid scale among `SHRINKS` of the largest kept magnitude with the least
    Σ ((w − q)/d)² over the kept weights (d [group]: the loop's [U]ᵢᵢ, what it charges a rounding)."""
    absmax = (W * kept).abs().amax(1)
    best, best_error = None, None
    for shrink in SHRINKS:
        scale = solvers.grid_scale(absmax * shrink, "int4")
        error = (((W - solvers.round_to_grid(W, scale[:, None], "int4")) / d) ** 2 * kept).sum(1)
        if best is None:
            best, best_error = scale, error
        else:
            better = error < best_error
            best, best_error = torch.where(better, scale, best), torch.where(better, error, best_error)
    return best


def refit_later(W: torch.Tensor, T: torch.Tensor, A: torch.Tensor, free: torch.Tensor, start: int,
                steps: int) -> None:
    """Columns start: of W move, where `free`, toward the least (w − t)·A·(w − t)ᵀ with every other entry held
    (preconditioned conjugate gradients, in place; entries of those columns not free must already hold their values)."""
    A2 = A[start:, start:]
    mask = free[:, start:].to(W.dtype)
    R = -((W - T) @ A[:, start:]) * mask  # minus the gradient on the moving columns
    inverse_diagonal = 1 / A2.diagonal()
    Z = R * inverse_diagonal
    P = Z.clone()
    rz = (R * Z).sum(1, keepdim=True)
    X = W[:, start:]
    for _ in range(steps):
        Q = (P @ A2) * mask
        pq = (P * Q).sum(1, keepdim=True)
        alpha = torch.where(pq > 0, rz / pq.clamp_min(1e-30), 0)
        X.addcmul_(alpha, P)
        R.addcmul_(alpha, Q, value=-1)
        torch.mul(R, inverse_diagonal, out=Z)
        rz_next = (R * Z).sum(1, keepdim=True)
        beta = torch.where(rz > 0, rz_next / rz.clamp_min(1e-30), 0)
        P.mul_(beta).add_(Z)
        rz = rz_next


def round_loop(W: torch.Tensor, T: torch.Tensor, A: torch.Tensor, U: torch.Tensor, kept: torch.Tensor, group: int,
               clip: bool = False, refit_steps: int = 0, blocksize: int = 128) -> tuple[torch.Tensor, torch.Tensor]:
    """SparseGPT's loop with the mask fixed (`solvers.prune_block`) on a copy of W, as `solvers._column_loop` runs
    it for ADMM, optionally with clipped scales and a refit of the later columns after each block. Returns the
    rounded weight and its scales [rows, cols / group]."""
    W = W.clone()
    rows, cols = W.shape
    scales = torch.empty(rows, cols // group, dtype=W.dtype)
    d_all = U.diagonal()
    for i1 in range(0, cols, blocksize):
        i2 = min(i1 + blocksize, cols)
        for g in range(-(-i1 // group) * group, i2, group):
            if clip:
                scales[:, g // group] = clipped_scales(W[:, g:g + group], d_all[g:g + group], kept[:, g:g + group],
                                                       group)
            else:
                scales[:, g // group] = solvers.grid_scale(W[:, g:g + group].abs().amax(1), "int4")
        WT = W[:, i1:i2].T.contiguous()
        scaleT = scales[:, torch.arange(i1, i2) // group].T.contiguous()
        pruned1, ErrT = torch.empty_like(WT, dtype=torch.bool), torch.empty_like(WT)
        solvers.prune_block(WT, U[i1:i2, i1:i2], d_all[i1:i2], SparsityPattern.parse("2:4"), (rows,), pruned1, ErrT,
                            "int4", scaleT, (~kept[:, i1:i2]).T.contiguous())
        W[:, i1:i2] = WT.T
        W[:, i2:].addmm_(ErrT.T, U[i1:i2, i2:], alpha=-1)
        if refit_steps and i2 < cols:
            W[:, i2:] *= kept[:, i2:]
            refit_later(W, T, A, kept, i2, refit_steps)
    return W * kept, scales


def coordinate_descent(W: torch.Tensor, T: torch.Tensor, A: torch.Tensor, kept: torch.Tensor, scales: torch.Tensor,
                       group: int, sweeps: int, block: int = 128) -> torch.Tensor:
    """`sweeps` passes over the columns: each kept weight moves to the grid point nearest the minimiser of
    (w − t)·A·(w − t)ᵀ in its own coordinate, the others held (so the loss never rises). Blocked: the gradient of
    the block's columns is updated column by column, the rest once a block."""
    W = W.clone()
    rows, cols = W.shape
    G = (W - T) @ A
    diagonal = A.diagonal()
    column_scale = scales.repeat_interleave(group, dim=1)
    for _ in range(sweeps):
        for b1 in range(0, cols, block):
            b2 = min(b1 + block, cols)
            before = W[:, b1:b2].clone()
            for j in range(b1, b2):
                target = W[:, j] - G[:, j] / diagonal[j]
                q = solvers.round_to_grid(target, column_scale[:, j], "int4") * kept[:, j]
                delta = q - W[:, j]
                W[:, j] = q
                G[:, j:b2].addr_(delta, A[j, j:b2])
                G[:, b1:j].addr_(delta, A[j, b1:j])
            G[:, :b1].addmm_(W[:, b1:b2] - before, A[b1:b2, :b1])
            G[:, b2:].addmm_(W[:, b1:b2] - before, A[b1:b2, b2:])
    return W


def layer_rows(args) -> tuple[dict[int, tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]], str]:
    """Per layer: down's sampled rows (float32), its Hessian (float32) and, with --held-out-tokens, the Hessian of
    later calibration tokens; and where the Hessians came from. From `--cache` when it holds them for these
    settings, else computed (and saved there)."""
    settings = f"tokens {args.tokens}, held-out {args.held_out_tokens}, rows {args.rows}"
    kinds = ("W", "H") + (("T",) if args.held_out_tokens else ())
    names = [f"{kind}{index}" for index in args.layers for kind in kinds]
    if args.cache and args.cache.exists():
        tensors = load_file(str(args.cache))
        source, _, cached = args.cache.with_suffix(".txt").read_text().partition("\n")
        if cached == settings and all(name in tensors for name in names):
            return {index: (tensors[f"W{index}"], tensors[f"H{index}"], tensors.get(f"T{index}"))
                    for index in args.layers}, source
    model, hessians, source = qwen_down_hessians(args.tokens, args.layers, args.held_out_tokens)
    out = {}
    for index in args.layers:
        W = model.model.layers[index].mlp.down_proj.weight.detach()
        sample = torch.randperm(W.shape[0], generator=torch.Generator().manual_seed(index))[:args.rows]
        fit, test = hessians[index] if args.held_out_tokens else (hessians[index], None)
        out[index] = (W[sample].float().contiguous(), fit.float().contiguous(),
                      None if test is None else test.float().contiguous())
    if args.cache:
        save_file({f"{kind}{index}": tensor for index, parts in out.items()
                   for kind, tensor in zip("WHT", parts) if tensor is not None}, str(args.cache))
        args.cache.with_suffix(".txt").write_text(f"{source}\n{settings}")
    return out, source


def main() -> None:
    parser = layer_parser(__doc__.split("\n\n")[0], 64)
    parser.add_argument("--held-out-tokens", type=int, default=0,
                        help="also report each loss on the Hessian of this many later calibration tokens (0: off)")
    parser.add_argument("--groups", type=int, nargs="+", default=[128, 64], help="columns a scale to try")
    parser.add_argument("--refit-steps", type=int, default=8,
                        help="conjugate-gradient steps a block for `refit` (0: no refit rows)")
    parser.add_argument("--sweeps", type=int, nargs="+", default=[1, 3], help="coordinate-descent sweeps")
    parser.add_argument("--cache", type=Path, help="safetensors file for the sampled rows and Hessians")
    args = parser.parse_args()
    if args.rows < 1 or args.tokens < 1 or args.refit_steps < 0 or min(args.sweeps) < 1 or args.held_out_tokens < 0:
        parser.error("--rows, --tokens and --sweeps must be positive, --refit-steps and --held-out-tokens at least 0")
    if 128 not in args.groups or any(group < 4 or 8960 % group for group in args.groups):
        parser.error("--groups must include 128 and divide down's 8960 columns")
    pattern = SparsityPattern.parse("2:4")
    results = []
    rows, source = layer_rows(args)
    for index, (Wp, Hp, Ht) in rows.items():
        H = solvers.normalized_hessian(Hp, torch.float32)
        U, damping = solvers.damped_factor(H, 0.01)
        A = H.clone()
        A.diagonal().add_(damping)
        began = time.perf_counter()
        D, kept, _ = solvers.admm_prune(Wp, H, damping, pattern, 100)
        admm_seconds = time.perf_counter() - began

        def record(name: str, weight: torch.Tensor, seconds: float, group: int | None = None) -> None:
            results.append({"layer": index, "rounding": name, "group": group, "loss": relative_error(Wp, weight, Hp),
                            "held_out_loss": None if Ht is None else relative_error(Wp, weight, Ht),
                            "seconds": seconds})
            print(results[-1], flush=True)

        record("2:4 bf16 (ADMM, unrounded)", D, admm_seconds)
        began = time.perf_counter()
        record("int4 unpruned (GPTQ)", solvers.gptq(Wp, Hp, "int4", group_size=128), time.perf_counter() - began, 128)
        today = solvers.admm(Wp, Hp, pattern, quantize="int4", group_size=128)
        for group in args.groups:
            variants = {"loop": {}, "clip": {"clip": True}}
            if args.refit_steps:
                variants.update({"refit": {"refit_steps": args.refit_steps},
                                 "clip + refit": {"clip": True, "refit_steps": args.refit_steps}})
            for name, options in variants.items():
                began = time.perf_counter()
                rounded, scales = round_loop(D, Wp, A, U, kept, group, **options)
                record(name, rounded, time.perf_counter() - began, group)
                if group == 128 and name == "loop":
                    results[-1]["same_as_admm_int4"] = bool(torch.equal(rounded, today))
                if name in ("loop", "clip"):
                    for sweeps in args.sweeps:
                        began = time.perf_counter()
                        record(f"{name} + cd {sweeps}", coordinate_descent(rounded, Wp, A, kept, scales, group, sweeps),
                               time.perf_counter() - began, group)
        for name, options in (("hessian order", {"order": "hessian"}),
                              ("solvers.admm, scale_search + 3 sweeps", {"scale_search": True, "rounding_sweeps": 3}),
                              ("hessian order, scale_search + 3 sweeps",
                               {"order": "hessian", "scale_search": True, "rounding_sweeps": 3})):
            began = time.perf_counter()  # with ADMM's 100 iterations again
            record(name, solvers.admm(Wp, Hp, pattern, quantize="int4", group_size=128, **options),
                   time.perf_counter() - began, 128)
    base = {r["layer"]: r for r in results if r["rounding"] == "loop" and r["group"] == 128}
    held = args.held_out_tokens > 0

    def cells(r: dict) -> str:
        line = f"| {r['layer']} | {r['rounding']} | {r['group'] or '-'} | {r['loss']:.4g} | " \
               f"{r['loss'] / base[r['layer']]['loss']:.3f} |"
        if held:
            line += f" {r['held_out_loss']:.4g} | {r['held_out_loss'] / base[r['layer']]['held_out_loss']:.3f} |"
        return line + f" {r['seconds']:.0f} |\n"

    same = [r["same_as_admm_int4"] for r in results if "same_as_admm_int4" in r]
    save_report(
        args.out, "benchmarks/int4_rounding_layer_cpu.py", results,
        "Rounding ADMM's 2:4 weight to int4 several ways: down's layer loss on Qwen2.5-Coder-1.5B (CPU)",
        torch.device("cpu"),
        f"{source}; {args.rows} of down's rows a layer, solved in float32. ADMM: 100 iterations, 1% damping, 2:4, "
        f"computed once a layer and rounded by each method. refit: {args.refit_steps} conjugate-gradient steps a "
        f"block of 128 columns; cd K: K coordinate-descent sweeps on the result of the method named first; clip: "
        f"shrinks {SHRINKS[0]:g} to {SHRINKS[-1]:g} in steps of 0.025. Today's rounding (`loop`, 128 columns a "
        f"scale) gave `solvers.admm(quantize=\"int4\")`'s weight bit for bit: {'yes' if all(same) else 'NO'}. "
        "Loss: tr(ΔW·H·ΔWᵀ) / tr(W·H·Wᵀ) (lower is better) on the Hessian the solves fitted"
        + ("; held-out: the same on the held-out tokens' Hessian, which no solve saw" if held else "")
        + "; / loop: against today's rounding of the same layer.\n\n"
        + "| layer | rounding | columns a scale | loss | / loop |" + (" held-out loss | / loop |" if held else "")
        + " seconds |\n|---|---|---|---|---|" + ("---|---|" if held else "") + "---|\n"
        + "".join(cells(r) for r in results))


if __name__ == "__main__":
    main()
