"""Triton kernel for y[b, o] = Σ_i W[o, i]·x[b, i] with W stored as N:M values + bitmask (see `format.py`).

Each program owns BLOCK_ROWS output rows and one split of the mask words. Per 32-bit mask word it runs
K = 32·N/M fixed steps: isolate the lowest set bit (`low = word & -word`), read its index from the float32
exponent of `low` (exact for a power of two, bit 31 included when read as unsigned), gather x at that column,
multiply by the next stored value and clear the bit. Values arrive in 16-byte vectors of 8 (4 int32 pairs) and
are split and widened in registers, so every value is loaded once; each decoded column serves all batch rows.
This module imports triton; `sparsedecoding.kernels` imports it only when the Triton path runs."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..errors import KernelInputError

PAIRS_PER_VECTOR = tl.constexpr(4)  # a 16-byte vector load: 4 int32 words, each holding 2 bf16/fp16 values
X_VECTOR = tl.constexpr(4)  # fp32 batch values per x vector load in the transposed layout (16 bytes)


@dataclass(frozen=True)
class SpmvConfig:
    """One launch configuration. `block_rows` output rows and `block_words` mask words per loop step and
    program; `split_k` programs share a row block, each summing a contiguous range of words; with
    `x_batch_minor` the launcher first writes x as float32 [in, batch] so one vector load fetches a column for
    four batch rows, already converted."""

    block_rows: int
    block_words: int
    split_k: int = 1
    num_warps: int = 4
    x_batch_minor: bool = False

    def __str__(self) -> str:
        layout = "xT" if self.x_batch_minor else "x"
        return f"R{self.block_rows}xW{self.block_words} split{self.split_k} w{self.num_warps} {layout}"


@triton.jit
def _split4(p, BLOCK_WORDS: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    """The 4 slices p[:, :, j] of a [words, rows, 4] tile, in order j = 0..3 (register moves only)."""
    even, odd = tl.split(tl.reshape(p, (BLOCK_WORDS, BLOCK_ROWS, 2, 2)))
    p0, p2 = tl.split(even)
    p1, p3 = tl.split(odd)
    return p0, p1, p2, p3


@triton.jit
def _unpack_pair(pair, VALUE_DTYPE: tl.constexpr):
    """The two 16-bit floats of an int32 word (first value in the low half) as float32."""
    if VALUE_DTYPE == tl.bfloat16:  # bf16 is the top half of a float32: one shift or mask each
        first = (pair << 16).to(tl.float32, bitcast=True)
        second = (pair & -65536).to(tl.float32, bitcast=True)
    else:
        first = (pair & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
        second = (pair >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    return first, second


@triton.jit
def _step(acc, word, value, x_word, x_batch, x_ok, X_COLUMN_STRIDE: tl.constexpr):
    """One bit-scan step: the lowest set bit of `word` is the column of `value`; acc += value·x[:, column]."""
    low = word & -word
    # float32(2^c) has exponent field 127 + c; x_word already points 127 columns early.
    column = low.to(tl.uint32, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True) >> 23
    x_ptrs = (x_word + column * X_COLUMN_STRIDE)[None, :, :, None] + x_batch
    x = tl.load(x_ptrs, mask=x_ok, other=0.0, eviction_policy="evict_last")
    acc += value[None, :, :, None] * x.to(tl.float32)
    return acc, word ^ low


@triton.jit
def _eight_steps(acc, word, pairs, x_word, x_batch, x_ok, X_COLUMN_STRIDE: tl.constexpr,
                 VALUE_DTYPE: tl.constexpr, BLOCK_WORDS: tl.constexpr, BLOCK_ROWS: tl.constexpr):
    """Steps for the 8 values of one vector, given as [words, rows, 4] int32 pairs."""
    p0, p1, p2, p3 = _split4(pairs, BLOCK_WORDS, BLOCK_ROWS)
    v0, v1 = _unpack_pair(p0, VALUE_DTYPE)
    v2, v3 = _unpack_pair(p1, VALUE_DTYPE)
    v4, v5 = _unpack_pair(p2, VALUE_DTYPE)
    v6, v7 = _unpack_pair(p3, VALUE_DTYPE)
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
    x_ptr, pairs_ptr, bitmask_ptr, y_ptr, partial_ptr, arrivals_ptr,
    out_features, words, batch,
    N: tl.constexpr, M: tl.constexpr, BATCH_BLOCK: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_WORDS: tl.constexpr, SPLIT_K: tl.constexpr,
    X_BATCH_MINOR: tl.constexpr, EVEN_ROWS: tl.constexpr, EVEN_WORDS: tl.constexpr, EVEN_BATCH: tl.constexpr,
):
    """y[b, o] for BLOCK_ROWS rows o and all b < batch; `pairs_ptr` is the values viewed as int32.

    Tiles are [words, rows, 4 pairs] for values and [batch groups, words, rows, batch lanes] for x and the
    accumulator: the compiler gives the innermost axis to one thread, warp lanes to rows and warps to words,
    the same for every tile, so no data moves between threads until the final sum over words."""
    K: tl.constexpr = 32 * N // M
    VALUE_DTYPE: tl.constexpr = y_ptr.dtype.element_ty
    pid_rows = tl.program_id(0)
    pid_split = tl.program_id(1)

    rows = pid_rows * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = (rows < out_features) | EVEN_ROWS
    # Words run backwards across the tile so the compiler sees no contiguity along them and keeps warp lanes
    # on rows for the mask words as for the other tiles, avoiding layout conversions between them.
    word_lane = BLOCK_WORDS - 1 - tl.arange(0, BLOCK_WORDS)
    pair_lane = tl.arange(0, PAIRS_PER_VECTOR)
    if X_BATCH_MINOR:  # x is float32 [in, BATCH_BLOCK], zero beyond `batch`
        X_COLUMN_STRIDE: tl.constexpr = BATCH_BLOCK
        BATCH_LANES: tl.constexpr = min(BATCH_BLOCK, X_VECTOR)
    else:  # x is [batch, in] in the values' dtype
        X_COLUMN_STRIDE: tl.constexpr = 1
        BATCH_LANES: tl.constexpr = 1
    BATCH_GROUPS: tl.constexpr = BATCH_BLOCK // BATCH_LANES
    b = (tl.arange(0, BATCH_GROUPS)[:, None, None, None] * BATCH_LANES
         + tl.arange(0, BATCH_LANES)[None, None, None, :])  # [groups, 1, 1, lanes]
    batch_ok = (b < batch) | EVEN_BATCH | X_BATCH_MINOR
    x_batch = b if X_BATCH_MINOR else b * (words * 32)

    words_per_split = tl.cdiv(words, SPLIT_K * BLOCK_WORDS) * BLOCK_WORDS
    w_begin = pid_split * words_per_split
    w_end = tl.minimum(w_begin + words_per_split, words)
    mask_rows = bitmask_ptr + rows.to(tl.int64)[None, :] * words
    pair_rows = pairs_ptr + rows.to(tl.int64)[None, :, None] * (words * (K // 2))

    acc = tl.zeros([BATCH_GROUPS, BLOCK_WORDS, BLOCK_ROWS, BATCH_LANES], dtype=tl.float32)
    for w0 in range(w_begin, w_end, BLOCK_WORDS):
        w = w0 + word_lane[:, None]
        ok = ((w < w_end) | EVEN_WORDS) & row_ok[None, :]
        word = tl.load(mask_rows + w, mask=ok, other=0, eviction_policy="evict_first")
        x_word = x_ptr + (w * 32 - 127) * X_COLUMN_STRIDE
        x_ok = ok[None, :, :, None] & batch_ok
        for vector in tl.static_range(K // 8):
            offsets = (w * (K // 2) + vector * PAIRS_PER_VECTOR)[:, :, None] + pair_lane[None, None, :]
            pairs = tl.load(pair_rows + offsets, mask=ok[:, :, None], other=0, eviction_policy="evict_first")
            acc, word = _eight_steps(acc, word, pairs, x_word, x_batch, x_ok, X_COLUMN_STRIDE, VALUE_DTYPE,
                                     BLOCK_WORDS, BLOCK_ROWS)

    y_tile = tl.sum(acc, axis=1)  # [groups, rows, lanes]
    out_rows = rows[None, :, None]
    out_b = tl.reshape(b, (BATCH_GROUPS, 1, BATCH_LANES))
    out_ok = ((out_rows < out_features) | EVEN_ROWS) & ((out_b < batch) | EVEN_BATCH)
    y_ptrs = y_ptr + out_b * out_features + out_rows
    if SPLIT_K == 1:
        tl.store(y_ptrs, y_tile.to(VALUE_DTYPE), mask=out_ok)
    else:
        # Each split stores its fp32 partial; the last one to arrive adds all partials in split order
        # (deterministic) and resets the counter for the next launch.
        split_stride = BATCH_BLOCK * out_features
        tl.store(partial_ptr + pid_split * split_stride + out_b * out_features + out_rows, y_tile, mask=out_ok)
        tl.debug_barrier()  # every thread's partial is written before the counter says so
        arrived = tl.atomic_add(arrivals_ptr + pid_rows, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            total = tl.zeros([BATCH_GROUPS, BLOCK_ROWS, BATCH_LANES], dtype=tl.float32)
            for split in tl.static_range(SPLIT_K):
                ptrs = partial_ptr + split * split_stride + out_b * out_features + out_rows
                total += tl.load(ptrs, mask=out_ok, other=0.0, cache_modifier=".cg")
            tl.store(y_ptrs, total.to(VALUE_DTYPE), mask=out_ok)
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
    x_arg = x
    if config.x_batch_minor:
        make = torch.empty if batch == batch_block else torch.zeros
        x_arg = make(x.shape[1], batch_block, dtype=torch.float32, device=x.device)
        x_arg[:, :batch].copy_(x.t())
    y = torch.empty(batch, out_features, dtype=x.dtype, device=x.device)
    row_blocks = triton.cdiv(out_features, config.block_rows)
    if config.split_k > 1:
        partial = torch.empty(config.split_k, batch_block, out_features, dtype=torch.float32, device=x.device)
        arrivals = _arrivals(x.device, row_blocks)
    else:  # never read by the kernel when split_k == 1
        partial, arrivals = y, bitmask
    nm_spmv_kernel[(row_blocks, config.split_k)](
        x_arg, values.view(torch.int32), bitmask, y, partial, arrivals,
        out_features, words, batch,
        N=n, M=m, BATCH_BLOCK=batch_block,
        BLOCK_ROWS=config.block_rows, BLOCK_WORDS=config.block_words, SPLIT_K=config.split_k,
        X_BATCH_MINOR=config.x_batch_minor,
        EVEN_ROWS=out_features % config.block_rows == 0,
        EVEN_WORDS=words % (config.block_words * config.split_k) == 0,
        EVEN_BATCH=batch == batch_block,
        num_warps=config.num_warps, num_stages=1,  # nothing to pipeline: no tl.dot, plain loads
    )
    return y
