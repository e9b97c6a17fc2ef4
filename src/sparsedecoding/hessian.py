"""Layer Hessians H = 2·X·Xᵀ/N of the reconstruction loss ‖W·X − Ŵ·X‖², accumulated as streaming sums over the
calibration positions that are kept (forward pre-hooks on the prunable linears). Linears that read the same input
(q/k/v, gate/up) share one accumulator, so each input is counted once."""

from __future__ import annotations

import math
from contextlib import contextmanager

import torch
from torch import nn

from .errors import CalibrationError, NonFiniteActivationError, SolverSettingsError
from .patterns import PRUNABLE_LINEARS

# Linears of one decoder layer that always read the same tensor.
SHARED_INPUT = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up", "up_proj": "gate_up"}


class HessianAccumulator:
    """Σ x·xᵀ and the count N over the rows fed to `add`; `hessian()` returns 2·Σ/N."""

    def __init__(self, dim: int, dtype: torch.dtype = torch.float32, device: torch.device | str = "cpu"):
        self.sum = torch.zeros(dim, dim, dtype=dtype, device=device)
        self.count = 0

    def add(self, rows: torch.Tensor) -> None:
        """Accumulate `rows` [N, dim] (the hooks check them for NaN and inf before they get here)."""
        if rows.dim() != 2 or rows.shape[1] != self.sum.shape[0]:
            raise CalibrationError(f"rows of shape {tuple(rows.shape)} do not fit a Hessian of {self.sum.shape[0]} "
                                   f"inputs; pass [N, {self.sum.shape[0]}]")
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
            if isinstance(module, nn.Linear) and name.rsplit(".", 1)[-1] in PRUNABLE_LINEARS}


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


def kept_rows(x: torch.Tensor, keep: KeepMask, where: str) -> torch.Tensor:
    """The rows of a linear's input [..., in] at the kept positions, refused if any is NaN/inf."""
    rows = x.reshape(-1, x.shape[-1])[keep.flat.to(x.device)]
    if not torch.isfinite(rows).all():
        raise NonFiniteActivationError(f"NaN/inf in the input of {where} during calibration; "
                                       f"check the model weights or use float32")
    return rows


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
            rows = kept_rows(args[0], keep, f"{where}{key}")
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


class PairedInputs:
    """Statistics for dense-target reconstruction of one decoder layer. The layer (weights still dense) runs every
    batch twice: first on the dense model's hidden states (`mode = "dense"`: each group's kept input rows x_d are
    held), then on the pruned model's (`mode = "pruned"`: H += x_p·x_pᵀ and C += x_d·x_pᵀ with the held rows of the
    same positions). Fitting Ŵ·x_p to W·x_d gives the closed form W·C·H⁻¹ (`dense_target`)."""

    def __init__(self):
        self.mode = "dense"
        self.held: dict[str, torch.Tensor] = {}
        self.hessian: dict[str, HessianAccumulator] = {}
        self.cross: dict[str, torch.Tensor] = {}


@contextmanager
def accumulate_paired_inputs(modules: dict[str, nn.Module], keep: KeepMask, dtype: torch.dtype = torch.float32,
                             where: str = "", dense_modules: dict[str, nn.Module] | None = None):
    """Like `accumulate_inputs`, for `PairedInputs`: yields the state whose `mode` the caller switches between the
    dense and the pruned run of each batch. `dense_modules` (same names): where the dense run's inputs are read when
    the dense run goes through another copy of the layer (default: `modules`)."""
    groups = input_groups(list(modules))
    state = PairedInputs()
    handles = []

    def make_hook(key: str):
        def hook(module: nn.Module, args: tuple) -> None:
            rows = kept_rows(args[0], keep, f"{where}{key}")
            if state.mode == "dense":
                state.held[key] = rows
                return
            held = state.held.pop(key, None)
            if held is None or held.shape != rows.shape:
                raise RuntimeError(f"{where}{key}: the pruned run of a batch must follow its dense run")
            state.hessian[key].add(rows)
            state.cross[key].addmm_(held.to(dtype).T, rows.to(dtype))
        return hook

    for key, members in groups.items():
        first = modules[members[0]]
        state.hessian[key] = HessianAccumulator(first.in_features, dtype, first.weight.device)
        state.cross[key] = torch.zeros(first.in_features, first.in_features, dtype=dtype, device=first.weight.device)
        handles.append(first.register_forward_pre_hook(make_hook(key)))
        if dense_modules is not None:
            handles.append(dense_modules[members[0]].register_forward_pre_hook(make_hook(key)))
    try:
        yield state
    finally:
        for handle in handles:
            handle.remove()


def paired_by_module(state: PairedInputs, names: list[str]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """({name: H}, {name: C}) with C scaled as H (2/N), shared inputs sharing the tensors."""
    hessians, crosses = {}, {}
    for key, members in input_groups(names).items():
        accumulator = state.hessian[key]
        hessian = accumulator.hessian()
        cross = state.cross[key] * (2.0 / accumulator.count)
        for name in members:
            hessians[name], crosses[name] = hessian, cross
    return hessians, crosses


def dense_target(weight: torch.Tensor, cross: torch.Tensor, hessian: torch.Tensor, percdamp: float) -> torch.Tensor:
    """The weight W_t that best maps the pruned model's inputs to the dense layer's outputs.

    With H = Σ x_p·x_pᵀ and C = Σ x_d·x_pᵀ, ‖Ŵ·X_p − W·X_d‖² = ‖(Ŵ − W_t)·X_p‖² + const for W_t = W·C·H⁻¹, so any
    solver that minimises ‖(Ŵ − W_t)·X_p‖² for H (SparseGPT, Wanda, magnitude) fitted on W_t fits the dense target
    instead of the pruned inputs' own outputs (asymmetric calibration, as GPTAQ does for quantization). The damping
    pulls towards W rather than towards zero: W_t = W·(C + λI)·(H + λI)⁻¹ = W + W·(C − H)·(H + λI)⁻¹, with
    λ = percdamp·mean(diag H) as in the solver, so equal streams give W_t = W exactly. Inputs that were always zero
    keep W_t = 0 there. Solved in float64; returns W's dtype."""
    from .solvers import check_inputs

    if isinstance(percdamp, bool) or not isinstance(percdamp, (int, float)) or not 0 <= percdamp < math.inf:
        raise SolverSettingsError(f"percdamp = {percdamp!r} must be a finite number of at least 0 (0: the exact "
                                  f"least-squares target); the usual value is 0.01")
    check_inputs(weight, hessian)
    if not isinstance(cross, torch.Tensor) or cross.shape != hessian.shape:
        raise CalibrationError(f"the cross term C must have the Hessian's shape {tuple(hessian.shape)}, got "
                               f"{tuple(getattr(cross, 'shape', ()))}")
    H = hessian.to(torch.float64).clone()
    dead = H.diagonal() == 0
    H[dead, dead] = 1
    damping = percdamp * float(hessian.diagonal().double().mean())
    H.diagonal().add_(damping)
    C = cross.to(torch.float64).clone()
    C.diagonal().add_(damping)
    lower, info = torch.linalg.cholesky_ex(H)
    if info != 0:
        raise CalibrationError(f"the pruned inputs' Hessian is not positive definite with damping {percdamp:g}; "
                               f"raise --percdamp or calibrate on more tokens")
    target = torch.cholesky_solve(C.T @ weight.to(torch.float64).T, lower).T
    target[:, dead] = 0
    return target.to(weight.dtype)


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
