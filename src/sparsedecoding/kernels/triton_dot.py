"""Tensor-core Triton kernel for y[b, o] = Σ_i W[o, i]·x[b, i], W packed N:M (see `format.py`), for 2-16 rows.

Why a second kernel: the bit-scan kernel (`triton_spmv`) decodes one stored value at a time on CUDA cores and
gathers x at its column for every batch row, so its L1 traffic grows with the batch; from batch 2 on cuBLAS,
which shares one x tile across many weight rows on tensor cores, is faster. Here each program rebuilds a dense
[rows, 32·words] tile of W from the packed bytes in registers and hands it to `tl.dot` with an x tile padded to 16
batch rows. The weight bytes read are the packed ones (1.125 per weight at 50%), the product costs the same for
batch 2 and 16, and the price is a few integer instructions per dense element to rebuild the tile.

Rebuilding: column c of a word w is kept iff bit c is set; its value is the row's stored value number
rank(c) = (set bits of the tile's row before c). Every mask word holds exactly K = 32·N/M set bits, so ranks
restart at K·w for word w of the tile, and the tile's stored values are one contiguous run of K·words. Two ways
to get rank (`DotConfig.rank`): `popc` counts the bits below c in c's word (PTX `popc`; a SWAR count in the
interpreter), `cumsum` takes an exclusive prefix sum of the kept bits along the tile's row. Two ways to fetch the
value (`DotConfig.gather`): `global` loads it at its own address (a 2-byte load per kept element, cache-served
after the first touch of a line), `register` loads the row's run of stored values with wide contiguous loads and
picks with `tl.gather`."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..errors import KernelInputError
from .triton_spmv import _arrivals, interpreted

BATCH_TILE = 16  # tl.dot needs ≥ 16 on every side: batch rows beyond x's are read as zeros
_RANKS = ("popc", "cumsum")
_GATHERS = ("global", "register")


@dataclass(frozen=True)
class DotConfig:
    """One launch configuration of the tensor-core kernel: `block_rows` output rows and `block_words` mask words
    (32 columns each) per loop step and program; `split_k` programs share a row block, each summing a contiguous
    range of words; `rank` and `gather` choose how the dense tile is rebuilt (module docstring)."""

    block_rows: int
    block_words: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 2
    rank: str = "popc"
    gather: str = "global"

    def __post_init__(self) -> None:
        sizes = (self.block_rows, self.block_words, self.split_k, self.num_warps, self.num_stages)
        if self.rank not in _RANKS or self.gather not in _GATHERS or any(v < 1 for v in sizes) \
                or self.block_rows < 16 or any(v & (v - 1) for v in (self.block_rows, self.block_words)):
            raise KernelInputError(f"nm_dot configuration {self!r}: rank one of {_RANKS}, gather one of "
                                   f"{_GATHERS}, block_rows ≥ 16 and tile sizes powers of two")

    def __str__(self) -> str:
        return (f"dot R{self.block_rows}xW{self.block_words} split{self.split_k} w{self.num_warps} "
                f"s{self.num_stages} {self.rank} {self.gather}")


@triton.jit
def _bits_below(word, ON_GPU: tl.constexpr):
    """Number of set bits of each int32 `word` (already masked to the bits below a column)."""
    if ON_GPU:
        count = tl.inline_asm_elementwise("popc.b32 $0, $1;", "=r,r", [word], dtype=tl.int32, is_pure=True, pack=1)
    else:  # SWAR count on the unsigned word, for the interpreter
        v = word.to(tl.uint32, bitcast=True)
        v = v - ((v >> 1) & 0x55555555)
        v = (v & 0x33333333) + ((v >> 2) & 0x33333333)
        v = (v + (v >> 4)) & 0x0F0F0F0F
        count = ((v * 0x01010101) >> 24).to(tl.int32)
    return count


@triton.jit
def _dense_tile(mask_rows, value_rows, w0, w_stop, col_word, col_bit, below_col, MASKED: tl.constexpr,
                K: tl.constexpr, BLOCK_WORDS: tl.constexpr, CUMSUM: tl.constexpr, REGISTER_GATHER: tl.constexpr,
                ON_GPU: tl.constexpr):
    """W[rows, 32·w0 : 32·(w0 + BLOCK_WORDS)] rebuilt from the packed parts; words ≥ w_stop read as zero
    columns when MASKED."""
    word_ptrs = mask_rows[:, None] + (w0 + col_word)[None, :]
    if MASKED:
        word = tl.load(word_ptrs, mask=(w0 + col_word < w_stop)[None, :], other=0, eviction_policy="evict_first")
    else:
        word = tl.load(word_ptrs, eviction_policy="evict_first")
    bit = (word >> col_bit[None, :]) & 1
    if CUMSUM:
        rank = tl.cumsum(bit, axis=1) - bit
    else:
        rank = _bits_below(word & below_col[None, :], ON_GPU) + (col_word * K)[None, :]
    kept = bit != 0
    if REGISTER_GATHER:
        run = tl.arange(0, K * BLOCK_WORDS)
        run_ptrs = value_rows[:, None] + (w0 * K + run)[None, :]
        if MASKED:
            stored = tl.load(run_ptrs, mask=(w0 * K + run < w_stop * K)[None, :], other=0.0,
                             eviction_policy="evict_first")
        else:
            stored = tl.load(run_ptrs, eviction_policy="evict_first")
        tile = tl.where(kept, tl.gather(stored, tl.minimum(rank, K * BLOCK_WORDS - 1), axis=1), 0.0)
    else:
        tile = tl.load(value_rows[:, None] + w0 * K + rank, mask=kept, other=0.0)
    return tile


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
    SPLIT_K: tl.constexpr, CUMSUM: tl.constexpr, REGISTER_GATHER: tl.constexpr, EVEN_ROWS: tl.constexpr,
    EVEN_WORDS: tl.constexpr, ON_GPU: tl.constexpr,
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
    col_word = cols // 32
    col_bit = cols % 32
    below_col = ~(-1 << col_bit)  # bits 0..c-1 of a word
    b = tl.arange(0, BATCH)
    x_cols = x_ptr + b[None, :] * in_features + cols[:, None]  # [columns, batch] tile of x
    b_ok = (b < batch)[None, :]

    words_per_split = tl.cdiv(words, SPLIT_K * BLOCK_WORDS) * BLOCK_WORDS
    w_begin = pid_split * words_per_split
    w_stop = tl.minimum(w_begin + words_per_split, words)
    w_full_stop = w_begin + tl.maximum(w_stop - w_begin, 0) // BLOCK_WORDS * BLOCK_WORDS

    acc = tl.zeros([BLOCK_ROWS, BATCH], dtype=tl.float32)
    for w0 in range(w_begin, w_full_stop, BLOCK_WORDS):
        tile = _dense_tile(mask_rows, value_rows, w0, w_stop, col_word, col_bit, below_col, False, K, BLOCK_WORDS,
                           CUMSUM, REGISTER_GATHER, ON_GPU)
        x = tl.load(x_cols + w0 * 32, mask=b_ok, other=0.0, eviction_policy="evict_last")
        acc = _dot(tile, x, acc, ON_GPU)
    if not EVEN_WORDS:
        if w_full_stop < w_stop:  # one partial step, masked
            tile = _dense_tile(mask_rows, value_rows, w_full_stop, w_stop, col_word, col_bit, below_col, True, K,
                               BLOCK_WORDS, CUMSUM, REGISTER_GATHER, ON_GPU)
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
        CUMSUM=config.rank == "cumsum", REGISTER_GATHER=config.gather == "register",
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
