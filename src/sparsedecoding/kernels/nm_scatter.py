"""Scatter-expansion tensor-core kernel for 50% N:M packed weights (`csrc/nm_scatter.cu`): y = x·Wᵀ for 1..16 rows
of x, with each warp storing its packed words' kept values into a dense shared-memory tile that ldmatrix feeds to
dense MMAs. An experiment for issue 12's 16:32 rows at batch 8-16, where `nm_mma`'s rank-based expansion runs at
0.6-0.8x cuBLAS and 16:32+2 on the 2:4 kernel is bound by its slots' bytes. Measured, it is slower than both
(0.71x cuBLAS at batch 8 on the H200: its register loads keep too few bytes in flight, and the expansion does not
overlap them), so the op, the engine and `sparsify` do not use it (benchmarks/CUDA_KERNEL_NOTES.md, fifty-first and
fifty-second sections).

Built at first use by `cuda_mma`'s build (nvcc into a cached shared library, called through ctypes on torch's
current stream, so it is captured by CUDA graphs). Takes the packed format as `pack_nm` writes it (no re-layout):
every mask word must keep exactly 16 values, which a launch checks on its first weight."""

from __future__ import annotations

import ctypes
import threading
from pathlib import Path

import torch

from ..errors import KernelInputError
from . import cuda_mma
from .cuda_mma import CudaKernelUnavailableError, check_inputs, open_library
from .format import PackedNM, popcount32

SOURCE = Path(__file__).parent / "csrc" / "nm_scatter.cu"
PROBE_DEFINE = "-DNM_SCATTER_NO_EXPAND"  # the build without the expansion (wrong products; a probe of its cost)
WARPS = (8, 16, 4)  # warps a CTA (16 rows each) the kernel is built for; the first is the default
PREFETCH = (0, 4, 8)  # steps ahead the L2 is asked for a lane's words (NM_SCATTER_PREFETCH); 0 asks for none
_DTYPES = {torch.bfloat16: 1, torch.float16: 0}
_lock = threading.Lock()
_libraries: dict[tuple[str, ...], ctypes.CDLL] = {}
_counters: dict[int, torch.Tensor] = {}  # the kernel's own split-K counters a device


