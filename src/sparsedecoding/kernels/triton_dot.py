"""Tensor-core Triton kernel for y[b, o] = Σ_i W[o, i]·x[b, i], W packed N:M (see `format.py`), for 2-16 rows.

Why a second kernel: the bit-scan kernel (`triton_spmv`) decodes one stored value at a time on CUDA cores and
gathers x at its column for every batch row, so its L1 traffic grows with the batch; from batch 3-4 on cuBLAS,
which shares one x tile across many weight rows on tensor cores, is faster. Here each program rebuilds a dense
[rows, 32·words] tile of W from the packed bytes in registers and hands it to `tl.dot` with an x tile padded to 16
batch rows. The weight bytes read are the packed ones (1.125 per weight at 50%), and the product costs the same
for batch 2 and 16; the price is a few instructions per dense element to rebuild the tile.

Rebuilding without gathers: `pack_nm` keeps exactly N columns in every group of M, so group g's stored values are
values[N·g : N·g + N], loaded as plain contiguous vectors. Walking the group's M mask bits in order, column j
takes the queue's head if its bit is set (zero otherwise) and a set bit pops the queue: N selects per column, all
in registers. That is cheap for N ≤ 4 (2:4, 4:8, 1:4); 8:16 and 16:32 would need 8-16 selects per column and stay
on the bit-scan kernel. A first version fetched each value at its rank (popcount or prefix sum of the bits below
it) with a 2-byte gather or `tl.gather`: 4.4-12x slower than the bit-scan kernel on the H200, bound by the
gathers' L1 traffic (benchmarks/KERNEL_NOTES.md)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..errors import KernelInputError
from .triton_spmv import _arrivals, interpreted

BATCH_TILE = 16  # tl.dot needs ≥ 16 on every side: batch rows beyond x's are read as zeros
MAX_GROUP_VALUES = 4  # N: selects per rebuilt column


def supports(n: int, m: int) -> bool:
    """Whether the tensor-core kernel serves pattern N:M (power-of-two N ≤ 4, M ≤ 8)."""
    return n in (1, 2, 4) and m in (2, 4, 8) and n < m


@dataclass(frozen=True)
class DotConfig:
    """One launch configuration of the tensor-core kernel: `block_rows` output rows and `block_words` mask words
    (32 columns each) per loop step and program; `split_k` programs share a row block, each summing a contiguous
    range of words."""

    block_rows: int
    block_words: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2

    def __post_init__(self) -> None:
        sizes = (self.block_rows, self.block_words, self.split_k, self.num_warps, self.num_stages)
        if any(v < 1 for v in sizes) or self.block_rows < 16 \
                or any(v & (v - 1) for v in (self.block_rows, self.block_words)):
            raise KernelInputError(f"nm_dot configuration {self!r}: block_rows ≥ 16 and tile sizes powers of two")

    def __str__(self) -> str:
        return f"dot R{self.block_rows}xW{self.block_words} split{self.split_k} w{self.num_warps} s{self.num_stages}"


@triton.jit
def _column(field, j: tl.constexpr, q0, q1, q2, q3, N: tl.constexpr):
    """Column j of every group (the queue head if the group's bit j is set, else 0) and the queue after it."""
    kept = ((field >> j) & 1) != 0
    column = tl.where(kept, q0, 0.0)
    if N > 1:
        q0 = tl.where(kept, q1, q0)
    if N > 2:
        q1 = tl.where(kept, q2, q1)
        q2 = tl.where(kept, q3, q2)
    return column, q0, q1, q2, q3


@triton.jit
def _dense_tile(mask_rows, value_rows, w0, w_stop, MASKED: tl.constexpr, N: tl.constexpr, M: tl.constexpr,
                BLOCK_ROWS: tl.constexpr, BLOCK_WORDS: tl.constexpr):
    """W[rows, 32·w0 : 32·(w0 + BLOCK_WORDS)] rebuilt from the packed parts ([rows, columns]); words ≥ w_stop
    read as zero columns when MASKED."""
    GROUPS: tl.constexpr = BLOCK_WORDS * 32 // M
    group = tl.arange(0, GROUPS)
    word_ptrs = mask_rows[:, None] + (w0 + group // (32 // M))[None, :]
    value_ptrs = value_rows[:, None, None] + (w0 * (32 * N // M) + group * N)[None, :, None] \
        + tl.arange(0, N)[None, None, :]
    if MASKED:
        ok = (w0 + group // (32 // M) < w_stop)[None, :]
        word = tl.load(word_ptrs, mask=ok, other=0, eviction_policy="evict_first")
        stored = tl.load(value_ptrs, mask=ok[:, :, None], other=0.0, eviction_policy="evict_first")
    else:
        word = tl.load(word_ptrs, eviction_policy="evict_first")
        stored = tl.load(value_ptrs, eviction_policy="evict_first")
    field = word >> ((group % (32 // M)) * M)[None, :]  # the group's bits at the bottom (higher bits unused)
    if N == 1:
        q0 = tl.reshape(stored, (BLOCK_ROWS, GROUPS))
        q1, q2, q3 = q0, q0, q0
    elif N == 2:
        q0, q1 = tl.split(stored)
        q2, q3 = q0, q0
    else:
        even, odd = tl.split(tl.reshape(stored, (BLOCK_ROWS, GROUPS, 2, 2)))
        q0, q2 = tl.split(even)
        q1, q3 = tl.split(odd)
    c0, q0, q1, q2, q3 = _column(field, 0, q0, q1, q2, q3, N)
    c1, q0, q1, q2, q3 = _column(field, 1, q0, q1, q2, q3, N)
    if M == 2:
        tile = tl.join(c0, c1)
    else:
        c2, q0, q1, q2, q3 = _column(field, 2, q0, q1, q2, q3, N)
        c3, q0, q1, q2, q3 = _column(field, 3, q0, q1, q2, q3, N)
        if M == 4:
            tile = tl.join(tl.join(c0, c2), tl.join(c1, c3))  # [.., k, t] holds column 2k + t
        else:
            c4, q0, q1, q2, q3 = _column(field, 4, q0, q1, q2, q3, N)
            c5, q0, q1, q2, q3 = _column(field, 5, q0, q1, q2, q3, N)
            c6, q0, q1, q2, q3 = _column(field, 6, q0, q1, q2, q3, N)
            c7, q0, q1, q2, q3 = _column(field, 7, q0, q1, q2, q3, N)
            tile = tl.join(tl.join(tl.join(c0, c4), tl.join(c2, c6)), tl.join(tl.join(c1, c5), tl.join(c3, c7)))
    return tl.reshape(tile, (BLOCK_ROWS, BLOCK_WORDS * 32))


@triton.jit
def _dot(tile, x, acc, ON_GPU: tl.constexpr):
    """acc + tile·x on tensor cores. The interpreter's tl.dot misreads bfloat16 operands (triton 3.9), so there
    both go in as float32: products of 16-bit floats are exact in float32 either way."""
    if ON_GPU:
        acc = tl.dot(tile, x, acc)
    else:
        acc = tl.dot(tile.to(tl.float32), x.to(tl.float32), acc)
    return acc


@triton.jit
def nm_dot_kernel(
    x_ptr, values_ptr, bitmask_ptr, y_ptr, partial_ptr, arrivals_ptr,
    out_features, words, batch,
    N: tl.constexpr, M: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_WORDS: tl.constexpr,
    SPLIT_K: tl.constexpr, EVEN_ROWS: tl.constexpr, EVEN_WORDS: tl.constexpr, ON_GPU: tl.constexpr,
):
    """y[b, o] for BLOCK_ROWS rows o and all b < batch ≤ 16; x is the caller's [batch, in]."""
    K: tl.constexpr = 32 * N // M
    BATCH: tl.constexpr = 16
    BLOCK_COLS: tl.constexpr = 32 * BLOCK_WORDS
    pid_rows = tl.program_id(0)
    pid_split = tl.program_id(1)
    in_features = words * 32

    rows = pid_rows * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    # Rows past the end read the last row again (their sums are never stored), so loads need no row mask.
    row_ids = tl.minimum(rows, out_features - 1).to(tl.int64)
    mask_rows = bitmask_ptr + row_ids * words
    value_rows = values_ptr + row_ids * (words * K)
    cols = tl.arange(0, BLOCK_COLS)
    b = tl.arange(0, BATCH)
    x_cols = x_ptr + b[None, :] * in_features + cols[:, None]  # [columns, batch] tile of x
    b_ok = (b < batch)[None, :]

    words_per_split = tl.cdiv(words, SPLIT_K * BLOCK_WORDS) * BLOCK_WORDS
    w_begin = pid_split * words_per_split
    w_stop = tl.minimum(w_begin + words_per_split, words)
    w_full_stop = w_begin + tl.maximum(w_stop - w_begin, 0) // BLOCK_WORDS * BLOCK_WORDS

    acc = tl.zeros([BLOCK_ROWS, BATCH], dtype=tl.float32)
    for w0 in range(w_begin, w_full_stop, BLOCK_WORDS):
        tile = _dense_tile(mask_rows, value_rows, w0, w_stop, False, N, M, BLOCK_ROWS, BLOCK_WORDS)
        x = tl.load(x_cols + w0 * 32, mask=b_ok, other=0.0, eviction_policy="evict_last")
        acc = _dot(tile, x, acc, ON_GPU)
    if not EVEN_WORDS:
        if w_full_stop < w_stop:  # one partial step, masked
            tile = _dense_tile(mask_rows, value_rows, w_full_stop, w_stop, True, N, M, BLOCK_ROWS, BLOCK_WORDS)
            x_ok = b_ok & (w_full_stop * 32 + cols < w_stop * 32)[:, None]
            x = tl.load(x_cols + w_full_stop * 32, mask=x_ok, other=0.0)
            acc = _dot(tile, x, acc, ON_GPU)

    ok = ((rows < out_features) | EVEN_ROWS)[:, None] & b_ok
    out_offsets = b[None, :] * out_features + rows[:, None]
    if SPLIT_K == 1:
        tl.store(y_ptr + out_offsets, acc.to(y_ptr.dtype.element_ty), mask=ok)
    else:
        # Each split stores its fp32 partial; the last one to arrive adds all partials in split order
        # (deterministic), writes y and resets the counter for the next launch.
        tl.store(partial_ptr + pid_split * BATCH * out_features + out_offsets, acc, mask=ok)
        tl.debug_barrier()  # every thread's partial is written before the counter says so
        arrived = tl.atomic_add(arrivals_ptr + pid_rows, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            total = tl.zeros([BLOCK_ROWS, BATCH], dtype=tl.float32)
            for split in tl.static_range(SPLIT_K):
                total += tl.load(partial_ptr + split * BATCH * out_features + out_offsets, mask=ok, other=0.0,
                                 cache_modifier=".cg")
            tl.store(y_ptr + out_offsets, total.to(y_ptr.dtype.element_ty), mask=ok)
            tl.atomic_xchg(arrivals_ptr + pid_rows, 0)


def _kernel_call(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int,
                 config: DotConfig) -> tuple[tuple[int, int], tuple, dict, torch.Tensor]:
    """(grid, arguments, keyword arguments, y) of one launch; allocates y and, for split-K, the partials."""
    batch = x.shape[0]
    if batch > BATCH_TILE:
        raise KernelInputError(f"nm_dot serves at most {BATCH_TILE} rows of x, got {batch}")
    if not supports(n, m):
        raise KernelInputError(f"nm_dot rebuilds tiles for N ≤ {MAX_GROUP_VALUES} and M ≤ 8 (2:4, 4:8, 1:4); "
                               f"{n}:{m} runs on the bit-scan kernel")
    out_features, words = bitmask.shape
    y = torch.empty(batch, out_features, dtype=x.dtype, device=x.device)
    row_blocks = triton.cdiv(out_features, config.block_rows)
    if config.split_k > 1:
        partial = torch.empty(config.split_k, BATCH_TILE, out_features, dtype=torch.float32, device=x.device)
        arrivals = _arrivals(x.device, row_blocks)
    else:  # never read by the kernel when split_k == 1
        partial, arrivals = y, bitmask
    arguments = (x, values, bitmask, y, partial, arrivals, out_features, words, batch)
    constants = dict(
        N=n, M=m, BLOCK_ROWS=config.block_rows, BLOCK_WORDS=config.block_words, SPLIT_K=config.split_k,
        EVEN_ROWS=out_features % config.block_rows == 0,
        EVEN_WORDS=words % (config.block_words * config.split_k) == 0, ON_GPU=not interpreted(),
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return (row_blocks, config.split_k), arguments, constants, y


def launch(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int,
           config: DotConfig) -> torch.Tensor:
    """y = x·Wᵀ for x [batch ≤ 16, in] with one given configuration (inputs already checked)."""
    grid, arguments, constants, y = _kernel_call(x, values, bitmask, n, m, config)
    nm_dot_kernel[grid](*arguments, **constants)
    return y


def compile_for(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int,
                config: DotConfig) -> None:
    """Compile (or find in Triton's caches) the kernel `launch` would run for these inputs, without running it."""
    grid, arguments, constants, _ = _kernel_call(x, values, bitmask, n, m, config)
    with torch.cuda.device(x.device):
        nm_dot_kernel.warmup(*arguments, grid=grid, **constants)
