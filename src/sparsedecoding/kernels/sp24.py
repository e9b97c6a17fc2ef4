"""2:4 weights on sparse tensor cores from a tiled layout (`csrc/sp24.cu`): y = x·Wᵀ for 1..16 rows of x.

The packed format (`PackedNM`, `PackedNMQ`: kept values or codes in row order plus a bitmask) stays what is saved
and loaded. `tile` rearranges one 2:4 weight, once, into what the kernel's warps load: per 16-row tile and
32-column k-tile, the four A registers of `mma.sp.m16n8k32` for every lane (kept values, int8 codes or int4 codes,
in offset binary) and the instruction's metadata words (two 2-bit positions per group of 4 columns, derived from
the bitmask), grouped so that each warp load is 512 contiguous bytes. The bytes are the format's: values or codes,
plus 4 bits of metadata per 4 columns (the bitmask's 1 bit per column), plus, for int4, the same group scales.

`tile_overflow` does the same for a 16:32+K weight split into its 2:4 part and two overflow slots a row and 32
columns (`overflow.OverflowNM`): the slots are tiled per row tile and step as well (`over_v`, `over_o`), and the
kernel adds their products inside the same warp (sp24.cu, OVER; 16-bit values, with or without the RMSNorm in front).

`tile_dense` tiles a dense int8 / int4 weight for the same kernel (sp24.cu, DENSE): as the kept values of the 2:4
weight of twice the columns that keeps positions 0 and 1 of every group, whose metadata is one constant word the
kernel never loads (x is staged with a zero pair after each pair of columns). This is the dense-quantized path's
default kernel on CUDA (`quantized.dense_kernel`).

`Sp24Launch` / `sp24_mm` run it (built at first use with nvcc, like `cuda_mma`, on compute capability 8.0 or
newer), splitting the steps of a row tile across CTAs (splits) and across warps of one CTA (slices);
`tuned_launch` picks both per problem. `tiled_to_dense` reads a tiled weight back through the instruction's
register semantics, so CPU tests check the layout without a GPU."""

from __future__ import annotations

import contextlib
import ctypes
import threading
from collections.abc import Iterator
from dataclasses import dataclass, replace
from functools import cached_property
from pathlib import Path

import torch

from ..errors import KernelInputError
from . import cuda_mma, quad_slots
from .format import PackedNM, pack_nm
from .overflow import OverflowNM
from .op import (GROUPED_CTAS_DEFAULT, MAX_BATCH, SP24_OVER_LOOP_CHOICES, sp24_early_trigger_setting,
                 sp24_early_trigger_timed, sp24_early_trigger_value, sp24_half_meta_setting, sp24_int4_step_setting,
                 sp24_int8_step_setting, sp24_grouped_ctas_setting, sp24_grouped_ctas_timed, sp24_grouped_ctas_value,
                 sp24_halves_acc_setting, sp24_handoff_setting, sp24_mixed_setting, sp24_mixed_value,
                 sp24_mma_ctas_setting, sp24_multicast_setting, settings_fingerprint, sp24_over_loop_setting,
                 sp24_pdl_setting, sp24_stream_k_setting)
from .quantized import PackedNMQ

SOURCE = Path(__file__).parent / "csrc" / "sp24.cu"
ROWS_PER_BLOCK = 128  # kRowsPerCta in sp24.cu: rows of a CTA with one warp per row tile (slices = 1)
SLICES = (1, 2, 4, 8)  # warps per row tile in a CTA (sharing out its steps)
MAX_SMEM = 66 * 1024  # kMaxSmem: staged x per CTA
# k-tiles per step (Steps<CODE>::ks) of the default build; codes may be tiled in steps of 8
# (SPARSEDECODING_SP24_INT8_STEP, SPARSEDECODING_SP24_INT4_STEP), which run on builds of their own
STEP_TILES = {0: 8, 8: 16, 4: 16}
# k-tiles a step of codes in a weight with overflow slots unless the setting says otherwise: 8, measured faster side
# by side (results/int8_step_h200_8b_16of32p2.md, int4_step_h200_8b_16of32p2.md, int4_step_h200_qwen_16of32p2.md)
STEP_WITH_SLOTS = {8: 8, 4: 8}
TILES_PER_LOAD = {0: 1, 8: 2, 4: 4}  # k-tiles a lane's 16-byte load of values covers (Steps<CODE>::tiles_per_load)
# int4: bit offset in a lane's 32-bit word of its element e = 4·half + 2·h + j (register r = 2·half + h holds
# nibbles r and r + 4: element j of register r sits at nibble r + 4j)
_INT4_SHIFTS = (0, 16, 4, 20, 8, 24, 12, 28)
_PAD_META = 0x44444444  # metadata of a padded k-tile: positions 0 and 1 in every group
_lock = threading.Lock()
# by (with SP24_COLUMNS, with SP24_HALF_META, SP24_INT8_KS, SP24_INT4_KS, with SP24_EARLY_TRIGGER, SP24_OVER_MMA_CTAS,
# with SP24_QUADS, SP24_MULTICAST, with SP24_GROUPED)
_libraries: dict[tuple[bool, bool, int, int, bool, int, bool, int, bool], ctypes.CDLL] = {}
_counters: dict[int, torch.Tensor] = {}
_COUNTER_SLOTS = 1 << 16
# by device index: the handoff's partial-sum and Σs² slots of split-K and stream-K launches
# (SPARSEDECODING_SP24_HANDOFF), every entry kEmpty (sp24.cu: all bits set) between launches; one launch at a time per
# device, as the counters. An outgrown one is kept (`_retired`): launches captured in CUDA graphs still use it.
_workspaces: dict[int, torch.Tensor] = {}
_retired: list[torch.Tensor] = []
_WORKSPACE_FLOATS = 1 << 22  # 16 MiB at first: 8 splits of batch 16 for 32768 rows


@dataclass(frozen=True)
class Sp24Weight:
    """A 2:4 weight of `shape` [out, in] in the kernel's tiled layout. `code` is 0 (16-bit values of `dtype`),
    8 (int8 codes, `row_scales` bf16 [out]) or 4 (int4 codes, `scales` tiled bf16, a group 2^`gk_shift` k-tiles,
    `groups` groups per row tile). `a`, `meta` and `scales` are flat uint8 / int32 / bf16 tensors. `glu`: a
    gate|up weight (gate rows, then as many up rows) tiled in row-tile pairs (`glu_order`); the kernel then gives
    silu(gate)·up, `out_features` = out / 2 columns. `over_v` (values of `dtype`) and `over_o` (uint8): the
    overflow slots of a 16:32+K weight (`tile_overflow`), or None. `dense`: a dense int8 / int4 weight
    (`tile_dense`) of `shape` [out, in], tiled as the 2:4 [out, 2·in] weight that keeps positions 0 and 1 of every
    group; its metadata is one constant word, not stored (`meta` None). `quads`: `over_v` / `over_o` hold
    quad-placed slots (`tile_quads`: each lane's value and placement byte a k-tile, kernels/quad_slots.py), which
    run in sp24.cu's OVER 5 (a build with SP24_QUADS) at every batch. `grouped`: the 2:4 weight of each 16-row tile's
    32-column words, each with its columns in its own order (`tile_grouped`, a 16:32g weight), the order's places of
    x in `over_o` (one byte a lane and k-tile), which runs in sp24.cu's OVER 6 (a build with SP24_GROUPED).
    `split_rows` (grouped only): the rows that share an order, the tile's 16, or 8 (each half of the tile its own
    order: two bytes a lane and k-tile, two gathers and two mma.sp a k-tile, a build with SP24_GROUPED_HALVES too)."""

    a: torch.Tensor
    meta: torch.Tensor | None
    scales: torch.Tensor | None
    row_scales: torch.Tensor | None
    shape: tuple[int, int]
    code: int
    dtype: torch.dtype
    steps: int
    gk_shift: int = 0
    groups: int = 0
    glu: bool = False
    over_v: torch.Tensor | None = None
    over_o: torch.Tensor | None = None
    dense: bool = False
    quads: bool = False
    grouped: bool = False
    split_rows: int = 16

    @cached_property
    def ks(self) -> int:
        """k-tiles a step: STEP_TILES[code], or 8 for codes tiled in steps of 8 (`step_tiles`; read off the tiled
        values: a step of a row tile holds ks / TILES_PER_LOAD[code] loads of 512 bytes). Read once per weight: it
        is part of every launch's `problem_key`, on the eager path."""
        loads = self.a.numel() * self.a.element_size() // (-(-self.shape[0] // 16) * self.steps * 512)
        return loads * TILES_PER_LOAD[self.code]

    @property
    def build_ks(self) -> int:
        """The SP24_INT8_KS of the kernel build that runs this weight (16 unless it is int8 codes tiled in steps of
        8)."""
        return self.ks if self.code == 8 else STEP_TILES[8]

    @property
    def build_int4_ks(self) -> int:
        """The SP24_INT4_KS of the kernel build that runs this weight (16 unless it is int4 codes tiled in steps of
        8)."""
        return self.ks if self.code == 4 else STEP_TILES[4]

    @property
    def tiled_in(self) -> int:
        """Columns of the tiled 2:4 layout (the kernel's `in`): in, or 2·in for a dense weight."""
        return 2 * self.shape[1] if self.dense else self.shape[1]

    @property
    def out_features(self) -> int:
        """Columns of y: out, or out / 2 for a GLU weight."""
        return self.shape[0] // 2 if self.glu else self.shape[0]

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.a, self.meta, self.scales, self.row_scales,
                                                          self.over_v, self.over_o) if t is not None)

    def to(self, device: torch.device | str) -> Sp24Weight:
        return self._map(lambda t: t.to(device))

    def clone(self) -> Sp24Weight:
        """A copy with its own tensors (the benches and the tuner rotate copies past the L2)."""
        return self._map(torch.Tensor.clone)

    def _map(self, fn) -> Sp24Weight:
        def apply(t):
            return None if t is None else fn(t)
        return Sp24Weight(fn(self.a), apply(self.meta), apply(self.scales), apply(self.row_scales), self.shape,
                          self.code, self.dtype, self.steps, self.gk_shift, self.groups, self.glu,
                          apply(self.over_v), apply(self.over_o), self.dense, self.quads, self.grouped,
                          self.split_rows)


def meta_codes(bitmask: torch.Tensor) -> torch.Tensor:
    """mma.sp metadata of every 4-column group of 2:4 mask words (int64 holding uint32): per nibble the lower
    kept position in bits 0-1 and the upper in bits 2-3. Raises KernelInputError unless every group keeps exactly
    two columns."""
    m = bitmask.to(torch.int64) & 0xFFFFFFFF
    codes = torch.zeros_like(m)
    for q in range(8):
        nib = (m >> (4 * q)) & 0xF
        bits = torch.stack([(nib >> b) & 1 for b in range(4)], dim=-1)
        if bool((bits.sum(-1) != 2).any()):
            raise KernelInputError("the sparse tensor-core kernel runs 2:4 weights whose every group of 4 columns "
                                   "keeps exactly 2; this bitmask has groups that do not (repack it with pack_nm)")
        first = bits.argmax(-1)
        second = 3 - bits.flip(-1).argmax(-1)
        codes |= (first | (second << 2)) << (4 * q)
    return codes


def _lane_values(kept: torch.Tensor, row_tiles: int, k_tiles: int) -> torch.Tensor:
    """Kept entries [rows, k_tiles·16] (any dtype) → [row_tiles, k_tiles, g 8, t 4, half 2, h 2, j 2]: lane (g, t)'s
    register 2·half + h element j is row 16·tile + 8h + g, kept index 8·half + 2t + j of the k-tile."""
    v = kept.reshape(row_tiles, 2, 8, k_tiles, 2, 4, 2)  # tile, h, g, k-tile, half, t, j
    return v.permute(0, 3, 2, 5, 4, 1, 6)


def _pad(t: torch.Tensor, rows: int, cols: int, value) -> torch.Tensor:
    out = torch.full((rows, cols), value, dtype=t.dtype, device=t.device)
    out[:t.shape[0], :t.shape[1]] = t
    return out


