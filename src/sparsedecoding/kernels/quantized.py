"""Packed N:M weights with quantized kept values, and the dense weight-only quantized baseline.

`PackedNMQ` is the bitmask of `format.py` plus integer codes of the kept values, in the same order as the bf16
`values` (row by row, increasing column), and their scales: W[o, c] = code · scales[o, c // group_size].
- int8: `codes` int8 [out, in·N/M]; `scales` [out, 1] (one per row, group_size = in).
- int4: `codes` uint8 [out, in·N/M/2], two codes a byte, the earlier value in the low nibble, each a two's
  complement −8..7; `scales` [out, in/group_size], groups counted in dense columns. group_size must be a multiple of
  32, so that a mask word never straddles two groups and the kernel loads one scale per word.
Scales are bfloat16: the solvers round scales to 1 (int8) or 5 (int4) significant bits, so they are exact there.

`pack_nm_quantized` builds one from a weight whose kept values lie on the grid (`solvers.sparsegpt(...,
quantize=...)` or `solvers.gptq`); `nmq_spmv` multiplies by it (the Triton kernel on CUDA, the reference on CPU);
`DenseQuantized` is the dense int8 / int4 weight of the dense-quantized baseline; on CUDA, int8 runs our `triton_w8`
kernel (PyTorch's is 10-20x slower than cuBLAS bf16 at batch 1) or the sparse tensor-core kernel's dense mode
(SPARSEDECODING_DENSE_INT8), int4 that dense mode, PyTorch's tinygemm or our `triton_w4` kernel
(SPARSEDECODING_DENSE_INT4)."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from ..errors import KernelInputError, PackingError
from ..solvers import QuantizedCodes, quantization_codes
from .format import _BITS, bitmask_to_bits, check_pattern, pack_nm, popcount32, values_per_word
from .op import dense_int4_setting, dense_int8_setting

log = logging.getLogger(__name__)
_said: set[str] = set()  # what `dense_kernel` has logged (each once): reasons, and its auto choices

QUANTIZED_FORMATS = ("int8", "int4")
CODE_BITS = {"int8": 8, "int4": 4}
SCALE_DTYPE = torch.bfloat16


def code_count(n: int, m: int, in_features: int) -> int:
    """Kept values per row: in·N/M."""
    return in_features // _BITS * values_per_word(n, m)


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """int8 codes −8..7 [rows, 2k] → uint8 [rows, k], code 2j in the low nibble of byte j, code 2j+1 in the high."""
    nibbles = codes.to(torch.int32) & 0xF
    return (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).to(torch.uint8)


def unpack_int4(packed: torch.Tensor) -> torch.Tensor:
    """Inverse of `pack_int4`: uint8 [rows, k] → int8 codes [rows, 2k], sign-extended."""
    pairs = torch.stack([packed.to(torch.int32) & 0xF, packed.to(torch.int32) >> 4], dim=-1)
    return (pairs - ((pairs & 0x8) << 1)).to(torch.int8).reshape(packed.shape[0], -1)


def check_int4_count(quantize: str, n: int, m: int, in_features: int) -> None:
    """PackingError where int4 codes of an N:M row cannot fill whole bytes (two codes a byte)."""
    count = code_count(n, m, in_features)
    if quantize == "int4" and count % 2:
        raise PackingError(f"int4 packs two codes a byte: a {n}:{m} row of {in_features} columns keeps {count} "
                           "values, an odd count; use a pattern that keeps an even number")


@dataclass(frozen=True)
class PackedNMQ:
    """An N:M sparse weight of `shape` [out, in] with `quantize` ("int8" or "int4") codes of its kept values, their
    `scales` and the `bitmask` of `PackedNM` (see the module docstring for the layout)."""

    codes: torch.Tensor
    scales: torch.Tensor
    bitmask: torch.Tensor
    n: int
    m: int
    shape: tuple[int, int]
    quantize: str
    group_size: int

    def __post_init__(self) -> None:
        check_pattern(self.n, self.m)
        out, in_features = self.shape
        if self.quantize not in QUANTIZED_FORMATS:
            raise PackingError(f"quantize = {self.quantize!r} is not a packed format; use int8 or int4")
        if self.group_size <= 0 or self.group_size % _BITS or in_features % self.group_size:
            raise PackingError(f"group_size {self.group_size} must be a multiple of 32 that divides in_features "
                               f"{in_features}")
        if self.quantize == "int8" and self.group_size != in_features:
            raise PackingError(f"int8 has one scale per row: group_size must be in_features {in_features}, got "
                               f"{self.group_size}")
        if self.bitmask.dtype != torch.int32 or in_features % _BITS \
                or tuple(self.bitmask.shape) != (out, in_features // _BITS):
            raise PackingError(f"bitmask {self.bitmask.dtype} {tuple(self.bitmask.shape)} does not fit weight shape "
                               f"{self.shape} (expected int32 ({out}, {in_features // _BITS}))")
        count = code_count(self.n, self.m, in_features)
        check_int4_count(self.quantize, self.n, self.m, in_features)
        expected = (torch.int8, (out, count)) if self.quantize == "int8" else (torch.uint8, (out, count // 2))
        if (self.codes.dtype, tuple(self.codes.shape)) != expected:
            raise PackingError(f"codes {self.codes.dtype} {tuple(self.codes.shape)} do not fit a {self.pattern} "
                               f"{self.quantize} weight of shape {self.shape} (expected {expected[0]} {expected[1]})")
        if self.scales.dtype != SCALE_DTYPE or tuple(self.scales.shape) != (out, in_features // self.group_size):
            raise PackingError(f"scales {self.scales.dtype} {tuple(self.scales.shape)} do not fit: expected "
                               f"bfloat16 ({out}, {in_features // self.group_size})")
        if not (self.codes.device == self.scales.device == self.bitmask.device):
            raise PackingError(f"codes on {self.codes.device}, scales on {self.scales.device}, bitmask on "
                               f"{self.bitmask.device}")

    @property
    def pattern(self) -> str:
        return f"{self.n}:{self.m}"

    def to(self, device: torch.device | str) -> PackedNMQ:
        return PackedNMQ(self.codes.to(device), self.scales.to(device), self.bitmask.to(device), self.n, self.m,
                         self.shape, self.quantize, self.group_size)

    def kept_codes(self) -> torch.Tensor:
        """int8 [out, in·N/M]: the code of every kept value, in storage order."""
        return self.codes if self.quantize == "int8" else unpack_int4(self.codes)

    def dense_codes(self) -> torch.Tensor:
        """float32 [out, in]: the code of every kept value at its column, zeros elsewhere."""
        keep = bitmask_to_bits(self.bitmask)
        codes = torch.zeros(keep.shape, dtype=torch.float32, device=keep.device)
        codes.masked_scatter_(keep, self.kept_codes().to(torch.float32))
        return codes

    def to_dense(self, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        """W [out, in] in `dtype`: code·scale (computed in float32, exact) at kept columns, zeros elsewhere."""
        scales = self.scales.to(torch.float32).repeat_interleave(self.group_size, dim=1)
        return (self.dense_codes() * scales).to(dtype)

    def kept_values(self) -> torch.Tensor:
        """float32 [out, in·N/M]: the dequantized kept values in storage order, what `PackedNM.values` would hold."""
        return self.to_dense(torch.float32)[bitmask_to_bits(self.bitmask)].view(self.shape[0], -1)

    def check_popcounts(self) -> None:
        """Raise PackingError unless every mask word has exactly 32·N/M set bits (what the kernel relies on)."""
        bad = (popcount32(self.bitmask) != values_per_word(self.n, self.m)).nonzero()
        if len(bad):
            row, word = bad[0].tolist()
            raise PackingError(f"mask word ({row}, {word}) does not have exactly {values_per_word(self.n, self.m)} "
                               f"set bits; repack the weight with pack_nm_quantized")

    def state_dict(self, prefix: str) -> dict[str, torch.Tensor]:
        """Tensors `{prefix}.codes`, `{prefix}.scales` and `{prefix}.bitmask` for a safetensors file."""
        return {f"{prefix}.codes": self.codes, f"{prefix}.scales": self.scales, f"{prefix}.bitmask": self.bitmask}

    @classmethod
    def from_state_dict(cls, tensors: dict[str, torch.Tensor], prefix: str, n: int, m: int, shape: tuple[int, int],
                        quantize: str, group_size: int) -> PackedNMQ:
        """Inverse of `state_dict`; checks shapes and popcounts since the tensors come from a file."""
        names = [f"{prefix}.{part}" for part in ("codes", "scales", "bitmask")]
        missing = [name for name in names if name not in tensors]
        if missing:
            raise PackingError(f"missing tensors {missing} for quantized packed weight {prefix!r}")
        packed = cls(*(tensors[name] for name in names), n, m, tuple(shape), quantize, group_size)
        packed.check_popcounts()
        return packed


# int4 scale groups PyTorch's dense int4 kernel (`_weight_int4pack_mm`, CPU and CUDA) takes
DENSE_INT4_GROUP_SIZES = (32, 64, 128, 256)


def check_dense_quantization(quantize: str, group_size: int) -> None:
    """PackingError unless a dense `quantize` weight with `group_size` columns a scale (int4) is one the engine's
    dense int4 / int8 kernels run: int4 takes a group size of DENSE_INT4_GROUP_SIZES only."""
    if quantize == "int4" and group_size not in DENSE_INT4_GROUP_SIZES:
        raise PackingError(f"int4 group_size {group_size!r}: the dense int4 kernel takes "
                           f"{', '.join(map(str, DENSE_INT4_GROUP_SIZES))}; 128 is the default")


def check_packed_quantization(quantize: str, group_size: int) -> None:
    """PackingError unless `quantize` is int8 or int4 and, for int4, `group_size` a positive multiple of 32."""
    if quantize not in QUANTIZED_FORMATS:
        raise PackingError(f"quantize = {quantize!r} is not a packed format; use int8 or int4")
    if quantize == "int4" and (not isinstance(group_size, int) or group_size <= 0 or group_size % _BITS):
        raise PackingError(f"int4 group_size {group_size!r} must be a positive multiple of 32 for the packed format "
                           f"(a mask word must not straddle two groups); 128 is the default")


def pack_nm_quantized(weight: torch.Tensor, n: int, m: int, quantize: str, group_size: int = 128) -> PackedNMQ:
    """Pack an N:M sparse weight whose values lie on a `quantize` grid (int8: one scale per row, `group_size`
    ignored; int4: one per `group_size` columns). The kept columns are `pack_nm`'s (every nonzero, then the first
    zeros of a short group); codes and scales come from `solvers.quantization_codes`, so the packed weight
    dequantizes to exactly `weight`. Raises PackingError for what `pack_nm` refuses or an int4 group size that is
    not a multiple of 32, QuantizationError for a weight off the grid."""
    check_packed_quantization(quantize, group_size)
    packed = pack_nm(weight, n, m)
    check_int4_count(quantize, n, m, weight.shape[1])
    grid = quantization_codes(weight, quantize, group_size)
    keep = bitmask_to_bits(packed.bitmask)
    codes = grid.codes[keep].view(weight.shape[0], -1)
    if quantize == "int4":
        codes = pack_int4(codes)
    return PackedNMQ(codes, grid.scales.to(SCALE_DTYPE), packed.bitmask, n, m, packed.shape, quantize,
                     grid.group_size)


def nmq_spmv_reference(x: torch.Tensor, packed: PackedNMQ) -> torch.Tensor:
    """y = x·Wᵀ with W dequantized exactly, products summed in float32, the result in x's dtype."""
    return (x.float() @ packed.to_dense(torch.float32).T).to(x.dtype)


