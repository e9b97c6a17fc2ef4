"""A 16:32+K weight tiled for sp24 (`sp24.tile_overflow`) in two launches: the sp24 kernel on its 2:4 part alone,
then `csrc/slots.cu`, which adds the overflow slots' products to that y. sp24.cu's OVER path does both in one
kernel, whose warps at 9-16 rows of x wait on the slots' shared loads (results/overflow_h200_one_cta.md: 0.54-0.58x
cuBLAS at batch 16 where the 2:4 part alone runs 1.25x); the slots kernel reads the same tiled slots (no second
copy) and x transposed ([in][4, 8 or 16], one or two 16-byte loads a slot for every row of x).

`split_linear` is the whole product: y of the weight's tiled rows from sp24 without slots or GLU epilogue, the slots
added, then silu(gate)·up for a GLU weight (its row tiles come in gate / up pairs, `sp24.glu_order`). The engine
runs it from the batch SPARSEDECODING_SP24_SPLIT_FROM names (`Sp24Linear.forward`), through the custom op
`sparsedecoding::sp24_slots_add` under torch.compile. `emulated_slots_add` follows the kernel's index arithmetic in
torch, so CPU tests check the layout it reads."""

from __future__ import annotations

import ctypes
import threading
from dataclasses import replace
from pathlib import Path

import torch
import torch.nn.functional as F

from ..errors import KernelInputError
from . import cuda_mma
from .op import MAX_BATCH, sp24_pdl_setting
from .sp24 import STEP_TILES, Sp24Weight, load, sp24_linear

SOURCE = Path(__file__).parent / "csrc" / "slots.cu"
_lock = threading.Lock()
_library: list[ctypes.CDLL] = []


def _load() -> ctypes.CDLL:
    with _lock:
        if not _library:
            load()  # the same checks as sp24 (GPU, compute capability, nvcc)
            library = cuda_mma.open_library(SOURCE, min_major=8)
            library.slots_launch.restype = ctypes.c_int
            library.slots_launch.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 7 + [ctypes.c_void_p]
            library.slots_error_string.restype = ctypes.c_char_p
            library.slots_error_string.argtypes = [ctypes.c_int]
            _library.append(library)
        return _library[0]


def width(batch: int) -> int:
    """Columns of the transposed x the kernel reads for `batch` rows of x: 4, 8 or 16."""
    return 4 if batch <= 4 else 8 if batch <= 8 else 16


def transposed(x: torch.Tensor) -> torch.Tensor:
    """x [batch, in] as the kernel reads it: [in, width(batch)], zeros past batch."""
    return F.pad(x.t(), (0, width(x.shape[0]) - x.shape[0])).contiguous()


def base(w: Sp24Weight) -> Sp24Weight:
    """w's 2:4 part as sp24 runs it here: no slots, no GLU epilogue (y in the tiled row order)."""
    return replace(w, over_v=None, over_o=None, glu=False)


def check(y: torch.Tensor, x: torch.Tensor, w: Sp24Weight) -> None:
    """KernelInputError for what `slots_add` does not take."""
    if w.over_v is None or w.over_o is None:
        raise KernelInputError("this tiled weight has no overflow slots")
    out, in_features = w.shape
    if x.dim() != 2 or x.shape[1] != in_features or not 1 <= x.shape[0] <= MAX_BATCH:
        raise KernelInputError(f"x has shape {tuple(x.shape)}; the slots kernel takes [1..{MAX_BATCH}, {in_features}]")
    if y.shape != (x.shape[0], out):
        raise KernelInputError(f"y has shape {tuple(y.shape)}; expected {(x.shape[0], out)}")
    if x.dtype not in (torch.bfloat16, torch.float16) or y.dtype != x.dtype or w.over_v.dtype != x.dtype:
        raise KernelInputError(f"x, y and the slots must share one 16-bit dtype; got {x.dtype}, {y.dtype} and "
                               f"{w.over_v.dtype}")
    if not (x.is_cuda and y.is_cuda and w.over_v.is_cuda) or x.device != y.device:
        raise KernelInputError("the slots kernel runs on one CUDA device")


