"""Packed N:M format: the kept values of each row plus one bit per column.

For W of shape [out, in] that is N:M sparse (at most N nonzeros in every group of M consecutive columns), with M
dividing 32 and in % 32 == 0: `values` is [out, in·N/M] in W's dtype, each row's kept weights in increasing column
order; `bitmask` is [out, in/32] int32 read as uint32, bit b of word w set iff column 32·w + b is kept. A group
with fewer than N nonzeros keeps some zeros explicitly, so every mask word holds exactly K = 32·N/M set bits and
the kernel can walk each word in K fixed steps."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from ..errors import PackingError
from ..patterns import KERNEL_PATTERNS

_PACK_CHUNK_ELEMENTS = 1 << 24  # rows are packed in slices of about this many weights to bound temporary memory
_BITS = 32
_GROUP_SIZES = tuple(m for _, m in KERNEL_PATTERNS)  # M of the patterns nm_pattern tries
# The kernels read bf16 and fp16; fp32 is kept for CPU checkpoints and the reference path. float64 and float8 have
# no kernel, so packing them would only defer the error to the first matrix product.
PACKABLE_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def check_pattern(n: int, m: int) -> None:
    """Raise PackingError unless 0 < n < m and m divides 32 (so groups never straddle a mask word)."""
    if not (isinstance(n, int) and isinstance(m, int) and 0 < n < m):
        raise PackingError(f"pattern {n}:{m} — need integers 0 < N < M; try 2:4")
    if _BITS % m:
        raise PackingError(f"pattern {n}:{m} — M must divide 32 (2:4, 4:8, 8:16, 16:32 work)")


def values_per_word(n: int, m: int) -> int:
    """K = 32·N/M: stored values (and set bits) per 32-column mask word."""
    return _BITS * n // m


def kernel_runs(n: int, m: int) -> bool:
    """Whether the sparse kernel runs N:M: M divides 32 and 32·N/M is a multiple of 8 (2:4, 4:8, 8:16, 16:32, 1:4,
    ...). The one rule that the op, the engine's loader and its pattern detection share."""
    return 0 < n < m and _BITS % m == 0 and values_per_word(n, m) % 8 == 0