def nmq_spmv(x: torch.Tensor, packed: PackedNMQ) -> torch.Tensor:
    """y[b, o] = Σ_i W[o, i]·x[b, i] for x [in] or [b, in], b ≤ 16, bf16/fp16 activations, fp32 sums, output in
    x's dtype. On CUDA the Triton kernel (`triton_nmq`) dequantizes the codes in registers; with
    SPARSEDECODING_KERNEL=cuda a 2:4 weight runs the tensor-core kernel instead (`cuda_mma.nmq_mm_cuda`, checked
    once per problem against float64, on sparse tensor cores with SPARSEDECODING_SPARSE_MMA=1; `auto` keeps Triton
    until that kernel is measured); on CPU the reference."""
    from .op import MAX_BATCH, check_kernel_setting, kernel_setting

    if x.dtype not in (torch.bfloat16, torch.float16):
        raise KernelInputError(f"x is {x.dtype}; nmq_spmv takes bfloat16 or float16 activations")
    if x.device != packed.codes.device:
        raise KernelInputError(f"x on {x.device} but the packed weight on {packed.codes.device}; move them to one "
                               "device")
    if x.dim() not in (1, 2) or x.shape[-1] != packed.shape[1] or not 1 <= x.numel() // packed.shape[1] <= MAX_BATCH:
        raise KernelInputError(f"x has shape {tuple(x.shape)}; expected [{packed.shape[1]}] or [batch, "
                               f"{packed.shape[1]}] with batch 1..{MAX_BATCH}")
    if x.device.type != "cuda":
        return nmq_spmv_reference(x, packed)
    if not (packed.codes.is_contiguous() and packed.scales.is_contiguous() and packed.bitmask.is_contiguous()):
        raise KernelInputError("nmq_spmv's kernels read the packed codes, scales and bitmask row-major: pass "
                               "contiguous parts (PackedNMQ(codes.contiguous(), ...))")
    setting = kernel_setting()
    check_kernel_setting(setting)
    if setting == "cuda":
        return _nmq_cuda(x.contiguous(), packed)
    from .triton_nmq import nmq_spmv_triton

    return nmq_spmv_triton(x.contiguous(), packed)


