"""Plain torch reference for the sparse matrix-vector product; the custom op's CPU implementation."""

from __future__ import annotations

import torch

from .format import PackedNM, dense_from_parts


def spmv_reference(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """y = x·Wᵀ with products summed in float32 and the result in x's dtype; x is [in] or [b, in]."""
    weight = dense_from_parts(values, bitmask).float()
    return (x.float() @ weight.T).to(x.dtype)


def nm_spmv_reference(x: torch.Tensor, packed: PackedNM) -> torch.Tensor:
    """`nm_spmv` computed by densifying the weight: y[b, o] = Σ_i W[o, i]·x[b, i], fp32 sums, x's dtype out."""
    return spmv_reference(x, packed.values, packed.bitmask)
