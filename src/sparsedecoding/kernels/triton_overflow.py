"""Triton kernel for the overflow slots of a 2:4 + overflow weight (`overflow.OverflowNM`): y[b, o] += Σ_w Σ_s
values[o, w, s] · x[b, 32·w + columns[o, w, s]], in place, for 1 to 16 rows of x.

This is the correction half of W = W24 + W_over: the sp24 tensor-core kernel computes x·W24ᵀ, and this kernel adds
the slots' products to its output. It is a second launch, not the fused epilogue that CUDA_KERNEL_NOTES.md sketches,
so what it measures is an upper bound on the format's cost: the slots' bytes (3 a slot at bf16) plus one more
kernel boundary and one more pass over y.

Layout (`OverflowSlots`, made once from an `OverflowNM`): values and columns as [words, slots, out], so that one
program's BLOCK_N rows of one word and slot are contiguous (coalesced loads of 2·BLOCK_N and BLOCK_N bytes). A
program owns BLOCK_N rows and loops over the words BLOCK_W at a time; for each slot it gathers x at the slots'
columns (all rows of a word read the same 64 bytes of x, which stay in L1) for every batch row at once, and keeps a
float32 [BLOCK_N, batch] accumulator. Unused slots hold value 0 and column 0, so the loop needs no slot mask. The
end reads y, adds, and writes y back in y's dtype.

The launch configuration is chosen per (device, shape, batch, dtype) on first use, each candidate checked once
against a float64 product, as `triton_w8` does."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..errors import KernelInputError
from .autotune import Float64Reference, Tuner
from .overflow import WORD, OverflowNM

MAX_BATCH = 16


@dataclass(frozen=True)
class OverflowSlots:
    """The slots of a [out, in] weight in the kernel's layout: `values` [in / 32, slots, out] (the weight's dtype)
    and `columns` [in / 32, slots, out] (uint8, the column within the word)."""

    values: torch.Tensor
    columns: torch.Tensor
    shape: tuple[int, int]

    @classmethod
    def of(cls, w: OverflowNM) -> OverflowSlots:
        return cls(w.values.permute(1, 2, 0).contiguous(), w.columns.permute(1, 2, 0).contiguous(), w.shape)

    @property
    def slots(self) -> int:
        return self.values.shape[1]

    @property
    def nbytes(self) -> int:
        return self.values.numel() * self.values.element_size() + self.columns.numel()

    def to_dense(self, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        """W_over [out, in] in `dtype` (the tests' and the float64 check's reference)."""
        out, in_features = self.shape
        dense = torch.zeros(out, in_features // WORD, WORD, dtype=dtype, device=self.values.device)
        dense.scatter_add_(2, self.columns.permute(2, 0, 1).long(), self.values.permute(2, 0, 1).to(dtype))
        return dense.view(out, in_features)

    def clone(self) -> OverflowSlots:
        return OverflowSlots(self.values.clone(), self.columns.clone(), self.shape)

    def to_device(self, device: torch.device | str) -> OverflowSlots:
        return OverflowSlots(self.values.to(device), self.columns.to(device), self.shape)


@dataclass(frozen=True)
class OverflowConfig:
    """BLOCK_N rows a program, BLOCK_W words a loop step."""

    block_n: int = 32
    block_w: int = 8
    num_warps: int = 4

    def __str__(self) -> str:
        return f"N{self.block_n}xW{self.block_w} w{self.num_warps}"


@triton.jit
def overflow_add_kernel(x_ptr, v_ptr, c_ptr, y_ptr, out_features, words, batch, stride_x, stride_y,
                        B_PAD: tl.constexpr, SLOTS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_W: tl.constexpr,
                        EVEN: tl.constexpr):
    """y[:batch, rows] += the slots' products for this program's BLOCK_N rows. x [batch, in] and y [batch, out]
    with unit column stride; B_PAD: batch rounded up to a power of two."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < out_features
    b = tl.arange(0, B_PAD)
    b_ok = b < batch
    acc = tl.zeros([BLOCK_N, B_PAD], dtype=tl.float32)
    for w0 in range(0, words, BLOCK_W):
        ws = w0 + tl.arange(0, BLOCK_W)
        ok = (ws < words)[:, None] & row_ok[None, :]  # [BLOCK_W, BLOCK_N]
        for s in tl.static_range(SLOTS):
            offsets = (ws[:, None] * SLOTS + s).to(tl.int64) * out_features + rows[None, :]
            if EVEN:
                v = tl.load(v_ptr + offsets, eviction_policy="evict_first")
                c = tl.load(c_ptr + offsets, eviction_policy="evict_first")
            else:
                v = tl.load(v_ptr + offsets, mask=ok, other=0.0, eviction_policy="evict_first")
                c = tl.load(c_ptr + offsets, mask=ok, other=0, eviction_policy="evict_first")
            k = ws[:, None] * 32 + c.to(tl.int32)  # [BLOCK_W, BLOCK_N]: the slot's column of x
            x_ptrs = x_ptr + b[None, None, :] * stride_x + k[:, :, None]
            xg = tl.load(x_ptrs, mask=ok[:, :, None] & b_ok[None, None, :], other=0.0, eviction_policy="evict_last")
            acc += tl.sum(v.to(tl.float32)[:, :, None] * xg.to(tl.float32), axis=0)
    y_ptrs = y_ptr + b[None, :] * stride_y + rows[:, None]
    y_ok = row_ok[:, None] & b_ok[None, :]
    y = tl.load(y_ptrs, mask=y_ok, other=0.0).to(tl.float32)
    tl.store(y_ptrs, (y + acc).to(y_ptr.dtype.element_ty), mask=y_ok)