_cuda_launches: dict[tuple, object] = {}  # checked `cuda_mma.CodesLaunch` per problem


def _nmq_cuda(x: torch.Tensor, packed: PackedNMQ) -> torch.Tensor:
    """The tensor-core kernel on a 2:4 quantized weight; its first run per problem (device, shape, batch, format,
    dtype) is checked against a float64 product, and a mismatch raises (a kernel bug is never used)."""
    from .cuda_mma import CodesLaunch
    from .op import KERNEL_SETTING, sparse_mma_setting

    key = (str(x.device), packed.shape, packed.n, packed.m, tuple(x.shape), packed.quantize, packed.group_size,
           str(x.dtype))
    launch = _cuda_launches.get(key)
    if launch is None:
        from .autotune import output_error

        if torch.cuda.is_current_stream_capturing():
            raise KernelInputError(f"{KERNEL_SETTING}=cuda: the tensor-core kernel meets {packed.pattern} "
                                   f"{packed.quantize} {packed.shape} at batch {x.numel() // packed.shape[1]} for the "
                                   "first time inside CUDA-graph capture; run it once eagerly first (it is checked "
                                   "against float64 then)")
        try:
            launch = CodesLaunch(x, packed, sparse_mma=sparse_mma_setting())
        except KernelInputError as exc:
            raise KernelInputError(f"{KERNEL_SETTING}=cuda, but {exc}; set {KERNEL_SETTING}=auto or triton") from None
        y = launch(x, packed.codes, packed.scales, packed.bitmask)
        error = output_error(y.view(-1, packed.shape[0]), x.view(-1, packed.shape[1]), packed.kept_values(),
                             packed.bitmask)
        if not error <= 1:
            raise RuntimeError(f"the tensor-core kernel's output on a {packed.pattern} {packed.quantize} weight "
                               f"{packed.shape} is off by {error:.3g} x the float64 bound: a kernel bug, or scales "
                               "with more significant bits than the solvers write (code·scale must be exact in x's "
                               f"dtype); unset {KERNEL_SETTING} to use the Triton kernel")
        _cuda_launches[key] = launch
    return launch(x, packed.codes, packed.scales, packed.bitmask)


