"""Optional block-wise refinement after the solver: with every pruned linear's mask fixed, Adam adjusts the kept
weights of one decoder layer so that the layer's output matches the dense layer's on the calibration sequences.

SparseGPT minimizes each linear's own reconstruction error from its Hessian. A decoder layer chains its linears
through attention and the MLP's nonlinearity, so the errors of q/k/v, o, gate/up and down interact. The refinement
fits them jointly. The loss is ‖layer_pruned(x) − layer_dense(x)‖² / ‖layer_dense(x)‖², summed over the positions
`refine_layer` is given. The pipeline gives it every real token of the calibration sequences (prompt and
continuation; padding never counts), not only the decode positions its Hessians come from.

Experimental, off by default: on SmolLM2-135M (`benchmarks/results/refine-smollm2-cpu/`) it lowered every
layer's held-out error yet made the model's answers end early (often at the first token), whether it fitted decode
positions only or every real token.

The last calibration batch is held out. If the refined weights do worse on it than the solver's weights, they are
discarded and the solver's weights stay; the stats say so. This uses only calibration data, never the evaluation
split."""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from .errors import SparseDecodingError


def _layer_output(layer: nn.Module, weights: dict[str, torch.Tensor], hidden: torch.Tensor, kwargs: dict):
    out = functional_call(layer, weights, (hidden,), kwargs)
    return out[0] if isinstance(out, tuple) else out


@torch.no_grad()
def _relative_error(layer, weights, batches, targets, positions) -> float:
    """Σ‖out − target‖² / Σ‖target‖² over the selected positions of the given batches."""
    error = energy = 0.0
    for (hidden, kwargs, _), target, kept in zip(batches, targets, positions):
        out = _layer_output(layer, weights, hidden, kwargs).float()[kept]
        reference = target.float()[kept]
        error += float(((out - reference) ** 2).sum())
        energy += float((reference ** 2).sum())
    return error / max(energy, 1e-30)


def refine_layer(layer: nn.Module, linears: dict[str, nn.Linear], batches: list, targets: list[torch.Tensor],
                 steps: int, lr: float, seed: int = 0, positions: list[torch.Tensor] | None = None) -> dict:
    """Refine `linears` (the layer's pruned linears, by name relative to `layer`) in place; zeros stay zero.
    batches: [(hidden, layer kwargs, kept positions)] as the pipeline replays them; targets: the dense layer's outputs
    on the same inputs; positions: per batch, a bool [batch, seq] mask of the positions in the loss (default: the
    batches' kept positions). Returns the held-out relative output error before and after, and whether the refined
    weights were kept."""
    if steps <= 0:
        raise SparseDecodingError(f"--refine-steps must be positive to refine, got {steps}")
    if lr <= 0:
        raise SparseDecodingError(f"--refine-lr must be positive, got {lr}")
    if len(batches) < 2:
        raise SparseDecodingError("refinement holds out the last calibration batch and needs at least two; "
                                  "lower --batch-size or give more calibration sequences")
    positions = [kept for _, _, kept in batches] if positions is None else positions
    train = list(zip(batches[:-1], targets[:-1], positions[:-1]))
    held_out = (batches[-1:], targets[-1:], positions[-1:])
    solver_weights = {f"{name}.weight": linear.weight.detach().clone() for name, linear in linears.items()}
    masks = {key: weight != 0 for key, weight in solver_weights.items()}
    dtypes = {key: weight.dtype for key, weight in solver_weights.items()}
    before = _relative_error(layer, solver_weights, *held_out)
    trainable = {parameter: parameter.requires_grad for parameter in layer.parameters()}
    for parameter in trainable:  # gradients go to the fp32 masters only, never into the model's own tensors
        parameter.requires_grad_(False)
    try:
        masters = _fit(layer, solver_weights, masks, dtypes, train, steps, lr, seed)
    finally:
        for parameter, flag in trainable.items():
            parameter.requires_grad_(flag)
    refined = _cast({key: master * masks[key] for key, master in masters.items()}, dtypes)
    after = _relative_error(layer, refined, *held_out)
    kept_refined = after < before
    chosen = refined if kept_refined else solver_weights
    for name, linear in linears.items():
        linear.weight.data.copy_(chosen[f"{name}.weight"])
    return {"held_out_error_before": before, "held_out_error_after": after, "kept": kept_refined}


def _cast(weights: dict[str, torch.Tensor], dtypes: dict[str, torch.dtype]) -> dict[str, torch.Tensor]:
    return {key: value.to(dtypes[key]) for key, value in weights.items()}


def _fit(layer, start: dict[str, torch.Tensor], masks: dict[str, torch.Tensor], dtypes: dict[str, torch.dtype],
         train: list, steps: int, lr: float, seed: int) -> dict[str, torch.Tensor]:
    """Adam on fp32 master copies of `start` over the training batches in a seeded order, re-masked after every
    step; the forward pass runs in `dtypes` (the weights' own). Returns the masters (detached)."""
    masters = {key: weight.float().clone().requires_grad_(True) for key, weight in start.items()}
    optimizer = torch.optim.Adam(list(masters.values()), lr=lr)
    order = torch.Generator().manual_seed(seed)
    with torch.enable_grad():
        for step in range(steps):
            if step % len(train) == 0:
                permutation = torch.randperm(len(train), generator=order).tolist()
            (hidden, kwargs, _), target, kept = train[permutation[step % len(train)]]
            out = _layer_output(layer, _cast(masters, dtypes), hidden, kwargs).float()[kept]
            reference = target.float()[kept]
            loss = ((out - reference) ** 2).sum() / (reference ** 2).sum().clamp(min=1e-30)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for key, master in masters.items():
                    master.mul_(masks[key])
    return {key: master.detach() for key, master in masters.items()}
