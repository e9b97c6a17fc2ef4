"""The packed kernel inside a transformers model: `sparsify` swaps, in place, every `nn.Linear` whose weight is N:M
sparse in a pattern the kernel runs for a `PackedLinear`; `load_packed` builds the same model from a packed
checkpoint (`sparsedecoding pack`). Either way the result is the transformers model itself, so `generate`, its
static cache and `torch.compile` work as on the dense model: `PackedLinear` calls the kernel through a cached
runner eagerly and through the custom op (with a fake implementation) under torch.compile. The 2:4 ones stay
`PackedLinear` here: with transformers' separate q/k/v and gate/up projections the tiled sparse tensor-core kernel
(`kernels.sp24_linear.tile_model`, which the engine applies) was measured slower end to end
(benchmarks/results/hf_generate_h200_sp24.md); call `tile_model(model)` after `sparsify` to opt in."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from .engine.loading import nm_pattern
from .errors import KernelInputError, PackingError
from .kernels import PackedLinear, PackedNM, pack_nm
from .kernels.sp24_linear import Sp24Linear
from .packed import load_packed_checkpoint

_KERNEL_DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class SparsifySummary:
    """What `sparsify` did: `swapped` maps each replaced linear's name to its N:M pattern, `kept_dense` names the
    linears left as they were (not N:M sparse, in_features not a multiple of 32, or the output embedding);
    `dense_bytes` and `packed_bytes` are the swapped weights' sizes before and after."""

    swapped: dict[str, str]
    kept_dense: list[str]
    dense_bytes: int
    packed_bytes: int

    @property
    def bytes_saved(self) -> int:
        return self.dense_bytes - self.packed_bytes

    def __str__(self) -> str:
        patterns = ", ".join(f"{pattern} x{count}" for pattern, count in sorted(Counter(self.swapped.values()).items()))
        return (f"{len(self.swapped)} linears packed ({patterns}), {len(self.kept_dense)} kept dense; their weights "
                f"{self.dense_bytes / 2**20:.1f} MiB -> {self.packed_bytes / 2**20:.1f} MiB "
                f"({self.bytes_saved / 2**20:.1f} MiB saved)")


def _output_embedding(model: nn.Module) -> nn.Module | None:
    get = getattr(model, "get_output_embeddings", None)
    return get() if get is not None else None


def sparsify(model: nn.Module) -> tuple[nn.Module, SparsifySummary]:
    """Replace in place every `nn.Linear` of `model` whose weight satisfies a kernel-supported N:M pattern
    (`engine.loading.nm_pattern`: the sparsest of 2:4, 4:8, 8:16, 16:32 families that holds, detected from the
    zeros) with a `PackedLinear` holding the same weight packed, the same bias, dtype and device. The output
    embedding (lm_head, often tied to the input embedding) and linears that are not N:M sparse stay as they were.
    Returns the model and a `SparsifySummary`.

    Raises PackingError when no linear is N:M sparse (the model was not pruned, or not to an N:M pattern), and
    KernelInputError, before changing anything, when a sparse linear's weight is not bfloat16 or float16 (the
    kernel's dtypes; call `model.to(torch.bfloat16)` first)."""
    output = _output_embedding(model)
    plan: dict[str, tuple[nn.Linear, tuple[int, int]]] = {}
    kept: list[str] = []
    for name, module in model.named_modules():
        if not isinstance(module, nn.Linear) or isinstance(module, (PackedLinear, Sp24Linear)):
            continue
        pattern = None if module is output else nm_pattern(module.weight.detach())
        if pattern is None:
            kept.append(name)
        else:
            plan[name] = (module, pattern)
    if not plan:
        raise PackingError(f"no linear of this {type(model).__name__} is N:M sparse ({len(kept)} dense linears); "
                           "prune the model to an N:M pattern such as 2:4 first (sparsedecoding prune)")
    wrong = {name: module.weight.dtype for name, (module, _) in plan.items()
             if module.weight.dtype not in _KERNEL_DTYPES}
    if wrong:
        name, dtype = next(iter(wrong.items()))
        raise KernelInputError(f"{name} holds {dtype} weights; the sparse kernel runs bfloat16 or float16: call "
                               "model.to(torch.bfloat16) before sparsify")
    swapped: dict[str, str] = {}
    dense_bytes = packed_bytes = 0
    for name, (module, (n, m)) in plan.items():
        weight = module.weight.detach()
        bias = module.bias.detach() if module.bias is not None else None
        packed = PackedLinear(pack_nm(weight, n, m), bias)
        model.set_submodule(name, packed)
        swapped[name] = f"{n}:{m}"
        dense_bytes += weight.numel() * weight.element_size()
        packed_bytes += sum(t.numel() * t.element_size() for t in (packed.values, packed.bitmask))
    return model, SparsifySummary(swapped, kept, dense_bytes, packed_bytes)


def load_packed(folder: str | Path, device: str | torch.device = "cpu") -> nn.Module:
    """The transformers causal LM of a packed checkpoint folder (written by `sparsedecoding pack`) with a
    `PackedLinear` wherever the checkpoint holds a packed weight: the model `sparsify` makes from the pruned
    folder, without ever holding those weights dense. Raises ModelNotFoundError / PackingError for a folder that
    is not a packed checkpoint or does not match its config.json."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig
    from transformers.initialization import no_init_weights

    state, _ = load_packed_checkpoint(folder, device)
    packed = {name.removesuffix(".weight"): weight for name, weight in state.items() if isinstance(weight, PackedNM)}
    dtype = next(iter(packed.values())).values.dtype
    with no_init_weights():  # every weight is assigned from the checkpoint below; skip the random initialisation
        model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=dtype)
    if (Path(folder) / "generation_config.json").is_file():  # stop tokens, sampling defaults: as from_pretrained
        model.generation_config = GenerationConfig.from_pretrained(folder)
    for name, weight in packed.items():
        model.set_submodule(name, PackedLinear(weight, state.get(f"{name}.bias")))
    dense = {name: tensor for name, tensor in state.items() if not isinstance(tensor, PackedNM)}
    result = model.load_state_dict(dense, strict=False, assign=True)
    model.tie_weights()  # a tied output embedding is not in the checkpoint: it shares the input embedding
    output = _output_embedding(model)
    tied = {f"{name}.weight" for name, module in model.named_modules() if module is output
            and output.weight is model.get_input_embeddings().weight}
    missing = [key for key in result.missing_keys if key.rsplit(".", 1)[0] not in packed and key not in tied]
    if missing or result.unexpected_keys:
        raise PackingError(f"{folder} does not match its config.json: missing {missing[:3]}, "
                           f"unexpected {result.unexpected_keys[:3]}")
    return model.to(device).eval().requires_grad_(False)
