"""Quad-placed overflow slots (16:32+4q): the layout and the per-lane arithmetic of a slot loop on the tensor cores
that reads no shared memory (sp24.cu's OVER 5, `sp24.tile_quads`; benchmarks/CUDA_KERNEL_NOTES.md, thirty-eighth
section).

A 16:32+4q weight (`SparsityPattern` placement "quads", `solvers.quad_placed_keep_mask`) is W = W24 + W_over as in
`overflow`, where in every 16-row tile and 32-column k-tile, rows g and g + 8 (a quad of lanes of `mma.sp`) hold at
most one weight of W_over in each group class c (groups c and c + 4). W_over is itself 2:4, and lane t of the quad
supplies exactly groups t and t + 4 of both rows in the A fragment of `mma.sp.m16n8k32`, so class t's weight lies
in lane t's own registers: a second mma.sp of W_over's A with the 2:4 part's own B fragment adds the slots, with
no gather of x. What each lane stores, per k-tile: its place's 16-bit value and one byte: its own nibble (bit 0: row
g + 8, bit 1: group c + 4, bits 2-3: position in the group) and, in the high nibble, that of lane t ^ 2; an empty
place is value 0, nibble 0. That is 3 bytes a place, 12 a quad and k-tile: the bytes of 16:32+2's two slots a row.

In the kernel a lane would put its value in register 2·(group bit) + (row bit) of its A (the second half of the
register when the position is 3, the first otherwise) and zero in the other three. The metadata lanes (t < 2; lane
t holds the metadata of groups 4t..4t+3 of both rows, bits 16·h + 4·(group mod 4)) need all four places' nibbles:
their own byte has classes t and t ^ 2, one `shfl.xor 1` brings t ^ 1 and t ^ 3. Each place whose group bit is t
then ORs (position, 3) into the constant word 0xCCCCCCCC (every group (0, 3); a position 3 keeps (0, 3) with the
value in the second half), so no bit is ever cleared. `emulate` runs exactly that in float64 (the tests' and the
tuner's reference for the kernel)."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import PackingError
from .overflow import split_two_largest

TILE_ROWS = 16
WORD = 32
STEP = 8  # k-tiles a slot step: the unit of a lane's loads (16 bytes of values, 8 info bytes)
META_BASE = 0xCCCCCCCC  # every group of four at positions (0, 3); a place ORs its position into the low two bits


@dataclass
class QuadSlots:
    """W_over of a 16:32+4q weight [out, in] in the lanes' layout: `values` [out / 16, steps, 32 lanes, 8 k-tiles]
    (the weight's dtype) and `info` (uint8, same shape), lane 4g + t owning class t of rows g and g + 8; a slot step
    covers 8 k-tiles (in padded with zero k-tiles to a multiple of 256 columns)."""

    values: torch.Tensor
    info: torch.Tensor
    shape: tuple[int, int]

    @property
    def nbytes(self) -> int:
        return self.values.numel() * self.values.element_size() + self.info.numel()


def split_quad_slots(weight: torch.Tensor) -> tuple[torch.Tensor, QuadSlots]:
    """(W24, slots) of a 16:32+4q weight [out, in]: W24 keeps the two largest |w| of every group of four
    (`overflow.split_two_largest`), the slots the rest. PackingError, in one line, unless out is a multiple of 16, in of
    32, and the rest fits one weight a quad, k-tile and group class."""
    if weight.dim() != 2 or weight.shape[0] % TILE_ROWS or weight.shape[1] % WORD:
        raise PackingError(f"a quad-placed weight needs [out, in] with out a multiple of {TILE_ROWS} and in of "
                           f"{WORD}; got {tuple(weight.shape)}")
    out, in_features = weight.shape
    w24, rest = split_two_largest(weight)
    tiles, ktiles = out // TILE_ROWS, in_features // WORD
    # [tile, half, g, k-tile, group bit, class, position]
    cells = rest.view(tiles, 2, TILE_ROWS // 2, ktiles, 2, 4, 4)
    used = cells != 0
    per_place = used.sum(dim=(1, 4, 6))  # [tile, g, k-tile, class]
    crowded = int((per_place > 1).sum())
    if crowded:
        raise PackingError(f"{crowded} places hold more than one weight beyond two in a group of four: not a "
                           "16:32+4q weight (prune with --pattern 16:32+4q)")
    # each place's one weight (or none): sum over its eight cells, and its nibble from the cell's index
    value = cells.sum(dim=(1, 4, 6))
    half = torch.arange(2, device=weight.device).view(1, 2, 1, 1, 1, 1, 1)
    group_bit = torch.arange(2, device=weight.device).view(1, 1, 1, 1, 2, 1, 1)
    position = torch.arange(4, device=weight.device).view(1, 1, 1, 1, 1, 1, 4)
    nibble = (used * (half | group_bit << 1 | position << 2)).sum(dim=(1, 4, 6))  # [tile, g, k-tile, class]
    steps = -(-ktiles // STEP)
    pad = steps * STEP - ktiles
    value = torch.nn.functional.pad(value, (0, 0, 0, pad))
    nibble = torch.nn.functional.pad(nibble, (0, 0, 0, pad))
    # -> [tile, step, g, class, k-tile of the step] -> lanes 4g + t
    value = value.view(tiles, 8, steps, STEP, 4).permute(0, 2, 1, 4, 3).reshape(tiles, steps, 32, STEP)
    nibble = nibble.view(tiles, 8, steps, STEP, 4).permute(0, 2, 1, 4, 3).reshape(tiles, steps, 32, STEP)
    partner = nibble.view(tiles, steps, 8, 4, STEP)[:, :, :, [2, 3, 0, 1]].reshape(tiles, steps, 32, STEP)
    info = (nibble | partner << 4).to(torch.uint8)
    return w24, QuadSlots(value.contiguous(), info.contiguous(), (out, in_features))


def emulate(slots: QuadSlots) -> torch.Tensor:
    """W_over [out, in] in float64, rebuilt the way the kernel would see it: each lane's A registers from its own
    value and nibble, each metadata lane's words from its byte and its neighbour's (the shuffle), then the
    instruction's decompression (position pairs of the metadata, as `sp24.tiled_to_dense` reads them). On the
    slots' device."""
    tiles, steps = slots.values.shape[:2]
    values = slots.values.to(torch.float64).view(tiles, steps, 8, 4, STEP)  # tile step g t k
    info = slots.info.to(torch.int64).view(tiles, steps, 8, 4, STEP)
    own = info & 0xF
    row_bit, group_bit, position = own & 1, own >> 1 & 1, own >> 2
    # A: register 2·(group bit) + (row bit), element 1 when the position is 3
    device = slots.values.device
    regs = torch.zeros(tiles, steps, 8, 4, STEP, 4, 2, dtype=torch.float64, device=device)
    regs.scatter_(5, (2 * group_bit + row_bit)[..., None, None].expand(*own.shape, 1, 2),
                  torch.stack([torch.where(position == 3, 0.0, values), torch.where(position == 3, values, 0.0)],
                              -1)[..., None, :])
    # metadata lane m (< 2): classes m and m ^ 2 from its own byte, m ^ 1 and m ^ 3 from its neighbour's (shfl.xor 1)
    meta = torch.full((tiles, steps, 8, 2, STEP), META_BASE, dtype=torch.int64, device=device)
    for m in range(2):
        bytes_ = {m: info[:, :, :, m], m ^ 1: info[:, :, :, m ^ 1]}
        for c, (source, shift) in {m: (m, 0), m ^ 2: (m, 4), m ^ 1: (m ^ 1, 0), m ^ 3: (m ^ 1, 4)}.items():
            nib = bytes_[source] >> shift & 0xF
            r, gh, p = nib & 1, nib >> 1 & 1, nib >> 2
            here = gh == m
            meta[:, :, :, m] |= torch.where(here, torch.where(p == 3, 0, p) << (16 * r + 4 * c), 0)
    dense = torch.zeros(tiles, 16, steps * STEP, WORD, dtype=torch.float64, device=device)
    for h in range(2):
        for q in range(8):  # group q: register 2·(q // 4) + h of lane t = q % 4, metadata lane q // 4
            vals = regs[:, :, :, q % 4, :, 2 * (q // 4) + h]  # tile step g k 2
            code = (meta[:, :, :, q // 4] >> (16 * h + 4 * (q % 4))) & 0xF  # tile step g k
            for j in range(2):
                pos = 4 * q + ((code >> (2 * j)) & 3)
                target = dense[:, 8 * h:8 * h + 8].view(tiles, 8, steps, STEP, WORD).permute(0, 2, 1, 3, 4)
                target.scatter_add_(4, pos[..., None], vals[..., j][..., None])
    out, in_features = slots.shape
    return dense.view(tiles * 16, steps * STEP * WORD)[:out, :in_features]