def _load(defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    with _lock:
        library = _libraries.get(defines)
        if library is None:
            library = open_library(SOURCE, 8, defines)
            library.nm_scatter_launch.restype = ctypes.c_int
            library.nm_scatter_launch.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 6 + [ctypes.c_void_p]
            library.nm_scatter_error_string.restype = ctypes.c_char_p
            library.nm_scatter_error_string.argtypes = [ctypes.c_int]
            library.nm_scatter_rows_per_block.restype = ctypes.c_int
            library.nm_scatter_range_words.restype = ctypes.c_int
            library.nm_scatter_ctas_per_sm.restype = ctypes.c_int
            library.nm_scatter_ctas_per_sm.argtypes = [ctypes.c_int]
            library.nm_scatter_smem_bytes.restype = ctypes.c_int
            library.nm_scatter_smem_bytes.argtypes = [ctypes.c_int]
            _libraries[defines] = library
        return library


def min_splits(words: int, range_words: int) -> int:
    """The fewest column splits that leave each split at most `range_words` mask words (the CTA's copy of x)."""
    return -(-words // range_words)


def default_splits(out: int, words: int, sms: int, rows_per_block: int, range_words: int, ctas_per_sm: int) -> int:
    """Column splits per row block: enough for each split's x copy, then as many as keep the CTAs within one wave,
    each split with at least two steps of 4 words (an estimate, not yet read off a GPU sweep)."""
    row_blocks = -(-out // rows_per_block)
    wave = max(1, ctas_per_sm * sms // row_blocks)
    return max(min_splits(words, range_words), min(wave, max(1, words // 8)))


def default_row_ctas(out: int, splits: int, rows_per_block: int, slots: int) -> int:
    """CTAs a split that share its row blocks (each runs every row_ctas-th block with one copy of x, its loads
    running on from one block into the next): as many as fill `slots` (CTAs resident on the GPU at once), evened out
    so that every CTA runs the same number of blocks."""
    row_blocks = -(-out // rows_per_block)
    per_cta = -(-row_blocks // max(1, slots // splits))
    return -(-row_blocks // per_cta)


def check_sixteen_per_word(bitmask: torch.Tensor) -> None:
    """Raise KernelInputError unless every mask word keeps exactly 16 columns (what `pack_nm` writes for a 50%
    pattern): the kernel walks 16 set bits a word and would store past a word's segment otherwise. Skipped during
    CUDA graph capture (its answer needs a host sync); a launch checks its first weight outside capture."""
    if bitmask.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    counts = popcount32(bitmask)
    if bool((counts != 16).any()):
        raise KernelInputError("the scatter kernel needs exactly 16 kept columns in every 32-column mask word (a 50% "
                               "pattern packed by pack_nm); this bitmask has words that do not")


class ScatterLaunch:
    """The scatter kernel for one problem (shapes, dtype, device of the first x and packed weight), with everything
    but the tensors fixed, like `cuda_mma.Launch`: a call allocates y (and split-K partials) and launches on torch's
    current stream. Construction checks the inputs (and the first weight's mask words), builds or loads the library
    and allocates the device's split-K counters, so it must run outside CUDA graph capture.
    `splits` defaults to `default_splits`; `warps` (one of WARPS) sets the CTA's rows (16 a warp) and so how many
    rows share one copy of x; `prefetch` (one of PREFETCH) how many steps past its register loads each lane asks the
    L2 for; `row_ctas` how many CTAs a split has, each running every row_ctas-th row block (default: one CTA a block,
    faster in 45 of the 48 problems of `results/scatter_h200_rowloop.md` than `default_row_ctas`); `probe` runs the
    build without the expansion (wrong products)."""

    def __init__(self, x: torch.Tensor, packed: PackedNM, splits: int | None = None, probe: bool = False,
                 warps: int = WARPS[0], prefetch: int = PREFETCH[0], row_ctas: int | None = None):
        if warps not in WARPS:
            raise KernelInputError(f"warps = {warps}; the scatter kernel is built for {sorted(WARPS)}")
        if prefetch not in PREFETCH:
            raise KernelInputError(f"prefetch = {prefetch}; the scatter kernel is built for {sorted(PREFETCH)}")
        check_inputs(x, packed)
        if packed.shape[0] * (packed.shape[1] // 32) >= 2**31:
            raise KernelInputError(f"a {packed.shape[0]}x{packed.shape[1]} weight has 2^31 mask words or more; the "
                                   "scatter kernel indexes them with 32-bit integers")
        check_sixteen_per_word(packed.bitmask)
        if not torch.cuda.is_available():
            raise CudaKernelUnavailableError("the scatter kernel needs a CUDA GPU; use nm_spmv")
        defines = (PROBE_DEFINE,) if probe else ()
        if warps != WARPS[0]:
            defines += (f"-DNM_SCATTER_WARPS={warps}",)
        if prefetch:
            defines += (f"-DNM_SCATTER_PREFETCH={prefetch}",)
        self.library = _load(defines)
        self.vector = x.dim() == 1
        self.batch = 1 if self.vector else x.shape[0]
        self.out, in_features = packed.shape
        self.words = in_features // 32
        self.device = x.device
        self.device_index = x.device.index if x.device.index is not None else torch.cuda.current_device()
        self.rows_per_block = self.library.nm_scatter_rows_per_block()
        self.range_words = self.library.nm_scatter_range_words()
        fewest = min_splits(self.words, self.range_words)
        nt = 1 if self.batch <= 8 else 2
        with cuda_mma._on_device(self.device_index):
            ctas = self.library.nm_scatter_ctas_per_sm(nt)
        if ctas < 1:
            optin = getattr(torch.cuda.get_device_properties(self.device), "shared_memory_per_block_optin", "?")
            raise KernelInputError(f"a CTA of {warps} warps takes {self.library.nm_scatter_smem_bytes(nt)} bytes of "
                                   f"shared memory at batch {self.batch} and does not fit on this GPU ({optin} bytes "
                                   f"a block): use warps=8 or fewer")
        sms = torch.cuda.get_device_properties(self.device).multi_processor_count
        if splits is None:
            splits = default_splits(self.out, self.words, sms, self.rows_per_block, self.range_words, ctas)
        if splits < fewest:
            raise KernelInputError(f"splits = {splits}; {self.words} mask words need at least {fewest} splits of at "
                                   f"most {self.range_words} words each")
        self.splits = splits
        self.row_blocks = -(-self.out // self.rows_per_block)
        self.slots = ctas * sms  # CTAs resident at once
        if row_ctas is None:
            row_ctas = self.row_blocks
        if not 1 <= row_ctas <= self.row_blocks:
            raise KernelInputError(f"row_ctas = {row_ctas}; {self.out} rows make {self.row_blocks} row blocks of "
                                   f"{self.rows_per_block}, so 1 to {self.row_blocks} CTAs a split")
        self.row_ctas = row_ctas
        self.dtype, self.dtype_code = x.dtype, _DTYPES[x.dtype]
        self.counters = cuda_mma.split_k_counters(_counters, self.device, self.device_index, self.out,
                                                  self.rows_per_block, "nm_mm_scatter") if splits > 1 else None

    def __call__(self, x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
        for name, t in (("x", x), ("values", values), ("bitmask", bitmask)):
            if t.data_ptr() % 16:
                raise KernelInputError(f"{name} does not start on a 16-byte boundary; pass a fresh .clone()")
        y, partials = cuda_mma.launch_outputs(self)
        with cuda_mma._on_device(self.device_index):
            err = self.library.nm_scatter_launch(
                x.data_ptr(), values.data_ptr(), bitmask.data_ptr(), y.data_ptr(),
                partials.data_ptr() if partials is not None else None,
                self.counters.data_ptr() if self.counters is not None else None,
                self.batch, self.out, self.words, self.dtype_code, self.splits, self.row_ctas,
                cuda_mma._current_raw_stream(self.device_index))
        if err:
            raise RuntimeError(f"nm_scatter kernel launch failed: "
                               f"{self.library.nm_scatter_error_string(err).decode()}")
        return y


def nm_mm_scatter(x: torch.Tensor, packed: PackedNM, splits: int | None = None) -> torch.Tensor:
    """y[b, o] = Σ_i W[o, i]·x[b, i] for x [in] or [b, in], b ≤ 16, bf16/fp16, fp32 accumulation, y in x's dtype, W a
    50% N:M packed weight, on the scatter kernel. Compiles it on first use; raises CudaKernelUnavailableError if it
    cannot. Each call builds a `ScatterLaunch`, whose mask check synchronises with the host outside graph capture:
    for repeated eager calls build one launch and call it."""
    return ScatterLaunch(x, packed, splits)(x, packed.values, packed.bitmask)
