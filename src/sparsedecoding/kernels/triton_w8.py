"""Triton kernel for the dense int8 weight-only baseline: y[b, o] = scale[o] · Σ_i W[o, i]·x[b, i] with W int8
[out, in] and one scale per output row (the `DenseQuantized` int8 layout), for 1 to 16 rows of x.

PyTorch's `_weight_int8pack_mm` runs at 0.05-0.09x cuBLAS bf16 on the H200 at batch 1
(benchmarks/results/quant_kernel_h200.md): far below what a user's int8 weight-only kernel does, so it is no
baseline to be measured against. This kernel streams W once: a program owns BLOCK_ROWS rows and a range of
columns (split-K), loads [BLOCK_ROWS, BLOCK_K] int8 tiles (16 bytes a lane), converts them to float (exact) and
multiplies them with x. Batch 1 keeps a [rows, BLOCK_K] float32 accumulator of products and sums it once at the
end; batches 2-16 feed the tile and x (zero-padded to 16 rows) to `tl.dot` with float32 accumulation. The row
scale multiplies each row's sum once. Split-K programs write float32 partials that a torch sum adds in split order
(deterministic).

The launch configuration is chosen per (device, shape, batch, dtype) on first use: every candidate is checked once
against a float64 product (a failing one is logged and never used) and the fastest by triton's do_bench is kept,
as `triton_nmq` does."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..errors import KernelInputError
from .autotune import Float64Reference, Tuner
from .triton_spmv import interpreted

MAX_BATCH = 16
DOT_ROWS = 16  # tl.dot's smallest operand side: batches 2-16 are padded to it


@dataclass(frozen=True)
class W8Config:
    """BLOCK_ROWS rows and BLOCK_K columns per program and loop step, `split_k` programs per row block."""

    block_rows: int = 8
    block_k: int = 512
    split_k: int = 1
    num_warps: int = 4

    def __str__(self) -> str:
        return f"R{self.block_rows}xK{self.block_k} split{self.split_k} w{self.num_warps}"


@triton.jit
def w8_kernel(x_ptr, w_ptr, s_ptr, y_ptr, out_features, in_features, batch,
              BATCH_BLOCK: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr,
              EVEN_K: tl.constexpr, DOT_FLOAT32: tl.constexpr):
    """y [batch, out] (or, for SPLIT_K > 1, this split's float32 partial: y_ptr is then [SPLIT_K, batch, out])
    for BLOCK_ROWS rows. x [batch, in] contiguous in the scales' dtype; BATCH_BLOCK 1 or 16. DOT_FLOAT32 (the
    interpreter only) feeds tl.dot float32 operands instead of x's dtype."""
    pid_rows = tl.program_id(0)
    pid_split = tl.program_id(1)
    rows = pid_rows * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    # rows past the end read the last row again (never stored), so the weight loads need no row mask
    safe_rows = tl.minimum(rows, out_features - 1).to(tl.int64)
    cols = tl.arange(0, BLOCK_K)
    w_rows = w_ptr + safe_rows[:, None] * in_features + cols[None, :]
    k_per_split = tl.cdiv(in_features, SPLIT_K * BLOCK_K) * BLOCK_K
    k_begin = pid_split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, in_features)
    b = tl.arange(0, BATCH_BLOCK)
    if BATCH_BLOCK == 1:
        acc = tl.zeros([BLOCK_ROWS, BLOCK_K], dtype=tl.float32)
        for k0 in range(k_begin, k_end, BLOCK_K):
            if EVEN_K:
                w = tl.load(w_rows + k0, eviction_policy="evict_first")
                x = tl.load(x_ptr + k0 + cols, eviction_policy="evict_last")
            else:
                ok = k0 + cols < k_end
                w = tl.load(w_rows + k0, mask=ok[None, :], other=0, eviction_policy="evict_first")
                x = tl.load(x_ptr + k0 + cols, mask=ok, other=0.0, eviction_policy="evict_last")
            acc += w.to(tl.float32) * x.to(tl.float32)[None, :]
        sums = tl.sum(acc, axis=1)[:, None]  # [rows, 1]
    else:
        sums = tl.zeros([BLOCK_ROWS, BATCH_BLOCK], dtype=tl.float32)
        in_batch = (b < batch)[None, :]
        for k0 in range(k_begin, k_end, BLOCK_K):
            k = k0 + cols
            x_ptrs = x_ptr + b[None, :] * in_features + k[:, None]  # [BLOCK_K, batch]: x transposed
            if EVEN_K:
                w = tl.load(w_rows + k0, eviction_policy="evict_first")
                x = tl.load(x_ptrs, mask=in_batch, other=0.0, eviction_policy="evict_last")
            else:
                ok = k < k_end
                w = tl.load(w_rows + k0, mask=ok[None, :], other=0, eviction_policy="evict_first")
                x = tl.load(x_ptrs, mask=in_batch & ok[:, None], other=0.0, eviction_policy="evict_last")
            if DOT_FLOAT32:  # the interpreter's tl.dot mishandles bfloat16 operands
                sums = tl.dot(w.to(tl.float32), x.to(tl.float32), sums)
            else:
                sums = tl.dot(w.to(tl.float32).to(x_ptr.dtype.element_ty), x, sums)  # int8 is exact in bf16, fp16
    scale = tl.load(s_ptr + safe_rows).to(tl.float32)
    tile = sums * scale[:, None]
    ptrs = y_ptr + (pid_split * batch + b[None, :]) * out_features + rows[:, None]
    tl.store(ptrs, tile.to(y_ptr.dtype.element_ty), mask=(rows < out_features)[:, None] & (b[None, :] < batch))


