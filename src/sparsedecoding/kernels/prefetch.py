"""L2 prefetch of the next linear's weight during a decode step.

At small batch a decode step is a chain of linears that stream their weights from memory, with latency-bound
kernels in between (attention, norms, the activation) during which the memory system is mostly idle, and each
linear pays a ramp-up before its loads reach full bandwidth. A linear that names the next one's tensors prefetches
up to `budget` bytes of them into L2 as it finishes (`cp.async.bulk.prefetch.L2` on sm_90): the bytes arrive during
the gap, and the next linear reads them from L2. The total bytes read from memory do not change; the time they take
overlaps time that was idle.

`chain_prefetch(model, budget)` links a model's linears in forward order (the order `named_modules` gives for the
engine's Transformer and for transformers' Llama / Qwen / Mistral: q, k, v or qkv, o, gate / up, down, then
lm_head), each prefetching the front `budget` bytes of the next, split over its tensors in proportion to their size.
The sources that prefetch are `Sp24Linear` (inside its kernel, no extra launch) and `nn.Linear` (swapped for
`PrefetchingLinear`: the cuBLAS product, then one small launch of the prefetch); any module with tensors can be a
target. The plans live in a registry keyed by the source tensor (`plan_for`), so a compiled region that runs many
layers through one graph needs no per-layer argument. Prefetching never changes a result, only when bytes arrive.

The engine applies SPARSEDECODING_L2_PREFETCH (MiB per linear; 0 turns it off) when it builds a model."""

from __future__ import annotations

import ctypes
import logging
import os
import weakref

import torch
import torch.nn.functional as F

from .op import KernelChoiceError

log = logging.getLogger(__name__)

PREFETCH_SETTING = "SPARSEDECODING_L2_PREFETCH"
DEFAULT_PREFETCH_MIB = 0
RANGES = 3  # byte ranges a launch takes (csrc/sp24.cu `Prefetch`)


