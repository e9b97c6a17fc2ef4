"""Triton kernel for y[b, o] = Σ_i W[o, i]·x[b, i] with W stored as N:M quantized codes + scales + bitmask (see
`quantized.py`): `triton_spmv`'s bit scan with the values dequantized in registers.

Each program owns BLOCK_ROWS output rows and a range of mask words; a lane walks one whole word of one row (lanes
of a warp are neighbouring rows of the same word, so their x gathers share cache lines). Per word it loads the
word's K = 32·N/M codes (one 16-byte load for int8 at 50%, one 8-byte load for int4), then runs K bit-scan
steps: the lowest set bit is the column of the next code; the code becomes a float32 and is multiplied with x there
into a per-word sum. A word lies in one scale group (group sizes are multiples of 32), so its sum is multiplied by
the word's scale once, after the K steps: the scale costs one load and one multiply per word, not per value.

The code becomes a float without an int-to-float conversion (I2F issues at a quarter of the FP32 rate on sm_90,
and the bit scan's `bfind` is a quarter-rate instruction too): its BITS bits u, taken out with a shift and a mask,
are a two's complement code c; u xor 2^(BITS-1) is c + 2^(BITS-1), and or-ed into the mantissa of 2^23 it makes
the float 2^23 + 2^(BITS-1) + c exactly, from which one subtraction leaves c (as `triton_nmq_tile` does).

Split-K: each split writes its fp32 partial, and the last split of a row block to arrive (an atomic counter per row
block, which it resets) adds the partials in split order (deterministic) and writes y, as `triton_spmv` does: no
further launches after the kernel's.

The bit scan (PTX on CUDA, the float-exponent trick under TRITON_INTERPRET=1) is `triton_spmv`'s."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..errors import KernelInputError
from .autotune import Float64Reference, Tuner
from .format import values_per_word
from .quantized import CODE_BITS, PackedNMQ
from .triton_nmq_tile import nmq_tile_kernel
from .triton_spmv import (_load_weights, _scan_and_x, _split4, _take_lowest_bit, interpreted, split_counters,
                          store_rows)

DESIGNS = ("scan", "tile")


@dataclass(frozen=True)
class NmqConfig:
    """`block_rows` rows and `block_words` words per program and loop step; `split_k` programs per row block;
    `design` "scan" (this module's bit scan, one lane per word) or "tile" (`triton_nmq_tile`: every word's 32
    columns expanded in parallel against a dense x tile)."""

    block_rows: int = 8
    block_words: int = 16
    split_k: int = 1
    num_warps: int = 4
    design: str = "scan"

    def __post_init__(self) -> None:
        sizes = (self.block_rows, self.block_words)
        if any(v < 1 or v & (v - 1) for v in sizes) or self.split_k < 1 or self.num_warps < 1 \
                or self.design not in DESIGNS:
            raise KernelInputError(f"nmq_spmv configuration {self!r}: tile sizes must be powers of two, split_k >= 1, "
                                   f"design one of {DESIGNS}")

    def __str__(self) -> str:
        return f"{self.design} R{self.block_rows}xW{self.block_words} split{self.split_k} w{self.num_warps}"


@triton.jit
def _code(chunk, k: tl.constexpr, BITS: tl.constexpr):
    """Code k of an int32 holding 32/BITS two's complement codes (code 0 in the low bits) as float32, exactly,
    through the mantissa of 2^23 (see the top)."""
    SIGN: tl.constexpr = 1 << (BITS - 1)
    bits = (chunk >> (BITS * k)) & ((1 << BITS) - 1)
    return (bits ^ (0x4B000000 | SIGN)).to(tl.float32, bitcast=True) - (8388608.0 + SIGN)


@triton.jit
def _code_step(word_sum, scan, code, x_word, x_lane, x_ok, X_COLUMN_STRIDE: tl.constexpr, FAST_SCAN: tl.constexpr):
    column, scan = _take_lowest_bit(scan, FAST_SCAN)
    x_ptrs = (x_word + column * X_COLUMN_STRIDE)[:, None] + x_lane[None, :]
    if x_ok is None:
        x = tl.load(x_ptrs, eviction_policy="evict_last")
    else:
        x = tl.load(x_ptrs, mask=x_ok, other=0.0, eviction_policy="evict_last")
    return word_sum + code[:, None] * x.to(tl.float32), scan


@triton.jit
def _int32_steps(word_sum, scan, chunk, x_word, x_lane, x_ok, BITS: tl.constexpr, X_COLUMN_STRIDE: tl.constexpr,
                 FAST_SCAN: tl.constexpr):
    """Steps for the 32/BITS codes of one int32, lowest first."""
    for k in tl.static_range(32 // BITS):
        word_sum, scan = _code_step(word_sum, scan, _code(chunk, k, BITS), x_word, x_lane, x_ok, X_COLUMN_STRIDE,
                                    FAST_SCAN)
    return word_sum, scan


@triton.jit
def _word(acc, w, ok, mask_rows, code_rows, scale_rows, x_ptr, x_lane, K: tl.constexpr, BITS: tl.constexpr,
          WORDS_PER_GROUP: tl.constexpr, X_COLUMN_STRIDE: tl.constexpr, LANES: tl.constexpr,
          BATCH_BLOCK: tl.constexpr, FAST_SCAN: tl.constexpr):
    """acc += scale · Σ code·x over every lane's word w (`ok` masks words past the split's end; None: no mask)."""
    INT32_PER_WORD: tl.constexpr = K * BITS // 32
    word = _load_weights(mask_rows + w, ok)
    scale = _load_weights(scale_rows + w // WORDS_PER_GROUP, ok).to(tl.float32)
    scan, x_word = _scan_and_x(word, w, x_ptr, X_COLUMN_STRIDE, FAST_SCAN)
    x_ok = None if ok is None else ok[:, None]
    word_sum = tl.zeros([LANES, BATCH_BLOCK], dtype=tl.float32)
    code_ptrs = code_rows + w * INT32_PER_WORD
    if INT32_PER_WORD == 4:  # int8 at 50%: the word's 16 codes in one 16-byte load
        p0, p1, p2, p3 = _split4(_load_weights(code_ptrs[:, None] + tl.arange(0, 4)[None, :], x_ok), LANES)
        word_sum, scan = _int32_steps(word_sum, scan, p0, x_word, x_lane, x_ok, BITS, X_COLUMN_STRIDE, FAST_SCAN)
        word_sum, scan = _int32_steps(word_sum, scan, p1, x_word, x_lane, x_ok, BITS, X_COLUMN_STRIDE, FAST_SCAN)
        word_sum, scan = _int32_steps(word_sum, scan, p2, x_word, x_lane, x_ok, BITS, X_COLUMN_STRIDE, FAST_SCAN)
        word_sum, scan = _int32_steps(word_sum, scan, p3, x_word, x_lane, x_ok, BITS, X_COLUMN_STRIDE, FAST_SCAN)
    elif INT32_PER_WORD == 2:  # int4 at 50%, int8 at 25%: one 8-byte load
        low, high = tl.split(_load_weights(code_ptrs[:, None] + tl.arange(0, 2)[None, :], x_ok))
        word_sum, scan = _int32_steps(word_sum, scan, low, x_word, x_lane, x_ok, BITS, X_COLUMN_STRIDE, FAST_SCAN)
        word_sum, scan = _int32_steps(word_sum, scan, high, x_word, x_lane, x_ok, BITS, X_COLUMN_STRIDE, FAST_SCAN)
    else:  # 1, 3 or 6 int32s (int4 at 25%, 24 codes a word): one 4-byte load each
        for c in tl.static_range(INT32_PER_WORD):
            word_sum, scan = _int32_steps(word_sum, scan, _load_weights(code_ptrs + c, ok), x_word, x_lane, x_ok,
                                          BITS, X_COLUMN_STRIDE, FAST_SCAN)
    return acc + scale[:, None] * word_sum


@triton.jit
def nmq_spmv_kernel(
    x_ptr, codes_ptr, scales_ptr, bitmask_ptr, y_ptr, partial_ptr, arrivals_ptr,
    out_features, words, batch, groups,
    N: tl.constexpr, M: tl.constexpr, BITS: tl.constexpr, WORDS_PER_GROUP: tl.constexpr,
    BATCH_BLOCK: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_WORDS: tl.constexpr, SPLIT_K: tl.constexpr,
    EVEN_WORDS: tl.constexpr, FAST_SCAN: tl.constexpr,
):
    """y for BLOCK_ROWS rows (with SPLIT_K > 1 through fp32 partials, `store_rows`). `codes_ptr` is the codes
    viewed as int32. x is [1, in] for one row, else [in, BATCH_BLOCK] float32 (zero beyond `batch`)."""
    K: tl.constexpr = 32 * N // M
    LANES: tl.constexpr = BLOCK_WORDS * BLOCK_ROWS
    X_COLUMN_STRIDE: tl.constexpr = BATCH_BLOCK
    pid_rows = tl.program_id(0)
    pid_split = tl.program_id(1)

    lane = tl.arange(0, LANES)  # (word, row) from slowest to fastest: a warp's lanes are rows of one word
    lane_word = lane // BLOCK_ROWS
    # Rows past the end read the last row again (their sums are never stored), so loads need no row mask.
    lane_rows = tl.minimum(pid_rows * BLOCK_ROWS + lane % BLOCK_ROWS, out_features - 1).to(tl.int64)
    x_lane = tl.arange(0, BATCH_BLOCK)
    mask_rows = bitmask_ptr + lane_rows * words
    code_rows = codes_ptr + lane_rows * (words * (K * BITS // 32))
    scale_rows = scales_ptr + lane_rows * groups

    words_per_split = tl.cdiv(words, SPLIT_K * BLOCK_WORDS) * BLOCK_WORDS
    w_begin = pid_split * words_per_split
    w_stop = tl.minimum(w_begin + words_per_split, words)
    w_full_stop = w_begin + tl.maximum(w_stop - w_begin, 0) // BLOCK_WORDS * BLOCK_WORDS
    acc = tl.zeros([LANES, BATCH_BLOCK], dtype=tl.float32)
    for w0 in range(w_begin, w_full_stop, BLOCK_WORDS):
        acc = _word(acc, w0 + lane_word, None, mask_rows, code_rows, scale_rows, x_ptr, x_lane, K, BITS,
                    WORDS_PER_GROUP, X_COLUMN_STRIDE, LANES, BATCH_BLOCK, FAST_SCAN)
    if not EVEN_WORDS:
        if w_full_stop < w_stop:  # one partial step, masked
            w = w_full_stop + lane_word
            acc = _word(acc, w, w < w_stop, mask_rows, code_rows, scale_rows, x_ptr, x_lane, K, BITS,
                        WORDS_PER_GROUP, X_COLUMN_STRIDE, LANES, BATCH_BLOCK, FAST_SCAN)

    tile = tl.sum(tl.reshape(acc, (BLOCK_WORDS, BLOCK_ROWS, BATCH_BLOCK)), axis=0)  # [rows, batch]
    store_rows(tile, y_ptr, partial_ptr, arrivals_ptr, pid_rows, pid_split, out_features, batch, BLOCK_ROWS,
               BATCH_BLOCK, SPLIT_K)


def check_nmq_pattern(packed: PackedNMQ) -> None:
    k = values_per_word(packed.n, packed.m)
    if k % 8:
        raise KernelInputError(f"nmq_spmv needs 32·N/M a multiple of 8 (2:4, 4:8, 8:16, 16:32, 1:4, ...); "
                               f"{packed.pattern} has {k}")


def launch_nmq(x: torch.Tensor, packed: PackedNMQ, config: NmqConfig) -> torch.Tensor:
    """y = x·Wᵀ for contiguous x [batch, in] (bf16 or fp16) with one configuration."""
    check_nmq_pattern(packed)
    batch = x.shape[0]
    out_features, words = packed.bitmask.shape
    batch_block = triton.next_power_of_2(batch)
    if batch == 1:
        x_arg = x
    else:  # [in, batch]: one decoded column serves every batch row
        x_arg = torch.zeros(x.shape[1], batch_block, dtype=torch.float32, device=x.device)
        x_arg[:, :batch].copy_(x.t())
    y = torch.empty(batch, out_features, dtype=x.dtype, device=x.device)
    row_blocks = triton.cdiv(out_features, config.block_rows)
    if config.split_k > 1:
        partial = torch.empty(config.split_k, batch, out_features, dtype=torch.float32, device=x.device)
        arrivals = split_counters(x.device, row_blocks)
    else:  # never read by the kernel with one split
        partial, arrivals = y, packed.bitmask
    grid = (row_blocks, config.split_k)
    constants = dict(
        N=packed.n, M=packed.m, BITS=CODE_BITS[packed.quantize], WORDS_PER_GROUP=packed.group_size // 32,
        BATCH_BLOCK=batch_block, BLOCK_ROWS=config.block_rows, BLOCK_WORDS=config.block_words,
        SPLIT_K=config.split_k, EVEN_WORDS=words % (config.block_words * config.split_k) == 0,
        num_warps=config.num_warps, num_stages=1,
    )
    if config.design == "scan":
        kernel, constants["FAST_SCAN"] = nmq_spmv_kernel, not interpreted()
    else:
        kernel = nmq_tile_kernel
    kernel[grid](x_arg, packed.codes.view(torch.int32), packed.scales, packed.bitmask, y, partial, arrivals,
                 out_features, words, batch, packed.scales.shape[1], **constants)
    return y


# (rows, words per loop step, warps) per design. A tile program holds [32 columns, rows, words] (times the batch)
# in registers, one (row, word) per thread: rows · words = 32 · warps.
_SCAN_TILES = ((8, 16, 4), (4, 32, 4), (16, 8, 4), (8, 32, 8), (4, 16, 2))
_TILE_TILES = ((16, 8, 4), (32, 4, 4), (8, 16, 4), (8, 4, 1))
_TILE_TILES_WIDE_BATCH = ((16, 8, 4), (8, 4, 1))


def candidate_configs(out_features: int, words: int, batch: int = 1) -> list[NmqConfig]:
    """Tiles to time for one problem: a few row and word widths, and split-K when there are few row blocks. The
    scan design's first tile comes first (the interpreter's choice). The tile design only from batch 2: at batch 1
    it was 1.7-2.4x slower than the scan on every 8B and 14B shape (results/quant_kernel_h200.md as of commit
    36021fd), and the do_bench timing once picked it there at twice the scan's time."""
    tiles = [(tile, "scan") for tile in _SCAN_TILES]
    if batch > 1:
        tiles += [(tile, "tile") for tile in (_TILE_TILES if batch <= 4 else _TILE_TILES_WIDE_BATCH)]
    configs = []
    for (rows, step, warps), design in tiles:
        blocks = triton.cdiv(out_features, rows)
        for split in (1, 2, 4):
            if split > 1 and (blocks * split > 4096 or words < 2 * step * split):
                continue
            configs.append(NmqConfig(rows, step, split, warps, design))
    return configs