def tinygemm_refusal(out: int, in_features: int, device: torch.device, inner_k_tiles: int = 8) -> str | None:
    """Why tinygemm's int4 layout cannot hold an [out, in_features] weight on `device`, or None: out_features must be
    a multiple of 16 (`_convert_weight_to_int4pack_for_cpu` and the CUDA layout), and on CUDA in_features one of
    16 x inner_k_tiles."""
    if out % 16:
        return f"out_features a multiple of 16, not {out}"
    if device.type == "cuda" and in_features % (16 * inner_k_tiles):
        return f"in_features a multiple of {16 * inner_k_tiles} on CUDA, not {in_features}"
    return None


@dataclass(frozen=True)
class DenseQuantized:
    """A dense weight [out, in] on a `quantize` grid, in the layout of the kernel that serves it (`dense_kernel`,
    chosen when it is built: SPARSEDECODING_DENSE_INT8 / _INT4, both "auto" by default):
    sp24 (int8 or int4): the sparse tensor-core kernel's dense mode (`sp24.tile_dense`), the same on every device,
    `weight` its tiled codes (uint8, flat) and `scales` its row scales (int8, bfloat16 [out]) or tiled group scales
    (int4, bfloat16, flat);
    int8 otherwise: `weight` int8 [out, in], `scales` [out] in the activations' dtype (`_weight_int8pack_mm`'s
    layout, which `triton_w8` reads);
    int4 under triton: `triton_w4`'s layout, the same on every device, `weight` uint8 [out, in/2] and `scales`
    [out, in/group_size] in the activations' dtype;
    int4 under tinygemm: `weight` the output of `_convert_weight_to_int4pack` (`_for_cpu` on CPU: the layouts
    differ), `scales` the [in/group_size, out, 2] scale-and-zero tensor of `_weight_int4pack_mm`, whose
    dequantization is (q − 8)·scale + zero with q = code + 8 and zero = 0 for our symmetric grids.
    `dense_quantized_mm` tells them apart by rank: a flat weight is sp24's; int4 scales of rank 2 triton_w4's, of
    rank 3 tinygemm's."""

    weight: torch.Tensor
    scales: torch.Tensor
    quantize: str
    group_size: int
    shape: tuple[int, int]

    @classmethod
    def from_codes(cls, grid: QuantizedCodes, dtype: torch.dtype = torch.bfloat16,
                   inner_k_tiles: int = 8) -> DenseQuantized:
        """From `solvers.quantization_codes` output, on its device. `inner_k_tiles` is the int4 kernel's K tiling
        (2, 4 or 8; `_convert_weight_to_int4pack` checks that in_features fits it)."""
        out, in_features = grid.codes.shape
        kernel = dense_kernel(grid, dtype)
        if kernel == "sp24":
            if dtype != torch.bfloat16:
                setting = "SPARSEDECODING_DENSE_INT8" if grid.quantize == "int8" else "SPARSEDECODING_DENSE_INT4"
                raise KernelInputError(f"{setting}=sp24 runs bfloat16 activations; got {dtype}")
            from .sp24 import tile_dense

            tiled = tile_dense(grid.codes, grid.scales, grid.quantize, grid.group_size)
            scales = tiled.row_scales if grid.quantize == "int8" else tiled.scales
            return cls(tiled.a, scales, grid.quantize, grid.group_size, (out, in_features))
        if grid.quantize == "int8":
            return cls(grid.codes.contiguous(), grid.scales[:, 0].to(dtype), "int8", in_features, (out, in_features))
        if kernel == "triton":
            from .triton_w4 import pack_w4

            weight, scales = pack_w4(grid.codes, grid.scales, dtype)
            return cls(weight, scales, "int4", grid.group_size, (out, in_features))
        refusal = tinygemm_refusal(out, in_features, grid.codes.device, inner_k_tiles)
        if refusal is not None:
            raise PackingError(f"tinygemm's int4 layout takes {refusal}: set SPARSEDECODING_DENSE_INT4=triton (or "
                               "auto, which picks it for such shapes)")
        unsigned = grid.codes.to(torch.int32) + 8
        if grid.codes.device.type == "cuda":  # tinygemm takes uint8 pairs with the first value in the high nibble
            pairs = (unsigned[:, 0::2] << 4 | unsigned[:, 1::2]).to(torch.uint8)
            weight = torch.ops.aten._convert_weight_to_int4pack(pairs.contiguous(), inner_k_tiles)
        else:
            weight = torch.ops.aten._convert_weight_to_int4pack_for_cpu(unsigned.contiguous(), inner_k_tiles)
        scale_and_zero = torch.stack([grid.scales.T, torch.zeros_like(grid.scales.T)], dim=-1).to(dtype)
        return cls(weight, scale_and_zero.contiguous(), "int4", grid.group_size, (out, in_features))

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """y = x·Wᵀ for x [b, in] in the scales' dtype."""
        return dense_quantized_mm(x, self.weight, self.scales, self.quantize, self.group_size)

    def to_dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight [out, in] in `dtype`, on the weight's device: each code times its scale, exact where `dtype`
        holds the grid's values (the dtype it was built from). tinygemm's layout has no reader of its own, so its
        weight comes from multiplying identity rows through the layout's own kernel (x·Wᵀ with x = I)."""
        out, in_features = self.shape
        if self.layout == "sp24":
            from . import sp24

            tiled = sp24.dense_from_parts(self.weight, self.scales, in_features, self.quantize, self.group_size)
            return sp24.to_dense(tiled)[:out].to(dtype)
        if self.quantize == "int8":
            return (self.weight.float() * self.scales.float()[:, None]).to(dtype)
        if self.layout == "w4":
            from .triton_w4 import unpack_w4

            return unpack_w4(self.weight, self.scales, dtype)
        product = (torch.ops.aten._weight_int4pack_mm if self.weight.device.type == "cuda"
                   else torch.ops.aten._weight_int4pack_mm_for_cpu)
        rows = []
        for start in range(0, in_features, 1024):  # 1024 rows of I at a time: the transposed weight's rows
            count = min(1024, in_features - start)
            eye = torch.zeros(count, in_features, dtype=self.scales.dtype, device=self.weight.device)
            eye[:, start:start + count].fill_diagonal_(1)
            rows.append(product(eye, self.weight, self.group_size, self.scales))
        return torch.cat(rows).T.contiguous().to(dtype)

    @property
    def layout(self) -> str:
        """"w4" for `triton_w4`'s int4 layout, "sp24" for the sparse tensor-core kernel's dense one (int8 or int4),
        "torch" for PyTorch's layouts (and triton_w8's, PyTorch's int8 one)."""
        if self.quantize == "int8":
            return "sp24" if self.weight.dim() == 1 else "torch"
        if self.scales.dim() < 3:
            return "w4" if self.scales.dim() == 2 else "sp24"
        return "torch"


