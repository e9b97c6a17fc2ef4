"""A linear layer whose weight is stored packed N:M."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import KernelInputError
from .format import PackedNM, dense_from_parts, pack_nm
from .op import MAX_BATCH, spmv


def check_layer_parts(packed, kind: type, bias, layer: str, build: str) -> None:
    """KernelInputError, when a packed layer is built, for a weight that is not a `kind` or a bias that is not a
    tensor [out] (the first call would fail deep in the kernel or the addition)."""
    if not isinstance(packed, kind):
        raise KernelInputError(f"{layer} takes a {kind.__name__}; got {type(packed).__name__} (a dense weight: {build})")
    if bias is not None and (not isinstance(bias, torch.Tensor) or tuple(bias.shape) != (packed.shape[0],)):
        shape = tuple(bias.shape) if isinstance(bias, torch.Tensor) else type(bias).__name__
        raise KernelInputError(f"{layer}'s bias must be a tensor [{packed.shape[0]}] (one value an output row); got "
                               f"{shape}")


class PackedLinear(torch.nn.Module):
    """y = x·Wᵀ + bias for x [..., in], with W [out, in] held as the buffers `values` and `bitmask` of a
    PackedNM. Up to 16 rows of x (decoding) run the sparse kernel `nm_spmv`, which reads 1.125 instead of 2 bytes
    per weight. More rows (prefill) multiply by W densified for the call: at that size the product is
    compute-bound, cuBLAS on the dense weight is faster than a vector kernel, and the dense copy is temporary,
    so the layer keeps only the packed bytes.

    `keep_dense_copy(rows)` trades memory for speed at wider batches: the layer then also holds W dense and
    multiplies `rows` or more rows of x by it with cuBLAS (2:4 stays at least as fast as cuBLAS through about 11 rows
    on the tensor-core kernel, 16:32 is slower from 3 rows on: benchmarks/results/cuda_dispatch_h200.md)."""

    def __init__(self, packed: PackedNM, bias: torch.Tensor | None = None):
        super().__init__()
        check_layer_parts(packed, PackedNM, bias, "PackedLinear", "PackedLinear.from_dense(weight, n, m)")
        self.n, self.m = packed.n, packed.m
        self.out_features, self.in_features = packed.shape
        self.register_buffer("values", packed.values)
        self.register_buffer("bitmask", packed.bitmask)
        self.register_buffer("bias", bias)
        self.register_buffer("dense", None, persistent=False)  # a cache of the packed weight, never saved
        self.dense_from_rows: int | None = None

    def keep_dense_copy(self, from_rows: int) -> None:
        """Hold W dense as well, and use it (cuBLAS) whenever x has `from_rows` rows or more."""
        if type(from_rows) is not int:
            raise KernelInputError(f"a dense copy from_rows must be a whole number of rows; got {from_rows!r}")
        if from_rows < 2:
            raise KernelInputError(f"dense copy from {from_rows} rows of x: the packed kernel would never run; "
                                   "use 2 or more")
        self.dense = dense_from_parts(self.values, self.bitmask)
        self.dense_from_rows = from_rows

    def _load_from_state_dict(self, *args, **kwargs):
        super()._load_from_state_dict(*args, **kwargs)
        if self._buffers["dense"] is not None:  # the copy follows the loaded weight
            self.dense = dense_from_parts(self.values, self.bitmask)

    @classmethod
    def from_dense(cls, weight: torch.Tensor, n: int, m: int, bias: torch.Tensor | None = None) -> PackedLinear:
        """Pack an N:M sparse dense weight (see `pack_nm` for what is accepted)."""
        return cls(pack_nm(weight, n, m), bias)

    @property
    def packed(self) -> PackedNM:
        return PackedNM(self.values, self.bitmask, self.n, self.m, (self.out_features, self.in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # The eager call is host-bound at 4096 rows, so this path is kept lean: buffers are read from their dict
        # (Module.__getattr__ costs about 0.7 us a buffer) and a 2-D x goes to the kernel without a reshape and a
        # view back (about 2 us); see benchmarks/KERNEL_NOTES.md, "Eager host cost of PackedLinear".
        buffers = self._buffers
        shape = x.shape
        flat = len(shape) == 2 and shape[1] == self.in_features
        if not flat and (len(shape) == 0 or shape[-1] != self.in_features):
            raise KernelInputError(f"x has shape {tuple(shape)}; this PackedLinear takes [..., {self.in_features}]")
        x2 = x if flat else x.reshape(-1, self.in_features)
        rows = x2.shape[0]
        dense = buffers["dense"]
        if dense is not None and rows >= self.dense_from_rows:
            if x2.dtype != dense.dtype or x2.device != dense.device:  # the kernel's own errors, for the copy too
                raise KernelInputError(f"x is {x2.dtype} on {x2.device} but this PackedLinear's weights are "
                                       f"{dense.dtype} on {dense.device}; cast or move x to match")
            y = F.linear(x2, dense)
        elif 0 < rows <= MAX_BATCH:  # no rows: the dense product below returns the empty result
            y = spmv(x2.contiguous(), buffers["values"], buffers["bitmask"], self.n, self.m)
        else:
            if x2.dtype != buffers["values"].dtype:  # as the kernel says for fewer rows
                raise KernelInputError(f"x is {x2.dtype} but the packed values are {buffers['values'].dtype}; cast "
                                       f"x to {buffers['values'].dtype}")
            y = F.linear(x2, dense_from_parts(buffers["values"], buffers["bitmask"]))
        bias = buffers["bias"]
        if bias is not None:
            y = y + bias
        return y if flat else y.view(*shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        copy = f", dense copy from {self.dense_from_rows} rows" if self.dense is not None else ""
        return f"in_features={self.in_features}, out_features={self.out_features}, pattern={self.n}:{self.m}{copy}"