def glu_order(out: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """Row order of a gate|up weight tiled for GLU: gate rows 16k..16k+15, then up rows out/2 + 16k..., for each
    k. Needs out a multiple of 32."""
    half = out // 2
    gate = torch.arange(half, device=device).view(-1, 16)
    return torch.stack([gate, gate + half], dim=1).reshape(-1)


def _rows(packed: PackedNM | PackedNMQ, index: torch.Tensor | slice) -> PackedNM | PackedNMQ:
    """The rows of `packed` that `index` (an order of rows, or a slice) takes."""
    bitmask = packed.bitmask[index]
    shape = (bitmask.shape[0], packed.shape[1])
    if isinstance(packed, PackedNMQ):
        return PackedNMQ(packed.codes[index], packed.scales[index], bitmask, packed.n, packed.m, shape,
                         packed.quantize, packed.group_size)
    return PackedNM(packed.values[index], bitmask, packed.n, packed.m, shape)


def step_tiles(code: int, step: int | None = None, slots: bool = False) -> int:
    """k-tiles a step of a weight tiled now with values `code`: STEP_TILES[0] for 16-bit values; for codes `step` (8
    or 16), by default SPARSEDECODING_SP24_INT8_STEP / _INT4_STEP, whose "auto" gives STEP_WITH_SLOTS[code] for a
    weight with overflow `slots` and STEP_TILES[code] without."""
    if code == 0:
        return STEP_TILES[0]
    ks = step if step is not None else sp24_int8_step_setting() if code == 8 else sp24_int4_step_setting()
    if ks is None:
        ks = STEP_WITH_SLOTS[code] if slots else STEP_TILES[code]
    if ks not in (8, 16):
        name = "int8_step" if code == 8 else "int4_step"
        raise KernelInputError(f"{name} = {ks}; use 8 or 16 k-tiles a step")
    return ks


def tile(packed: PackedNM | PackedNMQ, glu: bool = False, int8_step: int | None = None,
         int4_step: int | None = None) -> Sp24Weight:
    """The tiled layout of a 2:4 `PackedNM` (bf16/fp16 values) or `PackedNMQ` (int8, or int4 with a power-of-two
    multiple of 32 columns a scale); with `glu`, of a gate|up weight whose kernel gives silu(gate)·up (rows a
    multiple of 32). Steps of `int8_step` / `int4_step` k-tiles for codes (`step_tiles`). Runs where the tensors
    are; raises KernelInputError for anything else."""
    if (packed.n, packed.m) != (2, 4):
        raise KernelInputError(f"the sparse tensor-core kernel runs the 2:4 pattern; got {packed.pattern}")
    if glu:
        if packed.shape[0] % 32:
            raise KernelInputError(f"a GLU weight needs a multiple of 32 rows (gate and up halves of whole tiles); "
                                   f"got {packed.shape[0]}")
        order = glu_order(packed.shape[0], packed.bitmask.device)
        return replace(tile(_rows(packed, order), int8_step=int8_step, int4_step=int4_step), glu=True)
    out, in_features = packed.shape
    quantize = getattr(packed, "quantize", None)
    code = {None: 0, "int8": 8, "int4": 4}[quantize]
    if code == 0 and packed.values.dtype not in (torch.bfloat16, torch.float16):
        raise KernelInputError(f"values are {packed.values.dtype}; the kernel takes bfloat16 or float16")
    ks = step_tiles(code, {0: None, 8: int8_step, 4: int4_step}[code])
    row_tiles, k_tiles = -(-out // 16), in_features // 32
    steps = -(-k_tiles // ks)
    rows, tiles = row_tiles * 16, steps * ks
    device = packed.bitmask.device
    meta = meta_codes(packed.bitmask)
    meta = _pad(meta, rows, tiles, _PAD_META)
    # lane (g, t < 2): 16 bits of row g's codes (columns 16t..16t+15) and of row g+8's above
    halves = torch.stack([meta & 0xFFFF, meta >> 16], dim=-1).view(row_tiles, 2, 8, tiles, 2)  # tile h g s t
    words = halves[:, 0] | (halves[:, 1] << 16)  # tile g s t
    words = words.view(row_tiles, 8, steps, ks, 2).permute(0, 2, 1, 4, 3)  # tile step g t k
    meta_t = torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).contiguous().view(-1)
    scales = row_scales = None
    gk_shift = groups = 0
    if code == 0:
        kept = _pad(packed.values, rows, tiles * 16, 0)
        lanes = _lane_values(kept, row_tiles, tiles)  # tile s g t half h j
        a = lanes.reshape(row_tiles, steps, ks, 32, 8).contiguous().view(torch.uint8).view(-1)
        dtype = packed.values.dtype
    elif code == 8:
        offset = (packed.codes.to(torch.int32) + 128).to(torch.uint8)
        kept = _pad(offset, rows, tiles * 16, 128)
        lanes = _lane_values(kept, row_tiles, tiles).permute(0, 1, 2, 3, 5, 4, 6)  # tile s g t h half j
        # loads in order across steps (load L: k-tiles 2L, 2L + 1), whatever the step
        a = lanes.reshape(row_tiles, tiles // 2, 2, 32, 8).permute(0, 1, 3, 2, 4).contiguous().view(-1)
        row_scales = packed.scales.reshape(-1).contiguous()
        dtype = torch.bfloat16
    else:
        group_tiles = packed.group_size // 32
        if group_tiles & (group_tiles - 1):
            raise KernelInputError(f"int4 group size {packed.group_size}: the sparse tensor-core kernel needs a "
                                   "power-of-two multiple of 32 columns a scale")
        gk_shift = group_tiles.bit_length() - 1
        low, high = packed.codes.to(torch.int32) & 0xF, packed.codes.to(torch.int32) >> 4
        nibbles = torch.stack([low, high], dim=-1).view(out, -1) ^ 0x8  # two's complement -> offset binary
        kept = _pad(nibbles, rows, tiles * 16, 8).to(torch.int64)
        lanes = _lane_values(kept, row_tiles, tiles).reshape(row_tiles, tiles, 32, 8)  # nibble index r + 4j
        shifts = torch.tensor(_INT4_SHIFTS, dtype=torch.int64, device=device)
        word = (lanes << shifts).sum(-1)  # tile s lane
        # loads in order across steps (load L: k-tiles 4L..4L + 3), whatever the step
        word = word.view(row_tiles, tiles // 4, 4, 32).permute(0, 1, 3, 2)
        a = torch.where(word >= 2**31, word - 2**32, word).to(torch.int32).contiguous().view(torch.uint8).view(-1)
        groups = -(-tiles // group_tiles)
        s = _pad(packed.scales, rows, groups, 0).view(row_tiles, 2, 8, groups)  # tile h g group
        scales = s.permute(0, 3, 2, 1).contiguous().view(-1)
        dtype = torch.bfloat16
    return Sp24Weight(a, meta_t, scales, row_scales, (out, in_features), code, dtype, steps, gk_shift, groups)


_DENSE_MASK = 0x33333333  # bitmask word of the 2:4 weight that holds a dense one: positions 0 and 1 of each group


def tile_dense(codes: torch.Tensor, scales: torch.Tensor, quantize: str, group_size: int) -> Sp24Weight:
    """The tiled layout of a dense int8 / int4 weight W[o, i] = codes[o, i]·scales[o, i // group_size] (codes int8
    [out, in], scales [out, in / group_size]; int8: group_size = in), for the kernel's dense mode: W as the kept
    values of the 2:4 [out, 2·in] weight that keeps positions 0 and 1 of every group, so that each MMA group holds
    two adjacent columns of W (sp24.cu, DENSE). Needs out a multiple of 16 (the tile's rows: the layout keeps no
    row count) and in a multiple of 16; int4 a power-of-two multiple of 16 columns a scale. KernelInputError
    otherwise."""
    out, in_features = codes.shape
    if quantize not in ("int8", "int4"):
        raise KernelInputError(f"the dense tensor-core path runs int8 or int4 codes; got {quantize!r}")
    if out % 16 or in_features % 16:
        raise KernelInputError(f"a dense weight on the sparse tensor-core kernel needs rows and columns in multiples "
                               f"of 16; got {out} x {in_features}")
    if quantize == "int4" and (group_size % 16 or group_size & (group_size - 1) or in_features % group_size):
        raise KernelInputError(f"int4 group size {group_size}: the dense tensor-core path needs a power of two of "
                               f"at least 16 columns that divides in_features {in_features}")
    wide = 2 * in_features
    bitmask = torch.full((out, wide // 32), _DENSE_MASK, dtype=torch.int32, device=codes.device)
    if quantize == "int8":
        packed = PackedNMQ(codes.to(torch.int8).contiguous(), scales.reshape(out, 1).to(torch.bfloat16), bitmask,
                           2, 4, (out, wide), "int8", wide)
    else:
        nibbles = codes.to(torch.int32) & 0xF
        pairs = (nibbles[:, 0::2] | (nibbles[:, 1::2] << 4)).to(torch.uint8)
        packed = PackedNMQ(pairs.contiguous(), scales.to(torch.bfloat16).contiguous(), bitmask, 2, 4, (out, wide),
                           "int4", 2 * group_size)
    return replace(tile(packed, int8_step=STEP_TILES[8], int4_step=STEP_TILES[4]), meta=None,
                   shape=(out, in_features), dense=True)


def dense_from_parts(a: torch.Tensor, scales: torch.Tensor, in_features: int, quantize: str,
                     group_size: int) -> Sp24Weight:
    """A `tile_dense` weight from its tiled values `a` and scales (int4: tiled; int8: the row scales [out]) and
    the dense width: the rest of its fields follow from them (out is a multiple of 16)."""
    code = 8 if quantize == "int8" else 4
    steps = -(-(2 * in_features // 32) // STEP_TILES[code])
    tile_bytes = steps * (8 if code == 8 else 4) * 512  # of a 16-row tile
    row_tiles = a.numel() // tile_bytes
    group_tiles = group_size // 16  # int4: k-tiles (32 columns of the expanded weight) a scale
    groups = -(-steps * STEP_TILES[code] // group_tiles) if code == 4 else 0
    scale_count = 16 * row_tiles * (groups if code == 4 else 1)
    if a.dim() != 1 or a.numel() != row_tiles * tile_bytes or scales.numel() != scale_count:
        raise KernelInputError(f"{a.numel()} tiled bytes and {scales.numel()} scales are not a dense {quantize} "
                               f"weight of {in_features} columns in the sparse tensor-core layout (tile_dense's)")
    if code == 8:
        return Sp24Weight(a, None, None, scales, (16 * row_tiles, in_features), 8, torch.bfloat16, steps,
                          dense=True)
    return Sp24Weight(a, None, scales, None, (16 * row_tiles, in_features), 4, torch.bfloat16, steps,
                      group_tiles.bit_length() - 1, groups, dense=True)


def _meta_of(w: Sp24Weight) -> torch.Tensor:
    """w's tiled metadata words; for a dense weight the constant word, as the kernel takes it."""
    if w.meta is not None:
        return w.meta
    size = -(-w.shape[0] // 16) * w.steps * 16 * w.ks
    return torch.full((size,), _PAD_META, dtype=torch.int32, device=w.a.device)


def compact(wide: torch.Tensor) -> torch.Tensor:
    """The dense [rows, in] weight of its [rows, 2·in] 2:4 form (positions 0 and 1 of every group)."""
    rows, columns = wide.shape
    return wide.reshape(rows, columns // 4, 4)[:, :, :2].reshape(rows, columns // 2)


OVER_SLOTS = 2  # overflow slots a row and 32-column word that the kernel reads (sp24.cu, OVER)
OVER_INT4_GROUP = 128  # int4 codes with overflow slots: the one group size sp24.cu instantiates (kOverInt4Sps)
OVER_LOOPS = dict(zip(SP24_OVER_LOOP_CHOICES, (1, 2, 0, 3, 4)))  # op.sp24_over_loop_setting -> sp24.cu's over_loop
COLUMNS = 3  # the CUDA-core over_loop on a column copy of x, built only into the library with SP24_COLUMNS (sp24.cu)
MMA = 4  # the tensor-core over_loop (16-bit values), on the same copy and in the same library
COPIES = (COLUMNS, MMA)  # the over_loops that stage the column copy
QUADS = 5  # quad-placed slots (16:32+4q, `tile_quads`), built only into the library with SP24_QUADS
GROUPED = 6  # grouped columns (16:32g, `tile_grouped`), built only into the library with SP24_GROUPED


def over_loop(w: Sp24Weight, batch: int) -> int:
    """sp24_launch's `over_loop` for w at `batch` under SPARSEDECODING_SP24_OVER_LOOP: 1 (rows of x outer) when w
    has no overflow slots; "auto" resolves by batch to the order that was fastest there side by side: rows for 1-4,
    the slots on a column copy of x for 5-8 (results/overflow_h200_auto.md: columns at batch 8 1.00x cuBLAS against
    rows 0.86x and slots 0.90x), rows for 9-12 and the column copy again for 13-16 (results/overflow_h200_one_cta.md,
    one CTA a multiprocessor there: rows 0.78 / 0.65x at batch 9 / 12 against columns 0.67 / 0.61x, columns 0.58x
    at 16 against 0.54x). On that copy 16-bit values take the tensor cores (MMA), which beat the columns order
    side by side, 1.033 / 1.038 / 1.129x at batch 5 / 8 / 16 (and lost at 1-2 and 12, tied at 4:
    results/overflow_h200_mma.md); codes, which MMA does not take, the columns order. "mma" forces MMA for 16-bit
    values, and a weight of codes takes auto's order under it."""
    if w.grouped:  # one loop: B's rows gathered from the column copy of x in the weight's order
        return GROUPED
    if w.over_v is None:
        return 1
    if w.quads:  # quad-placed slots have one loop, on the tensor cores with the 2:4 part's own B fragments
        return QUADS
    loop = OVER_LOOPS[sp24_over_loop_setting()]
    if loop == MMA and w.code != 0:  # the tensor-core loop takes 16-bit values; codes keep auto's order
        loop = 0
    if loop == 0:
        if 5 <= batch <= 8 or batch >= 13:
            return MMA if w.code == 0 else COLUMNS
        return 1
    return loop


def early_trigger(w: Sp24Weight, batch: int) -> bool:
    """Whether a launch of w at `batch` uses the build with the early trigger (SP24_EARLY_TRIGGER=1): what
    SPARSEDECODING_SP24_EARLY_TRIGGER says where it is 0 or 1. Under auto, only where the engine measured the early
    build faster side by side (op.sp24_early_trigger_setting): 2:4 weights of bf16 values or of int8 codes in steps
    of 16, and 16:32+K weights of bf16 values at batch 1-4. Everything else keeps the default build: int4 codes
    (slower in the engine), dense int8 / int4 weights and codes with slots (not measured under it), and slotted
    weights from batch 5 on (0.949x at batch 8). Under timed (the default), the same choice is the build every
    candidate launch is tried in, and the tuner tries the other build too where `times_both_builds` says so
    (`tuned_launch`)."""
    setting = sp24_early_trigger_setting()
    if setting is not None:
        return setting
    if w.dense or w.code == 4 or w.quads or w.grouped:  # quad-placed slots, grouped columns: not measured under it
        return False
    if w.over_v is not None:
        return w.code == 0 and batch <= 4
    return w.code == 0 or w.build_ks == STEP_TILES[8]


def times_both_builds(w: Sp24Weight, batch: int) -> bool:
    """Whether the tuner, under SPARSEDECODING_SP24_EARLY_TRIGGER=timed, also times a launch of w at `batch` in the
    build `early_trigger` did not pick: everywhere except slotted weights (16:32+K) from batch 5 on, which stay in
    the default build as under auto. There the early build is slower in whole steps (0.949x at batch 8,
    results/early_trigger_h200_8b_16of32p2.md) though a launch alone can be faster in it, and timing both lost 1.6%
    and 1.4% of the 8B preset's 16:32+2 step at batch 8 in two runs, one in each order
    (results/timed_trigger_h200_8b_16of32p2_builds*.md). Quad-placed slots (`tile_quads`) keep the default build.
    Grouped columns (16:32g, 16:32g8) are timed in both since the seventy-fourth session: alone, the early build ran
    16:32g at 1.769 against 1.669x cuBLAS and 16:32g8 at 1.651 against 1.527x at batch 1, faster at every batch 1-16
    (results/grouped_halves_h100_early.md against _s74.md, one warm H100); in whole steps the 8B preset's 16:32g
    decode ran 1.604 / 1.443 / 1.095x dense at batch 1 / 8 / 16 so timed against 1.563 / 1.442 / 1.084x in the
    default build (results/grouped_trigger_ab_h100_8b_g.md, side by side), and 16:32g8's 1.498 / 1.369 / 0.944x
    against 1.472 / 1.329 / 0.926x (results/grouped_trigger_ab_h100_8b_g8.md)."""
    return sp24_early_trigger_timed() and not (w.over_v is not None and (batch > 4 or w.quads))


def staged_offset(columns: torch.Tensor) -> torch.Tensor:
    """Byte offset of column c (0-31) of a k-tile in the kernel's staged x (see sp24.cu): 16·((c % 8) / 2) +
    4·(c / 8) + 2·(c % 2)."""
    c = columns.to(torch.int32)
    return (16 * ((c & 7) >> 1) + 4 * (c >> 3) + 2 * (c & 1)).to(torch.uint8)


def _staged_column(offsets: torch.Tensor) -> torch.Tensor:
    """Inverse of `staged_offset`."""
    o = offsets.to(torch.int64)
    return (8 * ((o >> 2) & 3) + 2 * (o >> 4) + ((o >> 1) & 1)).to(torch.uint8)


def _lane_grid(device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """Index grids [8, 1] of g and [1, 4] of a lane's t (or a word j 0..3), for the slots' lane layout."""
    return torch.arange(8, device=device).view(8, 1), torch.arange(4, device=device).view(1, 4)


def tile_overflow(w: OverflowNM, glu: bool = False) -> Sp24Weight:
    """The tiled layout of a 16:32+K weight split by `overflow.split_overflow` (16-bit values) or
    `split_overflow_quantized` (int8 codes, or int4 codes with OVER_INT4_GROUP columns a scale), at most two slots:
    `tile` of its 2:4 part, plus the slots per row tile, slot step (8 k-tiles) and lane as sp24.cu's OVER path reads
    them (lane (g, t)'s slot k: word (t - g) % 4 + 4·(k / 4) of the slot step, row g + 8·((k / 2) % 2), slot k % 2; the
    column as its staged-x offset: so a lane holds both slots of its two rows in the two words whose MMA group (g +
    word) % 8 is t or t + 4, as the tensor-core slot loop needs). The slots hold the weight's dtype for 16-bit values,
    and int8 codes for codes (the kernel multiplies an int8 slot by its row scale, an int4 one by its row's scale of its
    column group). With `glu`, rows in `glu_order` as for `tile`."""
    if w.slots > OVER_SLOTS:
        raise KernelInputError(f"{w.slots} overflow slots a word; the kernel reads at most {OVER_SLOTS}")
    if w.quantized and w.w24.quantize == "int4" and w.w24.group_size != OVER_INT4_GROUP:
        raise KernelInputError(f"int4 group size {w.w24.group_size}: overflow slots with int4 codes run "
                               f"{OVER_INT4_GROUP} columns a scale")
    base = tile(w.w24, glu, step_tiles(8, slots=True), step_tiles(4, slots=True))
    values = w.values.to(torch.int8 if base.code else base.dtype)  # codes for codes
    columns = w.columns
    if w.slots < OVER_SLOTS:  # pad to two slots: value 0, column 0
        pad = OVER_SLOTS - w.slots
        values = torch.cat([values, values.new_zeros(*values.shape[:2], pad)], dim=2)
        columns = torch.cat([columns, columns.new_zeros(*columns.shape[:2], pad)], dim=2)
    out, in_features = w.shape
    if glu:
        order = glu_order(out, values.device)
        values, columns = values[order], columns[order]
    words = base.steps * base.ks
    row_tiles, steps = -(-out // 16), words // STEP_TILES[0]  # slot steps

    def lanes(t: torch.Tensor) -> torch.Tensor:
        padded = t.new_zeros(row_tiles * 16, words, OVER_SLOTS)
        padded[:out, :t.shape[1]] = t
        v = padded.view(row_tiles, 2, 8, steps, 2, 4, OVER_SLOTS)  # tile h g step half j | word 4·half + j
        v = v.permute(0, 3, 2, 5, 4, 1, 6)  # tile step g j half h s
        g, lane_t = _lane_grid(v.device)
        return v[:, :, g, (lane_t - g) & 3].contiguous().view(-1)  # tile step g t | k = 4·half + 2h + s

    return replace(base, over_v=lanes(values), over_o=lanes(staged_offset(columns)))


def tile_quads(weight: torch.Tensor) -> Sp24Weight:
    """The tiled layout of a 16:32+4q weight [out, in] of 16-bit values (`--pattern 16:32+4q`): `tile` of its 2:4
    part (the two largest |w| of every group of four) plus its quad-placed slots as `quad_slots.split_quad_slots`
    lays them out (each lane's 16-bit value and placement byte a k-tile, 16 and 8 bytes a lane and slot step, the
    shapes sp24.cu's loads of `over_v` / `over_o` take), for sp24.cu's OVER 5. No GLU tiling yet. PackingError
    unless the weight fits the placement; KernelInputError for codes."""
    if weight.dtype not in (torch.bfloat16, torch.float16):
        raise KernelInputError(f"quad-placed slots take 16-bit values; got {weight.dtype}")
    w24, slots = quad_slots.split_quad_slots(weight)
    base = tile(pack_nm(w24, 2, 4))
    steps = base.steps * base.ks // quad_slots.STEP
    if slots.values.shape[1] != steps:  # both pad the k-tiles to whole steps of 8
        raise KernelInputError(f"{slots.values.shape[1]} slot steps for {steps} tiled ones")
    return replace(base, over_v=slots.values.contiguous().view(torch.uint8).view(-1),
                   over_o=slots.info.contiguous().view(-1), quads=True)


GROUP_TILE_ROWS = 16  # a grouped weight's column order is shared by the 16 rows of an mma.sp tile
_PAIRINGS: torch.Tensor | None = None  # the 105 ways to pair 8 groups, [105, 4, 2]


def place_of(columns: torch.Tensor) -> torch.Tensor:
    """The place of column c (0-31) of a k-tile in sp24.cu's column-major copy of the staged x: its staged byte / 2,
    8·((c % 8) / 2) + 2·(c / 8) + c % 2 (`staged_offset`). Place q's 16 bytes sit in shared-memory bank group q % 8."""
    return (staged_offset(columns) // 2).long()


def _pairings() -> torch.Tensor:
    global _PAIRINGS
    if _PAIRINGS is None:
        def pairs(items: tuple[int, ...]) -> list[list[tuple[int, int]]]:
            if not items:
                return [[]]
            first, rest = items[0], items[1:]
            return [[(first, other)] + tail for i, other in enumerate(rest)
                    for tail in pairs(rest[:i] + rest[i + 1:])]
        _PAIRINGS = torch.tensor(pairs(tuple(range(8))), dtype=torch.int64)
    return _PAIRINGS


def arrange_groups(order: torch.Tensor) -> torch.Tensor:
    """The same partition as `order` [..., 32] (each word's columns in groups of four: positions 4q..4q + 3 hold
    group q) with its groups paired so that the ldmatrix of B reads with the fewest shared-memory wavefronts: positions
    8i..8i + 7 (groups 2i, 2i + 1) are one 8x8 matrix, whose 8 rows cost as many wavefronts as the most of them in one
    bank group (`place_of`). Of the 105 pairings, the one of least total cost (the first on ties); each group's columns
    ascending."""
    groups = order.reshape(*order.shape[:-1], 8, 4).sort(dim=-1).values
    bank = place_of(groups) % 8  # [..., 8, 4]
    counts = torch.nn.functional.one_hot(bank, 8).sum(-2)  # [..., 8 groups, 8 banks]
    pair_cost = (counts.unsqueeze(-2) + counts.unsqueeze(-3)).amax(-1)  # [..., 8, 8]
    pairings = _pairings().to(order.device)  # [105, 4, 2]
    cost = pair_cost[..., pairings[..., 0], pairings[..., 1]].sum(-1)  # [..., 105]
    best = pairings[cost.argmin(-1)].reshape(*order.shape[:-1], 8)  # group at each physical group slot
    return groups.gather(-2, best.unsqueeze(-1).expand(*best.shape, 4)).reshape(order.shape)


def ungroup_columns(dense: torch.Tensor, order: torch.Tensor, r0: int, split_rows: int = GROUP_TILE_ROWS
                    ) -> torch.Tensor:
    """Rows r0.. of a weight in the tiled column order back in the weight's own: column 32w + order[tile, w, l] gets
    column 32w + l of its row (tile = row / split_rows)."""
    rows, cols = dense.shape
    tiles = torch.arange(r0, r0 + rows, device=dense.device) // split_rows
    words = cols // 32
    index = (order[tiles, :words] + 32 * torch.arange(words, device=dense.device).view(1, -1, 1)).reshape(rows, cols)
    return torch.zeros_like(dense).scatter_(1, index, dense)


def tile_grouped(weight: torch.Tensor, order: torch.Tensor, arrange: bool = True, glu: bool = False,
                 split_rows: int = GROUP_TILE_ROWS) -> Sp24Weight:
    """The tiled layout of a 16:32g weight [out, in] of 16-bit values: `order` [row tiles, in / 32, 32] (int64) is
    each 16-row tile's word's columns as eight groups of four (positions 4q..4q + 3: group q), and
    every row keeps at most two weights in each group. The word's columns are tiled in that order (paired for the
    fewest bank conflicts first, `arrange_groups`, unless `arrange` is False), so each tile is a 2:4 weight that
    sp24.cu's OVER 6 multiplies with B's rows gathered from x in the same order; `over_o` holds each lane's place of
    x (`place_of`) a k-tile. With `glu`, a gate|up weight whose rows (and their tiles' orders) go in `glu_order`, as
    for `tile`. `split_rows` 8: each 8-row half of a tile has its own order (`order` [2 · row tiles, in / 32, 32]),
    `over_o` a lane's places for the first half, then for the second, a step (SP24_GROUPED_HALVES; a kernel probe
    that `Sp24Linear` and `prune` do not make yet). KernelInputError for codes, a wrong order, or a row that keeps
    three or more of a group."""
    if weight.dtype not in (torch.bfloat16, torch.float16):
        raise KernelInputError(f"grouped columns take 16-bit values; got {weight.dtype}")
    if split_rows not in (8, GROUP_TILE_ROWS):
        raise KernelInputError(f"a grouped weight's order is shared by 16 rows or 8; got split_rows = {split_rows!r}")
    out, in_features = weight.shape
    row_tiles, words = -(-out // GROUP_TILE_ROWS), in_features // 32
    orders = row_tiles * GROUP_TILE_ROWS // split_rows
    if in_features % 32 or tuple(order.shape) != (orders, words, 32):
        raise KernelInputError(f"a [{out}, {in_features}] weight needs in a multiple of 32 and an order of shape "
                               f"[{orders}, {words}, 32]; got {tuple(order.shape)}")
    order = order.to(weight.device, torch.int64)
    if not torch.equal(order.sort(-1).values, torch.arange(32, device=order.device).expand_as(order)):
        raise KernelInputError("each word's order must be a permutation of its 32 columns")
    if glu:
        if out % 32:
            raise KernelInputError(f"a GLU weight needs a multiple of 32 rows (gate and up halves of whole tiles); "
                                   f"got {out}")
        rows_in_order = glu_order(out, weight.device)
        weight, order = weight[rows_in_order], order[rows_in_order[::split_rows] // split_rows]
        return replace(tile_grouped(weight, order, arrange, split_rows=split_rows), glu=True)
    if arrange:
        order = arrange_groups(order)
    rows = torch.arange(out, device=weight.device) // split_rows
    index = (order[rows] + 32 * torch.arange(words, device=order.device).view(1, -1, 1)).reshape(out, in_features)
    tiled_order = weight.gather(1, index)
    kept = (tiled_order != 0).view(out, -1, 4).sum(-1)
    if (kept > 2).any():
        row, group = divmod(int((kept > 2).flatten().nonzero()[0]), kept.shape[1])
        raise KernelInputError(f"row {row} keeps {int(kept[row, group])} weights in group {group % 8} of word "
                               f"{group // 8}'s order; a 16:32g weight keeps at most two a group")
    base = tile(pack_nm(tiled_order, 2, 4))
    tiles = base.steps * base.ks
    places = place_of(order)
    if tiles > words:  # padded k-tiles: any order (their weights are zeros)
        places = torch.cat([places, place_of(torch.arange(32, device=order.device)).expand(orders, tiles - words,
                                                                                           32)], dim=1)
    halves = GROUP_TILE_ROWS // split_rows
    lanes = places.view(row_tiles, halves, base.steps, base.ks, 32).permute(0, 2, 4, 1, 3)  # tile step lane half k
    return replace(base, over_o=lanes.to(torch.uint8).contiguous().view(-1), grouped=True, split_rows=split_rows)


def random_grouped(out: int, in_features: int, generator: torch.Generator,
                   dtype: torch.dtype = torch.bfloat16, split_rows: int = GROUP_TILE_ROWS
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """A random 16:32g weight [out, in] and its order (`tile_grouped`) on the generator's device, for tests and
    benches: each 16-row tile's (or with `split_rows` 8, each 8-row half's) words in a random order, each row keeping
    two random columns of every group of four, standard normal values."""
    device = generator.device
    row_tiles, words = -(-out // GROUP_TILE_ROWS), in_features // 32
    order = torch.rand(row_tiles * GROUP_TILE_ROWS // split_rows, words, 32, generator=generator,
                       device=device).argsort(-1)
    rank = torch.rand(out, words, 8, 4, generator=generator, device=device).argsort(-1).argsort(-1)
    values = torch.randn(out, words, 8, 4, generator=generator, device=device) * (rank < 2)
    rows = torch.arange(out, device=device) // split_rows
    weight = torch.zeros(out, words, 32, device=device).scatter_(2, order[rows], values.reshape(out, words, 32))
    return weight.reshape(out, in_features).to(dtype), order


# `grouped_split`'s quick look: the share of the first words (of those whose rows all keep 16) whose split the greedy
# pass and the exact cover must find (no one-by-one search) before the whole weight is read; a 16:32g or 16:32g8
# mask's words nearly all pass (after both covers 2 of 65,536 random 16:32g8 words were left to the search,
# results/grouped_readback_cpu.md), a plain 16:32 or 16:32+2 mask's nearly none
QUICK_LOOK_SHARE = 0.9


def grouped_split(weight: torch.Tensor, first_words: int = 256, split_rows: int = GROUP_TILE_ROWS
                  ) -> torch.Tensor | None:
    """An order (`tile_grouped`) under which the 16:32 weight [out, in] (out a multiple of 16) is 16:32g, read off its
    nonzeros (`solvers.grouped_order_of`), or None where some 16-row tile's word has none. The first `first_words`
    words are looked at first (`looks_grouped`), so that a 16:32 or 16:32+2 weight (nearly every word breaks) is
    turned down cheaply: with the search, turning down a random 16:32+2 weight of 1024 x 4096 took 25 s on a CPU for
    8-row splits (seventy-second session), every 16:32 linear the engine tiles trying both. `split_rows` 8: an order
    for each 8-row half (16:32g8, [out / 8, in / 32, 32])."""
    from ..solvers import grouped_order_of

    if not looks_grouped(weight, first_words, split_rows):
        return None
    out, in_features = weight.shape
    order, found = grouped_order_of(_split_words(weight, split_rows), all_or_none=True)
    return order.view(out // split_rows, in_features // 32, 32) if bool(found.all()) else None


def looks_grouped(weight: torch.Tensor, first_words: int = 256, split_rows: int = GROUP_TILE_ROWS) -> bool:
    """`grouped_split`'s quick look: whether the 16:32 weight [out, in] may be 16:32g (`split_rows` 8: 16:32g8), from
    its first `first_words` words (their split found for QUICK_LOOK_SHARE of those whose rows all keep 16, without
    the one-by-one search). False settles it (no split for some word); True leaves the rest to `grouped_split`."""
    from ..solvers import grouped_order_of

    out, in_features = weight.shape
    if out % GROUP_TILE_ROWS or in_features % 32:
        return False
    first = _split_words(weight[:-(-first_words // (in_features // 32)) * split_rows], split_rows)[:first_words]
    full = (first.sum(2) == 16).all(1)  # words whose rows all keep 16: those the look can solve without the search
    return not bool(full.any()) or float(grouped_order_of(first[full], search=False)[1].float().mean()) \
        >= QUICK_LOOK_SHARE


def _split_words(weight: torch.Tensor, split_rows: int) -> torch.Tensor:
    """The kept masks of the words [out / split_rows · in / 32, split_rows, 32] of `weight` [out, in] whose rows share a
    split, row block by row block."""
    out, in_features = weight.shape
    words = (weight != 0).view(out // split_rows, split_rows, in_features // 32, 32).transpose(1, 2)
    return words.reshape(-1, split_rows, 32)


def grouped_order(w: Sp24Weight) -> torch.Tensor:
    """The column order [row tiles, in / 32, 32] of a `tile_grouped` weight (as arranged), read from its places; a
    GLU weight's tiles in their original order (gate, then up). With `split_rows` 8, [2 · row tiles, in / 32, 32]:
    the halves' orders."""
    row_tiles, words = -(-w.shape[0] // GROUP_TILE_ROWS), w.shape[1] // 32
    halves = GROUP_TILE_ROWS // w.split_rows
    places = w.over_o.view(row_tiles, w.steps, 32, halves, w.ks).permute(0, 3, 1, 4, 2)  # tile half step k lane
    places = places.reshape(row_tiles * halves, -1, 32)[:, :words]
    column_at = torch.argsort(place_of(torch.arange(32, device=places.device)))  # place -> column
    order = column_at[places.long()]
    if w.glu:  # tiled block k (of split_rows rows) holds original block glu_order(...)[k · split_rows] / split_rows
        order = order[torch.argsort(glu_order(w.shape[0], order.device)[::w.split_rows])]
    return order


def _quad_slots_of(w: Sp24Weight, device: torch.device) -> quad_slots.QuadSlots:
    """The `quad_slots.QuadSlots` view of a `tile_quads` weight's slot tensors, on `device`."""
    row_tiles = -(-w.shape[0] // 16)
    return quad_slots.QuadSlots(w.over_v.to(device).view(w.dtype).view(row_tiles, -1, 32, quad_slots.STEP),
                                w.over_o.to(device).view(row_tiles, -1, 32, quad_slots.STEP), w.shape)


def untile_slots(w: Sp24Weight) -> tuple[torch.Tensor, torch.Tensor]:
    """The slots of a `tile_overflow` weight as (values [out, in / 32, 2]: of w's dtype, or int8 codes for codes;
    columns uint8 of the same shape), rows in their original order; inverse of the tiling. `slot_weights` gives the
    weights."""
    if w.over_v is None:
        raise KernelInputError("this tiled weight has no overflow slots")
    if w.quads:
        raise KernelInputError("this tiled weight holds quad-placed slots (tile_quads); read them with "
                               "quad_slots.emulate")
    out, in_features = w.shape
    row_tiles, steps = -(-out // 16), w.steps * w.ks // STEP_TILES[0]

    def rows(t: torch.Tensor) -> torch.Tensor:
        v = t.view(row_tiles, steps, 8, 4, 2, 2, OVER_SLOTS)  # tile step g t half h s
        g, j = _lane_grid(v.device)
        v = v[:, :, g, (j + g) & 3].permute(0, 5, 2, 1, 4, 3, 6)  # tile h g step half j s: lane t = (j + g) % 4
        return v.reshape(row_tiles * 16, steps * STEP_TILES[0], OVER_SLOTS)[:out, :in_features // 32]

    values, columns = rows(w.over_v), _staged_column(rows(w.over_o))
    if w.glu:
        back = torch.argsort(glu_order(out, values.device))
        values, columns = values[back], columns[back]
    return values.contiguous(), columns.contiguous()


def slot_weights(w: Sp24Weight, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """`untile_slots` with the values as weights in `dtype`: for codes, code·scale (the row's, or for int4 the row's
    of the slot's column group; exact in float64, rounded once to `dtype`, as `PackedNMQ.to_dense` rounds)."""
    values, columns = untile_slots(w)
    if w.code == 0:
        return values.to(dtype), columns
    out, words, slots = values.shape
    # the scales come in the tiled row order, the slots in the original one
    back = torch.argsort(glu_order(out, values.device)) if w.glu else torch.arange(out, device=values.device)
    if w.code == 8:
        scales = w.row_scales.to(values.device).double()[back][:, None, None]
    else:
        row_tiles = -(-out // 16)
        by_row = w.scales.to(values.device).view(torch.bfloat16).view(row_tiles, w.groups, 8, 2)
        by_row = by_row.permute(0, 3, 2, 1).reshape(row_tiles * 16, w.groups)[:out][back].double()
        column = 32 * torch.arange(words, device=values.device).view(1, words, 1) + columns.long()
        scales = by_row.gather(1, (column >> (5 + w.gk_shift)).view(out, -1)).view(out, words, slots)
    return (values.double() * scales).to(dtype), columns


def _slot_rows(values: torch.Tensor, columns: torch.Tensor, r0: int, r1: int, dtype: torch.dtype) -> torch.Tensor:
    """Rows r0..r1 of the slots' dense weight [rows, in] in `dtype`."""
    rows, words = r1 - r0, values.shape[1]
    dense = torch.zeros(rows, words, 32, dtype=dtype, device=values.device)
    dense.scatter_add_(2, columns[r0:r1].long(), values[r0:r1].to(dtype))
    return dense.view(rows, words * 32)


def _codes_to_mask(codes: torch.Tensor) -> torch.Tensor:
    """Inverse of `meta_codes`: int64 words of 2-bit position pairs → int32 mask words."""
    mask = torch.zeros_like(codes)
    for q in range(8):
        nib = (codes >> (4 * q)) & 0xF
        mask |= ((1 << (nib & 3)) | (1 << (nib >> 2))) << (4 * q)
    return torch.where(mask >= 2**31, mask - 2**32, mask).to(torch.int32)


def _lanes_to_kept(lanes: torch.Tensor, out: int, kept_per_row: int) -> torch.Tensor:
    """Inverse of `_lane_values`: [tile, k-tile, g, t, half, h, j] → kept entries [out, kept_per_row]."""
    row_tiles, tiles = lanes.shape[:2]
    kept = lanes.permute(0, 5, 2, 1, 4, 3, 6).reshape(row_tiles * 16, tiles * 16)
    return kept[:out, :kept_per_row].contiguous()


def untile(w: Sp24Weight) -> PackedNM | PackedNMQ:
    """The packed weight (`PackedNM`, or `PackedNMQ` for codes) that `tile` made `w` from, exactly (rows in their
    original order for a GLU weight); on w's device. For a dense weight, its 2:4 form of twice the columns (`compact`
    of its `to_dense` is the weight). A weight with overflow slots raises KernelInputError
    (its 2:4 part alone is `untile(replace(w, over_v=None, over_o=None))`, its slots `untile_slots`)."""
    if w.over_v is not None:
        raise KernelInputError("this tiled weight has overflow slots, which a packed 2:4 weight cannot hold")
    if w.grouped:
        raise KernelInputError("this tiled weight has grouped columns (tile_grouped); its 2:4 form in the tiled "
                               "order is untile(replace(w, over_o=None, grouped=False)), the weight tiled_to_dense(w)")
    if w.glu:
        order = glu_order(w.shape[0], w.a.device)
        return _rows(untile(replace(w, glu=False)), torch.argsort(order))
    out, in_features = w.shape[0], w.tiled_in
    ks = w.ks
    row_tiles, tiles = -(-out // 16), w.steps * ks
    words = _meta_of(w).to(torch.int64).view(row_tiles, w.steps, 8, 2, ks) & 0xFFFFFFFF
    words = words.permute(0, 2, 1, 4, 3).reshape(row_tiles, 8, tiles, 2)  # tile g s t
    rows_g = (words[..., 0] & 0xFFFF) | ((words[..., 1] & 0xFFFF) << 16)
    rows_g8 = (words[..., 0] >> 16) | ((words[..., 1] >> 16) << 16)
    codes = torch.stack([rows_g, rows_g8], dim=1).reshape(row_tiles * 16, tiles)
    bitmask = _codes_to_mask(codes[:out, :in_features // 32]).contiguous()
    kept_per_row = in_features // 2
    if w.code == 0:
        lanes = w.a.view(w.dtype).view(row_tiles, tiles, 8, 4, 2, 2, 2)
        return PackedNM(_lanes_to_kept(lanes, out, kept_per_row), bitmask, 2, 4, (out, in_features))
    if w.code == 8:
        b = w.a.view(row_tiles, tiles // 2, 32, 2, 8).permute(0, 1, 3, 2, 4)
        lanes = b.reshape(row_tiles, tiles, 8, 4, 2, 2, 2).permute(0, 1, 2, 3, 5, 4, 6)  # h and half back
        codes8 = (_lanes_to_kept(lanes, out, kept_per_row).to(torch.int32) - 128).to(torch.int8)
        return PackedNMQ(codes8, w.row_scales.view(out, 1).clone(), bitmask, 2, 4, (out, in_features), "int8",
                         in_features)
    word = w.a.view(torch.int32).view(row_tiles, tiles // 4, 32, 4).permute(0, 1, 3, 2)  # load L: k-tiles 4L..4L+3
    word = word.reshape(row_tiles, tiles, 32).to(torch.int64) & 0xFFFFFFFF
    shifts = torch.tensor(_INT4_SHIFTS, dtype=torch.int64, device=word.device)
    nibbles = ((word[..., None] >> shifts) & 0xF) ^ 0x8  # offset binary -> two's complement nibble
    kept = _lanes_to_kept(nibbles.view(row_tiles, tiles, 8, 4, 2, 2, 2), out, kept_per_row)
    packed_codes = (kept[:, 0::2] | (kept[:, 1::2] << 4)).to(torch.uint8)
    group_size = 32 << w.gk_shift
    scales = w.scales.view(row_tiles, w.groups, 8, 2).permute(0, 3, 2, 1).reshape(row_tiles * 16, w.groups)
    scales = scales[:out, :in_features // group_size].contiguous()
    return PackedNMQ(packed_codes, scales, bitmask, 2, 4, (out, in_features), "int4", group_size)


def tiled_to_dense(w: Sp24Weight) -> torch.Tensor:
    """The float64 [out, in] weight that the kernel multiplies by, read back from the tiled tensors through
    mma.sp's register semantics (each lane's A registers, dequantized as the kernel does, placed at the kept
    positions its metadata names) — independent of `tile`, for tests. A GLU weight's rows come back in their
    original order. Overflow slots are added as `untile_slots` reads them, quad-placed ones as
    `quad_slots.emulate` does."""
    if w.grouped:  # (a GLU weight's rows come back in their original order first)
        return ungroup_columns(tiled_to_dense(replace(w, over_o=None, grouped=False)), grouped_order(w), 0,
                               w.split_rows)
    if w.quads:
        plain = tiled_to_dense(replace(w, over_v=None, over_o=None, quads=False))
        return plain + quad_slots.emulate(_quad_slots_of(w, torch.device("cpu")))
    if w.over_v is not None:
        values, columns = slot_weights(w, torch.float64)
        plain = tiled_to_dense(replace(w, over_v=None, over_o=None))
        return plain + _slot_rows(values.cpu(), columns.cpu(), 0, w.shape[0], torch.float64)
    if w.glu:
        return tiled_to_dense(replace(w, glu=False))[torch.argsort(glu_order(w.shape[0]))]
    if w.dense:
        return compact(tiled_to_dense(replace(w, meta=_meta_of(w), shape=(w.shape[0], w.tiled_in), dense=False)))
    out, in_features = w.shape
    ks = w.ks
    row_tiles, tiles = -(-out // 16), w.steps * ks
    a = w.a.cpu()
    if w.code == 0:
        regs = a.view(w.dtype).view(row_tiles, tiles, 8, 4, 4, 2).to(torch.float64)  # tile s g t reg j
    elif w.code == 8:
        # per load: [lane][k-tile of the pair][word (row g, row g+8)][byte]
        b = a.view(row_tiles, tiles // 2, 32, 2, 2, 4).to(torch.float64) - 128
        b = b.permute(0, 1, 3, 2, 4, 5).reshape(row_tiles, tiles, 8, 4, 2, 2, 2)  # tile s g t h half j
        regs = b.permute(0, 1, 2, 3, 5, 4, 6).reshape(row_tiles, tiles, 8, 4, 4, 2)  # reg = 2·half + h
        scale = w.row_scales.cpu().to(torch.float64)
    else:
        words = a.view(torch.int32).view(row_tiles, tiles // 4, 32, 4).permute(0, 1, 3, 2)
        words = words.reshape(row_tiles, tiles, 8, 4).to(torch.int64) & 0xFFFFFFFF  # tile s g t
        nib = torch.stack([(words >> (4 * n)) & 0xF for n in range(8)], dim=-1).to(torch.float64) - 8
        regs = nib.view(row_tiles, tiles, 8, 4, 2, 4).transpose(-1, -2)  # element j = nibble r + 4j
        sc = w.scales.cpu().view(torch.bfloat16).to(torch.float64).view(row_tiles, w.groups, 8, 2)
        group = torch.arange(tiles) >> w.gk_shift
        sc = sc[:, group]  # tile s g h
        regs = regs * sc[:, :, :, None, [0, 1, 0, 1], None]  # reg r is row g + 8·(r % 2)
    meta = w.meta.cpu().to(torch.int64).view(row_tiles, w.steps, 8, 2, ks) & 0xFFFFFFFF
    meta = meta.permute(0, 1, 4, 2, 3).reshape(row_tiles, tiles, 8, 2)  # tile s g t<2
    dense = torch.zeros(row_tiles, 16, tiles, 32, dtype=torch.float64)
    for h in range(2):
        for q in range(8):  # MMA group q: kept values in register 2·(q // 4) + h of lane t = q % 4
            vals = regs[:, :, :, q % 4, 2 * (q // 4) + h]  # tile s g j
            code = (meta[:, :, :, q // 4] >> (16 * h + 4 * (q % 4))) & 0xF  # tile s g
            for j in range(2):
                pos = 4 * q + ((code >> (2 * j)) & 3)
                target = dense[:, 8 * h:8 * h + 8].permute(0, 2, 1, 3)  # tile s g col
                target.scatter_add_(3, pos[..., None], vals[..., j][..., None])
    dense = dense.reshape(row_tiles * 16, tiles * 32)
    if w.code == 8:
        dense = dense[:out] * scale[:, None]
    return dense[:out, :in_features]


def _data_ptr(t: torch.Tensor | None) -> int | None:
    return t.data_ptr() if t is not None else None


class Sp24Call(ctypes.Structure):
    """sp24.cu's `Sp24Call`: the arguments of `sp24_launch`, field for field in its order, passed to `sp24_call` as
    one pointer (ctypes converting 33 arguments took about 5 us of an eager call's host time)."""

    _fields_ = [(name, ctypes.c_void_p) for name in ("x", "a", "meta", "scales", "row_scales", "y", "partials",
                                                      "counters")] \
        + [(name, ctypes.c_int) for name in ("batch", "out", "in_features", "steps", "is_bf16", "code_bits", "gk_shift",
                                             "groups", "splits", "slices", "glu")] \
        + [(name, ctypes.c_void_p) for name in ("res", "norm_w", "sum_out", "ss_slots")] \
        + [("eps", ctypes.c_float), ("pdl", ctypes.c_int)] \
        + [(name, ctypes.c_void_p) for name in ("stream", "over_v", "over_o")] \
        + [(name, ctypes.c_int) for name in ("over_loop", "dense", "stream_ctas")] \
        + [("handoff_slots", ctypes.c_void_p), ("heavy", ctypes.c_int)]


def _load(columns: bool = False, half_meta: bool | None = None, int8_ks: int = STEP_TILES[8],
          int4_ks: int = STEP_TILES[4], early_trigger: bool | None = None, mma_ctas: int = 2,
          quads: bool = False, multicast: int = 0, grouped: bool = False, halves: int = 0,
          grouped_ctas: int = 2) -> ctypes.CDLL:
    """The library (built or loaded once); with `columns`, the build that also holds the slots' loops on a column-major
    copy of x (over_loop 3 and 4), which the default build leaves out so that its other kernels compile as measured;
    `half_meta` (default: SPARSEDECODING_SP24_HALF_META) False builds it with SP24_HALF_META=0; `int8_ks` 8 with
    SP24_INT8_KS=8 (the weight's `build_ks`), `int4_ks` 8 with SP24_INT4_KS=8 (its `build_int4_ks`); `early_trigger`
    True with SP24_EARLY_TRIGGER=1 (default: SPARSEDECODING_SP24_EARLY_TRIGGER where it is 0 or 1; under auto and timed,
    a launch passes `early_trigger(w, batch)` and every other caller gets the default build); `mma_ctas` 1 (with
    `columns`) builds it with SP24_OVER_MMA_CTAS=1 (SPARSEDECODING_SP24_MMA_CTAS, for launches of the mma order);
    `quads` the build with SP24_QUADS (quad-placed slots, over_loop 5); `multicast` 2 or 4 the build with
    SP24_MULTICAST (`multicast_of`: SPARSEDECODING_SP24_MULTICAST, for launches without the RMSNorm in front, slots or
    dense weights); `grouped` the build with SP24_GROUPED (grouped columns, over_loop 6), `halves` 1 or 2 with
    SP24_GROUPED_HALVES=`halves` too (grouped columns whose tiles' 8-row halves have their own order, `split_rows` 8;
    the value SPARSEDECODING_SP24_HALVES_ACC's); `grouped_ctas` 1 with SP24_GROUPED_CTAS=1 (grouped launches' one-CTA
    bound, SPARSEDECODING_SP24_GROUPED_CTAS)."""
    if half_meta is None:
        half_meta = sp24_half_meta_setting()
    if early_trigger is None:
        early_trigger = bool(sp24_early_trigger_setting())
    key = (columns, half_meta, int8_ks, int4_ks, early_trigger, mma_ctas, quads, multicast, grouped, halves,
           grouped_ctas)
    with _lock:
        library = _libraries.get(key)
        if library is None:
            defines = (("-DSP24_COLUMNS",) if columns else ()) + (() if half_meta else ("-DSP24_HALF_META=0",)) \
                + (() if int8_ks == STEP_TILES[8] else (f"-DSP24_INT8_KS={int8_ks}",)) \
                + (() if int4_ks == STEP_TILES[4] else (f"-DSP24_INT4_KS={int4_ks}",)) \
                + (("-DSP24_EARLY_TRIGGER=1",) if early_trigger else ()) \
                + (() if mma_ctas == 2 else (f"-DSP24_OVER_MMA_CTAS={mma_ctas}",)) \
                + (("-DSP24_QUADS",) if quads else ()) \
                + ((f"-DSP24_MULTICAST={multicast}",) if multicast else ()) \
                + (("-DSP24_GROUPED",) if grouped else ()) + ((f"-DSP24_GROUPED_HALVES={halves}",) if halves else ()) \
                + (() if grouped_ctas == 2 else (f"-DSP24_GROUPED_CTAS={grouped_ctas}",))
            library = cuda_mma.open_library(SOURCE, min_major=8, defines=defines)
            library.sp24_call.restype = ctypes.c_int
            library.sp24_call.argtypes = [ctypes.POINTER(Sp24Call)]
            library.sp24_dense_launch.restype = ctypes.c_int
            library.sp24_dense_launch.argtypes = ([ctypes.c_void_p] * 5 + [ctypes.c_int] * 7 + [ctypes.c_void_p]
                                                  + [ctypes.c_int])
            library.sp24_error_string.restype = ctypes.c_char_p
            library.sp24_error_string.argtypes = [ctypes.c_int]
            library.sp24_rows_per_block.restype = ctypes.c_int
            library.sp24_max_smem.restype = ctypes.c_int
            if (library.sp24_rows_per_block(), library.sp24_max_smem()) != (ROWS_PER_BLOCK, MAX_SMEM):
                raise cuda_mma.CudaKernelUnavailableError("sp24.cu and sp24.py disagree on the tile size; rebuild")
            _libraries[key] = library
        return library


def load() -> None:
    """Build (or find cached) and load the library for the current device; raises CudaKernelUnavailableError with
    the reason when it cannot run here (no GPU, compute capability below 8.0, no nvcc, a failed build)."""
    if not torch.cuda.is_available():
        raise cuda_mma.CudaKernelUnavailableError("no CUDA GPU")
    major, minor = torch.cuda.get_device_capability()
    if major < 8:
        raise cuda_mma.CudaKernelUnavailableError(f"sparse tensor cores need compute capability 8.0 or newer; this "
                                                  f"GPU is {major}.{minor}")
    _load()  # without nvcc, only a library prebuilt into the cache (`cuda_mma.prebuilt`)


def min_splits(w: Sp24Weight, batch: int, norm: bool = False) -> int:
    """Fewest step ranges whose staged x fits the CTA's shared memory (with its column-major copy, for a weight with
    overflow slots in an order that reads it, columns or mma, see over_loop; a grouped weight's launches without the
    RMSNorm in front (`norm`) stage that copy alone)."""
    columns = w.ks * 32  # of x a step
    rows = not (w.grouped and not norm)
    step_bytes = 2 * columns * batch if rows else 0
    if over_loop(w, batch) in COPIES + (GROUPED,):
        step_bytes += columns * 16 * (1 if batch <= 8 else 2)  # 8 rows a column, 16 with two n-tiles
    most_steps = (MAX_SMEM - (64 * batch if rows else 0)) // step_bytes
    if most_steps < 1:
        raise KernelInputError(f"batch {batch} does not fit the kernel's shared memory")
    return -(-w.steps // most_steps)


def default_splits(w: Sp24Weight, batch: int, sms: int, slices: int = 1, norm: bool = False) -> int:
    """Step ranges per row block (of ROWS_PER_BLOCK / `slices` rows): enough CTAs for about two per
    multiprocessor, each with at least two steps, and no fewer than the staged x needs."""
    row_blocks = -(-w.shape[0] // (ROWS_PER_BLOCK // slices))
    wanted = max(1, min(-(-2 * sms // row_blocks), w.steps // 2))
    return max(wanted, min_splits(w, batch, norm))


def stream_units(w: Sp24Weight) -> int:
    """The units a stream-K launch of w shares out among its CTAs: every step of every row block (of ROWS_PER_BLOCK
    rows), laid end to end (sp24.cu's StreamUnits)."""
    return -(-w.shape[0] // ROWS_PER_BLOCK) * w.steps


def stream_staged_steps(w: Sp24Weight, ctas: int) -> int:
    """The most steps of x a CTA of a stream-K launch of w over `ctas` CTAs stages: those its units touch, at most
    all of them."""
    return min(w.steps, -(-stream_units(w) // ctas))


def stream_fits(w: Sp24Weight, batch: int, ctas: int, norm: bool = False) -> bool:
    """Whether a stream-K launch of w over `ctas` CTAs can run at `batch`: a weight without overflow slots, dense
    values or GLU, no RMSNorm in front, at most one CTA per unit, and its staged x within the shared memory."""
    if norm or w.over_v is not None or w.grouped or w.dense or w.glu or not 1 <= ctas <= stream_units(w):
        return False
    return batch * (2 * stream_staged_steps(w, ctas) * w.ks * 32 + 64) <= MAX_SMEM


def check_inputs(x: torch.Tensor, w: Sp24Weight) -> None:
    """Raise KernelInputError for anything the kernel would compute wrongly: dtype, shape, batch, device, layout."""
    in_features = w.shape[1]
    if x.dtype != w.dtype:
        raise KernelInputError(f"x is {x.dtype}; this weight runs with {w.dtype} activations")
    if x.dim() not in (1, 2) or x.shape[-1] != in_features:
        raise KernelInputError(f"x has shape {tuple(x.shape)}; expected [{in_features}] or [batch, {in_features}]")
    batch = x.shape[0] if x.dim() == 2 else 1
    if not 1 <= batch <= MAX_BATCH:
        raise KernelInputError(f"batch {batch} is outside 1..{MAX_BATCH}")
    if not x.is_contiguous():
        raise KernelInputError("x is not contiguous; call .contiguous() first")
    tensors = [("x", x), ("a", w.a)] + [(n, t) for n, t in (("meta", w.meta), ("scales", w.scales),
                                                                              ("row_scales", w.row_scales),
                                                                              ("over_v", w.over_v),
                                                                              ("over_o", w.over_o))
                                                          if t is not None]
    if x.device.type != "cuda" or any(t.device != x.device for _, t in tensors):
        raise KernelInputError("x and the tiled weight must be on one CUDA device; got "
                               + ", ".join(f"{name} on {t.device}" for name, t in tensors))
    for name, t in tensors[1:]:  # x off a 16-byte boundary is copied by `sp24_linear`, refused by `Sp24Launch`
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise KernelInputError(f"{name} must be contiguous and start on a 16-byte boundary")


def _capturing(device: torch.device) -> bool:
    """Whether torch's current stream on a CUDA `device` is capturing a CUDA graph."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def slot_workspace(device: torch.device, device_index: int, floats: int) -> torch.Tensor:
    """The device's slot workspace (`_workspaces`) with at least `floats` float32 entries, each kEmpty; allocated (or
    grown) outside CUDA graph capture only."""
    with _lock:
        workspace = _workspaces.get(device_index)
        if workspace is None or workspace.numel() < floats:
            if _capturing(device):
                raise KernelInputError("the first split-K call of this size on a device must run outside CUDA graph "
                                       "capture (it allocates the kernel's slots)")
            if workspace is not None:
                _retired.append(workspace)
            size = max(floats, _WORKSPACE_FLOATS, 2 * (workspace.numel() if workspace is not None else 0))
            workspace = torch.full((size,), -1, dtype=torch.int32, device=device).view(torch.float32)
            if device.type == "cuda":
                torch.cuda.synchronize(device)  # filled before any stream's launch reads it
            _workspaces[device_index] = workspace
        return workspace


def check_norm_inputs(x: torch.Tensor, w: Sp24Weight, res: torch.Tensor | None, weight: torch.Tensor) -> None:
    """KernelInputError unless `res` (or None) matches x and `weight` is the norm's [in] of x's dtype, each on x's
    device, contiguous and on a 16-byte boundary."""
    checks = [("norm weight", weight, (w.shape[1],))] + ([("res", res, tuple(x.shape))] if res is not None else [])
    for name, t, shape in checks:
        if tuple(t.shape) != shape or t.dtype != x.dtype or t.device != x.device:
            raise KernelInputError(f"{name} is {t.dtype} {tuple(t.shape)} on {t.device}; expected {x.dtype} "
                                   f"{shape} on {x.device}")
        if not t.is_contiguous() or t.data_ptr() % 16:
            raise KernelInputError(f"{name} must be contiguous and start on a 16-byte boundary")


class Sp24Launch:
    """The kernel for one problem (the first x's batch, dtype and device, the weight's shape and code), built or
    loaded at construction, which must run outside CUDA graph capture the first time a device uses split-K (it
    allocates the counters and the slot workspace, `slot_workspace`). `splits`: step ranges across CTAs (default
    `default_splits`); `slices`: warps per row tile inside a CTA, sharing out its steps (one of SLICES). A call
    allocates y (and the counting's partial slots) and launches on torch's current stream; split-K and stream-K launches
    that add by handoff keep their partial sums in the device's slot workspace, and like the counters it serves one
    stream at a time. With `norm`, a call takes the RMSNorm in front (`res`, `norm_weight`, `eps`) and returns (y, s):
    y = W·rmsnorm(s) for the residual sum s = x + res (see sp24.cu). Under SPARSEDECODING_SP24_PDL=1 (read at
    construction) the launches are programmatic on compute capability 9.0; SPARSEDECODING_SP24_HANDOFF (read at
    construction) says how split-K and stream-K sums are added.
    `ctas` > 0: a stream-K launch over that many CTAs instead (one slice, no split-K; `stream_fits` says where).
    `bound`: for a grouped-columns weight, the launch bound's CTAs a multiprocessor, 2 or 1 (the build of
    sp24.cu's SP24_GROUPED_CTAS; default `op.sp24_grouped_ctas_setting`); 2 for every other weight."""

    def __init__(self, x: torch.Tensor, w: Sp24Weight, splits: int | None = None, slices: int = 1,
                 norm: bool = False, early: bool | None = None, ctas: int = 0, heavy: int = 0,
                 bound: int | None = None):
        if slices not in SLICES:
            raise KernelInputError(f"slices = {slices}; use one of {SLICES}")
        if w.glu and slices > max(SLICES) // 2:
            raise KernelInputError(f"slices = {slices}: a GLU weight needs its row-tile pairs in one CTA (at most "
                                   f"{max(SLICES) // 2} slices)")
        check_inputs(x, w)
        if x.data_ptr() % 16:
            raise KernelInputError("x does not start on a 16-byte boundary; pass a fresh .clone()")
        if ctas and (slices != 1 or splits not in (None, 1)):
            raise KernelInputError(f"a stream-K launch ({ctas} CTAs) takes one slice and no split-K")
        if heavy and (ctas or splits not in (None, 1) or slices == max(SLICES) or w.glu or w.over_v is not None
                      or w.grouped
                      or (1 if x.dim() == 1 else x.shape[0]) > MIXED_MAX_BATCH
                      or not 0 < heavy * (max(SLICES) // slices) <= -(-w.shape[0] // 16)):
            raise KernelInputError(f"a mixed grid ({heavy} CTAs at {slices} slices, then one row tile a CTA) takes "
                                   f"batch 1-{MIXED_MAX_BATCH}, one split, fewer than 8 slices, no GLU, slots or "
                                   "stream-K, and at most the weight's row tiles in its heavy CTAs")
        if ctas and not stream_fits(w, 1 if x.dim() == 1 else x.shape[0], ctas, norm):
            raise KernelInputError(f"a stream-K launch over {ctas} CTAs cannot run this problem (it needs no RMSNorm "
                                   "in front, slots, dense weight or GLU, at most one CTA per step of a row block, "
                                   "and its staged x within the shared memory)")
        self.over_loop = over_loop(w, 1 if x.dim() == 1 else x.shape[0])
        if bound not in (None, 1, 2) or (bound == 1 and self.over_loop != GROUPED):
            raise KernelInputError(f"bound = {bound!r}: the one-CTA bound (1) is for grouped-columns weights; use 2 "
                                   "or None")
        self.bound = (sp24_grouped_ctas_setting() if bound is None else bound) if self.over_loop == GROUPED else 2
        load()
        self.early_trigger = early_trigger(w, 1 if x.dim() == 1 else x.shape[0]) if early is None else early
        self.multicast = multicast_of(w, norm)
        self.library = _load(self.over_loop in COPIES, sp24_half_meta_setting(), w.build_ks, w.build_int4_ks,
                             self.early_trigger, sp24_mma_ctas_setting() if self.over_loop == MMA else 2,
                             self.over_loop == QUADS, self.multicast, self.over_loop == GROUPED,
                             sp24_halves_acc_setting() if self.over_loop == GROUPED and w.split_rows != GROUP_TILE_ROWS
                             else 0, self.bound)
        self.vector = x.dim() == 1
        self.batch = 1 if self.vector else x.shape[0]
        self.out, self.in_features = w.shape[0], w.tiled_in
        self.dense = w.dense
        self.device = x.device
        self.device_index = x.device.index if x.device.index is not None else torch.cuda.current_device()
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        self.slices = slices
        self.heavy = heavy
        self.pdl = sp24_pdl_setting() and torch.cuda.get_device_capability(self.device)[0] >= 9
        self.ctas = ctas
        self.splits = 1 if ctas or heavy else default_splits(w, self.batch, sms, slices, norm) if splits is None \
            else splits
        if not ctas and self.splits < min_splits(w, self.batch, norm):
            raise KernelInputError(f"splits = {self.splits}: batch {self.batch} needs at least "
                                   f"{min_splits(w, self.batch, norm)} for its x to fit shared memory")
        per_split = -(-w.steps // self.splits)
        self.used_splits = -(-w.steps // per_split)
        self.norm = norm
        row_tiles = -(-self.out // 16)
        self.row_blocks = -(-row_tiles // (ROWS_PER_BLOCK // 16 // slices))
        self.dtype = x.dtype
        self.counters = self.handoff_slots = None
        if self.used_splits > 1 or ctas:
            if sp24_handoff_setting():  # as many floats as the call's partials, then as its Σs² slots (16-byte aligned)
                floats = -(-self._partial_floats() // 4) * 4 + self._ss_floats()
                self.handoff_slots = slot_workspace(self.device, self.device_index, floats)
            self.counters = _counters.get(self.device_index)
            if self.counters is None:
                if torch.cuda.is_current_stream_capturing():
                    raise KernelInputError("the first split-K call on a device must run outside CUDA graph capture")
                self.counters = _counters[self.device_index] = torch.zeros(_COUNTER_SLOTS, dtype=torch.int32,
                                                                           device=self.device)
        self._template = bytes(Sp24Call(
            counters=_data_ptr(self.counters), batch=self.batch, out=self.out, in_features=self.in_features,
            steps=w.steps, is_bf16=int(self.dtype == torch.bfloat16), code_bits=w.code, gk_shift=w.gk_shift,
            groups=w.groups, splits=self.splits, slices=self.slices, glu=int(w.glu), pdl=int(self.pdl),
            over_loop=self.over_loop, dense=int(self.dense), stream_ctas=self.ctas,
            handoff_slots=_data_ptr(self.handoff_slots), heavy=self.heavy))

    def _partial_floats(self) -> int:
        """A call's partial slots: two of batch x ROWS_PER_BLOCK a CTA for stream-K, a split's sums of every row for
        split-K (0 without either)."""
        if self.ctas:
            return 2 * self.ctas * self.batch * ROWS_PER_BLOCK
        return self.used_splits * self.batch * self.out if self.used_splits > 1 else 0

    def _ss_floats(self) -> int:
        """A split-K call's Σs² slots with the RMSNorm in front: one a row block, split and row of x (else 0)."""
        return self.row_blocks * self.used_splits * self.batch if self.norm and self.used_splits > 1 else 0

    def __call__(self, x: torch.Tensor, w: Sp24Weight, res: torch.Tensor | None = None,
                 norm_weight: torch.Tensor | None = None, eps: float = 0.0):
        # An eager call is host-bound at these sizes, so this is kept lean: the launch's fixed arguments sit in a
        # template struct copied per call (a copy, so that threads sharing a launch never share its pointers), y
        # comes from `new_empty` with separate sizes, and the device switch is skipped where it is not needed
        if x.data_ptr() % 16:
            raise KernelInputError("x does not start on a 16-byte boundary; pass a fresh .clone()")
        if self.norm != (norm_weight is not None):
            raise KernelInputError("this launch was built " + ("with" if self.norm else "without") + " the RMSNorm "
                                   "in front; pass norm_weight exactly when it was")
        y = x.new_empty(w.out_features) if self.vector else x.new_empty(self.batch, w.out_features)
        call = Sp24Call.from_buffer_copy(self._template)
        call.x, call.y, call.a = x.data_ptr(), y.data_ptr(), w.a.data_ptr()
        for name in ("meta", "scales", "row_scales", "over_v", "over_o"):
            tensor = getattr(w, name)
            if tensor is not None:
                setattr(call, name, tensor.data_ptr())
        # Every buffer the kernel gets a pointer to is held in a local until the launch is queued: a tensor dropped
        # right after .data_ptr() goes back to the caching allocator, and the next allocation (the residual sum
        # below) would reuse its memory, so split-K partials and the sum overwrote each other.
        total = partials = ss_slots = None
        if self.ctas or self.used_splits > 1:  # the counting's slots (see sp24.cu's StreamUnits and split-K)
            partials = torch.empty(self._partial_floats(), dtype=torch.float32, device=self.device)
            call.partials = partials.data_ptr()
            if self._ss_floats():
                ss_slots = torch.empty(self._ss_floats(), dtype=torch.float32, device=self.device)
                call.ss_slots = ss_slots.data_ptr()
        if self.norm:
            total = torch.empty_like(x)
            call.sum_out, call.norm_w, call.eps = total.data_ptr(), norm_weight.data_ptr(), eps
            if res is not None:
                call.res = res.data_ptr()
        if torch.cuda.current_device() == self.device_index:
            call.stream = cuda_mma._current_raw_stream(self.device_index)
            err = self.library.sp24_call(call)
        else:
            with cuda_mma._on_device(self.device_index):
                call.stream = cuda_mma._current_raw_stream(self.device_index)
                err = self.library.sp24_call(call)
        if err:
            hint = ("; if this driver cannot launch programmatically, set SPARSEDECODING_SP24_PDL=0" if self.pdl
                    else "")
            raise RuntimeError(f"sp24 kernel launch failed: {self.library.sp24_error_string(err).decode()}{hint}")
        return (y, total) if self.norm else y


def sp24_mm(x: torch.Tensor, w: Sp24Weight, splits: int | None = None, slices: int | None = None) -> torch.Tensor:
    """y = x·Wᵀ for x [in] or [b, in] (b ≤ 16) and a tiled 2:4 weight; fp32 accumulation, y in x's dtype. Without
    `splits` and `slices`, the problem's tuned launch (`sp24_linear`); with either, a launch of exactly that split
    (default splits, or one slice, for the one not given)."""
    if splits is None and slices is None:
        return sp24_linear(x, w)
    return Sp24Launch(x, w, splits, slices or 1)(x, w)


def to_dense(w: Sp24Weight) -> torch.Tensor:
    """The [out, in] weight in w's activation dtype (codes times scales, rounded once, as `PackedNMQ.to_dense`),
    expanded by one kernel launch on w's CUDA device (prefill); elsewhere through `untile`. A GLU weight's rows
    come in their original order (gate, then up)."""
    if w.grouped:  # the 2:4 form in the tiled order, its columns put back
        return ungroup_columns(to_dense(replace(w, over_o=None, grouped=False)), grouped_order(w).to(w.a.device), 0,
                               w.split_rows)
    if w.a.device.type != "cuda":
        if w.over_v is not None:
            return tiled_to_dense(w).to(w.dtype)
        packed = untile(w)
        dense = packed.to_dense() if w.code == 0 else packed.to_dense(w.dtype)
        return compact(dense) if w.dense else dense
    library = _load(int8_ks=w.build_ks, int4_ks=w.build_int4_ks)
    dense = torch.empty(w.shape, dtype=w.dtype, device=w.a.device)

    def ptr(t):
        return t.data_ptr() if t is not None else None
    index = w.a.device.index if w.a.device.index is not None else torch.cuda.current_device()
    with cuda_mma._on_device(index):
        err = library.sp24_dense_launch(w.a.data_ptr(), ptr(w.meta), ptr(w.scales), ptr(w.row_scales),
                                        dense.data_ptr(), w.shape[0], w.tiled_in, w.steps,
                                        int(w.dtype == torch.bfloat16), w.code, w.gk_shift, w.groups,
                                        cuda_mma._current_raw_stream(index), int(w.dense))
    if err:
        raise RuntimeError(f"sp24 dense expansion failed: {library.sp24_error_string(err).decode()}")
    if w.glu:  # the kernel writes rows in the tiled order
        dense = dense[torch.argsort(glu_order(w.shape[0], dense.device))]
    if w.quads:  # the quad-placed slots fill zeros of the 2:4 part: exact in w's dtype
        dense += quad_slots.emulate(_quad_slots_of(w, dense.device)).to(w.dtype)
    elif w.over_v is not None:  # the slots fill zeros of the 2:4 part: the sum is exact in w's dtype
        values, columns = slot_weights(w, w.dtype)
        dense += _slot_rows(values, columns, 0, w.shape[0], w.dtype)
    return dense


# --- tuned launches per problem, as the engine runs them ------------------------------------------------------

_SPLIT_CANDIDATES = (1, 2, 3, 4, 6, 8, 12, 16)  # with one slice
_SLICED_SPLIT_CANDIDATES = (1, 2, 3, 4)  # with 2, 4 or 8 slices (each already splits the steps inside a CTA)
# The tuner times each candidate over copies of the weight that add up to TUNE_ROTATION_L2S L2 caches (at most
# _MAX_COPIES copies), as the kernel bench does: in a decode step every weight comes from DRAM. Until the forty-fifth
# session it used two L2s and at most 8 copies, so a 4096x4096 int4 weight (6.4 MB) rotated over 58 MB, most of
# which an H200's 60 MB L2 could hold.
TUNE_ROTATION_L2S = 3
_MAX_COPIES = 128
# under SPARSEDECODING_SP24_EARLY_TRIGGER=timed (the default), where `times_both_builds`: None, the tuner tries every
# candidate in both builds; a number N, only the N fastest in the first build are tried again in the other (3 until
# the forty-fifth session; benchmarks/tuner_ab.py compares the two)
TIMED_OTHER_BUILD: int | None = None
# whether the tuner times its candidates in interleaved rounds (`autotune.interleaved_replay_ms`) or one after another
# (`replay_ms`, as until the forty-fifth session); benchmarks/tuner_ab.py compares the two
TUNE_INTERLEAVED = True
_launches: dict[tuple, Sp24Launch] = {}
# a candidate launch of a problem: (splits, slices, whether it runs the early-trigger build, grid, grouped launch
# bound), the grid being the stream-K CTAs (> 0), minus the heavy CTAs of a mixed grid (< 0, `mixed_heavy`), or 0
# (split-K and slices); the bound 1 or 2 CTAs a multiprocessor (`Sp24Launch`'s `bound`; 2 without grouped columns)
Choice = tuple[int, int, bool, int, int]
_timings: dict[tuple, dict[Choice, float]] = {}  # problem -> candidate -> ms per launch
_choices: dict[tuple, dict[Choice, Sp24Launch]] = {}  # problem -> every correct candidate's launch
_recorded: dict[tuple, int] | None = None  # problem -> lookups, while `recording_problems` runs


# the fields of a `problem_key`, in order (`problem_text` reads them by name)
PROBLEM_KEY_FIELDS = ("x_device", "x_shape", "x_dtype", "weight_device", "weight_shape", "code", "ks", "gk_shift",
                      "steps", "glu", "dense", "norm", "pdl", "half_meta", "early_trigger", "over_loop", "mma_ctas",
                      "multicast", "stream_k", "handoff", "mixed", "layout")


def clusters_on(device: torch.device) -> bool:
    """Whether launches on `device` may take the multicast build: thread-block clusters and multicast bulk copies
    need compute capability 9.0 (a CPU device answers True: nothing launches there, and the keys stay comparable)."""
    return device.type != "cuda" or torch.cuda.get_device_capability(device)[0] >= 9


def multicast_of(w: Sp24Weight, norm: bool) -> int:
    """The cluster size a launch of w stages x with (SPARSEDECODING_SP24_MULTICAST): 0 where the setting is 0, below
    compute capability 9.0 (`clusters_on`), and for launches the multicast build leaves as they are (the RMSNorm in
    front, overflow slots, grouped columns, dense weights)."""
    if norm or w.over_v is not None or w.grouped or w.dense or not clusters_on(w.a.device):
        return 0
    return sp24_multicast_setting()


_keys: dict[tuple, tuple] = {}  # problem_key's memo: (the settings' raw fingerprint, the problem) -> the key


def problem_key(x: torch.Tensor, w: Sp24Weight, norm: bool = False) -> tuple:
    """What a tuned launch is kept for: the problem, and SPARSEDECODING_SP24_PDL, _HALF_META and _EARLY_TRIGGER (a
    launch tuned under one value is not reused under another); for a weight with overflow slots, _OVER_LOOP and
    _MMA_CTAS too; _MULTICAST where it applies (`multicast_of`); _STREAM_K, _HANDOFF and _MIXED; the `layout` (fields:
    PROBLEM_KEY_FIELDS). Memoised on the settings' raw values (`op.settings_fingerprint`) and the problem, so that
    an eager call does not parse every setting again (a bad value still raises, and is never memoised)."""
    fast = (settings_fingerprint(), x.device, x.shape, x.dtype, w.a.device, w.shape, w.code, w.ks, w.gk_shift,
            w.steps, w.glu, w.dense, norm, w.over_v is not None, w.quads, w.grouped, w.split_rows)
    key = _keys.get(fast)
    if key is None:
        key = _keys[fast] = _problem_key(x, w, norm)
    return key


def _problem_key(x: torch.Tensor, w: Sp24Weight, norm: bool) -> tuple:
    return (x.device, x.shape, x.dtype, w.a.device, w.shape, w.code, w.ks, w.gk_shift, w.steps, w.glu, w.dense, norm,
            sp24_pdl_setting(), sp24_half_meta_setting(), sp24_early_trigger_value(),
            sp24_over_loop_setting() if w.over_v is not None else None,
            sp24_mma_ctas_setting() if w.over_v is not None else None, multicast_of(w, norm), sp24_stream_k_setting(),
            sp24_handoff_setting(), sp24_mixed_value(),
            layout(w) + (f"-acc{sp24_halves_acc_setting()}" if w.grouped and w.split_rows != GROUP_TILE_ROWS else "")
            + (_bound_suffix() if w.grouped else ""))


def _bound_suffix() -> str:
    """A grouped layout's `problem_key` suffix for SPARSEDECODING_SP24_GROUPED_CTAS: "" under timed (the default),
    "-ctas2" under 2, "-ctas1" under 1 (launches tuned under one are not reused under another)."""
    value = sp24_grouped_ctas_value()
    return "" if value == GROUPED_CTAS_DEFAULT else f"-ctas{value}"


def layout(w: Sp24Weight) -> str:
    """Which tiled layout w is beyond its code and slots: "grouped" (`tile_grouped`; "grouped8" with 8-row halves),
    "quads" (`tile_quads`) or "" (its launches are tuned apart: the same shape in another layout runs another
    loop)."""
    return ("grouped" if w.split_rows == GROUP_TILE_ROWS else f"grouped{w.split_rows}") if w.grouped \
        else "quads" if w.quads else ""


# (res or None, norm weight, eps): the RMSNorm in front of a launch (`Sp24Launch(..., norm=True)`)
NormInputs = tuple[torch.Tensor | None, torch.Tensor, float]


def _reference(x: torch.Tensor, w: Sp24Weight, norm: NormInputs | None = None):
    """The float64 product's reference (`autotune.Float64Reference`) for x [b, in] and w, densified in chunks on
    x's device; `NormReference` with the RMSNorm in front; for a GLU weight, `GluReference` over either."""
    from .autotune import Float64Reference

    packed = untile(replace(w, over_v=None, over_o=None, grouped=False))
    x2 = x.view(1, -1) if x.dim() == 1 else x
    if w.grouped:  # the 2:4 form in the tiled order, each row's columns put back
        order = grouped_order(w).to(x.device)

        def weight_rows(r0: int, r1: int) -> torch.Tensor:
            return ungroup_columns(_dense_rows(packed, r0, r1), order, r0, w.split_rows)
    elif w.dense:
        def weight_rows(r0: int, r1: int) -> torch.Tensor:
            return compact(_dense_rows(packed, r0, r1))
    elif w.over_v is None:
        def weight_rows(r0: int, r1: int) -> torch.Tensor:
            return _dense_rows(packed, r0, r1)
    elif w.quads:  # the 2:4 part plus the quad-placed slots, rebuilt as the lanes would (on x's device)
        over = quad_slots.emulate(_quad_slots_of(w, x.device))

        def weight_rows(r0: int, r1: int) -> torch.Tensor:
            return _dense_rows(packed, r0, r1) + over[r0:r1]
    else:  # the 2:4 part plus the overflow slots
        values, columns = slot_weights(w, torch.float64)

        def weight_rows(r0: int, r1: int) -> torch.Tensor:
            return _dense_rows(packed, r0, r1) + _slot_rows(values, columns, r0, r1, torch.float64)
    if norm is None:
        reference = Float64Reference.of_rows(x2, w.shape[0], weight_rows)
    else:
        res, weight, eps = norm
        reference = NormReference(x2, None if res is None else res.view_as(x2), weight, eps, w.shape[0],
                                  weight_rows)
    return GluReference(reference, x.dtype) if w.glu else reference


class NormReference:
    """W·rmsnorm(x + res) in float64 as the kernel computes it: the residual sum s = x + res and the staged
    u = w ⊙ s each rounded to x's dtype (exactly what the kernel writes and stages), times r = 1/sqrt(mean(s²) + eps)
    taken in float64. Bound: r times the product's bound over u, plus 2⁻¹⁰·r·Σ|W·u| for the kernel's 1/rms (fp32
    Σs² of up to 2¹⁴ exact squares and rsqrt: well under 2⁻¹⁰ relative)."""

    def __init__(self, x: torch.Tensor, res: torch.Tensor | None, weight: torch.Tensor, eps: float, rows: int,
                 weight_rows):
        from .autotune import Float64Reference

        self.sum = x if res is None else (x.float() + res.float()).to(x.dtype)
        staged = (weight.float() * self.sum.float()).to(x.dtype)
        s64 = self.sum.double()
        r = 1 / torch.sqrt((s64 * s64).mean(-1, keepdim=True) + eps)
        product = Float64Reference.of_rows(staged, rows, weight_rows)
        self.exact = product.exact * r
        self.bound = product.bound * r + 2.0**-10 * r * product.magnitude

    def error(self, y: torch.Tensor) -> float:
        """Largest |y - W·rmsnorm(s)| / bound (≤ 1 passes; NaN fails)."""
        return float(((y.double() - self.exact).abs() / self.bound).max())


class GluReference:
    """silu(gate)·up in float64 from a `Float64Reference` of the [gate; up] product, and a bound on the kernel's
    error: the sums' bounds carried through (|silu'| ≤ 1.1), plus one unit of y's last place, plus the fp32
    activation's own rounding (2⁻¹⁸ relative: __expf, a division and a product in fp32)."""

    def __init__(self, reference, dtype: torch.dtype):
        self.reference = reference
        half = reference.exact.shape[1] // 2
        gate, up = reference.exact[:, :half], reference.exact[:, half:]
        gate_bound, up_bound = reference.bound[:, :half], reference.bound[:, half:]
        silu = gate * torch.sigmoid(gate)
        self.exact = silu * up
        info = torch.finfo(dtype)
        self.bound = (1.1 * gate_bound * (up.abs() + up_bound) + (silu.abs() + 1.1 * gate_bound) * up_bound
                      + (info.eps + 2.0**-18) * self.exact.abs() + info.tiny)

    def error(self, y: torch.Tensor) -> float:
        """Largest |y - silu(gate)·up| / bound (≤ 1 passes; NaN fails)."""
        return float(((y.double() - self.exact).abs() / self.bound).max())


def _dense_rows(packed: PackedNM | PackedNMQ, r0: int, r1: int) -> torch.Tensor:
    part = _rows(packed, slice(r0, r1))
    return part.to_dense(torch.float64) if isinstance(part, PackedNMQ) else part.to_dense().double()


def rotation_copies(weight_bytes: int, l2_bytes: int, l2s: float | None = None, most: int | None = None) -> int:
    """How many temporary copies the tuner adds to a weight of `weight_bytes` so that a round over all of them reads
    `l2s` (default TUNE_ROTATION_L2S) times the L2's bytes, at most `most` (default _MAX_COPIES)."""
    l2s = TUNE_ROTATION_L2S if l2s is None else l2s
    most = _MAX_COPIES if most is None else most
    return max(0, min(most, -(-int(l2s * l2_bytes) // weight_bytes) - 1))


def _copies(w: Sp24Weight) -> list[Sp24Weight]:
    """w and the temporary copies `rotation_copies` asks for."""
    l2_bytes = torch.cuda.get_device_properties(w.a.device).L2_cache_size
    return [w] + [w.clone() for _ in range(rotation_copies(w.nbytes, l2_bytes))]


def tuned_launch(x: torch.Tensor, w: Sp24Weight, norm: NormInputs | None = None) -> Sp24Launch:
    """The problem's launch with the fastest correct (splits, slices) pair (`_candidates`) or stream-K grid
    (`_stream_candidates`), chosen on first use:
    each candidate's output is checked against a float64 product (a mismatch raises: a kernel bug, never a silent
    substitute) and timed as the decoder runs it, replayed from a CUDA graph round-robin over weight copies past the
    L2 (`rotation_copies`), the candidates in interleaved rounds (`autotune.interleaved_replay_ms`). With `norm`,
    the launches take that RMSNorm in front, and their residual sums must equal x + res exactly.
    The candidates run the build `early_trigger` picks; under SPARSEDECODING_SP24_EARLY_TRIGGER=timed (the default)
    with programmatic launches, where `times_both_builds`, every candidate runs in the other build too (checked the
    same way, timed in the same rounds; TIMED_OTHER_BUILD), and the fastest of all is kept. Until the forty-fifth
    session only the three fastest in the first build were tried in the other, and a launch fast only in the other
    build could be missed: the 8B o at batch 1 in int4, 1/4s 5.3 us in the default build and 3.8 us in the early one
    (results/placement_probe_h200.md), was kept at 4.8 us.
    Raises KernelInputError inside a CUDA-graph capture for a problem not seen before."""
    key = problem_key(x, w, norm is not None)
    launch = _launches.get(key)
    if launch is not None:
        return launch
    if torch.cuda.is_available() and x.is_cuda and torch.cuda.is_current_stream_capturing():
        raise KernelInputError(f"sp24 is not tuned for {key} yet; run it once on this shape and batch before "
                               "capturing a CUDA graph")
    batch = 1 if x.dim() == 1 else x.shape[0]
    check_inputs(x, w)
    low = min_splits(w, batch, norm is not None)
    sms = torch.cuda.get_device_properties(x.device).multi_processor_count
    if norm is not None:
        check_norm_inputs(x, w, norm[0], norm[1])
    reference = _reference(x, w, norm)

    def checked(launch: Sp24Launch) -> Sp24Launch:
        y = launch(x, w, *(norm or ()))
        where = f"{key} with {launch.splits} splits, {launch.slices} slices" + (
            " (early-trigger build)" if launch.early_trigger else "") + (
            " (one-CTA bound)" if launch.bound == 1 else "")
        if norm is not None:
            y, total = y
            expected = (reference.reference if w.glu else reference).sum
            if not torch.equal(total.view_as(expected), expected):
                raise RuntimeError(f"sp24: the residual sum x + res differs from torch's for {where}; set "
                                   "SPARSEDECODING_KERNEL=triton and report this")
        error = reference.error(y.view(-1, w.out_features))
        if not error <= 1:  # NaN fails too
            raise RuntimeError(f"sp24: the kernel is off by {error:.3g} x the float64 bound for {where}; set "
                               "SPARSEDECODING_KERNEL=triton and report this")
        return launch

    launches: dict[Choice, Sp24Launch] = {}
    for slices, splits in _candidates(w, batch, sms, low):
        launch = Sp24Launch(x, w, splits, slices, norm is not None)
        if (launch.used_splits, slices) in {(c.used_splits, c.slices) for c in launches.values() if not c.ctas}:
            continue  # the same grid as a candidate already kept
        launches[(splits, slices, launch.early_trigger, 0, launch.bound)] = checked(launch)
    for ctas in _stream_candidates(w, batch, sms, norm is not None):
        launch = Sp24Launch(x, w, norm=norm is not None, ctas=ctas)
        launches[(1, 1, launch.early_trigger, ctas, launch.bound)] = checked(launch)
    for slices, heavy in _mixed_candidates(w, batch, sms):
        launch = Sp24Launch(x, w, 1, slices, norm is not None, heavy=heavy)
        launches[(1, slices, launch.early_trigger, -heavy, launch.bound)] = checked(launch)
    if w.grouped and sp24_grouped_ctas_timed():  # every candidate under the one-CTA bound too
        for choice in list(launches):
            other = choice[:4] + (1,)
            launches[other] = checked(_launch_of(x, w, other, norm is not None))
    # the trigger's place only matters to a programmatic launch
    both = times_both_builds(w, batch) and next(iter(launches.values())).pdl

    def add_other_build(choices: list[Choice]) -> None:
        for splits, slices, early, grid, bound in choices:
            other = (splits, slices, not early, grid, bound)
            launches[other] = checked(_launch_of(x, w, other, norm is not None))

    if both and TIMED_OTHER_BUILD is None:
        add_other_build(list(launches))
    weights = _copies(w)
    from .autotune import interleaved_replay_ms, replay_ms  # imports triton

    def timed(choices) -> dict[Choice, float]:
        choices = list(choices)
        calls = [lambda weight, launch=launches[choice]: launch(x, weight, *(norm or ())) for choice in choices]
        if TUNE_INTERLEAVED:
            return dict(zip(choices, interleaved_replay_ms(calls, weights)))
        return {choice: replay_ms(call, weights) for choice, call in zip(choices, calls)}

    timings = timed(launches)
    if both and TIMED_OTHER_BUILD is not None:
        fastest = sorted(timings, key=timings.get)[:TIMED_OTHER_BUILD]
        add_other_build(fastest)
        timings.update(timed([c for choice in fastest for c in (choice, choice[:2] + (not choice[2],) + choice[3:])]))
    reference = weights = None  # free them before the launch is kept (the closures above are done)
    best = min(timings, key=timings.get)
    _launches[key], _timings[key], _choices[key] = launches[best], timings, launches
    return launches[best]


@contextlib.contextmanager
def recording_problems() -> Iterator[dict[tuple, int]]:
    """Within the block, every problem the engine's calls look up (`sp24_linear`, `sp24_norm_linear`) is counted
    in the yielded dict, keyed as `problem_key` keys them: a decode step's capture lists the problems it launches."""
    global _recorded
    outer, _recorded = _recorded, {}
    try:
        yield _recorded
    finally:
        _recorded = outer


def launch_timings(key: tuple) -> dict[Choice, float]:
    """A tuned problem's correct (splits, slices, early build, stream-K CTAs) candidates and the tuner's milliseconds
    per launch for each (each launch alone, back to back), fastest first."""
    timings = _timings[key]
    return {choice: timings[choice] for choice in sorted(timings, key=timings.get)}


def problem_text(key: tuple) -> str:
    """A `problem_key` as reports show it: the weight's shape and values, x's rows, the norm in front, GLU."""
    field = dict(zip(PROBLEM_KEY_FIELDS, key))
    x_shape, weight_shape, code = field["x_shape"], field["weight_shape"], field["code"]
    glu, dense, norm = field["glu"], field["dense"], field["norm"]
    values = {0: "16-bit", 8: "int8", 4: "int4"}.get(code, f"code {code}")
    rows = 1 if len(x_shape) == 1 else x_shape[0]
    return (f"{weight_shape[0]}x{weight_shape[1]} {'dense ' if dense else ''}{values}, {rows} rows"
            + (", norm" if norm else "") + (", GLU" if glu else ""))


def chosen_launch(key: tuple) -> Choice:
    """The (splits, slices, early build, grid, bound) a tuned problem launches with now (`Choice`)."""
    return choice_of(_launches[key])


def choice_of(launch: Sp24Launch) -> Choice:
    """The `Choice` that names `launch`."""
    return launch.splits, launch.slices, launch.early_trigger, launch.ctas or -launch.heavy, launch.bound


def forget_tuning(key: tuple) -> None:
    """Drop a problem's tuning (its launch, timings and candidates), so that its next call tunes it anew; calls
    captured in CUDA graphs before keep their launch."""
    for store in (_launches, _timings, _choices):
        store.pop(key, None)


def choose_launch(key: tuple, choice: Choice) -> None:
    """Launch a tuned problem with another of its correct candidates from now on (`engine.step_tune` picks them by
    whole decode steps); calls captured in CUDA graphs before keep the launch they were captured with."""
    if choice not in _choices.get(key, {}):
        raise KernelInputError(f"{choice} is not a checked candidate of the tuned problem {key}")
    _launches[key] = _choices[key][choice]


def _launch_of(x: torch.Tensor, w: Sp24Weight, choice: Choice, norm: bool) -> Sp24Launch:
    """The launch a `Choice` names."""
    splits, slices, early, grid, bound = choice
    return Sp24Launch(x, w, splits, slices, norm, early=early, ctas=max(grid, 0), heavy=max(-grid, 0), bound=bound)


def mixed_heavy(row_tiles: int, slices: int, sms: int, ctas_per_sm: int = 2) -> int | None:
    """The heavy CTAs of a mixed grid (sp24.cu's `heavy`) for a weight of `row_tiles` row tiles at `slices` slices
    (8 / slices tiles a heavy CTA, one a light one), or None where it cannot help. A grid of one kind whose CTAs pass
    one wave (`ctas_per_sm` a multiprocessor) puts two heavy CTAs on some multiprocessors: 14B o, 320 row tiles at 4
    slices, 160 CTAs, 28 multiprocessors reading four row tiles while the others read two. With h heavy CTAs and the
    remaining row tiles one a CTA, the grid is one wave when h ≥ (row_tiles − wave) / (tiles − 1); if the hardware
    hands out CTAs in order, a first one to each multiprocessor before any second (assumed, not observed; the bf16 14B
    o's 9.00 → 8.42 us agrees with it), then with h ≤ sms no multiprocessor gets two heavy ones: at most tiles + 1 row
    tiles each (three, for the 14B o's 320 and the 8B qkv's 384 at 4 slices)."""
    tiles = max(SLICES) // slices
    wave = ctas_per_sm * sms
    if tiles < 2 or row_tiles <= wave or -(-row_tiles // tiles) <= sms:  # no multiprocessor reads two CTAs' tiles
        return None
    heavy = -(-(row_tiles - wave) // (tiles - 1))
    return heavy if heavy <= sms and heavy * tiles <= row_tiles else None


def spread_heavy(row_tiles: int, slices: int, sms: int) -> int | None:
    """The heavy CTAs of the mixed grid with one heavy CTA on every multiprocessor (SPARSEDECODING_SP24_MIXED=2, a
    probe): `sms` CTAs of 8 / slices row tiles, then the rest one row tile a CTA, where that rest is at most one a
    multiprocessor; None elsewhere. Its most row tiles a multiprocessor are `mixed_heavy`'s (tiles + 1) in fewer CTAs
    (14B o at 4 slices: 132 + 56 CTAs against 56 + 208), so that multiprocessors with one CTA leave the room of a
    second to the next programmatic launch's CTAs, which with the early trigger request their weights under this grid
    (candidate 2 of benchmarks/CUDA_KERNEL_NOTES.md's fifty-eighth section)."""
    tiles = max(SLICES) // slices
    rest = row_tiles - sms * tiles
    return sms if tiles >= 2 and 0 < rest <= sms else None


# under SPARSEDECODING_SP24_MIXED=1 (the default) the tuner also tries mixed grids (`mixed_heavy`) at these slices,
# with one split, at batch 1 to MIXED_MAX_BATCH (the kernels of one n-tile: sp24.cu's kMixed)
MIXED_SLICES = (2, 4)
MIXED_MAX_BATCH = 8


def _mixed_candidates(w: Sp24Weight, batch: int, sms: int) -> list[tuple[int, int]]:
    """(slices, heavy CTAs) of the mixed grids the tuner tries: one split (where the staged x fits), no GLU or slots
    (the launcher refuses them) and no dense weights (the kernel would run them; no test covers them yet). A light
    CTA's warps beyond the weight's steps have none to read, as in a uniform launch at 8 slices."""
    if (not sp24_mixed_setting() or batch > MIXED_MAX_BATCH or w.glu or w.over_v is not None or w.grouped or w.dense
            or min_splits(w, batch) > 1):
        return []
    row_tiles = -(-w.shape[0] // 16)
    found = [(slices, mixed_heavy(row_tiles, slices, sms)) for slices in MIXED_SLICES]
    if sp24_mixed_value() == "2":
        found += [(slices, spread_heavy(row_tiles, slices, sms)) for slices in MIXED_SLICES]
    return sorted({(slices, heavy) for slices, heavy in found if heavy is not None})


def _candidates(w: Sp24Weight, batch: int, sms: int, low: int) -> list[tuple[int, int]]:
    """(slices, splits) the tuner tries: one slice with every split candidate and the default, more slices with
    few splits (a GLU weight at most 4, its tile pairs in one CTA); only splits whose staged x fits (at least
    `low`) and that leave every slice a step."""
    found = set()
    for slices in SLICES[:-1] if w.glu else SLICES:
        splits = _SPLIT_CANDIDATES if slices == 1 else _SLICED_SPLIT_CANDIDATES
        for count in {*splits, default_splits(w, batch, sms, slices), low}:
            if low <= count <= w.steps and -(-w.steps // count) >= slices:
                found.add((slices, count))
    return sorted(found)


# stream-K grids the tuner tries: CTAs per multiprocessor (the launch bound's two, and one)
STREAM_CTAS_PER_SM = (1, 2)


def _stream_candidates(w: Sp24Weight, batch: int, sms: int, norm: bool) -> list[int]:
    """Stream-K grids (CTAs) the tuner tries under SPARSEDECODING_SP24_STREAM_K=1: STREAM_CTAS_PER_SM times the
    multiprocessors, where `stream_fits`."""
    if not sp24_stream_k_setting():
        return []
    return [k * sms for k in STREAM_CTAS_PER_SM if stream_fits(w, batch, k * sms, norm)]


def tuning_results() -> dict[tuple, tuple[Choice, dict[Choice, float]]]:
    """For every problem tuned so far: the chosen candidate (`Choice`) and each candidate's median time in ms."""
    return {key: (chosen_launch(key), dict(_timings[key])) for key in _launches}


def choice_label(choice: Choice) -> str:
    """A candidate launch as reports show it: splits, then `/Ns` for N slices (or `skN` for a stream-K launch over N
    CTAs), `-mH` after a mixed grid's slices for its H heavy CTAs, then `+e` on the early-trigger build under
    SPARSEDECODING_SP24_EARLY_TRIGGER=timed (under the other values the setting says which build runs) and `+1c` under
    a grouped launch's one-CTA bound. A choice without its fifth field (the bound) reads as bound 2."""
    splits, slices, early, ctas = choice[:4]
    grid = f"sk{ctas}" if ctas > 0 else f"{splits}" + (f"/{slices}s" if slices > 1 else "") + (
        f"-m{-ctas}" if ctas < 0 else "")
    return grid + ("+e" if early and sp24_early_trigger_timed() else "") + ("+1c" if choice[4:5] == (1,) else "")


def launch_label(launch: Sp24Launch) -> str:
    """A launch as reports show it (`choice_label`)."""
    return choice_label(choice_of(launch))


def sp24_norm_linear(x: torch.Tensor, w: Sp24Weight, res: torch.Tensor | None, norm_weight: torch.Tensor,
                     eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(W·rmsnorm(s), s) for the residual sum s = x + res (`res` None: s = x) through the problem's tuned launch;
    x, res and the norm weight off 16-byte alignment are copied first."""
    x, res, norm_weight = (t if t is None or (t.is_contiguous() and t.data_ptr() % 16 == 0) else t.contiguous().clone()
                           for t in (x, res, norm_weight))
    norm = (res, norm_weight, eps)
    key = problem_key(x, w, True)
    if _recorded is not None:
        _recorded[key] = _recorded.get(key, 0) + 1
    launch = _launches.get(key)
    if launch is None:
        check_inputs(x, w)
        check_norm_inputs(x, w, res, norm_weight)
        launch = tuned_launch(x, w, norm)
    return launch(x, w, *norm)


def sp24_linear(x: torch.Tensor, w: Sp24Weight) -> torch.Tensor:
    """y = x·Wᵀ through the problem's tuned launch (eagerly a dict lookup, then the launch); an x off 16-byte
    alignment is copied first. Equal keys pass `check_inputs` alike except for memory layout, checked per call."""
    key = problem_key(x, w)
    if _recorded is not None:
        _recorded[key] = _recorded.get(key, 0) + 1
    launch = _launches.get(key)
    if launch is None or not x.is_contiguous():
        check_inputs(x, w)
        launch = tuned_launch(x if x.data_ptr() % 16 == 0 else x.clone(), w)
    return launch(x if x.data_ptr() % 16 == 0 else x.clone(), w)


@torch.library.custom_op("sparsedecoding::sp24_mm", mutates_args=())
def _sp24_op(x: torch.Tensor, a: torch.Tensor, meta: torch.Tensor | None, scales: torch.Tensor | None,
             row_scales: torch.Tensor | None, out_features: int, in_features: int, code: int, steps: int,
             gk_shift: int, groups: int, glu: bool, over_v: torch.Tensor | None = None,
             over_o: torch.Tensor | None = None, dense: bool = False, grouped: bool = False,
             split_rows: int = GROUP_TILE_ROWS) -> torch.Tensor:
    """`sp24_linear` for torch.compile; `out_features` is the weight's rows (twice y's columns with `glu`);
    `over_v` / `over_o`: a 16:32+K weight's overflow slots, or None; `dense`: a `tile_dense` weight (meta None);
    `grouped`: a `tile_grouped` weight (its places in `over_o`), `split_rows` its rows an order."""
    dtype = x.dtype
    return sp24_linear(x, Sp24Weight(a, meta, scales, row_scales, (out_features, in_features), code, dtype, steps,
                                     gk_shift, groups, glu, over_v, over_o, dense, grouped=grouped,
                                     split_rows=split_rows))


@torch.library.custom_op("sparsedecoding::sp24_norm_mm", mutates_args=())
def _sp24_norm_op(x: torch.Tensor, res: torch.Tensor, norm_weight: torch.Tensor, eps: float, a: torch.Tensor,
                  meta: torch.Tensor, scales: torch.Tensor | None, row_scales: torch.Tensor | None, out_features: int,
                  in_features: int, code: int, steps: int, gk_shift: int, groups: int, glu: bool,
                  over_v: torch.Tensor | None = None, over_o: torch.Tensor | None = None,
                  grouped: bool = False, split_rows: int = GROUP_TILE_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    """`sp24_norm_linear` for torch.compile: (W·rmsnorm(x + res), x + res)."""
    w = Sp24Weight(a, meta, scales, row_scales, (out_features, in_features), code, x.dtype, steps, gk_shift, groups,
                   glu, over_v, over_o, grouped=grouped, split_rows=split_rows)
    return sp24_norm_linear(x, w, res, norm_weight, eps)


@_sp24_norm_op.register_fake
def _sp24_norm_fake(x: torch.Tensor, res: torch.Tensor, norm_weight: torch.Tensor, eps: float, a: torch.Tensor,
                    meta: torch.Tensor, scales: torch.Tensor | None, row_scales: torch.Tensor | None,
                    out_features: int, in_features: int, code: int, steps: int, gk_shift: int, groups: int,
                    glu: bool, over_v: torch.Tensor | None = None, over_o: torch.Tensor | None = None,
                    grouped: bool = False, split_rows: int = GROUP_TILE_ROWS) -> tuple[torch.Tensor, torch.Tensor]:
    return (x.new_empty((*x.shape[:-1], out_features // 2 if glu else out_features)), torch.empty_like(x))


@_sp24_op.register_fake
def _sp24_fake(x: torch.Tensor, a: torch.Tensor, meta: torch.Tensor | None, scales: torch.Tensor | None,
               row_scales: torch.Tensor | None, out_features: int, in_features: int, code: int, steps: int,
               gk_shift: int, groups: int, glu: bool, over_v: torch.Tensor | None = None,
               over_o: torch.Tensor | None = None, dense: bool = False, grouped: bool = False,
               split_rows: int = GROUP_TILE_ROWS) -> torch.Tensor:
    return x.new_empty((*x.shape[:-1], out_features // 2 if glu else out_features))
