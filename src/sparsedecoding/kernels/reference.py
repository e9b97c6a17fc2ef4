"""Plain torch references: the sparse matrix-vector product (the custom op's CPU implementation) and RMSNorm."""

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


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """weight · x / sqrt(mean(x²) + eps) over the last axis, the mean taken in float32 and the product in x's dtype
    (as HF does): the engine's RMSNorm, and what a fused Sp24Linear computes outside its kernel."""
    x32 = x.float()
    return weight * (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