def check_overflow_inputs(x: torch.Tensor, slots: OverflowSlots, y: torch.Tensor) -> None:
    """One clear error for what the kernel cannot take."""
    out_features, in_features = slots.shape
    if x.dim() != 2 or x.shape[1] != in_features or not 1 <= x.shape[0] <= MAX_BATCH:
        raise KernelInputError(f"x has shape {tuple(x.shape)}; expected [batch, {in_features}] with batch "
                               f"1..{MAX_BATCH}")
    if tuple(y.shape) != (x.shape[0], out_features):
        raise KernelInputError(f"y has shape {tuple(y.shape)}; expected [{x.shape[0]}, {out_features}]")
    if x.dtype not in (torch.bfloat16, torch.float16) or slots.values.dtype != x.dtype or y.dtype != x.dtype:
        raise KernelInputError(f"overflow_add needs x, y and the slot values in bf16 or fp16, the same; got "
                               f"{x.dtype}, {y.dtype} and {slots.values.dtype}")
    if slots.columns.dtype != torch.uint8 or slots.values.shape != slots.columns.shape \
            or slots.values.shape != (in_features // WORD, slots.slots, out_features):
        raise KernelInputError(f"the slots must be values and uint8 columns of shape [{in_features // WORD}, slots, "
                               f"{out_features}]; got {tuple(slots.values.shape)} and {slots.columns.dtype} "
                               f"{tuple(slots.columns.shape)}")
    if not (slots.values.is_contiguous() and slots.columns.is_contiguous()):
        raise KernelInputError("the slots must be contiguous (OverflowSlots.of makes them so)")
    if not (x.device == y.device == slots.values.device == slots.columns.device):
        raise KernelInputError(f"x, y and the slots are on {x.device}, {y.device}, {slots.values.device}")
    if x.stride(1) != 1 or y.stride(1) != 1:
        raise KernelInputError("x and y need unit column stride")


def launch_overflow_add(x: torch.Tensor, slots: OverflowSlots, y: torch.Tensor, config: OverflowConfig) -> None:
    out_features, in_features = slots.shape
    words = in_features // WORD
    batch = x.shape[0]
    grid = (triton.cdiv(out_features, config.block_n),)
    overflow_add_kernel[grid](x, slots.values, slots.columns, y, out_features, words, batch, x.stride(0),
                              y.stride(0), B_PAD=triton.next_power_of_2(batch), SLOTS=slots.slots,
                              BLOCK_N=config.block_n, BLOCK_W=config.block_w,
                              EVEN=out_features % config.block_n == 0 and words % config.block_w == 0,
                              num_warps=config.num_warps)


_CANDIDATES = ((32, 8, 4), (64, 8, 4), (16, 8, 4), (32, 4, 4), (64, 4, 8), (128, 4, 8), (32, 16, 4))
_tuner = Tuner("overflow_add")


def candidate_configs() -> list[OverflowConfig]:
    return [OverflowConfig(n, w, warps) for n, w, warps in _CANDIDATES]


def float64_reference(x: torch.Tensor, slots: OverflowSlots, y: torch.Tensor) -> Float64Reference:
    """y + x·W_overᵀ in float64 for the y given (read before the kernel adds to it), with
    `autotune.Float64Reference`'s bound taken over the sum: y enters it as one more product of magnitude |y|."""
    dense64 = slots.to_dense(torch.float64)
    reference = Float64Reference.of_rows(x, dense64.shape[0], lambda r0, r1: dense64[r0:r1])
    y64 = y.double()
    reference.exact = reference.exact + y64
    reference.magnitude = reference.magnitude + y64.abs()
    info = torch.finfo(x.dtype)
    reference.bound = (info.eps * reference.exact.abs() + 2 * (x.shape[1] + 1) * 2.0**-24 * reference.magnitude
                       + info.tiny)
    return reference


def tuned_config(x: torch.Tensor, slots: OverflowSlots, y: torch.Tensor) -> OverflowConfig:
    """The fastest correct candidate for this problem (device, shape, slots, batch, dtype), checked and timed once
    (on copies of y: the kernel adds in place); under the interpreter the first candidate."""
    def run(config: OverflowConfig) -> torch.Tensor:
        out = y.clone()
        launch_overflow_add(x, slots, out, config)
        return out

    key = (str(x.device), slots.shape, slots.slots, x.shape[0], str(x.dtype))
    return _tuner.config(key, candidate_configs, run, lambda: float64_reference(x, slots, y))


def overflow_add_(x: torch.Tensor, slots: OverflowSlots, y: torch.Tensor,
                  config: OverflowConfig | None = None) -> torch.Tensor:
    """y += x·W_overᵀ in place for x [batch ≤ 16, in] and y [batch, out] (bf16 or fp16) and returns y."""
    check_overflow_inputs(x, slots, y)
    launch_overflow_add(x, slots, y, config or tuned_config(x, slots, y))
    return y
