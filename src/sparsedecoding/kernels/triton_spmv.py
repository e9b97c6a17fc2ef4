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
    """One launch configuration: `block_rows` output rows and `block_words` mask words per loop step and
    program; `split_k` programs share a row block, each summing a contiguous range of words."""

    block_rows: int
    block_words: int
    split_k: int = 1
    num_warps: int = 4

    def __str__(self) -> str:
        return f"R{self.block_rows}xW{self.block_words} split{self.split_k} w{self.num_warps}"


@triton.jit
def _split4(p, LANES: tl.constexpr):
    """The 4 columns p[:, j] of a [lanes, 4] tile, in order j = 0..3 (register moves only)."""
    even, odd = tl.split(tl.reshape(p, (LANES, 2, 2)))
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
def _step(acc0, acc1, acc2, acc3, word, value, x_word, x_lane, x_ok, X_COLUMN_STRIDE: tl.constexpr,
          BATCH_LANES: tl.constexpr, BATCH_GROUPS: tl.constexpr):
    """One bit-scan step: the lowest set bit of `word` is the column of `value`; acc_g += value·x[group g, column]
    for the (up to 4) groups of BATCH_LANES batch rows."""
    low = word & -word
    # float32(2^c) has exponent field 127 + c; x_word already points 127 columns early.
    column = low.to(tl.uint32, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True) >> 23
    x_ptrs = (x_word + column * X_COLUMN_STRIDE)[:, None] + x_lane[None, :]
    v = value[:, None]
    acc0 += v * tl.load(x_ptrs, mask=x_ok, other=0.0, eviction_policy="evict_last").to(tl.float32)
    if BATCH_GROUPS > 1:
        acc1 += v * tl.load(x_ptrs + BATCH_LANES, mask=x_ok, other=0.0, eviction_policy="evict_last")
    if BATCH_GROUPS > 2:
        acc2 += v * tl.load(x_ptrs + 2 * BATCH_LANES, mask=x_ok, other=0.0, eviction_policy="evict_last")
        acc3 += v * tl.load(x_ptrs + 3 * BATCH_LANES, mask=x_ok, other=0.0, eviction_policy="evict_last")
    return acc0, acc1, acc2, acc3, word ^ low


@triton.jit
def _eight_steps(acc0, acc1, acc2, acc3, word, pairs, x_word, x_lane, x_ok, X_COLUMN_STRIDE: tl.constexpr,
                 BATCH_LANES: tl.constexpr, BATCH_GROUPS: tl.constexpr, VALUE_DTYPE: tl.constexpr,
                 LANES: tl.constexpr):
    """Steps for the 8 values of one vector, given as [lanes, 4] int32 pairs."""
    p0, p1, p2, p3 = _split4(pairs, LANES)
    v0, v1 = _unpack_pair(p0, VALUE_DTYPE)
    v2, v3 = _unpack_pair(p1, VALUE_DTYPE)
    v4, v5 = _unpack_pair(p2, VALUE_DTYPE)
    v6, v7 = _unpack_pair(p3, VALUE_DTYPE)
    acc0, acc1, acc2, acc3, word = _step(acc0, acc1, acc2, acc3, word, v0, x_word, x_lane, x_ok, X_COLUMN_STRIDE,
                                         BATCH_LANES, BATCH_GROUPS)
    acc0, acc1, acc2, acc3, word = _step(acc0, acc1, acc2, acc3, word, v1, x_word, x_lane, x_ok, X_COLUMN_STRIDE,
                                         BATCH_LANES, BATCH_GROUPS)
    acc0, acc1, acc2, acc3, word = _step(acc0, acc1, acc2, acc3, word, v2, x_word, x_lane, x_ok, X_COLUMN_STRIDE,
                                         BATCH_LANES, BATCH_GROUPS)
    acc0, acc1, acc2, acc3, word = _step(acc0, acc1, acc2, acc3, word, v3, x_word, x_lane, x_ok, X_COLUMN_STRIDE,
                                         BATCH_LANES, BATCH_GROUPS)
    acc0, acc1, acc2, acc3, word = _step(acc0, acc1, acc2, acc3, word, v4, x_word, x_lane, x_ok, X_COLUMN_STRIDE,
                                         BATCH_LANES, BATCH_GROUPS)
    acc0, acc1, acc2, acc3, word = _step(acc0, acc1, acc2, acc3, word, v5, x_word, x_lane, x_ok, X_COLUMN_STRIDE,
                                         BATCH_LANES, BATCH_GROUPS)
    acc0, acc1, acc2, acc3, word = _step(acc0, acc1, acc2, acc3, word, v6, x_word, x_lane, x_ok, X_COLUMN_STRIDE,
                                         BATCH_LANES, BATCH_GROUPS)
    acc0, acc1, acc2, acc3, word = _step(acc0, acc1, acc2, acc3, word, v7, x_word, x_lane, x_ok, X_COLUMN_STRIDE,
                                         BATCH_LANES, BATCH_GROUPS)
    return acc0, acc1, acc2, acc3, word


