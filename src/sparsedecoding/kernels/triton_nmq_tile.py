"""The "dense tile" design of the quantized N:M kernel (`triton_nmq`): per mask word, expand the 32 columns in
parallel instead of walking the K kept values one by one.

Each program owns BLOCK_ROWS output rows and steps over BLOCK_WORDS mask words at a time. Per step it loads x at
the step's 32·BLOCK_WORDS columns densely (one coalesced load, shared by all the program's rows) and, for every
(row, word), builds the word's dense dequantized segment w[0..31] in registers:
- bit c of the word, as 0 or -1: (word << (31 - c)) >> 31 (arithmetic shift);
- the bit offset of column c's code in the word's codes, BITS · rank(c): a cumulative sum s of those bits over the
  32 columns is minus the inclusive count of set bits, so -BITS·s - BITS is BITS · (exclusive rank) at a set bit
  (any value at an unset one: its code is masked off below). Codes are stored in rank order, the earlier in the
  lower bits, so the code lies in int32 chunk offset // 32 (chosen by comparing offset with the chunk
  boundaries) at bit offset mod 32;
- dequantize without an int-to-float conversion: a BITS-bit two's complement code u becomes offset binary by
  xor with 2^(BITS-1), and or-ing that into the mantissa of 2^23 gives the float 2^23 + 2^(BITS-1) + code exactly;
  subtracting 2^23 + 2^(BITS-1) leaves the code. The bit mask is and-ed into u first, so an unset column comes
  out as exactly 0.
Then y[row] += scale(row, word) · Σ_c w[c]·x[c] (fp32): a word lies in one scale group, so the scale is applied
to the word's sum. All of this is elementwise or a scan over the 32 columns: no step depends on the previous
kept value, and no x load depends on the mask. Tensors are [32 columns, rows, words]: with the columns as the
leading axis and rows·words = 32·num_warps, the compiler keeps a word's 32 columns in one thread (seen in the SASS
of an offline sm_90 compile; x reaches that layout through shared memory), so the scan and the column sum are
register adds, not warp shuffles. Split-K writes fp32 partials, which the last split of a row block adds in
split order (`triton_spmv.store_rows`). Cost estimate and status: benchmarks/KERNEL_NOTES.md ("Dense tile design")."""

from __future__ import annotations

import triton
import triton.language as tl

from .triton_spmv import _load_weights, _split4, store_rows


@triton.jit
def _chunk_per_column(code_ptrs, offset, ok, CHUNKS: tl.constexpr, BLOCK_ROWS: tl.constexpr,
                      BLOCK_WORDS: tl.constexpr):
    """[32, rows, words]: the int32 code chunk that holds the code at bit `offset` of the word's codes.
    `code_ptrs` [rows, words] point at each word's first chunk; `ok` masks words past the split's end (None: no
    mask)."""
    if CHUNKS == 1:
        chunk = _load_weights(code_ptrs, ok)[None, :, :]
    elif CHUNKS == 2 or CHUNKS == 4:  # one vector load per word, split in registers
        vector_ok = None if ok is None else ok[:, :, None]
        vector = _load_weights(code_ptrs[:, :, None] + tl.arange(0, CHUNKS)[None, None, :], vector_ok)
        if CHUNKS == 2:
            low, high = tl.split(vector)
            chunk = tl.where(offset >= 32, high[None, :, :], low[None, :, :])
        else:
            p0, p1, p2, p3 = _split4(tl.reshape(vector, (BLOCK_ROWS * BLOCK_WORDS, 4)), BLOCK_ROWS * BLOCK_WORDS)
            chunk = tl.reshape(p0, (BLOCK_ROWS, BLOCK_WORDS))[None, :, :]
            chunk = tl.where(offset >= 32, tl.reshape(p1, (BLOCK_ROWS, BLOCK_WORDS))[None, :, :], chunk)
            chunk = tl.where(offset >= 64, tl.reshape(p2, (BLOCK_ROWS, BLOCK_WORDS))[None, :, :],
                             chunk)
            chunk = tl.where(offset >= 96, tl.reshape(p3, (BLOCK_ROWS, BLOCK_WORDS))[None, :, :],
                             chunk)
    else:  # 3 or 6 chunks (24 codes a word, 3:4): one load each
        chunk = _load_weights(code_ptrs, ok)[None, :, :]
        for j in tl.static_range(1, CHUNKS):
            chunk = tl.where(offset >= j * 32, _load_weights(code_ptrs + j, ok)[None, :, :], chunk)
    return chunk


