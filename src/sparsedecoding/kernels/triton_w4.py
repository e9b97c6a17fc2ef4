"""Triton kernel for the dense int4 weight-only baseline: y[b, o] = Σ_g s[o, g] · Σ_{i in group g} q[o, i]·x[b, i]
with q the int4 codes (-8..7) of W [out, in] and one scale per `group_size` input columns (the `DenseQuantized`
int4 grid), for 1 to 16 rows of x.

Layout (`pack_w4`): codes as bytes [out, in/2], byte j of a row holding column 2j in its low nibble and column
2j + 1 in its high one, each as code + 8; scales [out, in/group_size] in the activations' dtype. Plain row-major
bytes, the same on every device.

PyTorch's `_weight_int4pack_mm` (tinygemm) reads its weights at 30-46% of copy bandwidth on the H200 at batch 1
(results/quant_kernel_h200.md); this kernel streams them as `triton_w8` does. A program owns BLOCK_ROWS rows and a
range of columns (split-K). Batch 1 loads [BLOCK_ROWS, GROUPS, group/2] byte tiles (whole groups of a row side by
side), splits each byte into its two codes, multiplies them with x's even and odd columns in float32 and scales each
group's products by its scale as it adds them into a float32 accumulator, summed once at the end. x's columns come
either from one contiguous load split in two (measured: 0.71x tinygemm at batch 1, results/w4_h200.md) or, with
`x_words`, as 32-bit words of two columns indexed like the weight bytes, so that they need no change of layout
(built after the last GPU run: CPU-tested, the tuner times both). Batches 2-16 take
one group a loop step: its codes, interleaved back into column order, go to `tl.dot` against x (zero-padded to 16
rows, float32 accumulation; codes are exact in bf16 and fp16), and the group's scales multiply the sums. Split-K
programs write float32 partials that a torch sum adds in split order.

The launch configuration is chosen per (device, shape, batch, dtype, group size) on first use: every candidate is
checked against a float64 product (a failing one is logged and never used) and the fastest by triton's do_bench is
kept, as `triton_w8` does."""

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
GROUP_SIZES = (32, 64, 128, 256)


@dataclass(frozen=True)
class W4Config:
    """BLOCK_ROWS rows and `groups` scale groups (batch 1; one for batches 2-16) per program and loop step,
    `split_k` programs per row block."""

    block_rows: int = 8
    groups: int = 4
    split_k: int = 1
    num_warps: int = 4
    x_words: bool = False  # batch 1: x read as 32-bit words in the weight bytes' layout (else loaded and split)

    def __str__(self) -> str:
        words = " xw" if self.x_words else ""
        return f"R{self.block_rows}xG{self.groups} split{self.split_k} w{self.num_warps}{words}"


@triton.jit
def _codes_f32(nibbles):
    """Nibbles 0..15 (offset-binary codes) as the float32 codes -8..7 without an int-to-float conversion (16 a clock
    per multiprocessor on sm_90, against 128 float adds: at 4 bits a weight it bounds the kernel well below copy
    bandwidth, results/w4_h200_i2f.md): the bits of 2²³ + v, minus 2²³ + 8."""
    return (nibbles.to(tl.uint32) | 0x4B000000).to(tl.float32, bitcast=True) - 8388616.0


