"""Triton kernel for y[b, o] = Σ_i W[o, i]·x[b, i] with W stored as N:M values + bitmask (see `format.py`).

Each program owns BLOCK_ROWS output rows and one split of the mask words. Per 32-bit mask word it runs
K = 32·N/M fixed steps: isolate the lowest set bit (`low = word & -word`), read its index from the float32
exponent of `low` (exact for a power of two, bit 31 included when read as unsigned), gather x at that column,
multiply by the next stored value and clear the bit. Values arrive in 16-byte vectors of 8 and are split in
registers, so every value is loaded once; each decoded column serves all batch rows. This module imports
triton; `sparsedecoding.kernels` imports it only when the Triton path runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..errors import KernelInputError

VALUES_PER_VECTOR = tl.constexpr(8)  # 16 bytes of bf16/fp16: one vector load


@dataclass(frozen=True)
class SpmvConfig:
    """One launch configuration. `block_rows` output rows and `block_words` mask words per loop step and
    program; `split_k` programs share a row block, each summing a contiguous range of words; with
    `x_batch_minor` the launcher first transposes x to [in, batch] so one vector load fetches a column for
    every batch row."""

    block_rows: int
    block_words: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 1
    x_batch_minor: bool = False

    def __str__(self) -> str:
        layout = "xT" if self.x_batch_minor else "x"
        return (f"R{self.block_rows}xW{self.block_words} split{self.split_k} "
                f"w{self.num_warps} s{self.num_stages} {layout}")


@triton.jit
def _split8(v, BLOCK_WORDS: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    """The 8 slices v[:, :, j] of a [words, rows, 8] tile, in order j = 0..7 (register moves only)."""
    even, odd = tl.split(tl.reshape(v, (BLOCK_WORDS, BLOCK_ROWS, 4, 2)))
    e0, e1 = tl.split(tl.reshape(even, (BLOCK_WORDS, BLOCK_ROWS, 2, 2)))
    o0, o1 = tl.split(tl.reshape(odd, (BLOCK_WORDS, BLOCK_ROWS, 2, 2)))
    v0, v4 = tl.split(e0)
    v2, v6 = tl.split(e1)
    v1, v5 = tl.split(o0)
    v3, v7 = tl.split(o1)
    return v0, v1, v2, v3, v4, v5, v6, v7


@triton.jit
def _step(acc, word, value, x_word, x_batch, x_ok, X_COLUMN_STRIDE: tl.constexpr):
    """One bit-scan step: the lowest set bit of `word` is the column of `value`; acc += value·x[:, column]."""
    low = word & -word
    # float32(2^c) has exponent field 127 + c; x_word already points 127 columns early.
    column = low.to(tl.uint32, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True) >> 23
    x_ptrs = (x_word + column * X_COLUMN_STRIDE)[:, :, None] + x_batch[None, None, :]
    x = tl.load(x_ptrs, mask=x_ok, other=0.0, eviction_policy="evict_last")
    acc += value.to(tl.float32)[:, :, None] * x.to(tl.float32)
    return acc, word ^ low


@triton.jit
def _eight_steps(acc, word, values, x_word, x_batch, x_ok, X_COLUMN_STRIDE: tl.constexpr,
                 BLOCK_WORDS: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    v0, v1, v2, v3, v4, v5, v6, v7 = _split8(values, BLOCK_WORDS, BLOCK_ROWS)
    acc, word = _step(acc, word, v0, x_word, x_batch, x_ok, X_COLUMN_STRIDE)
    acc, word = _step(acc, word, v1, x_word, x_batch, x_ok, X_COLUMN_STRIDE)
    acc, word = _step(acc, word, v2, x_word, x_batch, x_ok, X_COLUMN_STRIDE)
    acc, word = _step(acc, word, v3, x_word, x_batch, x_ok, X_COLUMN_STRIDE)
    acc, word = _step(acc, word, v4, x_word, x_batch, x_ok, X_COLUMN_STRIDE)
    acc, word = _step(acc, word, v5, x_word, x_batch, x_ok, X_COLUMN_STRIDE)
    acc, word = _step(acc, word, v6, x_word, x_batch, x_ok, X_COLUMN_STRIDE)
    acc, word = _step(acc, word, v7, x_word, x_batch, x_ok, X_COLUMN_STRIDE)
    return acc, word


@triton.jit
def nm_spmv_kernel(
    x_ptr, values_ptr, bitmask_ptr, y_ptr, partial_ptr, arrivals_ptr,
    out_features, words, batch,
    N: tl.constexpr, M: tl.constexpr, BATCH_BLOCK: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_WORDS: tl.constexpr, SPLIT_K: tl.constexpr,
    X_BATCH_MINOR: tl.constexpr, EVEN_ROWS: tl.constexpr, EVEN_WORDS: tl.constexpr, EVEN_BATCH: tl.constexpr,
):
    """y[b, o] for BLOCK_ROWS rows o and all b < batch. Tiles are [words, rows, inner]: the inner axis is
    the 8 values of one vector or the batch, so one thread holds it whole and a warp's lanes run over rows."""
    K: tl.constexpr = 32 * N // M
    pid_rows = tl.program_id(0)
    pid_split = tl.program_id(1)

    rows = pid_rows * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = (rows < out_features) | EVEN_ROWS
    # Words run backwards across the tile so the compiler sees no contiguity along them and keeps warp lanes
    # on rows for every tile (mask words, values, x), avoiding layout conversions between them.
    word_lane = BLOCK_WORDS - 1 - tl.arange(0, BLOCK_WORDS)
    lane8 = tl.arange(0, VALUES_PER_VECTOR)
    b = tl.arange(0, BATCH_BLOCK)
    batch_ok = (b < batch) | EVEN_BATCH
    if X_BATCH_MINOR:  # x is [in, BATCH_BLOCK]
        X_COLUMN_STRIDE: tl.constexpr = BATCH_BLOCK
        x_batch = b
    else:  # x is [batch, in]
        X_COLUMN_STRIDE: tl.constexpr = 1
        x_batch = b * (words * 32)

    words_per_split = tl.cdiv(words, SPLIT_K * BLOCK_WORDS) * BLOCK_WORDS
    w_begin = pid_split * words_per_split
    w_end = tl.minimum(w_begin + words_per_split, words)
    mask_rows = bitmask_ptr + rows.to(tl.int64)[None, :] * words
    value_rows = values_ptr + rows.to(tl.int64)[None, :, None] * (words * K)

    acc = tl.zeros([BLOCK_WORDS, BLOCK_ROWS, BATCH_BLOCK], dtype=tl.float32)
    for w0 in range(w_begin, w_end, BLOCK_WORDS):
        w = w0 + word_lane[:, None]
        ok = ((w < w_end) | EVEN_WORDS) & row_ok[None, :]
        word = tl.load(mask_rows + w, mask=ok, other=0, eviction_policy="evict_first")
        x_word = x_ptr + (w * 32 - 127) * X_COLUMN_STRIDE
        x_ok = ok[:, :, None] & batch_ok[None, None, :]
        for chunk in tl.static_range(K // VALUES_PER_VECTOR):
            offsets = (w * K + chunk * VALUES_PER_VECTOR)[:, :, None] + lane8[None, None, :]
            values = tl.load(value_rows + offsets, mask=ok[:, :, None], other=0.0, eviction_policy="evict_first")
            acc, word = _eight_steps(acc, word, values, x_word, x_batch, x_ok, X_COLUMN_STRIDE,
                                     BLOCK_WORDS, BLOCK_ROWS)

    y_tile = tl.sum(acc, axis=0)  # [rows, batch]
    out_ok = row_ok[:, None] & batch_ok[None, :]
    y_ptrs = y_ptr + b[None, :] * out_features + rows[:, None]
    if SPLIT_K == 1:
        tl.store(y_ptrs, y_tile.to(y_ptr.dtype.element_ty), mask=out_ok)
    else:
        # Each split stores its fp32 partial; the last one to arrive adds all partials in split order
        # (deterministic) and resets the counter for the next launch.
        partial_ptrs = partial_ptr + (pid_split * BATCH_BLOCK + b[None, :]) * out_features + rows[:, None]
        tl.store(partial_ptrs, y_tile, mask=out_ok)
        tl.debug_barrier()  # every thread's partial is written before the counter says so
        arrived = tl.atomic_add(arrivals_ptr + pid_rows, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            total = tl.zeros([BLOCK_ROWS, BATCH_BLOCK], dtype=tl.float32)
            for split in tl.static_range(SPLIT_K):
                ptrs = partial_ptr + (split * BATCH_BLOCK + b[None, :]) * out_features + rows[:, None]
                total += tl.load(ptrs, mask=out_ok, other=0.0, cache_modifier=".cg")
            tl.store(y_ptrs, total.to(y_ptr.dtype.element_ty), mask=out_ok)
            tl.atomic_xchg(arrivals_ptr + pid_rows, 0)


_arrival_counters: dict[torch.device, torch.Tensor] = {}


def _arrivals(device: torch.device, row_blocks: int) -> torch.Tensor:
    """Per-device int32 counters for split-K, all zero between launches (the last split of each row block
    resets its counter). Created outside CUDA-graph capture so that graphs never own them."""
    counters = _arrival_counters.get(device)
    if counters is None or counters.numel() < row_blocks:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise KernelInputError(
                "nm_spmv needs more split-K counters than exist; run it once on this shape before capturing a "
                "CUDA graph (warm-up also tunes the kernel)")
        counters = torch.zeros(max(row_blocks, 4096), dtype=torch.int32, device=device)
        _arrival_counters[device] = counters
    return counters


def launch(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int,
           config: SpmvConfig) -> torch.Tensor:
    """y = x·Wᵀ for x [batch, in] with one given configuration (inputs already checked)."""
    batch = x.shape[0]
    out_features, words = bitmask.shape
    batch_block = triton.next_power_of_2(batch)
    if config.x_batch_minor and batch != batch_block:
        raise KernelInputError(f"config {config} transposes x, which needs a power-of-two batch, got {batch}")
    x_arg = x.t().contiguous() if config.x_batch_minor else x
    y = torch.empty(batch, out_features, dtype=x.dtype, device=x.device)
    row_blocks = triton.cdiv(out_features, config.block_rows)
    if config.split_k > 1:
        partial = torch.empty(config.split_k, batch_block, out_features, dtype=torch.float32, device=x.device)
        arrivals = _arrivals(x.device, row_blocks)
    else:  # never read by the kernel when split_k == 1
        partial, arrivals = y, bitmask
    nm_spmv_kernel[(row_blocks, config.split_k)](
        x_arg, values, bitmask, y, partial, arrivals,
        out_features, words, batch,
        N=n, M=m, BATCH_BLOCK=batch_block,
        BLOCK_ROWS=config.block_rows, BLOCK_WORDS=config.block_words, SPLIT_K=config.split_k,
        X_BATCH_MINOR=config.x_batch_minor,
        EVEN_ROWS=out_features % config.block_rows == 0,
        EVEN_WORDS=words % (config.block_words * config.split_k) == 0,
        EVEN_BATCH=batch == batch_block,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return y