_tuner = Tuner("nmq_spmv")


def tuner_key(x: torch.Tensor, packed: PackedNMQ) -> tuple:
    """What a tuning result is kept per: device, shape, batch, format and x's dtype."""
    return (str(x.device), packed.shape, x.shape[0], packed.n, packed.m, packed.quantize, packed.group_size,
            str(x.dtype))


def tuned_config(x: torch.Tensor, packed: PackedNMQ) -> NmqConfig:
    """The fastest correct one of `candidate_configs` (both designs) for this problem, checked and timed once per
    (device, shape, batch, format) as the decoder runs it: replayed from a CUDA graph round-robin over copies of
    the weight past the L2 (`autotune.fastest_correct`); under the interpreter the first candidate."""
    def run_on(config: NmqConfig, tensors: tuple[torch.Tensor, ...]) -> torch.Tensor:
        return launch_nmq(x, dataclasses.replace(packed, codes=tensors[0], scales=tensors[1], bitmask=tensors[2]),
                          config)

    return _tuner.config(tuner_key(x, packed), lambda: candidate_configs(*packed.bitmask.shape, x.shape[0]),
                         lambda config: launch_nmq(x, packed, config),
                         lambda: Float64Reference(x, packed.kept_values(), packed.bitmask),
                         lambda: ((packed.codes, packed.scales, packed.bitmask), run_on))


def rejected_candidates() -> dict[tuple, dict[NmqConfig, str]]:
    """For every problem tuned so far: the candidates that failed to compile or to match float64, and why."""
    return _tuner.rejected_candidates()


def nmq_spmv_triton(x: torch.Tensor, packed: PackedNMQ, config: NmqConfig | None = None) -> torch.Tensor:
    """`quantized.nmq_spmv` on the Triton kernel: x [in] or [batch, in] contiguous, on the weight's device."""
    x2 = x.view(1, -1) if x.dim() == 1 else x
    y = launch_nmq(x2, packed, config or tuned_config(x2, packed))
    return y.view(-1) if x.dim() == 1 else y
