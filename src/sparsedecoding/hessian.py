"""Layer Hessians H = 2·X·Xᵀ/N of the reconstruction loss ‖W·X − Ŵ·X‖², accumulated as streaming sums over the
calibration positions that are kept (forward pre-hooks on the prunable linears). Linears that read the same input
(q/k/v, gate/up) share one accumulator, so each input is counted once."""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import nn

from .errors import NonFiniteActivationError

PRUNABLE = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# Linears of one decoder layer that always read the same tensor.
SHARED_INPUT = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


class HessianAccumulator:
    """Σ x·xᵀ and the count N over the rows fed to `add`; `hessian()` returns 2·Σ/N."""

    def __init__(self, dim: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self.sum = torch.zeros(dim, dim, dtype=dtype, device=device)
        self.count = 0

    def add(self, rows: torch.Tensor) -> None:
        rows = rows.to(self.sum.dtype)
        self.sum.addmm_(rows.T, rows)
        self.count += rows.shape[0]

    def hessian(self) -> torch.Tensor:
        if self.count == 0:
            raise NonFiniteActivationError("no calibration positions reached this layer")
        return self.sum * (2.0 / self.count)


def prunable_linears(layer: nn.Module) -> dict[str, nn.Linear]:
    """The decoder layer's prunable linears by their name inside the layer (e.g. `self_attn.q_proj`)."""
    return {name: module for name, module in layer.named_modules()
            if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in PRUNABLE}


def input_groups(names: list[str]) -> dict[str, list[str]]:
    """Group linear names by shared input: {group key: [names]}; unshared linears are their own group."""
    groups: dict[str, list[str]] = {}
    for name in names:
        prefix, _, leaf = name.rpartition(".")
        key = f"{prefix}.{SHARED_INPUT[leaf]}" if leaf in SHARED_INPUT else name
        groups.setdefault(key, []).append(name)
    return groups


class KeepMask:
    """The kept-position mask of the batch being replayed, read by the hooks."""

    def __init__(self):
        self.flat: torch.Tensor | None = None

    def set(self, keep: torch.Tensor) -> None:
        self.flat = keep.reshape(-1)


@contextmanager
def accumulate_inputs(modules: dict[str, nn.Module], keep: KeepMask, dtype: torch.dtype = torch.float32,
                      where: str = ""):
    """Attach pre-hooks that add each module's kept input rows to an accumulator; yields {group: accumulator}.

    `modules` maps names to linears; modules sharing an input (by `input_groups`) share one accumulator, hooked on
    the first member only."""
    groups = input_groups(list(modules))
    accumulators: dict[str, HessianAccumulator] = {}
    handles = []

    def make_hook(key: str):
        def hook(module: nn.Module, args: tuple) -> None:
            x = args[0]
            rows = x.reshape(-1, x.shape[-1])[keep.flat.to(x.device)]
            if not torch.isfinite(rows).all():
                raise NonFiniteActivationError(f"NaN/inf in the input of {where}{key} during calibration; "
                                               f"check the model weights or use float32")
            accumulators[key].add(rows)
        return hook

    for key, members in groups.items():
        first = modules[members[0]]
        accumulators[key] = HessianAccumulator(first.in_features, dtype, first.weight.device)
        handles.append(first.register_forward_pre_hook(make_hook(key)))
    try:
        yield accumulators
    finally:
        for handle in handles:
            handle.remove()


def hessians_by_module(accumulators: dict[str, HessianAccumulator], names: list[str]) -> dict[str, torch.Tensor]:
    """Expand group accumulators to one Hessian per module name (shared inputs share the tensor)."""
    result = {}
    for key, members in input_groups(names).items():
        hessian = accumulators[key].hessian()
        for name in members:
            result[name] = hessian
    return result


@torch.no_grad()
def collect_hessians(model, calib, *, batch_size: int = 8, dtype: torch.dtype = torch.float32,
                     progress: bool = True) -> dict[str, torch.Tensor]:
    """H for every prunable linear of a model from one teacher-forced replay of `calib` through the (dense) model.
    Keys are full module names (`model.layers.0.self_attn.q_proj`)."""
    from tqdm.auto import tqdm

    from .generation import position_ids_from_mask

    device = next(model.parameters()).device
    modules = {f"model.layers.{index}.{name}": module
               for index, layer in enumerate(model.model.layers)
               for name, module in prunable_linears(layer).items()}
    keep = KeepMask()
    batches = list(calib.batches(batch_size))
    with accumulate_inputs(modules, keep, dtype) as accumulators:
        for input_ids, attention_mask, kept in tqdm(batches, desc="hessians", unit="batch", disable=not progress):
            keep.set(kept.to(device))
            model.model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device),
                        position_ids=position_ids_from_mask(attention_mask).to(device), use_cache=False)
    return hessians_by_module(accumulators, list(modules))