@triton.jit
def _halves_f32(words, FP16: tl.constexpr):
    """The two 16-bit floats of each 32-bit word (x's columns 2j and 2j + 1, little-endian) as float32: for bf16 a
    shift and a mask (its bits are float32's upper half), for fp16 a conversion of each half."""
    bits = words.to(tl.uint32, bitcast=True)
    if FP16:
        even = (bits & 0xFFFF).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
        odd = (bits >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
    else:
        even = (bits << 16).to(tl.float32, bitcast=True)
        odd = (bits & 0xFFFF0000).to(tl.float32, bitcast=True)
    return even, odd


@triton.jit
def w4_kernel(x_ptr, w_ptr, s_ptr, y_ptr, out_features, in_features, batch,
              GROUP: tl.constexpr, BATCH_BLOCK: tl.constexpr, BLOCK_ROWS: tl.constexpr, GROUPS: tl.constexpr,
              SPLIT_K: tl.constexpr, X_WORDS: tl.constexpr, FP16: tl.constexpr, DOT_FLOAT32: tl.constexpr):
    """y [batch, out] (or, for SPLIT_K > 1, this split's float32 partial: y_ptr is then [SPLIT_K, batch, out]) for
    BLOCK_ROWS rows. x [batch, in] contiguous in the scales' dtype (X_WORDS, batch 1: the same memory as uint32
    [in/2]); w bytes [out, in/2]; s [out, in/GROUP]. BATCH_BLOCK 1 (GROUPS groups a step) or 16 (GROUPS must be 1).
    FP16: x is float16 (else bfloat16). DOT_FLOAT32 (the interpreter only) feeds tl.dot float32 operands."""
    pid_rows = tl.program_id(0)
    pid_split = tl.program_id(1)
    HALF: tl.constexpr = GROUP // 2
    STEP: tl.constexpr = GROUPS * GROUP  # columns a loop step
    rows = pid_rows * BLOCK_ROWS + tl.arange(0, BLOCK_ROWS)
    # rows past the end read the last row again (never stored), so the weight loads need no row mask
    safe_rows = tl.minimum(rows, out_features - 1).to(tl.int64)
    n_groups = in_features // GROUP
    k_per_split = tl.cdiv(in_features, SPLIT_K * STEP) * STEP
    k_begin = pid_split * k_per_split
    k_end = tl.minimum(k_begin + k_per_split, in_features)
    j = tl.arange(0, HALF)  # byte within a group
    b = tl.arange(0, BATCH_BLOCK)
    if BATCH_BLOCK == 1:
        g = tl.arange(0, GROUPS)
        t = tl.arange(0, 2)
        w_at = w_ptr + safe_rows[:, None, None] * (in_features // 2) + g[None, :, None] * HALF + j[None, None, :]
        s_at = s_ptr + safe_rows[:, None] * n_groups + g[None, :]
        # X_WORDS: x's column pairs as 32-bit words [GROUPS, HALF], indexed like the weight bytes (so in their
        # layout); otherwise x's columns as [GROUPS, HALF, 2] (one contiguous load), split into even and odd ones
        x_words_at = x_ptr + g[:, None] * HALF + j[None, :]
        x_at = x_ptr + g[:, None, None] * GROUP + 2 * j[None, :, None] + t[None, None, :]
        acc = tl.zeros([BLOCK_ROWS, GROUPS, HALF], dtype=tl.float32)
        for k0 in range(k_begin, k_end, STEP):
            ok = k0 + g * GROUP < k_end  # whole groups: in_features is a multiple of GROUP
            w = tl.load(w_at + k0 // 2, mask=ok[None, :, None], other=0x88, eviction_policy="evict_first")
            scale = tl.load(s_at + k0 // GROUP, mask=ok[None, :], other=0.0).to(tl.float32)
            if X_WORDS:
                words = tl.load(x_words_at + k0 // 2, mask=ok[:, None], other=0, eviction_policy="evict_last")
                x_even, x_odd = _halves_f32(words, FP16)
            else:
                x = tl.load(x_at + k0, mask=ok[:, None, None], other=0.0, eviction_policy="evict_last")
                x_even, x_odd = tl.split(x.to(tl.float32))
            low = _codes_f32(w & 15)
            high = _codes_f32(w >> 4)
            acc += (low * x_even[None, :, :] + high * x_odd[None, :, :]) * scale[:, :, None]
        sums = tl.sum(tl.sum(acc, axis=2), axis=1)[:, None]  # [rows, 1]
    else:
        sums = tl.zeros([BLOCK_ROWS, BATCH_BLOCK], dtype=tl.float32)
        in_batch = (b < batch)[None, :]
        k = tl.arange(0, GROUP)
        w_at = w_ptr + safe_rows[:, None] * (in_features // 2) + j[None, :]
        x_at = x_ptr + b[None, :] * in_features + k[:, None]  # [GROUP, batch]: x transposed
        for k0 in range(k_begin, k_end, GROUP):
            w = tl.load(w_at + k0 // 2, eviction_policy="evict_first")
            x = tl.load(x_at + k0, mask=in_batch, other=0.0, eviction_policy="evict_last")
            scale = tl.load(s_ptr + safe_rows * n_groups + k0 // GROUP).to(tl.float32)
            # the two codes of a byte side by side: [rows, HALF, 2] -> [rows, GROUP] in column order
            codes = tl.reshape(tl.join(_codes_f32(w & 15), _codes_f32(w >> 4)), [BLOCK_ROWS, GROUP])
            if DOT_FLOAT32:  # the interpreter's tl.dot mishandles bfloat16 operands
                part = tl.dot(codes, x.to(tl.float32))
            else:  # codes are exact in bf16 and fp16
                part = tl.dot(codes.to(x_ptr.dtype.element_ty), x)
            sums += part * scale[:, None]
    ptrs = y_ptr + (pid_split * batch + b[None, :]) * out_features + rows[:, None]
    tl.store(ptrs, sums.to(y_ptr.dtype.element_ty), mask=(rows < out_features)[:, None] & (b[None, :] < batch))


def pack_w4(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(bytes [out, in/2], scales [out, in/group] in `dtype`) from int4 codes [out, in] (integers -8..7, any integer
    dtype) and their float scales [out, in/group]."""
    if codes.dim() != 2 or codes.shape[1] % 2:
        raise KernelInputError(f"int4 codes must be [out, in] with an even in; got {tuple(codes.shape)}")
    unsigned = codes.to(torch.int16) + 8
    if int(unsigned.min()) < 0 or int(unsigned.max()) > 15:
        raise KernelInputError("int4 codes must lie in -8..7")
    packed = (unsigned[:, 0::2] | unsigned[:, 1::2] << 4).to(torch.uint8)
    return packed.contiguous(), scales.to(dtype).contiguous()


def unpack_w4(weight: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The dequantized weight [out, in] in `dtype` (code · scale rounded once) from `pack_w4`'s parts."""
    out, half = weight.shape
    group = 2 * half // scales.shape[1]
    codes = torch.stack([(weight & 15).to(torch.int16) - 8, (weight >> 4).to(torch.int16) - 8], dim=-1)
    dense = codes.reshape(out, 2 * half).float() * scales.float().repeat_interleave(group, dim=1)
    return dense.to(dtype)


def check_w4_inputs(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> int:
    """One clear error for what the kernel cannot take; returns the group size."""
    if weight.dtype != torch.uint8 or weight.dim() != 2:
        raise KernelInputError(f"w4_mm needs a uint8 weight [out, in/2] (`pack_w4`); got {weight.dtype} "
                               f"{tuple(weight.shape)}")
    out_features, in_features = weight.shape[0], 2 * weight.shape[1]
    if x.dim() != 2 or x.shape[1] != in_features or not 1 <= x.shape[0] <= MAX_BATCH:
        raise KernelInputError(f"x has shape {tuple(x.shape)}; expected [batch, {in_features}] with batch "
                               f"1..{MAX_BATCH}")
    if x.dtype not in (torch.bfloat16, torch.float16) or scales.dtype != x.dtype:
        raise KernelInputError(f"w4_mm needs x and scales in bf16 or fp16, the same; got {x.dtype} and "
                               f"{scales.dtype}")
    if scales.dim() != 2 or scales.shape[0] != out_features or scales.shape[1] == 0 \
            or in_features % scales.shape[1] or in_features // scales.shape[1] not in GROUP_SIZES:
        raise KernelInputError(f"scales has shape {tuple(scales.shape)}; expected [{out_features}, {in_features} / "
                               f"group size] with a group size of {', '.join(map(str, GROUP_SIZES))}")
    if not (x.device == weight.device == scales.device):
        raise KernelInputError(f"x, weight and scales are on {x.device}, {weight.device}, {scales.device}")
    return in_features // scales.shape[1]


def launch_w4(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, config: W4Config) -> torch.Tensor:
    """y = x·Wᵀ for contiguous x [batch, in] with one configuration."""
    batch = x.shape[0]
    out_features, in_features = weight.shape[0], 2 * weight.shape[1]
    group = in_features // scales.shape[1]
    if config.split_k == 1:
        y = out = torch.empty(batch, out_features, dtype=x.dtype, device=x.device)
    else:
        out = torch.empty(config.split_k, batch, out_features, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(out_features, config.block_rows), config.split_k)
    words = batch == 1 and config.x_words and x.data_ptr() % 4 == 0 and x.stride(0) % 2 == 0  # as int32 words
    w4_kernel[grid](x.view(torch.int32) if words else x, weight, scales, out, out_features, in_features, batch,
                    GROUP=group, BATCH_BLOCK=1 if batch == 1 else DOT_ROWS, BLOCK_ROWS=config.block_rows,
                    GROUPS=config.groups if batch == 1 else 1, SPLIT_K=config.split_k, X_WORDS=words,
                    FP16=x.dtype == torch.float16, DOT_FLOAT32=interpreted(),
                    num_warps=config.num_warps, num_stages=1 if batch == 1 else 2)
    if config.split_k > 1:
        y = out.sum(0).to(x.dtype)
    return y


# batch 1: (rows, bytes a row a step, warps), each step 16 bytes a lane or more; batches 2-16: (rows, warps), one
# group a step, tl.dot needing 16 or more rows
_TILES_ONE = ((8, 512, 4), (16, 256, 4), (4, 1024, 4), (16, 512, 8), (32, 256, 8))
_TILES_DOT = ((16, 4), (32, 4), (64, 4), (32, 8))


def candidate_configs(out_features: int, in_features: int, batch: int, group: int) -> list[W4Config]:
    """Tiles to time for one problem, each with split-K 1 and, where row blocks are few, 2 and 4."""
    configs = []
    if batch == 1:
        tiles = [(rows, max(1, 2 * nbytes // group), warps) for rows, nbytes, warps in _TILES_ONE]
        tiles = [(rows, groups, warps) for rows, groups, warps in tiles if groups & (groups - 1) == 0]
    else:
        tiles = [(rows, 1, warps) for rows, warps in _TILES_DOT]
    for rows, groups, warps in tiles:
        blocks = triton.cdiv(out_features, rows)
        step = groups * group
        for split in (1, 2, 4):
            if split > 1 and (blocks * split > 4096 or in_features < 2 * step * split):
                continue
            # batch 1 both ways of reading x (x_words not yet timed on a GPU: the tuner decides)
            configs += [W4Config(rows, groups, split, warps, words) for words in ((False, True) if batch == 1
                                                                                 else (False,))]
    return configs


_tuner = Tuner("w4_mm")


def float64_reference(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> Float64Reference:
    """x·Wᵀ in float64 with `autotune.Float64Reference`'s bound, W dequantized exactly (code · scale in float64), a
    chunk of rows at a time."""
    def rows(r0: int, r1: int) -> torch.Tensor:
        group = 2 * weight.shape[1] // scales.shape[1]
        part = weight[r0:r1]
        codes = torch.stack([(part & 15).double() - 8, (part >> 4).double() - 8], dim=-1).reshape(r1 - r0, -1)
        return codes * scales[r0:r1].double().repeat_interleave(group, dim=1)

    return Float64Reference.of_rows(x, weight.shape[0], rows)


def tuned_config(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> W4Config:
    """The fastest correct candidate for this problem (device, shape, batch, dtype, group size), checked and timed
    once; under the interpreter the first candidate."""
    group = 2 * weight.shape[1] // scales.shape[1]
    key = (str(x.device), tuple(weight.shape), x.shape[0], str(x.dtype), group)
    return _tuner.config(key, lambda: candidate_configs(weight.shape[0], 2 * weight.shape[1], x.shape[0], group),
                         lambda config: launch_w4(x, weight, scales, config),
                         lambda: float64_reference(x, weight, scales))


def rejected_candidates() -> dict[tuple, dict[W4Config, str]]:
    """For every problem tuned so far: the candidates that failed to compile or to match float64, and why."""
    return _tuner.rejected_candidates()


def w4_mm(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor,
          config: W4Config | None = None) -> torch.Tensor:
    """y = x·Wᵀ for x [batch ≤ 16, in] bf16/fp16 and W as `pack_w4`'s bytes [out, in/2] and scales [out, groups]
    in x's dtype."""
    check_w4_inputs(x, weight, scales)
    x, weight, scales = x.contiguous(), weight.contiguous(), scales.contiguous()  # the tuner runs what launches
    if x.data_ptr() % 4 or x.stride(0) % 2:  # x_words reads x as int32 words: an odd element offset (or row
        x = x.reshape(-1).clone().view(x.shape)  # stride) is copied to fresh, aligned storage
    return launch_w4(x, weight, scales, config or tuned_config(x, weight, scales))
