"""Linear layers for quantized weights, as the engine runs them: `QuantizedPackedLinear` holds an N:M weight with
int8 / int4 kept values (`PackedNMQ`) and decodes with `nmq_spmv`; `DenseQuantizedLinear` holds a dense int8 / int4
weight (`DenseQuantized`) and multiplies with `dense_quantized_mm` (our int8 and int4 kernels, or PyTorch's int4), the
baseline the sparse one is measured against.

`nmq_spmv` is also registered as the torch custom op `sparsedecoding::nmq_spmv`, traced instead of the Python call
while torch.compile runs: the compiler sees only its output shape, and the op runs unchanged inside a CUDA graph
(the Triton kernel is tuned on the first call, which the engine makes in its warm-up before capture)."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import KernelInputError
from .format import apply_keeping_dtypes
from .linear import check_layer_parts
from .op import MAX_BATCH
from .quantized import DenseQuantized, PackedNMQ, dense_quantized_mm, nmq_spmv


@torch.library.custom_op("sparsedecoding::nmq_spmv", mutates_args=())
def _nmq_spmv_op(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, bitmask: torch.Tensor, n: int, m: int,
                 quantize: str, group_size: int) -> torch.Tensor:
    shape = (bitmask.shape[0], bitmask.shape[1] * 32)
    return nmq_spmv(x, PackedNMQ(codes, scales, bitmask, n, m, shape, quantize, group_size))


@_nmq_spmv_op.register_fake
def _nmq_spmv_fake(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor, bitmask: torch.Tensor, n: int, m: int,
                   quantize: str, group_size: int) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], bitmask.shape[0]))


class QuantizedPackedLinear(torch.nn.Module):
    """y = x·Wᵀ + bias for x [..., in], W [out, in] held as the buffers `codes`, `scales` and `bitmask` of a
    `PackedNMQ`. Up to 16 rows of x (decoding) run `nmq_spmv`, which dequantizes in registers; more rows (prefill)
    multiply by W dequantized for the call, as `PackedLinear` does with its values."""

    def __init__(self, packed: PackedNMQ, bias: torch.Tensor | None = None):
        super().__init__()
        check_layer_parts(packed, PackedNMQ, bias, "QuantizedPackedLinear", "kernels.quantized.pack_nm_quantized")
        self.n, self.m, self.quantize, self.group_size = packed.n, packed.m, packed.quantize, packed.group_size
        self.out_features, self.in_features = packed.shape
        self.register_buffer("codes", packed.codes)
        self.register_buffer("scales", packed.scales)
        self.register_buffer("bitmask", packed.bitmask)
        self.register_buffer("bias", bias)

    def _apply(self, fn, recurse=True):
        """`model.half()` / `.float()` convert the bias with the activations; the scales stay bfloat16, the format's
        (held aside, not converted and back, which would round tiny scales through float16)."""
        apply_keeping_dtypes(self, ("scales",), fn, lambda: super(QuantizedPackedLinear, self)._apply(fn, recurse))
        return self

    @property
    def packed(self) -> PackedNMQ:
        return PackedNMQ(self.codes, self.scales, self.bitmask, self.n, self.m,
                         (self.out_features, self.in_features), self.quantize, self.group_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() == 0 or x.shape[-1] != self.in_features:
            raise KernelInputError(f"x has shape {tuple(x.shape)}; this QuantizedPackedLinear takes "
                                   f"[..., {self.in_features}]")
        rows = x.numel() // self.in_features
        x2 = x.reshape(rows, self.in_features)
        if rows > MAX_BATCH or rows == 0:  # prefill, or no rows (the kernel takes 1..MAX_BATCH)
            y = F.linear(x2, self.packed.to_dense(x.dtype))
        elif torch.compiler.is_compiling():
            y = torch.ops.sparsedecoding.nmq_spmv(x2.contiguous(), self.codes, self.scales, self.bitmask, self.n,
                                                  self.m, self.quantize, self.group_size)
        else:
            y = nmq_spmv(x2.contiguous(), self.packed)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.quantize == "int4" else ""
        return (f"in_features={self.in_features}, out_features={self.out_features}, pattern={self.n}:{self.m}, "
                f"{self.quantize}{group}")


class DenseQuantizedLinear(torch.nn.Module):
    """y = x·Wᵀ + bias for x [..., in] in the scales' dtype, W [out, in] a `DenseQuantized` weight held as the
    buffers `qweight` and `scales` (`DenseQuantized`'s layouts). The codes are
    not named `weight`, so that a transformers checkpoint saved from such a model cannot load them as a float
    weight (its reload reports lm_head.weight missing instead). tinygemm's int4 layout is the device's (CPU and CUDA
    differ): build such a module on the device it runs on."""

    def __init__(self, dense: DenseQuantized, bias: torch.Tensor | None = None):
        super().__init__()
        self.quantize, self.group_size = dense.quantize, dense.group_size
        self.out_features, self.in_features = dense.shape
        # PyTorch's int4 layouts differ between CPU and CUDA; triton_w4's and sp24's are the same on every device
        self.layout_device = dense.weight.device.type if dense.layout == "torch" else None
        self.register_buffer("qweight", dense.weight)
        self.register_buffer("scales", dense.scales)
        self.register_buffer("bias", bias)

    @property
    def layout(self) -> str:
        """`DenseQuantized.layout` of the held weight."""
        return DenseQuantized(self.qweight, self.scales, self.quantize, self.group_size,
                              (self.out_features, self.in_features)).layout

    def to_dense(self, dtype: torch.dtype) -> torch.Tensor:
        """The weight [out, in] in `dtype` (`DenseQuantized.to_dense`), on the module's device; a tinygemm layout
        moved off the device it was built for is read on that device (its kernel there knows it)."""
        device = self.qweight.device
        built = torch.device(self.layout_device) if self.layout_device not in (None, device.type) else device
        dense = DenseQuantized(self.qweight.to(built), self.scales.to(built), self.quantize, self.group_size,
                               (self.out_features, self.in_features))
        return dense.to_dense(dtype).to(device)

    def _apply(self, fn, recurse=True):
        """In the sparse tensor-core kernel's dense layout the scales are bfloat16, the kernel's, whatever
        `model.half()` / `.float()` do to the activations (that kernel then refuses other activations with one
        error; prefill rows multiply by the dequantized weight in x's dtype). The other layouts' scales follow the
        activations' dtype."""
        held = ("scales",) if self.layout == "sp24" else ()
        apply_keeping_dtypes(self, held, fn, lambda: super(DenseQuantizedLinear, self)._apply(fn, recurse))
        return self

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.quantize == "int4" and self.layout_device not in (None, x.device.type):
            raise KernelInputError(f"this int4 weight was laid out for {self.layout_device}, not {x.device.type}: "
                                   "build it (sparsify, load_packed, the engine) on the device it runs on")
        rows = x.numel() // self.in_features
        y = dense_quantized_mm(x.reshape(rows, self.in_features).contiguous(), self.qweight, self.scales,
                               self.quantize, self.group_size)
        if self.bias is not None:
            y = y + self.bias
        return y.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        group = f", group_size={self.group_size}" if self.quantize == "int4" else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, dense {self.quantize}{group}"