@torch.library.custom_op("sparsedecoding::w4_mm", mutates_args=())
def _w4_mm_op(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    from .triton_w4 import w4_mm

    return w4_mm(x, weight, scales)


@_w4_mm_op.register_fake
def _w4_mm_fake(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


@torch.library.custom_op("sparsedecoding::w8_mm", mutates_args=())
def _w8_mm_op(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    from .triton_w8 import w8_mm

    return w8_mm(x, weight, scales)


@_w8_mm_op.register_fake
def _w8_mm_fake(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return x.new_empty((x.shape[0], weight.shape[0]))


def dense_kernel(grid: QuantizedCodes, dtype: torch.dtype) -> str:
    """The kernel a dense weight of `grid` built for `dtype` activations runs: int8 "sp24" or "triton"
    (SPARSEDECODING_DENSE_INT8); int4 "sp24", "tinygemm" or "triton" (SPARSEDECODING_DENSE_INT4). Under "auto" (the
    default of both): sp24 for a bf16 weight on a CUDA device where that kernel loads and whose shape (and int4
    group size) it takes; triton for int8 and tinygemm for int4 otherwise."""
    int8 = grid.quantize == "int8"
    kernel = dense_int8_setting() if int8 else dense_int4_setting()
    if kernel != "auto":
        return kernel
    out, in_features = grid.codes.shape
    group = grid.group_size
    fits = (dtype == torch.bfloat16 and grid.codes.device.type == "cuda" and out % 16 == 0 and in_features % 16 == 0
            and (int8 or group % 16 == 0 and group & (group - 1) == 0))
    if fits:
        from . import cuda_mma, sp24

        try:
            sp24.load()
        except cuda_mma.CudaKernelUnavailableError as exc:
            fits = False
            if str(exc) not in _said:
                _said.add(str(exc))
                log.warning("dense int8 / int4 weights (DENSE_INT8 / DENSE_INT4 = auto) use triton_w8 / tinygemm: "
                            "the sparse tensor-core kernel is unavailable here (%s)", exc)
    tinygemm = tinygemm_refusal(out, in_features, grid.codes.device) is None
    chosen = "sp24" if fits else ("triton" if int8 or not tinygemm else "tinygemm")
    said = f"{grid.quantize} {chosen}"
    if said not in _said:
        _said.add(said)
        log.info("dense %s weights: %s (SPARSEDECODING_DENSE_%s=auto)", grid.quantize,
                 "the sparse tensor-core kernel's dense mode" if fits else chosen, grid.quantize.upper())
    return chosen


def dense_quantized_mm(x: torch.Tensor, weight: torch.Tensor, scales: torch.Tensor, quantize: str,
                       group_size: int) -> torch.Tensor:
    """y = x·Wᵀ for x [b, in] in the scales' dtype and W given as the parts of a `DenseQuantized`. In the sparse
    tensor-core kernel's dense layout (a 1-d weight; int8 or int4) that kernel up to 16 rows on CUDA (the op
    `sparsedecoding::sp24_mm`, tuned on its first, eager call) and the dequantized weight otherwise. Dense int8 in
    PyTorch's layout on CUDA runs our `triton_w8` kernel up to 16 rows (the op `sparsedecoding::w8_mm`, opaque to
    torch.compile and tuned on its first, eager call); int4 in `triton_w4`'s layout (2-d scales) our `triton_w4`
    kernel up to 16 rows on CUDA (the op `sparsedecoding::w4_mm`) and the dequantized weight otherwise, int4 in
    PyTorch's layout its tinygemm `_weight_int4pack_mm`."""
    if weight.dim() == 1:  # the sparse tensor-core kernel's dense layout (int8 or int4)
        from . import sp24
        from .op import MAX_BATCH

        w = sp24.dense_from_parts(weight, scales, x.shape[-1], quantize, group_size)
        if x.device.type == "cuda" and 0 < x.shape[0] <= MAX_BATCH:
            if x.dtype != torch.bfloat16:
                raise KernelInputError(f"x is {x.dtype}; this dense {quantize} weight is laid out for the sparse "
                                       "tensor-core kernel, which takes bfloat16 activations (build it for "
                                       f"{x.dtype} instead: DenseQuantized.from_codes(..., {x.dtype}))")
            return torch.ops.sparsedecoding.sp24_mm(x, w.a, None, w.scales, w.row_scales, w.shape[0], w.shape[1],
                                                    w.code, w.steps, w.gk_shift, w.groups, False, None, None, True)
        return torch.nn.functional.linear(x, sp24.to_dense(w).to(x.dtype))
    if quantize == "int8":
        if x.device.type == "cuda":  # our kernel up to 16 rows (PyTorch's runs at 0.05-0.09x cuBLAS there)
            from .op import MAX_BATCH

            if 0 < x.shape[0] <= MAX_BATCH:
                return torch.ops.sparsedecoding.w8_mm(x, weight, scales)
            return torch.nn.functional.linear(x, weight.to(x.dtype)) * scales
        return torch.ops.aten._weight_int8pack_mm(x, weight, scales)
    if scales.dim() == 2:  # triton_w4's layout
        from .op import MAX_BATCH

        if x.device.type == "cuda" and 0 < x.shape[0] <= MAX_BATCH:
            return torch.ops.sparsedecoding.w4_mm(x, weight, scales)
        from .triton_w4 import unpack_w4

        return torch.nn.functional.linear(x, unpack_w4(weight, scales, x.dtype))
    if x.device.type == "cuda":
        return torch.ops.aten._weight_int4pack_mm(x, weight, group_size, scales)
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, weight, group_size, scales)