def slots_add(y: torch.Tensor, x: torch.Tensor, w: Sp24Weight, xt: torch.Tensor | None = None) -> torch.Tensor:
    """y + x·W_overᵀ (a new tensor) for y [batch, out] in the tiled row order, x [batch, in]; fp32 sums, rounded once
    to y's dtype when added. `xt`: `transposed(x)` if the caller has it (the benchmark times the kernel alone)."""
    check(y, x, w)
    library = _load()
    xt, y = transposed(x) if xt is None else xt, y.contiguous()
    result = torch.empty_like(y)
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    pdl = sp24_pdl_setting() and torch.cuda.get_device_capability(x.device)[0] >= 9
    with cuda_mma._on_device(device):
        err = library.slots_launch(xt.data_ptr(), w.over_v.data_ptr(), w.over_o.data_ptr(), y.data_ptr(),
                                   result.data_ptr(), x.shape[0], xt.shape[1], w.shape[0], w.shape[1], w.steps,
                                   int(x.dtype == torch.bfloat16), int(pdl), cuda_mma._current_raw_stream(device))
    if err:
        raise RuntimeError(f"slots kernel launch failed: {library.slots_error_string(err).decode()}")
    return result


def glu(y: torch.Tensor) -> torch.Tensor:
    """silu(gate)·up of y [batch, out] in a GLU weight's tiled row order (gate tile k, then up tile k)."""
    pairs = y.view(y.shape[0], -1, 2, 16)
    return (F.silu(pairs[:, :, 0].float()) * pairs[:, :, 1].float()).to(y.dtype).reshape(y.shape[0], -1)


def split_linear(x: torch.Tensor, w: Sp24Weight) -> torch.Tensor:
    """x·Wᵀ (silu(gate)·up for a GLU weight) for x [batch, in] in two launches: sp24 on the 2:4 part, then the
    slots."""
    y = slots_add(sp24_linear(x, base(w)), x, w)
    return glu(y) if w.glu else y


def emulated_slots_add(y: torch.Tensor, x: torch.Tensor, w: Sp24Weight) -> torch.Tensor:
    """What slots.cu computes, by its own index arithmetic over the tiled slots (float64 sums), on any device."""
    out, in_features = w.shape
    row_tiles, steps = -(-out // 16), w.steps
    values = w.over_v.view(row_tiles, steps, 8, 4, 8).double()  # tile step g t k
    offsets = w.over_o.view(row_tiles, steps, 8, 4, 8).long()
    tile = torch.arange(row_tiles).view(-1, 1, 1, 1, 1)
    step = torch.arange(steps).view(1, -1, 1, 1, 1)
    g = torch.arange(8).view(1, 1, -1, 1, 1)
    t = torch.arange(4).view(1, 1, 1, -1, 1)
    k = torch.arange(8).view(1, 1, 1, 1, -1)
    row = (16 * tile + g + 8 * ((k >> 1) & 1)).expand_as(values)
    c = 8 * ((offsets >> 2) & 3) + 2 * (offsets >> 4) + ((offsets >> 1) & 1)
    col = 32 * (STEP_TILES[0] * step + 2 * t + (k >> 2)) + c
    col = torch.where(col < in_features, col, torch.zeros_like(col))
    xd = x.double().cpu()
    products = values.cpu().unsqueeze(-1) * xd.t()[col.cpu()]  # [..., batch]
    sums = torch.zeros(row_tiles * 16, x.shape[0], dtype=torch.float64)
    sums.index_add_(0, row.reshape(-1).cpu(), products.reshape(-1, x.shape[0]))
    return (y.double().cpu() + sums[:out].t()).to(y.dtype).to(y.device)


@torch.library.custom_op("sparsedecoding::sp24_slots_add", mutates_args=())
def _slots_op(y: torch.Tensor, x: torch.Tensor, over_v: torch.Tensor, over_o: torch.Tensor, out_features: int,
              in_features: int, steps: int) -> torch.Tensor:
    """`slots_add` for torch.compile (`out_features`: the weight's rows)."""
    w = Sp24Weight(over_v.new_empty(0, dtype=torch.uint8), over_v.new_empty(0, dtype=torch.int32), None, None,
                   (out_features, in_features), 0, x.dtype, steps, over_v=over_v, over_o=over_o)
    return slots_add(y, x, w)


@_slots_op.register_fake
def _slots_fake(y: torch.Tensor, x: torch.Tensor, over_v: torch.Tensor, over_o: torch.Tensor, out_features: int,
                in_features: int, steps: int) -> torch.Tensor:
    return torch.empty_like(y)
