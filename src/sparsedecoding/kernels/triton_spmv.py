"""Triton kernel for y[b, o] = Σ_i W[o, i]·x[b, i] with W stored as N:M values + bitmask (see `format.py`).

Each program owns BLOCK_ROWS output rows and one split of the mask words. Per 32-bit mask word it runs
K = 32·N/M fixed steps: find the lowest set bit, use its index as the column of the next stored value (gather x
there, multiply, accumulate in fp32) and clear it. Values arrive in 16-byte vectors of 8 (4 int32 pairs) and are
split and widened in registers, so every value is loaded once; each decoded column serves all batch rows.

What limits this kernel on an H200 is the L1 data pipe (one wavefront per clock per SM; the profile that shows it
is in benchmarks/KERNEL_NOTES.md, v1): a 16-byte-per-lane load costs one wavefront for every
128-byte line each quarter-warp touches, a narrower load one per line the warp touches. So the lane layout is
chosen to touch few lines per instruction:
- WORD_LANES = 1: a lane walks a whole word (two 16-byte value loads). Lanes of a quarter-warp are rows of one
  word, so an x gather touches one or two lines (good for wide batches, where x gathers dominate), but each
  value load touches 8 lines per quarter-warp.
- WORD_LANES = 2: two neighbouring lanes share a word, one 16-byte load each: the low lane walks the word's
  first K/2 set bits, the high lane first clears them and walks the rest. WARP_WORDS words of a row sit next to
  each other in a warp, so a quarter-warp reads 2 rows × 64 contiguous bytes (WARP_WORDS = 2) or one row's 128
  bytes (WARP_WORDS = 4): 4-8x fewer value wavefronts, for as many x gather instructions per value.
Lanes are laid out over one flat axis, (word group, row, word in group, half) from slowest to fastest, and every
tile is [that axis, a short contiguous inner axis]: the compiler then gives the inner axis to one thread and the
flat axis to warp lanes in order for every tile alike, so no data moves between threads until the final sums.

On CUDA the bit scan runs on the bit-reversed word with PTX `bfind.shiftamt` (the word's lowest set bit is the
highest of its reverse), and the bit is cleared with a shift and an xor. The portable scan, used under
TRITON_INTERPRET=1 where inline PTX cannot run, reads the index from the float32 exponent of `word & -word`.
This module imports triton; `sparsedecoding.kernels` imports it only when the Triton path runs."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..errors import KernelInputError

PAIRS_PER_VECTOR = tl.constexpr(4)  # a 16-byte vector load: 4 int32 words, each holding 2 bf16/fp16 values
X_VECTOR_BYTES = tl.constexpr(16)  # batch values of one column per x vector load in the transposed layout
FLOAT_EXPONENT_BIAS = tl.constexpr(127)  # the portable scan's column is 127 + c; x pointers start 127 early


def interpreted() -> bool:
    """Whether Triton kernels run in the interpreter (numpy on CPU), where inline PTX cannot run."""
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


@dataclass(frozen=True)
class SpmvConfig:
    """One launch configuration: `block_rows` output rows and `block_words` mask words per loop step and
    program; `split_k` programs share a row block, each summing a contiguous range of words; `word_lanes` lanes
    per word and `warp_words` neighbouring words of a row per warp (see the module docstring). For batches above
    1, x goes to the kernel transposed, [in, batch], so one vector load per decoded column serves 4 (float32,
    `x_float32`) or 8 (x's 16-bit dtype, widened in registers) batch rows: 16-bit halves the x gathers' L1
    wavefronts, which dominate at wide batches, for about three more instructions per value and batch row."""

    block_rows: int
    block_words: int
    split_k: int = 1
    num_warps: int = 4
    word_lanes: int = 1
    warp_words: int = 1
    x_float32: bool = True

    def __post_init__(self) -> None:
        sizes = (self.block_rows, self.block_words, self.split_k, self.num_warps, self.warp_words)
        if self.word_lanes not in (1, 2) or any(v < 1 for v in sizes) or self.block_words % self.warp_words \
                or any(v & (v - 1) for v in (self.block_rows, self.block_words, self.warp_words)):
            raise KernelInputError(f"nm_spmv configuration {self!r}: word_lanes must be 1 or 2, tile sizes powers "
                                   "of two, and warp_words must divide block_words")

    def __str__(self) -> str:
        lanes = f" {self.word_lanes}x{self.warp_words}" if self.word_lanes > 1 else ""
        x16 = "" if self.x_float32 else " x16"
        return f"R{self.block_rows}xW{self.block_words}{lanes} split{self.split_k} w{self.num_warps}{x16}"


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
def _scan_start(word, FAST_SCAN: tl.constexpr):
    """The bit-scan state of a word: its bit reverse for the PTX scan, the word itself for the portable one."""
    if FAST_SCAN:
        scan = tl.inline_asm_elementwise("brev.b32 $0, $1;", "=r,r", [word], dtype=tl.int32, is_pure=True, pack=1)
    else:
        scan = word
    return scan


@triton.jit
def _take_lowest_bit(scan, FAST_SCAN: tl.constexpr):
    """(column of the word's lowest set bit, the scan state with that bit cleared).

    PTX: `scan` is the bit-reversed word; bfind.shiftamt gives 31 - (index of its highest set bit), which is the
    word's lowest set bit c; xor with 2^31 >> c clears it. Portable: float32(2^c) has exponent field 127 + c
    (exact for a power of two, bit 31 included when read as unsigned), so the column comes out biased by 127,
    which the x pointers absorb; xor with the isolated bit clears it."""
    if FAST_SCAN:
        column, rest = tl.inline_asm_elementwise(
            "{ .reg .u32 c, bit; bfind.shiftamt.u32 c, $2; mov.u32 bit, 0x80000000; shr.u32 bit, bit, c;"
            " xor.b32 $1, $2, bit; mov.u32 $0, c; }",
            "=r,=r,r", [scan], dtype=(tl.int32, tl.int32), is_pure=True, pack=1)
    else:
        low = scan & -scan
        column = low.to(tl.uint32, bitcast=True).to(tl.float32).to(tl.int32, bitcast=True) >> 23
        rest = scan ^ low
    return column, rest


@triton.jit
def _scan_and_x(word, w, x_ptr, X_COLUMN_STRIDE: tl.constexpr, FAST_SCAN: tl.constexpr):
    """(the scan state of mask word `word`, the x pointer of its column 0, biased as the scan's columns are)."""
    scan = _scan_start(word, FAST_SCAN)
    if FAST_SCAN:
        x_word = x_ptr + w * 32 * X_COLUMN_STRIDE
    else:
        x_word = x_ptr + (w * 32 - FLOAT_EXPONENT_BIAS) * X_COLUMN_STRIDE
    return scan, x_word


@triton.jit
def _load_x(ptrs, ok):
    """x at the decoded columns as float32; `ok` is None in full loop steps (no mask, no zero fill)."""
    if ok is None:
        x = tl.load(ptrs, eviction_policy="evict_last")
    else:
        x = tl.load(ptrs, mask=ok, other=0.0, eviction_policy="evict_last")
    return x.to(tl.float32)


@triton.jit
def _step(acc0, acc1, acc2, acc3, scan, value, x_word, x_lane, x_ok, X_COLUMN_STRIDE: tl.constexpr,
          BATCH_LANES: tl.constexpr, BATCH_GROUPS: tl.constexpr, FAST_SCAN: tl.constexpr):
    """One bit-scan step: the lowest set bit is the column of `value`; acc_g += value·x[group g, column] for the
    (up to 4) groups of BATCH_LANES batch rows."""
    column, scan = _take_lowest_bit(scan, FAST_SCAN)
    x_ptrs = (x_word + column * X_COLUMN_STRIDE)[:, None] + x_lane[None, :]
    v = value[:, None]
    acc0 += v * _load_x(x_ptrs, x_ok)
    if BATCH_GROUPS > 1:
        acc1 += v * _load_x(x_ptrs + BATCH_LANES, x_ok)
    if BATCH_GROUPS > 2:
        acc2 += v * _load_x(x_ptrs + 2 * BATCH_LANES, x_ok)
        acc3 += v * _load_x(x_ptrs + 3 * BATCH_LANES, x_ok)
    return acc0, acc1, acc2, acc3, scan


@triton.jit
def _pair_steps(acc0, acc1, acc2, acc3, scan, pair, x_word, x_lane, x_ok, X_COLUMN_STRIDE: tl.constexpr,
                BATCH_LANES: tl.constexpr, BATCH_GROUPS: tl.constexpr, VALUE_DTYPE: tl.constexpr,
                FAST_SCAN: tl.constexpr):
    """Steps for the 2 values of one int32 pair, low half first."""
    first, second = _unpack_pair(pair, VALUE_DTYPE)
    acc0, acc1, acc2, acc3, scan = _step(acc0, acc1, acc2, acc3, scan, first, x_word, x_lane, x_ok, X_COLUMN_STRIDE,
                                         BATCH_LANES, BATCH_GROUPS, FAST_SCAN)
    return _step(acc0, acc1, acc2, acc3, scan, second, x_word, x_lane, x_ok, X_COLUMN_STRIDE, BATCH_LANES,
                 BATCH_GROUPS, FAST_SCAN)


@triton.jit
def _vector_steps(acc0, acc1, acc2, acc3, scan, vector, x_word, x_lane, x_ok, X_COLUMN_STRIDE: tl.constexpr,
                  BATCH_LANES: tl.constexpr, BATCH_GROUPS: tl.constexpr, VALUE_DTYPE: tl.constexpr,
                  LANES: tl.constexpr, FAST_SCAN: tl.constexpr):
    """Steps for the 8 values of one vector, given as [lanes, 4] int32 pairs."""
    p0, p1, p2, p3 = _split4(vector, LANES)
    acc0, acc1, acc2, acc3, scan = _pair_steps(acc0, acc1, acc2, acc3, scan, p0, x_word, x_lane, x_ok,
                                               X_COLUMN_STRIDE, BATCH_LANES, BATCH_GROUPS, VALUE_DTYPE, FAST_SCAN)
    acc0, acc1, acc2, acc3, scan = _pair_steps(acc0, acc1, acc2, acc3, scan, p1, x_word, x_lane, x_ok,
                                               X_COLUMN_STRIDE, BATCH_LANES, BATCH_GROUPS, VALUE_DTYPE, FAST_SCAN)
    acc0, acc1, acc2, acc3, scan = _pair_steps(acc0, acc1, acc2, acc3, scan, p2, x_word, x_lane, x_ok,
                                               X_COLUMN_STRIDE, BATCH_LANES, BATCH_GROUPS, VALUE_DTYPE, FAST_SCAN)
    return _pair_steps(acc0, acc1, acc2, acc3, scan, p3, x_word, x_lane, x_ok, X_COLUMN_STRIDE, BATCH_LANES,
                       BATCH_GROUPS, VALUE_DTYPE, FAST_SCAN)


@triton.jit
def _load_weights(ptrs, ok):
    """Mask words and values are read once: stream them past the caches. `ok` None: no mask."""
    if ok is None:
        loaded = tl.load(ptrs, eviction_policy="evict_first")
    else:
        loaded = tl.load(ptrs, mask=ok, other=0, eviction_policy="evict_first")
    return loaded


@triton.jit
def _lane_words(acc0, acc1, acc2, acc3, w, half, ok, mask_rows, pair_rows, pair_lane, x_ptr, x_lane,
                K: tl.constexpr, WORD_LANES: tl.constexpr, X_COLUMN_STRIDE: tl.constexpr,
                BATCH_LANES: tl.constexpr, BATCH_GROUPS: tl.constexpr, VALUE_DTYPE: tl.constexpr,
                LANES: tl.constexpr, FAST_SCAN: tl.constexpr):
    """Every lane's share of its word w: all K steps (WORD_LANES = 1) or the K/2 steps of its half (lane `half`
    of 2). `ok` masks words past the split's end; None in full loop steps."""
    LANE_VALUES: tl.constexpr = K // WORD_LANES
    word = _load_weights(mask_rows + w, ok)
    vector_ptrs = pair_rows[:, None] + (w * (K // 2) + half * (LANE_VALUES // 2))[:, None] + pair_lane[None, :]
    vector_ok = None if ok is None else ok[:, None]
    v0 = _load_weights(vector_ptrs, vector_ok)
    if LANE_VALUES > 8:
        v1 = _load_weights(vector_ptrs + PAIRS_PER_VECTOR, vector_ok)
    if LANE_VALUES > 16:
        v2 = _load_weights(vector_ptrs + 2 * PAIRS_PER_VECTOR, vector_ok)
    if WORD_LANES == 2:  # the high lane's values start at the word's (K/2 + 1)-th set bit
        for _ in tl.static_range(LANE_VALUES):
            word = word & (word - half)
    scan, x_word = _scan_and_x(word, w, x_ptr, X_COLUMN_STRIDE, FAST_SCAN)
    x_ok = None if ok is None else ok[:, None]
    acc0, acc1, acc2, acc3, scan = _vector_steps(acc0, acc1, acc2, acc3, scan, v0, x_word, x_lane, x_ok,
                                                 X_COLUMN_STRIDE, BATCH_LANES, BATCH_GROUPS, VALUE_DTYPE, LANES,
                                                 FAST_SCAN)
    if LANE_VALUES > 8:
        acc0, acc1, acc2, acc3, scan = _vector_steps(acc0, acc1, acc2, acc3, scan, v1, x_word, x_lane, x_ok,
                                                     X_COLUMN_STRIDE, BATCH_LANES, BATCH_GROUPS, VALUE_DTYPE,
                                                     LANES, FAST_SCAN)
    if LANE_VALUES > 16:
        acc0, acc1, acc2, acc3, scan = _vector_steps(acc0, acc1, acc2, acc3, scan, v2, x_word, x_lane, x_ok,
                                                     X_COLUMN_STRIDE, BATCH_LANES, BATCH_GROUPS, VALUE_DTYPE,
                                                     LANES, FAST_SCAN)
    return acc0, acc1, acc2, acc3


@triton.jit
def _store_group(acc, group, y_ptr, partial_ptr, pid_split, out_features, batch, rows, row_ok,
                 BATCH_LANES: tl.constexpr, BATCH_BLOCK: tl.constexpr, BLOCK_WORDS: tl.constexpr,
                 BLOCK_ROWS: tl.constexpr, WARP_WORDS: tl.constexpr, WORD_LANES: tl.constexpr,
                 SPLIT_K: tl.constexpr, EVEN_BATCH: tl.constexpr):
    """Sum one group's accumulator over the tile's words and word halves; store it as y (one split) or as an
    fp32 partial."""
    per_row = tl.reshape(acc, (BLOCK_WORDS // WARP_WORDS, BLOCK_ROWS, WARP_WORDS * WORD_LANES, BATCH_LANES))
    tile = tl.sum(tl.sum(per_row, axis=2), axis=0)  # [rows, lanes]
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
    WORD_LANES: tl.constexpr, WARP_WORDS: tl.constexpr,
    EVEN_ROWS: tl.constexpr, EVEN_WORDS: tl.constexpr, EVEN_BATCH: tl.constexpr, FAST_SCAN: tl.constexpr,
):
    """y[b, o] for BLOCK_ROWS rows o and all b < batch; `pairs_ptr` is the values viewed as int32. x is the
    caller's [1, in] for one row, else [in, BATCH_BLOCK] in float32 or x's dtype (zero beyond `batch`)."""
    K: tl.constexpr = 32 * N // M
    LANES: tl.constexpr = BLOCK_WORDS * BLOCK_ROWS * WORD_LANES
    if BATCH_BLOCK == 1:
        X_COLUMN_STRIDE: tl.constexpr = 1
        BATCH_LANES: tl.constexpr = 1
    else:
        X_COLUMN_STRIDE: tl.constexpr = BATCH_BLOCK
        X_VECTOR: tl.constexpr = X_VECTOR_BYTES * 8 // x_ptr.dtype.element_ty.primitive_bitwidth
        BATCH_LANES: tl.constexpr = X_VECTOR if BATCH_BLOCK >= X_VECTOR else BATCH_BLOCK
    BATCH_GROUPS: tl.constexpr = BATCH_BLOCK // BATCH_LANES
    VALUE_DTYPE: tl.constexpr = y_ptr.dtype.element_ty
    pid_rows = tl.program_id(0)
    pid_split = tl.program_id(1)

    # flat lane axis = (word group, row, word in group, half), slowest to fastest
    lane = tl.arange(0, LANES)
    half = lane % WORD_LANES
    lane_word = (lane // (WORD_LANES * WARP_WORDS * BLOCK_ROWS)) * WARP_WORDS + (lane // WORD_LANES) % WARP_WORDS
    # Rows past the end read the last row again (their sums are never stored), so loads need no row mask.
    lane_rows = tl.minimum(pid_rows * BLOCK_ROWS + (lane // (WORD_LANES * WARP_WORDS)) % BLOCK_ROWS,
                           out_features - 1)
    x_lane = tl.arange(0, BATCH_LANES)
    pair_lane = tl.arange(0, PAIRS_PER_VECTOR)

    words_per_split = tl.cdiv(words, SPLIT_K * BLOCK_WORDS) * BLOCK_WORDS
    w_begin = pid_split * words_per_split
    w_stop = tl.minimum(w_begin + words_per_split, words)  # the last split may end early or own no words
    w_full_stop = w_begin + tl.maximum(w_stop - w_begin, 0) // BLOCK_WORDS * BLOCK_WORDS  # end of full loop steps
    mask_rows = bitmask_ptr + lane_rows.to(tl.int64) * words
    pair_rows = pairs_ptr + lane_rows.to(tl.int64) * (words * (K // 2))

    acc0 = tl.zeros([LANES, BATCH_LANES], dtype=tl.float32)
    acc1 = tl.zeros([LANES, BATCH_LANES] if BATCH_GROUPS > 1 else [1, 1], dtype=tl.float32)
    acc2 = tl.zeros([LANES, BATCH_LANES] if BATCH_GROUPS > 2 else [1, 1], dtype=tl.float32)
    acc3 = tl.zeros([LANES, BATCH_LANES] if BATCH_GROUPS > 2 else [1, 1], dtype=tl.float32)
    for w0 in range(w_begin, w_full_stop, BLOCK_WORDS):
        acc0, acc1, acc2, acc3 = _lane_words(acc0, acc1, acc2, acc3, w0 + lane_word, half, None, mask_rows,
                                             pair_rows, pair_lane, x_ptr, x_lane, K, WORD_LANES, X_COLUMN_STRIDE,
                                             BATCH_LANES, BATCH_GROUPS, VALUE_DTYPE, LANES, FAST_SCAN)
    if not EVEN_WORDS:
        if w_full_stop < w_stop:  # one partial step, masked
            w = w_full_stop + lane_word
            acc0, acc1, acc2, acc3 = _lane_words(acc0, acc1, acc2, acc3, w, half, w < w_stop, mask_rows, pair_rows,
                                                 pair_lane, x_ptr, x_lane, K, WORD_LANES, X_COLUMN_STRIDE,
                                                 BATCH_LANES, BATCH_GROUPS, VALUE_DTYPE, LANES, FAST_SCAN)

    rows = pid_rows * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    row_ok = (rows < out_features) | EVEN_ROWS
    _store_group(acc0, 0, y_ptr, partial_ptr, pid_split, out_features, batch, rows, row_ok, BATCH_LANES,
                 BATCH_BLOCK, BLOCK_WORDS, BLOCK_ROWS, WARP_WORDS, WORD_LANES, SPLIT_K, EVEN_BATCH)
    if BATCH_GROUPS > 1:
        _store_group(acc1, 1, y_ptr, partial_ptr, pid_split, out_features, batch, rows, row_ok, BATCH_LANES,
                     BATCH_BLOCK, BLOCK_WORDS, BLOCK_ROWS, WARP_WORDS, WORD_LANES, SPLIT_K, EVEN_BATCH)
    if BATCH_GROUPS > 2:
        _store_group(acc2, 2, y_ptr, partial_ptr, pid_split, out_features, batch, rows, row_ok, BATCH_LANES,
                     BATCH_BLOCK, BLOCK_WORDS, BLOCK_ROWS, WARP_WORDS, WORD_LANES, SPLIT_K, EVEN_BATCH)
        _store_group(acc3, 3, y_ptr, partial_ptr, pid_split, out_features, batch, rows, row_ok, BATCH_LANES,
                     BATCH_BLOCK, BLOCK_WORDS, BLOCK_ROWS, WARP_WORDS, WORD_LANES, SPLIT_K, EVEN_BATCH)
    if SPLIT_K > 1:  # each split has stored its fp32 partial ([SPLIT_K, BATCH_BLOCK, out])
        b = tl.arange(0, BATCH_BLOCK)[None, :]
        finish_splits(y_ptr, partial_ptr, arrivals_ptr, pid_rows, b * out_features + rows[:, None],
                      row_ok[:, None] & ((b < batch) | EVEN_BATCH), BATCH_BLOCK * out_features, BLOCK_ROWS,
                      BATCH_BLOCK, SPLIT_K)


@triton.jit
def finish_splits(y_ptr, partial_ptr, arrivals_ptr, pid_rows, at, ok, split_stride, BLOCK_ROWS: tl.constexpr,
                  BATCH_BLOCK: tl.constexpr, SPLIT_K: tl.constexpr):
    """Split-K's end, once this program has stored its fp32 partial at partial_ptr + split·split_stride + `at`
    ([BLOCK_ROWS, BATCH_BLOCK] offsets, `ok` where they are real): the row block's last split to arrive (a counter
    per row block at `arrivals_ptr`, zero between launches) adds every split's partial in split order
    (deterministic), writes y at `at` and resets the counter for the next launch."""
    tl.debug_barrier()  # every thread's partial is written before the counter says so
    arrived = tl.atomic_add(arrivals_ptr + pid_rows, 1, sem="acq_rel")
    if arrived == SPLIT_K - 1:
        total = tl.zeros([BLOCK_ROWS, BATCH_BLOCK], dtype=tl.float32)
        for split in tl.static_range(SPLIT_K):
            total += tl.load(partial_ptr + split * split_stride + at, mask=ok, other=0.0, cache_modifier=".cg")
        tl.store(y_ptr + at, total.to(y_ptr.dtype.element_ty), mask=ok)
        tl.atomic_xchg(arrivals_ptr + pid_rows, 0)


@triton.jit
def store_rows(tile, y_ptr, partial_ptr, arrivals_ptr, pid_rows, pid_split, out_features, batch,
               BLOCK_ROWS: tl.constexpr, BATCH_BLOCK: tl.constexpr, SPLIT_K: tl.constexpr):
    """Write this program's sums `tile` [rows, batch] (fp32): y for one split; else this split's partial
    (partial_ptr [SPLIT_K, batch, out]), and `finish_splits`."""
    rows = pid_rows * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    b = tl.arange(0, BATCH_BLOCK)[None, :]
    ok = (rows < out_features)[:, None] & (b < batch)
    at = b * out_features + rows[:, None]
    if SPLIT_K == 1:
        tl.store(y_ptr + at, tile.to(y_ptr.dtype.element_ty), mask=ok)
    else:
        tl.store(partial_ptr + pid_split * batch * out_features + at, tile, mask=ok)
        finish_splits(y_ptr, partial_ptr, arrivals_ptr, pid_rows, at, ok, batch * out_features, BLOCK_ROWS,
                      BATCH_BLOCK, SPLIT_K)


_arrival_counters: dict[torch.device, torch.Tensor] = {}
MAX_ROW_BLOCKS = 1 << 16  # far above any decoder linear (57344 rows / 8-row blocks = 7168)


def split_counters(device: torch.device, row_blocks: int) -> torch.Tensor:
    """Per-device int32 counters for split-K (`nm_spmv_kernel` and the quantized kernels' `store_rows` share them:
    launches on a stream run in order), all zero between launches (the last split of each row block resets its
    counter). Allocated once at a fixed size and never replaced, so a CUDA graph captured earlier can
    never point at freed counters; the first allocation must happen outside graph capture."""
    if row_blocks > MAX_ROW_BLOCKS:
        raise KernelInputError(f"split-K supports at most {MAX_ROW_BLOCKS} row blocks, got {row_blocks}")
    counters = _arrival_counters.get(device)
    if counters is None:
        if device.type == "cuda" and torch.cuda.is_current_stream_capturing():
            raise KernelInputError(
                "the split-K counters do not exist yet; run the kernel once before capturing a CUDA graph "
                "(warm-up also tunes the kernel)")
        counters = torch.zeros(MAX_ROW_BLOCKS, dtype=torch.int32, device=device)
        _arrival_counters[device] = counters
    return counters


def _kernel_call(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int,
                 config: SpmvConfig) -> tuple[tuple[int, int], tuple, dict, torch.Tensor]:
    """(grid, arguments, keyword arguments, y) of one launch; allocates y and, for split-K, the partials."""
    if (32 * n // m) % (8 * config.word_lanes):
        raise KernelInputError(f"{config} splits a word over {config.word_lanes} lanes, which needs 32·N/M a "
                               f"multiple of {8 * config.word_lanes}; {n}:{m} has {32 * n // m}")
    batch = x.shape[0]
    out_features, words = bitmask.shape
    batch_block = triton.next_power_of_2(batch)
    x_arg = x
    if batch > 1:  # [in, batch]: one vector load per decoded column serves 4 (float32) or 8 (16-bit) batch rows
        make = torch.empty if batch == batch_block else torch.zeros
        x_arg = make(x.shape[1], batch_block, dtype=torch.float32 if config.x_float32 else x.dtype, device=x.device)
        x_arg[:, :batch].copy_(x.t())
    y = torch.empty(batch, out_features, dtype=x.dtype, device=x.device)
    row_blocks = triton.cdiv(out_features, config.block_rows)
    if config.split_k > 1:
        partial = torch.empty(config.split_k, batch_block, out_features, dtype=torch.float32, device=x.device)
        arrivals = split_counters(x.device, row_blocks)
    else:  # never read by the kernel when split_k == 1
        partial, arrivals = y, bitmask
    arguments = (x_arg, values.view(torch.int32), bitmask, y, partial, arrivals, out_features, words, batch)
    constants = dict(
        N=n, M=m, BATCH_BLOCK=batch_block,
        BLOCK_ROWS=config.block_rows, BLOCK_WORDS=config.block_words, SPLIT_K=config.split_k,
        WORD_LANES=config.word_lanes, WARP_WORDS=config.warp_words,
        EVEN_ROWS=out_features % config.block_rows == 0,
        EVEN_WORDS=words % (config.block_words * config.split_k) == 0, EVEN_BATCH=batch == batch_block,
        FAST_SCAN=not interpreted(),
        num_warps=config.num_warps, num_stages=1,  # nothing to pipeline: no tl.dot, plain loads
    )
    return (row_blocks, config.split_k), arguments, constants, y


def launch(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int,
           config: SpmvConfig) -> torch.Tensor:
    """y = x·Wᵀ for x [batch, in] with one given configuration (inputs already checked)."""
    grid, arguments, constants, y = _kernel_call(x, values, bitmask, n, m, config)
    nm_spmv_kernel[grid](*arguments, **constants)
    return y


def compile_for(x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor, n: int, m: int,
                config: SpmvConfig) -> None:
    """Compile (or find in Triton's caches) the kernel `launch` would run for these inputs, without running it.
    Safe to call from several threads at once: Triton compiles outside the GIL, and each thread sets x's device."""
    grid, arguments, constants, _ = _kernel_call(x, values, bitmask, n, m, config)
    with torch.cuda.device(x.device):
        nm_spmv_kernel.warmup(*arguments, grid=grid, **constants)