class L2Prefetch:
    """Up to three byte ranges to prefetch: the front `budget` bytes of `tensors` (largest three kept), each
    tensor's share in proportion to its size, rounded down to 16 bytes. Holds the tensors, so that the ranges stay
    valid while the plan exists; `pointers` / `lengths` are the ctypes arrays a launch passes."""

    def __init__(self, tensors: list[torch.Tensor], budget: int):
        tensors = sorted((t for t in tensors if t.numel()), key=_nbytes, reverse=True)[:RANGES]
        total = sum(_nbytes(t) for t in tensors)
        fraction = min(1.0, budget / total) if total else 0.0
        self.tensors = tensors
        self.pointers = (ctypes.c_void_p * RANGES)(*[t.data_ptr() for t in tensors])
        self.lengths = (ctypes.c_ulonglong * RANGES)(*[int(_nbytes(t) * fraction) // 16 * 16 for t in tensors])
        self.nbytes = sum(self.lengths)


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


NO_PREFETCH = L2Prefetch([], 0)
_plans: dict[int, tuple[weakref.ref, L2Prefetch]] = {}


def set_plan(source: torch.Tensor, plan: L2Prefetch | None) -> None:
    """The plan the linear reading `source` (its largest tensor) runs as it finishes; None removes it. Targets
    must be on source's CUDA device and start on 16-byte boundaries."""
    key = source.data_ptr()
    if plan is None or plan.nbytes == 0:
        _plans.pop(key, None)
        return
    for t in plan.tensors:
        if t.device != source.device or t.device.type != "cuda" or t.data_ptr() % 16:
            raise KernelChoiceError(f"an L2 prefetch target on {t.device} (alignment {t.data_ptr() % 16}) cannot be "
                                    f"prefetched by a linear on {source.device}")
    _plans[key] = (weakref.ref(source), plan)


def plan_for(source: torch.Tensor) -> L2Prefetch:
    """The plan registered for `source` (the same storage), or NO_PREFETCH; a plan whose source tensor is gone is
    dropped."""
    entry = _plans.get(source.data_ptr())
    if entry is None:
        return NO_PREFETCH
    held = entry[0]()
    if held is None or held.data_ptr() != source.data_ptr():
        del _plans[source.data_ptr()]
        return NO_PREFETCH
    return entry[1]


def launch(plan: L2Prefetch, device: torch.device, mode: int = 0) -> None:
    """Issue `plan` alone on torch's current stream (one small kernel; a no-op for an empty plan). `mode` 0: bulk
    prefetches (sm_90); 1: prefetch.global.L2 a line per thread; 2: the same with evict_last; 3: L2-only loads."""
    if plan.nbytes == 0:
        return
    from . import cuda_mma, sp24

    library = sp24._load()
    index = device.index if device.index is not None else torch.cuda.current_device()
    with cuda_mma._on_device(index):
        err = library.sp24_prefetch_launch(plan.pointers, plan.lengths, mode, cuda_mma._current_raw_stream(index))
    if err:
        raise RuntimeError(f"L2 prefetch launch failed: {library.sp24_error_string(err).decode()}")


@torch.library.custom_op("sparsedecoding::linear_prefetch", mutates_args=())
def _linear_prefetch_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    y = F.linear(x, weight, bias)
    if x.is_cuda:
        launch(plan_for(weight), x.device)
    return y


@_linear_prefetch_op.register_fake
def _linear_prefetch_fake(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


class PrefetchingLinear(torch.nn.Linear):
    """`nn.Linear` (the same parameters) that, after its product, prefetches what its registered plan names."""

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear) -> PrefetchingLinear:
        module = cls.__new__(cls)
        torch.nn.Module.__init__(module)
        module.in_features, module.out_features = linear.in_features, linear.out_features
        module.weight, module.bias = linear.weight, linear.bias
        return module

    def to_linear(self) -> torch.nn.Linear:
        module = torch.nn.Linear.__new__(torch.nn.Linear)
        torch.nn.Module.__init__(module)
        module.in_features, module.out_features = self.in_features, self.out_features
        module.weight, module.bias = self.weight, self.bias
        return module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_cuda:
            return F.linear(x, self.weight, self.bias)
        return torch.ops.sparsedecoding.linear_prefetch(x, self.weight, self.bias)


def _linears(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The model's linears (dense, packed, quantized or tiled) in forward order."""
    from .linear import PackedLinear
    from .quantized_linear import DenseQuantizedLinear, QuantizedPackedLinear
    from .sp24_linear import Sp24Linear

    kinds = (torch.nn.Linear, PackedLinear, QuantizedPackedLinear, DenseQuantizedLinear, Sp24Linear)
    return [(name, module) for name, module in model.named_modules() if isinstance(module, kinds)]


def _targets(module: torch.nn.Module) -> list[torch.Tensor]:
    """What a linear reads: its parameters and buffers other than the bias."""
    tensors = [t for name, t in (*module.named_parameters(recurse=False), *module.named_buffers(recurse=False))
               if t is not None and name != "bias"]
    return [t.detach() for t in tensors]


def _source(module: torch.nn.Module) -> torch.Tensor | None:
    """The tensor whose plan `module` looks up when it runs, if it can prefetch."""
    from .sp24_linear import Sp24Linear

    if isinstance(module, Sp24Linear):
        return module.a
    if isinstance(module, PrefetchingLinear):
        return module.weight
    return None


def chain_prefetch(model: torch.nn.Module, budget: int) -> int:
    """Link every linear of `model` on CUDA to the next in forward order: each `Sp24Linear` and dense `nn.Linear`
    (swapped, in place, for a `PrefetchingLinear` sharing its parameters) prefetches the front `budget` bytes of
    the next linear's tensors. A budget of 0 removes the links (and the swaps). Returns how many linears prefetch.
    Raises KernelChoiceError if the prefetch kernel cannot run here."""
    unchain_prefetch(model)
    if budget <= 0:
        return 0
    from . import cuda_mma, sp24

    try:
        sp24.load()
    except cuda_mma.CudaKernelUnavailableError as exc:
        raise KernelChoiceError(f"{PREFETCH_SETTING}: the L2 prefetch kernel cannot run here ({exc}); set it to 0"
                                ) from exc
    for name, module in _linears(model):
        if type(module) is torch.nn.Linear and module.weight.is_cuda:
            model.set_submodule(name, PrefetchingLinear.from_linear(module))
    linears = _linears(model)
    linked = 0
    for (_, module), (_, following) in zip(linears, linears[1:]):
        source = _source(module)
        targets = [t for t in _targets(following) if t.is_cuda]
        if source is None or not source.is_cuda or not targets:
            continue
        set_plan(source, L2Prefetch(targets, budget))
        linked += 1
    return linked


def unchain_prefetch(model: torch.nn.Module) -> None:
    """Remove every prefetch link of `model`'s linears and turn `PrefetchingLinear`s back into `nn.Linear`."""
    for name, module in _linears(model):
        source = _source(module)
        if source is not None:
            set_plan(source, None)
        if isinstance(module, PrefetchingLinear):
            model.set_submodule(name, module.to_linear())


def prefetch_setting() -> int:
    """SPARSEDECODING_L2_PREFETCH as bytes (the variable holds MiB, a whole number ≥ 0; default
    DEFAULT_PREFETCH_MIB); anything else is a KernelChoiceError."""
    value = os.environ.get(PREFETCH_SETTING, "").strip() or str(DEFAULT_PREFETCH_MIB)
    if not value.isdigit():
        raise KernelChoiceError(f"{PREFETCH_SETTING}={value!r}; give the MiB each linear prefetches of the next "
                                "(a whole number, 0 for off)")
    return int(value) << 20


def prefetch_for_engine(model: torch.nn.Module) -> int:
    """What the engine does after building a model on CUDA: `chain_prefetch` with SPARSEDECODING_L2_PREFETCH's
    budget (nothing when it is 0). Returns how many linears prefetch."""
    budget = prefetch_setting()
    if budget == 0 or not any(p.is_cuda for p in model.parameters()):
        return 0
    linked = chain_prefetch(model, budget)
    log.info("%d linears prefetch up to %d MiB of the next into L2", linked, budget >> 20)
    return linked
