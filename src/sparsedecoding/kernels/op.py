"""`nm_spmv` as the torch custom op `sparsedecoding::nm_spmv`: CUDA runs the Triton kernel, CPU runs the torch
reference, and a fake implementation gives torch.compile the output shape. The op is opaque to the compiler,
so it also runs unchanged inside CUDA graphs (tuning happens on the first eager call, before capture)."""

from __future__ import annotations

import torch

from ..errors import KernelInputError
from .format import PackedNM, values_per_word
from .reference import spmv_reference

MAX_BATCH = 16
_DTYPES = (torch.bfloat16, torch.float16)


def check_spmv_inputs(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int) -> None:
    """Raise KernelInputError for anything the kernel would compute wrongly: pattern, dtype, device, layout,
    shape and batch size."""
    if not (0 < n < m and 32 % m == 0) or values_per_word(n, m) % 8:
        raise KernelInputError(f"nm_spmv supports N:M patterns with M dividing 32 and 32·N/M a multiple of 8 "
                               f"(2:4, 4:8, 8:16, 16:32, 1:4, ...); got {n}:{m}")
    if x.dtype not in _DTYPES:
        raise KernelInputError(f"x is {x.dtype}; nm_spmv takes bfloat16 or float16 activations")
    if values.dtype != x.dtype:
        raise KernelInputError(f"x is {x.dtype} but the packed values are {values.dtype}; cast x to {values.dtype}")
    if bitmask.dtype != torch.int32:
        raise KernelInputError(f"bitmask is {bitmask.dtype}; it must be int32 (pack the weight with pack_nm)")
    if not (x.device == values.device == bitmask.device):
        raise KernelInputError(f"x on {x.device}, values on {values.device}, bitmask on {bitmask.device}; "
                               "move them to one device")
    for name, t in (("x", x), ("values", values), ("bitmask", bitmask)):
        if not t.is_contiguous():
            raise KernelInputError(f"{name} is not contiguous; call .contiguous() first")
    if values.dim() != 2 or bitmask.dim() != 2 or values.shape[0] != bitmask.shape[0] \
            or values.shape[1] != bitmask.shape[1] * values_per_word(n, m):
        raise KernelInputError(f"values {tuple(values.shape)} and bitmask {tuple(bitmask.shape)} do not form a "
                               f"packed {n}:{m} weight")
    if bitmask.shape[0] == 0 or bitmask.shape[1] == 0:
        raise KernelInputError(f"empty packed weight of {bitmask.shape[0]} rows and {bitmask.shape[1]} words")
    in_features = bitmask.shape[1] * 32
    if x.dim() not in (1, 2) or x.shape[-1] != in_features:
        raise KernelInputError(f"x has shape {tuple(x.shape)}; expected [{in_features}] or [batch, {in_features}]")
    batch = x.shape[0] if x.dim() == 2 else 1
    if not 1 <= batch <= MAX_BATCH:
        raise KernelInputError(f"batch {batch} is outside 1..{MAX_BATCH}; for more rows multiply by "
                               "packed.to_dense() (PackedLinear does this)")


@torch.library.custom_op("sparsedecoding::nm_spmv", mutates_args=(), device_types="cuda")
def _nm_spmv_op(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int) -> torch.Tensor:
    check_spmv_inputs(x, values, bitmask, n, m)
    from .autotune import tuned_config  # imports triton
    from .triton_spmv import launch

    x2 = x.view(1, -1) if x.dim() == 1 else x
    y = launch(x2, values, bitmask, n, m, tuned_config(x2, values, bitmask, n, m))
    return y.view(-1) if x.dim() == 1 else y


@_nm_spmv_op.register_kernel("cpu")
def _nm_spmv_cpu(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int) -> torch.Tensor:
    check_spmv_inputs(x, values, bitmask, n, m)
    return spmv_reference(x, values, bitmask)


@_nm_spmv_op.register_fake
def _nm_spmv_fake(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int) -> torch.Tensor:
    check_spmv_inputs(x, values, bitmask, n, m)
    return x.new_empty((*x.shape[:-1], bitmask.shape[0]))


def nm_spmv(x: torch.Tensor, packed: PackedNM) -> torch.Tensor:
    """y[b, o] = Σ_i W[o, i]·x[b, i] for x [in] or [b, in] with b ≤ 16, bf16/fp16, fp32 accumulation, output in
    x's dtype, W given packed. On CUDA the Triton kernel runs; on CPU the torch reference."""
    return torch.ops.sparsedecoding.nm_spmv(x, packed.values, packed.bitmask, packed.n, packed.m)