@triton.jit
def _store_group(acc, group, y_ptr, partial_ptr, pid_split, out_features, batch, rows, row_ok,
                 BATCH_LANES: tl.constexpr, BATCH_BLOCK: tl.constexpr, BLOCK_WORDS: tl.constexpr,
                 BLOCK_ROWS: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_BATCH: tl.constexpr):
    """Sum one group's accumulator over the tile's words; store it as y (one split) or as an fp32 partial."""
    tile = tl.sum(tl.reshape(acc, (BLOCK_WORDS, BLOCK_ROWS, BATCH_LANES)), axis=0)  # [rows, lanes]
    b = group * BATCH_LANES + tl.arange(0, BATCH_LANES)[None, :]
    ok = row_ok[:, None] & ((b < batch) | EVEN_BATCH)
    if SPLIT_K == 1:
        tl.store(y_ptr + b * out_features + rows[:, None], tile.to(y_ptr.dtype.element_ty), mask=ok)
    else:
        split_offset = pid_split * BATCH_BLOCK * out_features
        tl.store(partial_ptr + split_offset + b * out_features + rows[:, None], tile, mask=ok)


@triton.jit
def nm_spmv_kernel(
    x_ptr, pairs_ptr, bitmask_ptr, y_ptr, partial_ptr, arrivals_ptr,
    out_features, words, batch,
    N: tl.constexpr, M: tl.constexpr, BATCH_BLOCK: tl.constexpr,
    BLOCK_ROWS: tl.constexpr, BLOCK_WORDS: tl.constexpr, SPLIT_K: tl.constexpr,
    EVEN_ROWS: tl.constexpr, EVEN_WORDS: tl.constexpr, EVEN_BATCH: tl.constexpr,
):
    """y[b, o] for BLOCK_ROWS rows o and all b < batch; `pairs_ptr` is the values viewed as int32. x is the
    caller's [1, in] for one row, else float32 [in, BATCH_BLOCK] (zero beyond `batch`).

    The tile's (word, row) pairs are flattened into one axis, rows fastest, and every tile is [that axis, a
    short contiguous inner axis]: the compiler then gives the inner axis to one thread and the flat axis to warp
    lanes for every tile alike (whatever its tie-breaking between equally strided axes), so lanes run over rows
    of one word and no data moves between threads until the final sum over words."""
    K: tl.constexpr = 32 * N // M
    LANES: tl.constexpr = BLOCK_WORDS * BLOCK_ROWS
    if BATCH_BLOCK == 1:
        X_COLUMN_STRIDE: tl.constexpr = 1
        BATCH_LANES: tl.constexpr = 1
    else:
        X_COLUMN_STRIDE: tl.constexpr = BATCH_BLOCK
        BATCH_LANES: tl.constexpr = X_VECTOR if BATCH_BLOCK >= X_VECTOR else BATCH_BLOCK
    BATCH_GROUPS: tl.constexpr = BATCH_BLOCK // BATCH_LANES
    pid_rows = tl.program_id(0)
    pid_split = tl.program_id(1)

    lane = tl.arange(0, LANES)
    lane_rows = pid_rows * BLOCK_ROWS + lane % BLOCK_ROWS
    lane_row_ok = (lane_rows < out_features) | EVEN_ROWS
    lane_word = lane // BLOCK_ROWS
    x_lane = tl.arange(0, BATCH_LANES)
    pair_lane = tl.arange(0, PAIRS_PER_VECTOR)

    words_per_split = tl.cdiv(words, SPLIT_K * BLOCK_WORDS) * BLOCK_WORDS
    w_begin = pid_split * words_per_split
    mask_rows = bitmask_ptr + lane_rows.to(tl.int64) * words
    pair_rows = pairs_ptr + lane_rows.to(tl.int64) * (words * (K // 2))

    acc0 = tl.zeros([LANES, BATCH_LANES], dtype=tl.float32)
    acc1 = tl.zeros([LANES, BATCH_LANES] if BATCH_GROUPS > 1 else [1, 1], dtype=tl.float32)
    acc2 = tl.zeros([LANES, BATCH_LANES] if BATCH_GROUPS > 2 else [1, 1], dtype=tl.float32)
    acc3 = tl.zeros([LANES, BATCH_LANES] if BATCH_GROUPS > 2 else [1, 1], dtype=tl.float32)
    for w0 in range(w_begin, w_begin + words_per_split, BLOCK_WORDS):  # the last split may run past `words`
        w = w0 + lane_word
        ok = ((w < words) | EVEN_WORDS) & lane_row_ok
        word = tl.load(mask_rows + w, mask=ok, other=0, eviction_policy="evict_first")
        x_word = x_ptr + (w * 32 - 127) * X_COLUMN_STRIDE
        x_ok = ok[:, None]
        for vector in tl.static_range(K // 8):
            offsets = (w * (K // 2) + vector * PAIRS_PER_VECTOR)[:, None] + pair_lane[None, :]
            pairs = tl.load(pair_rows[:, None] + offsets, mask=ok[:, None], other=0, eviction_policy="evict_first")
            acc0, acc1, acc2, acc3, word = _eight_steps(
                acc0, acc1, acc2, acc3, word, pairs, x_word, x_lane, x_ok, X_COLUMN_STRIDE, BATCH_LANES,
                BATCH_GROUPS, y_ptr.dtype.element_ty, LANES)

    rows = pid_rows * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = (rows < out_features) | EVEN_ROWS
    _store_group(acc0, 0, y_ptr, partial_ptr, pid_split, out_features, batch, rows, row_ok, BATCH_LANES,
                 BATCH_BLOCK, BLOCK_WORDS, BLOCK_ROWS, SPLIT_K, EVEN_BATCH)
    if BATCH_GROUPS > 1:
        _store_group(acc1, 1, y_ptr, partial_ptr, pid_split, out_features, batch, rows, row_ok, BATCH_LANES,
                     BATCH_BLOCK, BLOCK_WORDS, BLOCK_ROWS, SPLIT_K, EVEN_BATCH)
    if BATCH_GROUPS > 2:
        _store_group(acc2, 2, y_ptr, partial_ptr, pid_split, out_features, batch, rows, row_ok, BATCH_LANES,
                     BATCH_BLOCK, BLOCK_WORDS, BLOCK_ROWS, SPLIT_K, EVEN_BATCH)
        _store_group(acc3, 3, y_ptr, partial_ptr, pid_split, out_features, batch, rows, row_ok, BATCH_LANES,
                     BATCH_BLOCK, BLOCK_WORDS, BLOCK_ROWS, SPLIT_K, EVEN_BATCH)
    if SPLIT_K > 1:
        # Each split has stored its fp32 partial; the last one to arrive adds all partials in split order
        # (deterministic), writes y and resets the counter for the next launch.
        tl.debug_barrier()  # every thread's partial is written before the counter says so
        arrived = tl.atomic_add(arrivals_ptr + pid_rows, 1, sem="acq_rel")
        if arrived == SPLIT_K - 1:
            b = tl.arange(0, BATCH_BLOCK)[None, :]
            ok = row_ok[:, None] & ((b < batch) | EVEN_BATCH)
            total = tl.zeros([BLOCK_ROWS, BATCH_BLOCK], dtype=tl.float32)
            for split in tl.static_range(SPLIT_K):
                ptrs = partial_ptr + split * BATCH_BLOCK * out_features + b * out_features + rows[:, None]
                total += tl.load(ptrs, mask=ok, other=0.0, cache_modifier=".cg")
            tl.store(y_ptr + b * out_features + rows[:, None], total.to(y_ptr.dtype.element_ty), mask=ok)
            tl.atomic_xchg(arrivals_ptr + pid_rows, 0)


_arrival_counters: dict[torch.device, torch.Tensor] = {}
MAX_ROW_BLOCKS = 1 << 16  # far above any decoder linear (57344 rows / 8-row blocks = 7168)


def _arrivals(device: torch.device, row_blocks: int) -> torch.Tensor:
    """Per-device int32 counters for split-K, all zero between launches (the last split of each row block
    resets its counter). Allocated once at a fixed size and never replaced, so a CUDA graph captured earlier can
    never point at freed counters; the first allocation must happen outside graph capture."""
    if row_blocks > MAX_ROW_BLOCKS:
        raise KernelInputError(f"nm_spmv split-K supports at most {MAX_ROW_BLOCKS} row blocks, got {row_blocks}")
    counters = _arrival_counters.get(device)
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise KernelInputError(
                "nm_spmv's split-K counters do not exist yet; run it once before capturing a CUDA graph "
                "(warm-up also tunes the kernel)")
        counters = torch.zeros(MAX_ROW_BLOCKS, dtype=torch.int32, device=device)
        _arrival_counters[device] = counters
    return counters


def launch(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int,
           config: SpmvConfig) -> torch.Tensor:
    """y = x·Wᵀ for x [batch, in] with one given configuration (inputs already checked)."""
    batch = x.shape[0]
    out_features, words = bitmask.shape
    batch_block = triton.next_power_of_2(batch)
    x_arg = x
    if batch > 1:  # float32 [in, batch]: one vector load per decoded column serves 4 batch rows, no conversions
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
        EVEN_ROWS=out_features % config.block_rows == 0,
        EVEN_WORDS=words % (config.block_words * config.split_k) == 0,
        EVEN_BATCH=batch == batch_block,
        num_warps=config.num_warps, num_stages=1,  # nothing to pipeline: no tl.dot, plain loads
    )
    return y