def nm_pattern(weight: torch.Tensor) -> tuple[int, int] | None:
    """The kernel-supported N:M pattern (M in 4, 8, 16, 32, N ≤ M/2) that `weight` [out, in] satisfies with the
    smallest N/M, ties going to the smaller M; None when there is none or `in` is not a multiple of 32 (packed
    format). N is the largest nonzero count of a group, rounded up to what the kernel runs (32·N/M a multiple of 8):
    packing keeps explicit zeros, so a sparser weight packs correctly under a denser pattern. A weight that keeps
    more than half of some group (3:4, 24:32) is not one pruning made, and packed it would save little and run
    slower than dense beyond batch 1, so it stays dense. The one rule by which `pack --pattern auto`, `sparsify`
    and the engine's `--sparse auto` choose."""
    rows, columns = weight.shape
    if columns % 32 or weight.numel() == 0:
        return None
    nonzero = weight != 0
    best = None
    for m in _GROUP_SIZES:
        n = max(int(nonzero.view(rows, columns // m, m).sum(-1).max()), 1)
        while 2 * n <= m and not kernel_runs(n, m):
            n += 1
        if 2 * n <= m and kernel_runs(n, m) and (best is None or n * best[1] < best[0] * m):
            best = (n, m)
    return best


def apply_keeping_dtypes(module: torch.nn.Module, names: tuple[str, ...], fn, apply) -> None:
    """Run `apply` (the module's Module._apply of `fn`) with the buffers `names` held aside, then give each `fn` as
    raw integers of its width, so that it moves (`.to(device)`, `.cuda()`, `to_empty`) but is never converted:
    `model.half()` converts activations' tensors (bias, dense copies), not a format's own values or scales, which
    the kernels read in their stored dtype (converting and back would also round tiny bfloat16 scales through
    float16). The buffers are put back whatever `apply` raises."""
    held = {name: module._buffers[name] for name in names if module._buffers.get(name) is not None}
    for name in held:
        module._buffers[name] = None  # in place, so the buffers keep their order
    try:
        apply()
    finally:
        for name, tensor in held.items():
            module._buffers[name] = tensor
    for name, tensor in held.items():
        raw = _RAW.get(tensor.element_size()) if tensor.is_floating_point() else None
        moved = fn(tensor) if raw is None else fn(tensor.view(raw)).view(tensor.dtype)
        module._buffers[name] = moved


_RAW = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}  # same-width integer views


def popcount32(bitmask: torch.Tensor) -> torch.Tensor:
    """Number of set bits of every int32 word (read as uint32), as int64."""
    v = bitmask.to(torch.int64) & 0xFFFFFFFF
    v = v - ((v >> 1) & 0x55555555)
    v = (v & 0x33333333) + ((v >> 2) & 0x33333333)
    v = (v + (v >> 4)) & 0x0F0F0F0F
    return ((v * 0x01010101) & 0xFFFFFFFF) >> 24


def bits_to_bitmask(keep: torch.Tensor) -> torch.Tensor:
    """[rows, in] bool → [rows, in/32] int32 with bit b of word w = keep[:, 32·w + b] (two's complement)."""
    rows, cols = keep.shape
    weights = torch.ones(1, dtype=torch.int64, device=keep.device) << torch.arange(_BITS, device=keep.device)
    words = (keep.view(rows, cols // _BITS, _BITS).to(torch.int64) * weights).sum(-1)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def _bit_values(device: torch.device) -> torch.Tensor:
    """int32 words with only bit b set, b = 0..31 (bit 31 is the int32 minimum)."""
    powers = torch.ones(1, dtype=torch.int64, device=device) << torch.arange(_BITS, device=device)
    return torch.where(powers >= 1 << 31, powers - (1 << 32), powers).to(torch.int32)


def bitmask_to_bits(bitmask: torch.Tensor) -> torch.Tensor:
    """Inverse of `bits_to_bitmask`: [rows, words] int32 → [rows, 32·words] bool."""
    rows, words = bitmask.shape
    return ((bitmask[..., None] & _bit_values(bitmask.device)) != 0).view(rows, words * _BITS)


def dense_from_parts(values: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
    """W [out, 32·words] from its packed parts: the kept values scattered to the set bits, zeros elsewhere."""
    keep = bitmask_to_bits(bitmask)
    return torch.zeros(keep.shape, dtype=values.dtype, device=values.device).masked_scatter_(keep, values)


@dataclass(frozen=True)
class PackedNM:
    """An N:M sparse weight of `shape` [out, in] as `values` [out, in·N/M] and `bitmask` [out, in/32] int32."""

    values: torch.Tensor
    bitmask: torch.Tensor
    n: int
    m: int
    shape: tuple[int, int]

    def __post_init__(self) -> None:
        check_pattern(self.n, self.m)
        out, in_features = self.shape
        k = values_per_word(self.n, self.m)
        if self.bitmask.dtype != torch.int32:
            raise PackingError(f"bitmask must be int32, got {self.bitmask.dtype}")
        if in_features % _BITS or tuple(self.bitmask.shape) != (out, in_features // _BITS):
            raise PackingError(f"bitmask shape {tuple(self.bitmask.shape)} does not fit weight shape {self.shape}"
                               f" (expected ({out}, {in_features // _BITS}) and in_features % 32 == 0)")
        if tuple(self.values.shape) != (out, in_features // _BITS * k):
            raise PackingError(f"values shape {tuple(self.values.shape)} does not fit {self.n}:{self.m} weight "
                               f"shape {self.shape} (expected ({out}, {in_features // _BITS * k}))")
        if self.values.device != self.bitmask.device:
            raise PackingError(f"values on {self.values.device} but bitmask on {self.bitmask.device}")

    @property
    def pattern(self) -> str:
        return f"{self.n}:{self.m}"

    def to(self, device: torch.device | str) -> PackedNM:
        return PackedNM(self.values.to(device), self.bitmask.to(device), self.n, self.m, self.shape)

    def to_dense(self) -> torch.Tensor:
        """W with zeros at every column whose bit is clear."""
        return dense_from_parts(self.values, self.bitmask)

    def check_popcounts(self) -> None:
        """Raise PackingError unless every mask word has exactly 32·N/M set bits (what the kernel relies on)."""
        counts = popcount32(self.bitmask)
        k = values_per_word(self.n, self.m)
        bad = (counts != k).nonzero()
        if len(bad):
            row, word = bad[0].tolist()
            raise PackingError(f"mask word ({row}, {word}) has {int(counts[row, word])} set bits, "
                               f"{self.pattern} needs exactly {k}; repack the weight with pack_nm")

    def state_dict(self, prefix: str) -> dict[str, torch.Tensor]:
        """Tensors `{prefix}.values` and `{prefix}.bitmask` for a safetensors file."""
        return {f"{prefix}.values": self.values, f"{prefix}.bitmask": self.bitmask}

    @classmethod
    def from_state_dict(cls, tensors: dict[str, torch.Tensor], prefix: str, n: int, m: int,
                        shape: tuple[int, int]) -> PackedNM:
        """Inverse of `state_dict`; checks shapes and popcounts since the tensors come from a file."""
        missing = [k for k in (f"{prefix}.values", f"{prefix}.bitmask") if k not in tensors]
        if missing:
            raise PackingError(f"missing tensors {missing} for packed weight {prefix!r}")
        packed = cls(tensors[f"{prefix}.values"], tensors[f"{prefix}.bitmask"], n, m, tuple(shape))
        packed.check_popcounts()
        return packed

    def save(self, path: str | Path) -> None:
        """One safetensors file with `values`, `bitmask` and the pattern and shape as metadata."""
        metadata = {"format": "sparsedecoding-nm", "n": str(self.n), "m": str(self.m),
                    "shape": json.dumps(list(self.shape))}
        path = Path(path)
        temporary = path.with_name(f"{path.name}.{os.getpid()}.tmp")  # whole or absent: never a truncated file
        try:
            save_file({"values": self.values.contiguous(), "bitmask": self.bitmask.contiguous()}, str(temporary),
                      metadata=metadata)
            os.replace(temporary, path)
        finally:
            temporary.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: str | Path, device: str | torch.device = "cpu") -> PackedNM:
        """The weight `save` wrote to `path`; PackingError for a file that is missing, damaged or not one of those."""
        from safetensors import SafetensorError, safe_open

        try:
            with safe_open(str(path), framework="pt") as f:
                metadata = f.metadata() or {}
            if metadata.get("format") != "sparsedecoding-nm":
                raise PackingError(f"{path} is not a packed N:M file written by PackedNM.save")
            tensors = load_file(str(path), device=str(device))
            shape = tuple(json.loads(metadata["shape"]))
            packed = cls(tensors["values"], tensors["bitmask"], int(metadata["n"]), int(metadata["m"]), shape)
        except (SafetensorError, OSError, KeyError, ValueError, TypeError) as exc:
            raise PackingError(f"{path} is not a whole packed N:M file written by PackedNM.save "
                               f"({type(exc).__name__}: {exc})") from None
        if packed.values.dtype not in PACKABLE_DTYPES:
            raise PackingError(f"{path} stores its values as {packed.values.dtype}; PackedNM.save writes "
                               f"{', '.join(str(d) for d in PACKABLE_DTYPES)}")
        packed.check_popcounts()
        return packed

    def to_compressed_tensors(self, name: str) -> dict[str, torch.Tensor]:
        """The compressed-tensors "sparse-bitmask" layout of this weight: `{prefix}.shape`, `.compressed` (kept
        values, row-major), `.bitmask` (uint8 [out, in/8], bit j of byte B = column 8·B + j, i.e. numpy's
        packbits with bitorder="little") and `.row_offsets` (index of each row's first value); `prefix` is
        `name` without a trailing ".weight". Explicitly stored zeros stay marked, which that format allows."""
        prefix = name.removesuffix(".weight")
        out, in_features = self.shape
        words = self.bitmask.to(torch.int64) & 0xFFFFFFFF
        shifts = torch.arange(0, _BITS, 8, device=words.device)
        bytes_ = ((words[..., None] >> shifts) & 0xFF).to(torch.uint8).reshape(out, in_features // 8)
        per_row = self.values.shape[1]
        return {
            f"{prefix}.shape": torch.tensor(list(self.shape), dtype=torch.int64),
            f"{prefix}.compressed": self.values.reshape(-1),
            f"{prefix}.bitmask": bytes_,
            f"{prefix}.row_offsets": torch.arange(out, dtype=torch.int64, device=words.device) * per_row,
        }


def pack_nm(weight: torch.Tensor, n: int, m: int) -> PackedNM:
    """Pack an N:M sparse weight [out, in]: keep every nonzero, and in groups with fewer than N nonzeros also
    the first zeros, so each group keeps exactly N columns. Raises PackingError if a group has more than N
    nonzeros, if M does not divide 32, if in % 32 != 0, if W has no rows, holds NaN or inf, or is not bf16, fp16 or
    fp32 (float32 values are for storage: `nm_spmv` and the packed layers run bf16 or fp16, so cast the result's
    values, or load a float32 packed checkpoint with `load_packed(dtype=torch.bfloat16)`)."""
    check_pattern(n, m)
    if not isinstance(weight, torch.Tensor) or weight.dim() != 2:
        raise PackingError(f"expected a 2-D weight [out, in], got {getattr(weight, 'shape', type(weight))}")
    if weight.dtype not in PACKABLE_DTYPES:
        raise PackingError(f"expected a floating-point weight in bfloat16, float16 or float32, "
                           f"got {str(weight.dtype).removeprefix('torch.')}; convert it first")
    out, in_features = weight.shape
    if weight.is_meta:
        raise PackingError("weight is on the meta device and has no values; load the weights before packing")
    if out == 0:
        raise PackingError(f"weight of shape {tuple(weight.shape)} has no rows; there is nothing to pack")
    if in_features == 0 or in_features % _BITS:
        raise PackingError(f"in_features = {in_features} must be a positive multiple of 32 for the packed format")
    if not bool(torch.isfinite(weight).all()):
        raise PackingError("weight holds NaN or inf, which would make every output it touches non-finite; prune "
                           "again from a finite checkpoint before packing")
    k = values_per_word(n, m)
    values = torch.empty(out, in_features // _BITS * k, dtype=weight.dtype, device=weight.device)
    bitmask = torch.empty(out, in_features // _BITS, dtype=torch.int32, device=weight.device)
    step = max(1, _PACK_CHUNK_ELEMENTS // in_features)
    for r0 in range(0, out, step):
        block = weight[r0:r0 + step]
        keep = _keep_mask(block, n, m, r0)
        values[r0:r0 + step] = block[keep].view(block.shape[0], -1)
        bitmask[r0:r0 + step] = bits_to_bitmask(keep)
    return PackedNM(values, bitmask, n, m, (out, in_features))


def _keep_mask(block: torch.Tensor, n: int, m: int, first_row: int) -> torch.Tensor:
    """Exactly n kept columns per group: the nonzeros, then zeros from the left of the group."""
    rows, cols = block.shape
    nonzero = (block != 0).view(rows, cols // m, m)
    count = nonzero.sum(-1, keepdim=True)
    if bool((count > n).any()):
        row, group = (count[..., 0] > n).nonzero()[0].tolist()
        raise PackingError(
            f"weight is not {n}:{m} sparse: row {first_row + row}, columns {group * m}..{group * m + m - 1} hold "
            f"{int(count[row, group, 0])} nonzeros (at most {n} allowed); prune it to {n}:{m} first")
    zero_rank = torch.cumsum(~nonzero, dim=-1)  # 1 for the group's first zero, 2 for the second, ...
    fill = ~nonzero & (zero_rank <= n - count)
    return (nonzero | fill).view(rows, cols)
