"""A 16:32+K weight tiled for sp24 (`sp24.tile_overflow`) in two launches: the sp24 kernel on its 2:4 part alone,
then `csrc/slots.cu`, which adds the overflow slots' products to that y. sp24.cu's OVER path does both in one
kernel, whose warps at 9-16 rows of x wait on the slots' shared loads; the question was whether a grid of its own
would add the slots faster. Measured, it does not (results/overflow_h200_split.md, 8B + 14B shapes, geomean vs
cuBLAS at batch 8 / 12 / 16: split 0.74 / 0.55 / 0.51x, the fused kernel 1.00 / 0.65 / 0.58x): at 16 rows of x
every slot gathers 32 bytes of x for 3 bytes of weight, about 14 GB a decode step of the 8B model, so the slots
kernel alone takes about as long as sp24 on the 2:4 part. The engine therefore keeps the fused kernel; this module
stays as the benchmark's second form (`benchmarks/overflow_bench.py`, the split columns) with its float64 tests.

`split_linear` is the whole product: y of the weight's tiled rows from sp24 without slots or GLU epilogue, the slots
added, then silu(gate)·up for a GLU weight (its row tiles come in gate / up pairs, `sp24.glu_order`).
`emulated_slots_add` follows the kernel's index arithmetic in torch, so CPU tests check the layout it reads."""

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
MAX_SMEM = 64 * 1024  # slots.cu's kMaxSmem: the staged range of xt a CTA
ROWS_PER_CTA = 128  # 8 warps, a row tile each
_lock = threading.Lock()
_library: list[ctypes.CDLL] = []


def _load() -> ctypes.CDLL:
    with _lock:
        if not _library:
            load()  # the same checks as sp24 (GPU, compute capability, nvcc)
            library = cuda_mma.open_library(SOURCE, min_major=8)
            library.slots_launch.restype = ctypes.c_int
            library.slots_launch.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 8 + [ctypes.c_void_p]
            library.slots_error_string.restype = ctypes.c_char_p
            library.slots_error_string.argtypes = [ctypes.c_int]
            library.slots_max_smem.restype = ctypes.c_int
            if library.slots_max_smem() != MAX_SMEM:
                raise cuda_mma.CudaKernelUnavailableError("slots.cu and sp24_split.py disagree on shared memory")
            _library.append(library)
        return _library[0]


def width(batch: int) -> int:
    """Columns of the transposed x the kernel reads for `batch` rows of x: 4, 8 or 16."""
    return 4 if batch <= 4 else 8 if batch <= 8 else 16


def transposed(x: torch.Tensor) -> torch.Tensor:
    """x [batch, in] as the kernel reads it: [in, width(batch)], zeros past batch."""
    return F.pad(x.t(), (0, width(x.shape[0]) - x.shape[0])).contiguous()


def splits(w: Sp24Weight, batch: int, sms: int) -> int:
    """Step ranges (CTAs along y) for the slots kernel: enough for each CTA's staged xt to fit MAX_SMEM and for
    the grid to give every multiprocessor two CTAs, at most one a step."""
    per_split_max = MAX_SMEM // (256 * 2 * width(batch))
    need = -(-2 * sms // -(-w.shape[0] // ROWS_PER_CTA))  # step ranges for two CTAs a multiprocessor
    per_split = max(1, min(per_split_max, w.steps // need))
    return -(-w.steps // per_split)


def base(w: Sp24Weight) -> Sp24Weight:
    """w's 2:4 part as sp24 runs it here: no slots, no GLU epilogue (y in the tiled row order)."""
    return replace(w, over_v=None, over_o=None, glu=False)


def check(y: torch.Tensor, x: torch.Tensor, w: Sp24Weight) -> None:
    """KernelInputError for what `slots_add` does not take."""
    if w.over_v is None or w.over_o is None:
        raise KernelInputError("this tiled weight has no overflow slots")
    if w.code != 0:
        raise KernelInputError("the slots kernel runs weights of 16-bit values; this one holds codes")
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
    to y's dtype when added. `xt`: `transposed(x)` if the caller has it (made before sp24, it lets the slots
    kernel follow sp24 programmatically)."""
    check(y, x, w)
    library = _load()
    batch, (out, in_features) = x.shape[0], w.shape
    if xt is None:
        xt = transposed(x)
    elif xt.shape != (in_features, width(batch)) or not xt.is_contiguous() or xt.dtype != x.dtype:
        raise KernelInputError(f"xt has shape {tuple(xt.shape)}; expected transposed(x), {(in_features, width(batch))}")
    y = y.contiguous()
    result = torch.empty_like(y)
    device = x.device.index if x.device.index is not None else torch.cuda.current_device()
    count = splits(w, batch, torch.cuda.get_device_properties(x.device).multi_processor_count)
    per_split = -(-w.steps // count)
    used = -(-w.steps // per_split)
    ws = (torch.zeros(batch * out + -(-out // ROWS_PER_CTA), dtype=torch.float32, device=x.device) if used > 1
          else None)
    pdl = sp24_pdl_setting() and torch.cuda.get_device_capability(x.device)[0] >= 9
    with cuda_mma._on_device(device):
        err = library.slots_launch(xt.data_ptr(), w.over_v.data_ptr(), w.over_o.data_ptr(), y.data_ptr(),
                                   result.data_ptr(), ws.data_ptr() if ws is not None else None, batch, xt.shape[1],
                                   out, in_features, w.steps, count, int(x.dtype == torch.bfloat16), int(pdl),
                                   cuda_mma._current_raw_stream(device))
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
    xt = transposed(x)
    y = slots_add(sp24_linear(x, base(w)), x, w, xt)
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
    col = 32 * (STEP_TILES[0] * step + ((t - g) & 3) + 4 * (k >> 2)) + c
    # the kernel stages zeros for the padded words' columns past `in`
    xd = F.pad(x.double().cpu(), (0, steps * 256 - in_features))
    products = values.cpu().unsqueeze(-1) * xd.t()[col.cpu()]  # [..., batch]
    sums = torch.zeros(row_tiles * 16, x.shape[0], dtype=torch.float64)
    sums.index_add_(0, row.reshape(-1).cpu(), products.reshape(-1, x.shape[0]))
    return (y.double().cpu() + sums[:out].t()).to(y.dtype).to(y.device)
