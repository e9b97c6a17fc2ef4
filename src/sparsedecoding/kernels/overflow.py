"""2:4 plus overflow slots: the format a 16:32+K weight could run in on the 2:4 sparse tensor-core kernel.

A 16:32+K mask (`SparsityPattern`'s `overflow`) keeps 16 of every 32 columns with at most K kept weights beyond two
in a group of four. Such a weight is W = W24 + W_over: W24 holds the two largest |w| kept in each group of four (a
2:4 weight, packed by `pack_nm` and tiled by `sp24.tile` as any other), and W_over the rest, at most K a row and
word (32 columns). W_over is stored in `slots` fixed places a row and word, so a kernel reads it with no ragged
indexing: a value (the weight's dtype) and its column within the word (uint8, 0-31), value 0 where a slot is
unused. Bytes a weight at bf16 with two slots: 1.125 (2:4) + 2·3/32 = 1.31, against 2 dense.

With quantized values (a 16:32 `PackedNMQ`, int8 or int4 codes), `split_overflow_quantized` splits the codes the same
way: the 2:4 part is a `PackedNMQ` with the weight's scales, and the slots hold codes, dequantized with the scale of
their row (int8) or of their row and column group (int4).

This module is the format and its reference product on any device. `sp24.tile_overflow` lays a split weight out
for the sp24 kernel, which adds the slots' products inside the same warp (sp24.cu, OVER; measured in
benchmarks/results/overflow_h200.md), and `triton_overflow` adds them in a second launch. The engine runs a 16:32
linear whose mask fits 16:32+2 in this format (`sp24_linear.Sp24Linear`, SPARSEDECODING_SP24_SLOTS)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import PackingError
from .format import PackedNM, pack_nm
from .quantized import PackedNMQ, pack_int4

WORD = 32  # columns a mask word covers; the slots are per row and word


@dataclass
class OverflowNM:
    """W = `w24` (a packed 2:4 weight) + the slots: `values` [out, in / 32, slots] and `columns` (uint8, the column
    within the word) of the same shape. With a quantized `w24` (`PackedNMQ`), `values` are the slots' int8 codes,
    dequantized with w24's scales (`slot_values`)."""

    w24: PackedNM | PackedNMQ
    values: torch.Tensor
    columns: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return self.w24.shape

    @property
    def slots(self) -> int:
        return self.values.shape[2]

    @property
    def quantized(self) -> bool:
        return isinstance(self.w24, PackedNMQ)

    def slot_values(self) -> torch.Tensor:
        """The slots' weights [out, in / 32, slots]: `values` for 16-bit ones; for codes, code·scale in float32 (exact,
        as `PackedNMQ.to_dense` computes it)."""
        if not self.quantized:
            return self.values
        out, words, slots = self.values.shape
        column = WORD * torch.arange(words, device=self.values.device).view(1, words, 1) + self.columns.long()
        group = (column // self.w24.group_size).view(out, words * slots)
        scales = self.w24.scales.float().gather(1, group).view(out, words, slots)
        return self.values.float() * scales

    def to_dense(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """W [out, in], in `dtype` (default the values' dtype; float32 for codes). For codes, every weight is
        code·scale in float32 rounded once to `dtype`, as `PackedNMQ.to_dense` gives it."""
        dtype = dtype or (torch.float32 if self.quantized else self.values.dtype)
        out, in_features = self.shape
        work = torch.float32 if self.quantized else dtype
        w24 = self.w24.to_dense(torch.float32) if self.quantized else self.w24.to_dense()
        dense = w24.to(work).view(out, in_features // WORD, WORD)
        dense.scatter_add_(2, self.columns.long(), self.slot_values().to(work))
        return dense.view(out, in_features).to(dtype)

    def nbytes(self) -> int:
        """Bytes a kernel would read for W: the packed 2:4 values (or codes and scales) and bitmask, and the slots
        (a value, or an int8 code, and a column byte each)."""
        parts = (self.w24.codes, self.w24.scales) if self.quantized else (self.w24.values,)
        w24 = sum(t.numel() * t.element_size() for t in parts) + self.w24.bitmask.numel() * 4
        return w24 + self.values.numel() * self.values.element_size() + self.columns.numel()


def split_two_largest(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(W24, rest) of a weight [out, in] (in a multiple of 4): W24 keeps the two largest |w| of every group of four
    columns, rest the others; W24 + rest = weight."""
    out, in_features = weight.shape
    fours = weight.view(out, in_features // 4, 4)
    top = fours.abs().float().topk(2, dim=-1).indices
    in24 = torch.zeros_like(fours, dtype=torch.bool).scatter_(-1, top, True) & (fours != 0)
    w24 = torch.where(in24, fours, torch.zeros_like(fours)).view(out, in_features)
    return w24, torch.where(in24, torch.zeros_like(fours), fours).view(out, in_features)


def split_overflow(weight: torch.Tensor, slots: int = 2) -> OverflowNM:
    """Split a 16:32+K weight [out, in] (K ≤ `slots`) into its 2:4 part and the overflow slots. Raises PackingError,
    in one line, when a group of 32 columns keeps more than 16 or a word more than `slots` beyond two in its
    groups of four (prune with `--pattern 16:32+K` first), or when in is not a multiple of 32."""
    if weight.dim() != 2 or weight.shape[1] % WORD:
        raise PackingError(f"expected a weight [out, in] with in a multiple of {WORD}, got {tuple(weight.shape)}")
    if not 1 <= slots <= 8:
        raise PackingError(f"slots = {slots}; a word can hold 1 to 8 weights beyond two in its groups of four")
    out, in_features = weight.shape
    words = in_features // WORD
    kept = (weight != 0).view(out, words, WORD)
    too_many = int((kept.sum(-1) > WORD // 2).sum())
    if too_many:
        raise PackingError(f"{too_many} groups of {WORD} columns keep more than {WORD // 2} weights: not a 16:32 "
                           "weight")
    w24, rest = split_two_largest(weight)
    rest = rest.view(out, words, WORD)
    over = words_over_cap(weight, slots)
    if over:
        raise PackingError(f"{over} words keep more than {slots} weights beyond two in their groups of four: not a "
                           f"16:32+{slots} weight (prune with --pattern 16:32+{slots})")
    # the overflow's columns first, in column order, then the word's first columns with value 0
    order = torch.argsort((rest == 0).to(torch.int8), dim=-1, stable=True)[..., :slots]
    values = rest.gather(-1, order)
    columns = torch.where(values != 0, order, torch.zeros_like(order)).to(torch.uint8)
    return OverflowNM(pack_nm(w24, 2, 4), values.contiguous(), columns.contiguous())


def split_overflow_quantized(packed: PackedNMQ, slots: int = 2) -> OverflowNM:
    """`split_overflow` for a quantized 16:32 weight: its codes split as the weights would be (a kept code 0, a
    weight of value zero, is dropped like one), the 2:4 part a `PackedNMQ` with the same scales, the slots int8
    codes. PackingError, in one line, as `split_overflow` raises it."""
    if (packed.n, packed.m) != (16, 32):
        raise PackingError(f"overflow slots split a 16:32 weight; this one is {packed.pattern}")
    split = split_overflow(packed.dense_codes(), slots)
    codes = split.w24.values.to(torch.int8)
    if packed.quantize == "int4":
        codes = pack_int4(codes)
    w24 = PackedNMQ(codes, packed.scales, split.w24.bitmask, 2, 4, packed.shape, packed.quantize, packed.group_size)
    return OverflowNM(w24, split.values.to(torch.int8), split.columns)


def merge_overflow_quantized(w24: PackedNMQ, codes: torch.Tensor, columns: torch.Tensor) -> PackedNMQ:
    """Inverse of `split_overflow_quantized`: the 16:32 `PackedNMQ` of a 2:4 part and slot codes [out, in / 32, K]
    at `columns` (a kept code 0 may come back in another position of its word, as `pack_nm` places zeros)."""
    out, in_features = w24.shape
    dense = w24.dense_codes().view(out, in_features // WORD, WORD)
    dense.scatter_add_(2, columns.long(), codes.float())
    packed = pack_nm(dense.view(out, in_features), 16, 32)
    kept = packed.values.to(torch.int8)
    if w24.quantize == "int4":
        kept = pack_int4(kept)
    return PackedNMQ(kept, w24.scales, packed.bitmask, 16, 32, w24.shape, w24.quantize, w24.group_size)


def words_over_cap(weight: torch.Tensor, slots: int = 2) -> int:
    """How many 32-column words of `weight` [out, in] (in a multiple of 32) hold more than `slots` nonzeros beyond
    two in their groups of four: 0 exactly when `split_overflow(weight, slots)` finds room for every one."""
    fours = (weight != 0).view(weight.shape[0], -1, WORD // 4, 4).sum(-1)
    return int(((fours - 2).clamp(min=0).sum(-1) > slots).sum())


def overflow_mm_reference(x: torch.Tensor, w: OverflowNM) -> torch.Tensor:
    """y = x·Wᵀ for x [..., in] from the split parts, in float32 (the reference a kernel is checked against)."""
    out, in_features = w.shape
    xf = x.float()
    y = xf @ (w.w24.to_dense(torch.float32) if w.quantized else w.w24.to_dense().float()).T
    gathered = xf.view(*x.shape[:-1], 1, in_features // WORD, WORD).expand(*x.shape[:-1], out, in_features // WORD,
                                                                         WORD)
    picked = gathered.gather(-1, w.columns.long().expand(*x.shape[:-1], out, in_features // WORD, w.slots))
    return y + (picked * w.slot_values().float()).sum((-1, -2))