@triton.jit
def _tile_step(acc, w, ok, mask_rows, code_rows, scale_rows, x_ptr, K: tl.constexpr,
               BITS: tl.constexpr, WORDS_PER_GROUP: tl.constexpr, X_COLUMN_STRIDE: tl.constexpr,
               BATCH_BLOCK: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_WORDS: tl.constexpr):
    """acc [rows, words, batch] += scale · Σ_c w[c]·x[c] for the words `w` [words] of every row (`ok` [words]
    masks words past the split's end; None: no mask)."""
    CHUNKS: tl.constexpr = K * BITS // 32
    SIGN: tl.constexpr = 1 << (BITS - 1)
    column = tl.arange(0, 32)
    b = tl.arange(0, BATCH_BLOCK)
    words_ok = None if ok is None else ok[None, :]
    word = _load_weights(mask_rows[:, None] + w[None, :], words_ok)  # [rows, words]
    scale = _load_weights(scale_rows[:, None] + (w // WORDS_PER_GROUP)[None, :], words_ok).to(tl.float32)
    dense_column = column[:, None] + w[None, :] * 32  # [32, words]
    x_ptrs = x_ptr + (dense_column * X_COLUMN_STRIDE)[:, :, None] + b[None, None, :]
    if ok is None:
        x = tl.load(x_ptrs, eviction_policy="evict_last")
    else:
        x = tl.load(x_ptrs, mask=ok[None, :, None], other=0.0, eviction_policy="evict_last")

    bit = (word[None, :, :] << (31 - column)[:, None, None]) >> 31  # [32, rows, words]: 0 or -1
    offset = tl.cumsum(bit, axis=0) * -BITS - BITS  # BITS · rank: the code's bit offset in the word's codes
    chunk = _chunk_per_column(code_rows[:, None] + w[None, :] * CHUNKS, offset, words_ok, CHUNKS, BLOCK_ROWS,
                              BLOCK_WORDS)
    code = (chunk >> (offset & 31)) & ((1 << BITS) - 1) & bit
    value = (code ^ (0x4B000000 | SIGN)).to(tl.float32, bitcast=True) - (8388608.0 + SIGN)
    word_sum = tl.sum(value[:, :, :, None] * x.to(tl.float32)[:, None, :, :], axis=0)  # [rows, words, batch]
    return acc + scale[:, :, None] * word_sum


@triton.jit
def nmq_tile_kernel(
    x_ptr, codes_ptr, scales_ptr, bitmask_ptr, y_ptr, partial_ptr, arrivals_ptr,
    out_features, words, batch, groups,
    N: tl.constexpr, M: tl.constexpr, BITS: tl.constexpr, WORDS_PER_GROUP: tl.constexpr,
    BATCH_BLOCK: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_WORDS: tl.constexpr, SPLIT_K: tl.constexpr,
    EVEN_WORDS: tl.constexpr,
):
    """`triton_nmq.nmq_spmv_kernel`'s contract (same arguments but FAST_SCAN): y for BLOCK_ROWS rows (with
    SPLIT_K > 1 through fp32 partials). x is [1, in] for one row, else [in, BATCH_BLOCK] float32 (zero beyond
    `batch`)."""
    K: tl.constexpr = 32 * N // M
    X_COLUMN_STRIDE: tl.constexpr = BATCH_BLOCK
    pid_rows = tl.program_id(0)
    pid_split = tl.program_id(1)

    # Rows past the end read the last row again (their sums are never stored), so loads need no row mask.
    rows = tl.minimum(pid_rows * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS), out_features - 1).to(tl.int64)
    mask_rows = bitmask_ptr + rows * words
    code_rows = codes_ptr + rows * (words * (K * BITS // 32))
    scale_rows = scales_ptr + rows * groups
    word_lane = tl.arange(0, BLOCK_WORDS)

    words_per_split = tl.cdiv(words, SPLIT_K * BLOCK_WORDS) * BLOCK_WORDS
    w_begin = pid_split * words_per_split
    w_stop = tl.minimum(w_begin + words_per_split, words)
    w_full_stop = w_begin + tl.maximum(w_stop - w_begin, 0) // BLOCK_WORDS * BLOCK_WORDS
    acc = tl.zeros([BLOCK_ROWS, BLOCK_WORDS, BATCH_BLOCK], dtype=tl.float32)
    for w0 in range(w_begin, w_full_stop, BLOCK_WORDS):
        acc = _tile_step(acc, w0 + word_lane, None, mask_rows, code_rows, scale_rows, x_ptr, K, BITS,
                         WORDS_PER_GROUP, X_COLUMN_STRIDE, BATCH_BLOCK, BLOCK_ROWS, BLOCK_WORDS)
    if not EVEN_WORDS:
        if w_full_stop < w_stop:  # one partial step, masked
            w = w_full_stop + word_lane
            acc = _tile_step(acc, w, w < w_stop, mask_rows, code_rows, scale_rows, x_ptr, K, BITS,
                             WORDS_PER_GROUP, X_COLUMN_STRIDE, BATCH_BLOCK, BLOCK_ROWS, BLOCK_WORDS)

    tile = tl.sum(acc, axis=1)  # [rows, batch]
    store_rows(tile, y_ptr, partial_ptr, arrivals_ptr, pid_rows, pid_split, out_features, batch, BLOCK_ROWS,
               BATCH_BLOCK, SPLIT_K)