def check_w8_inputs(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> None:
    """One clear error for what the kernel cannot take."""
    if weight.dtype != torch.int8 or weight.dim() != 2:
        raise KernelInputError(f"w8_mm needs an int8 weight [out, in]; got {weight.dtype} {tuple(weight.shape)}")
    out_features, in_features = weight.shape
    if x.dim() != 2 or x.shape[1] != in_features or not 1 <= x.shape[0] <= MAX_BATCH:
        raise KernelInputError(f"x has shape {tuple(x.shape)}; expected [batch, {in_features}] with batch "
                               f"1..{MAX_BATCH}")
    if x.dtype not in (torch.bfloat16, torch.float16) or scales.dtype != x.dtype:
        raise KernelInputError(f"w8_mm needs x and scales in bf16 or fp16, the same; got {x.dtype} and "
                               f"{scales.dtype}")
    if tuple(scales.shape) != (out_features,):
        raise KernelInputError(f"scales has shape {tuple(scales.shape)}; expected [{out_features}]")
    if not (x.device == weight.device == scales.device):
        raise KernelInputError(f"x, weight and scales are on {x.device}, {weight.device}, {scales.device}")


def launch_w8(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, config: W8Config) -> torch.Tensor:
    """y = x·(scale·W)ᵀ for contiguous x [batch, in] with one configuration."""
    batch = x.shape[0]
    out_features, in_features = weight.shape
    if config.split_k == 1:
        y = out = torch.empty(batch, out_features, dtype=x.dtype, device=x.device)
    else:
        out = torch.empty(config.split_k, batch, out_features, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(out_features, config.block_rows), config.split_k)
    w8_kernel[grid](x, weight, scales, out, out_features, in_features, batch,
                    BATCH_BLOCK=1 if batch == 1 else DOT_ROWS, BLOCK_ROWS=config.block_rows,
                    BLOCK_K=config.block_k, SPLIT_K=config.split_k,
                    EVEN_K=in_features % (config.block_k * config.split_k) == 0, DOT_FLOAT32=interpreted(),
                    num_warps=config.num_warps, num_stages=1 if batch == 1 else 2)
    if config.split_k > 1:
        y = out.sum(0).to(x.dtype)
    return y


# (rows, columns per step, warps): batch 1 reads 16 bytes a lane (rows · columns = 16 · 32 · warps, or twice
# that); tl.dot needs 16 or more rows
_TILES_ONE = ((8, 512, 4), (4, 1024, 4), (16, 256, 4), (8, 1024, 8), (16, 512, 8))
_TILES_DOT = ((16, 128, 4), (32, 128, 4), (16, 256, 4), (64, 64, 4))


def candidate_configs(out_features: int, in_features: int, batch: int) -> list[W8Config]:
    """Tiles to time for one problem, each with split-K 1 and, where rows blocks are few, 2 and 4."""
    configs = []
    for rows, step, warps in (_TILES_ONE if batch == 1 else _TILES_DOT):
        blocks = triton.cdiv(out_features, rows)
        for split in (1, 2, 4):
            if split > 1 and (blocks * split > 4096 or in_features < 2 * step * split):
                continue
            configs.append(W8Config(rows, step, split, warps))
    return configs


_tuner = Tuner("w8_mm")


def float64_reference(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> Float64Reference:
    """x·(scale·W)ᵀ in float64 with `autotune.Float64Reference`'s bound, a chunk of rows at a time."""
    return Float64Reference.of_rows(x, weight.shape[0],
                                    lambda r0, r1: weight[r0:r1].double() * scales[r0:r1].double()[:, None])


def tuned_config(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> W8Config:
    """The fastest correct candidate for this problem (device, shape, batch, dtype), checked and timed once; under
    the interpreter the first candidate."""
    key = (str(x.device), tuple(weight.shape), x.shape[0], str(x.dtype))
    return _tuner.config(key, lambda: candidate_configs(*weight.shape, x.shape[0]),
                         lambda config: launch_w8(x, weight, scales, config),
                         lambda: float64_reference(x, weight, scales))


def rejected_candidates() -> dict[tuple, dict[W8Config, str]]:
    """For every problem tuned so far: the candidates that failed to compile or to match float64, and why."""
    return _tuner.rejected_candidates()


def w8_mm(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
          config: W8Config | None = None) -> torch.Tensor:
    """y = x·(scale·W)ᵀ for x [batch ≤ 16, in] bf16/fp16, W int8 [out, in], scales [out] in x's dtype."""
    check_w8_inputs(x, weight, scales)
    x, weight, scales = x.contiguous(), weight.contiguous(), scales.contiguous()  # the tuner runs what launches
    return launch_w8(x, weight, scales, config or tuned_config(x, weight, scales))
