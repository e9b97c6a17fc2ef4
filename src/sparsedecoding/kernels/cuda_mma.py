"""Tensor-core kernel for 50% N:M packed weights (`csrc/nm_mma.cu`): y = x·Wᵀ for 1..16 rows of x.

The CUDA source is compiled at first use with the machine's `nvcc` into a shared library for the device's
architecture (cached under $SPARSEDECODING_CACHE/cuda_build, default ~/.cache/sparsedecoding/cuda_build, keyed by
a hash of the source, the nvcc version and the build command; built once under a lock by processes sharing the cache,
renamed into place whole, and checked whole before it is loaded) and called through ctypes on torch's current stream,
so it runs inside CUDA graphs. No torch headers or ninja are needed, which keeps the build to a few seconds.
SPARSEDECODING_NM_MMA_GEOMETRY (e.g. `warps=4,chunk_words=4`) builds it with smaller CTAs, for measuring: see
`geometry_setting`.

Every 50% pattern (2:4, 4:8, 8:16, 16:32) keeps exactly 16 values per 32-column mask word, so one kernel serves
them all; 2:4 also keeps exactly 2 per group of 4 (`pack_nm` guarantees it) and takes a faster expansion.
`nmq_mm_cuda` runs the same kernel on a 2:4 `PackedNMQ` (int8 or int4 codes, dequantized in registers)."""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import logging
import os
import re
import shutil
import struct
import subprocess
import tempfile
import threading
from pathlib import Path

import torch

from ..errors import KernelInputError, SparseDecodingError
from .format import PackedNM, values_per_word
from .op import MAX_BATCH  # one m16 tile of x: the same rows as the Triton kernel serves
from .op import NM_MMA_GEOMETRY_CHOICES, NM_MMA_GEOMETRY_SETTING
from .op import nm_mma_geometry_setting as geometry_setting
SOURCE = Path(__file__).parent / "csrc" / "nm_mma.cu"
_DTYPES = {torch.bfloat16: 1, torch.float16: 0}
ROWS_PER_BLOCK = 128  # rows of W per CTA (kRows in nm_mma.cu) in the default geometry
CHUNK_WORDS = 8  # mask words per pipeline stage (kChunkWords) in the default geometry
GEOMETRY_SETTING = NM_MMA_GEOMETRY_SETTING  # read by `geometry_setting` (kernels/op.py, with the other settings)
GEOMETRY_CHOICES = NM_MMA_GEOMETRY_CHOICES
DEFAULT_CTAS_PER_SM = 2  # the default geometry's CTAs a multiprocessor on the H200 (98.6 KB of shared memory each)
STAGES = (2, 3, 4)  # pipeline depths the library is built with
DEFAULT_STAGES = 2  # fastest on the H200 at every 8B shape and batch but one (benchmarks/results)
_COUNTER_SLOTS = 1 << 16  # one int per row block of a split-K launch: outputs up to 8M rows
log = logging.getLogger(__name__)
_lock = threading.Lock()
_libraries: dict[tuple[str, ...], ctypes.CDLL] = {}  # by geometry_defines
_counters: dict[int, torch.Tensor] = {}


class CudaKernelUnavailableError(SparseDecodingError, RuntimeError):
    """The CUDA tensor-core kernel was asked for but cannot run here (no GPU, no nvcc, or the build failed)."""


def _nvcc() -> str | None:
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    if home and (Path(home) / "bin" / "nvcc").is_file():
        return str(Path(home) / "bin" / "nvcc")
    return shutil.which("nvcc")


def available() -> bool:
    """True when a CUDA device and an nvcc compiler, or a prebuilt library in the cache, are present (the build or
    the load may still fail)."""
    if not torch.cuda.is_available():
        return False
    if _nvcc() is not None:
        return True
    try:
        return any(cache_dir().glob(f"{SOURCE.stem}_sm*.json"))
    except CudaKernelUnavailableError:  # no cache folder to look in
        return False


def cache_dir() -> Path:
    """$SPARSEDECODING_CACHE/cuda_build, default ~/.cache/sparsedecoding/cuda_build."""
    root = os.environ.get("SPARSEDECODING_CACHE")
    if root:
        return Path(root) / "cuda_build"
    try:
        return Path.home() / ".cache" / "sparsedecoding" / "cuda_build"
    except RuntimeError:  # no HOME and no passwd entry (a container's arbitrary user id)
        raise CudaKernelUnavailableError("the kernel cache has no folder: HOME is not set; set SPARSEDECODING_CACHE "
                                         "to a writable folder") from None


def _arch(min_major: int = 9) -> str:
    major, minor = torch.cuda.get_device_capability()
    if major < min_major:
        raise CudaKernelUnavailableError(f"the kernel needs compute capability {min_major}.0 or newer"
                                         + (" (Hopper bulk copies)" if min_major == 9 else "")
                                         + f"; this GPU is {major}.{minor}: use the Triton kernel (nm_spmv)")
    return f"{major}{minor}"


def geometry_defines(geometry: dict[str, int]) -> list[str]:
    """nvcc's -D flags for a `geometry_setting` result."""
    return [f"-DNM_MMA_{name.upper()}={value}" for name, value in sorted(geometry.items())]


_LOCAL_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def source_bytes(source_path: Path) -> bytes:
    """The bytes a build of `source_path` depends on: the source, then each header it includes by a quoted name
    from its own folder (`csrc/mma_common.cuh`), so that a change to a shared header names new libraries."""
    data = source_path.read_bytes()
    for name in _LOCAL_INCLUDE.findall(data.decode("utf-8")):
        data += (source_path.parent / name).read_bytes()
    return data


def library_path(source_path: Path, arch: str, defines: tuple[str, ...], nvcc: str) -> Path:
    """Where `build` keeps the library of `source_path` for compute capability `arch` ("90") built with `defines` by
    this `nvcc`: named by a hash of the source, nvcc's version line and the whole build command (arch, flags and
    defines), so any change builds anew (`benchmarks/prebuild_kernels.py` fills it offline)."""
    key = hashlib.sha256(source_bytes(source_path) + _version_line(nvcc).encode()
                         + " ".join(_flags(source_path, arch, defines)).encode()).hexdigest()[:16]
    return cache_dir() / f"{source_path.stem}_sm{arch}_{key}.so"


def _flags(source_path: Path, arch: str, defines: tuple[str, ...]) -> list[str]:
    """The build command without the machine's paths: what makes two builds of one source the same."""
    return build_command("nvcc", Path(source_path.name), arch, defines, Path("library.so"))


def _record(source_path: Path, arch: str, defines: tuple[str, ...]) -> dict:
    """What a library's record (the .json beside it) says it was built from."""
    return {"source": source_path.name, "source_sha256": hashlib.sha256(source_bytes(source_path)).hexdigest(),
            "arch": arch, "flags": _flags(source_path, arch, defines)}


def prebuilt(source_path: Path, arch: str, defines: tuple[str, ...]) -> Path | None:
    """A whole library in the cache built from this source for `arch` with these flags, found by its record, for a
    machine without nvcc (a serving image given a cache that `benchmarks/prebuild_kernels.py` filled elsewhere)."""
    wanted = _record(source_path, arch, defines)
    for record in sorted(cache_dir().glob(f"{source_path.stem}_sm{arch}_*.json")):
        try:
            found = json.loads(record.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        library = record.with_suffix(".so")
        if isinstance(found, dict) and all(found.get(key) == value for key, value in wanted.items()) \
                and library.is_file() and damaged(library) is None:
            return library
    return None


def _version_line(nvcc: str) -> str:
    """The last line of `nvcc --version` (its exact build)."""
    try:
        version = subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()
    except OSError as exc:
        raise CudaKernelUnavailableError(f"{nvcc} cannot be run ({exc.strerror}); fix it or set CUDA_HOME to a "
                                         f"working CUDA toolkit") from None
    return version[-1] if version else ""


def damaged(library: Path) -> str | None:
    """Why the shared library at `library` is not a whole 64-bit little-endian ELF file (cut short by a crash, a
    full disk or an interrupted copy), or None. Loading a cut-short library can kill the process with SIGBUS
    before Python sees an error, so a cached file is checked first: every loadable segment and the section header
    table must lie inside the file."""
    try:
        return _damaged(library)
    except OSError as exc:
        return f"cannot be read ({exc.strerror})"


def _damaged(library: Path) -> str | None:
    size = library.stat().st_size
    with open(library, "rb") as handle:
        header = handle.read(64)
        if len(header) < 64 or header[:4] != b"\x7fELF" or header[4] != 2 or header[5] != 1:
            return f"not a 64-bit ELF shared library ({size} bytes)"
        phoff, shoff = struct.unpack_from("<QQ", header, 0x20)
        phentsize, phnum, shentsize, shnum = struct.unpack_from("<HHHH", header, 0x36)
        headers_end = max(shoff + shnum * shentsize, phoff + phnum * phentsize)
        if headers_end > size:
            return f"cut short at {size} bytes (its headers reach byte {headers_end})"
        handle.seek(phoff)
        table = handle.read(phnum * phentsize)
    for index in range(phnum):
        kind, _, offset, _, _, file_size = struct.unpack_from("<IIQQQQ", table, index * phentsize)
        if kind == 1 and offset + file_size > size:  # PT_LOAD
            return f"cut short at {size} bytes (a loadable segment reaches byte {offset + file_size})"
    return None


@contextlib.contextmanager
def _build_lock(target: Path):
    """Hold an exclusive lock on `target`'s lock file while it is built, so that processes sharing the cache (server
    workers, torchrun ranks) build it once and the others wait and load it."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        handle = open(target.with_suffix(".lock"), "a")
    except OSError as exc:
        raise CudaKernelUnavailableError(f"cannot write the kernel cache {target.parent} ({exc.strerror}); set "
                                         f"SPARSEDECODING_CACHE to a writable folder") from None
    with handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX)
        except OSError as exc:  # a filesystem without locks (NFS mounted nolock): the rename still keeps it whole
            log.warning("cannot lock %s (%s); processes sharing this cache may each build %s", handle.name,
                        exc.strerror, target.name)
        yield


def compile_library(nvcc: str, source_path: Path, arch: str, defines: tuple[str, ...], target: Path) -> None:
    """Compile into a temporary file of a unique name beside `target`, check it is whole, flush it to disk and
    rename it to `target` (atomic: no process ever loads a half-written library); the temporary file is removed
    whatever happens. CudaKernelUnavailableError with nvcc's messages if the compile fails."""
    try:
        descriptor, name = tempfile.mkstemp(dir=target.parent, prefix=target.stem + ".", suffix=".tmp")
    except OSError as exc:
        raise CudaKernelUnavailableError(f"cannot write the kernel cache {target.parent} ({exc.strerror}); set "
                                         f"SPARSEDECODING_CACHE to a writable folder") from None
    os.close(descriptor)
    partial = Path(name)
    try:
        command = build_command(nvcc, source_path, arch, defines, partial)
        result = subprocess.run(command, capture_output=True, text=True)
        problem = damaged(partial) if result.returncode == 0 else None
        if result.returncode != 0 or problem:
            output = (result.stderr + result.stdout).strip()
            raise CudaKernelUnavailableError(f"nvcc failed to build {source_path.name} (exit {result.returncode}"
                                             f"{'; ' + problem if problem else ''}); command: {' '.join(command)}"
                                             f"\n{output}")
        with open(partial, "rb") as handle:
            os.fsync(handle.fileno())
        os.chmod(partial, 0o755)  # mkstemp made it owner-only: a cache prebuilt by one user is served by another
        os.replace(partial, target)
        record = target.with_suffix(".json.tmp")
        record.write_text(json.dumps({**_record(source_path, arch, defines), "nvcc": _version_line(nvcc)}, indent=1))
        os.replace(record, target.with_suffix(".json"))
    finally:
        partial.unlink(missing_ok=True)


def build_command(nvcc: str, source_path: Path, arch: str, defines: tuple[str, ...], target: Path) -> list[str]:
    """The nvcc command line that builds `source_path` into the shared library `target`."""
    return [nvcc, "-O3", "-shared", "-Xcompiler", "-fPIC", "-std=c++17",
            f"-gencode=arch=compute_{arch},code=sm_{arch}", *defines, "-o", str(target), str(source_path)]


def build(source_path: Path = SOURCE, min_major: int = 9, defines: tuple[str, ...] = ()) -> Path:
    """Compile `source_path` (default `nm_mma.cu`, which needs compute capability `min_major`.0) for the current
    device, with nvcc flags `defines` (`geometry_defines`), unless a matching library is cached; return its path.
    Raises CudaKernelUnavailableError with nvcc's messages if the compile fails."""
    nvcc = _nvcc()
    arch = _arch(min_major)
    if nvcc is None:
        found = prebuilt(source_path, arch, defines)
        if found is not None:
            return found
        raise CudaKernelUnavailableError(f"nvcc not found (set CUDA_HOME or put nvcc on PATH), and {cache_dir()} "
                                         f"holds no library of {source_path.name} prebuilt for sm_{arch} with these "
                                         "settings; the CUDA kernels are compiled at first use")
    target = library_path(source_path, arch, defines, nvcc)
    if target.is_file() and damaged(target) is None:
        return target
    with _build_lock(target):
        if target.is_file():  # built meanwhile by another process, or damaged
            problem = damaged(target)
            if problem is None:
                return target
            log.warning("the cached kernel library %s is damaged (%s); building it again", target, problem)
            try:
                target.unlink()
            except OSError as exc:
                raise CudaKernelUnavailableError(f"the cached kernel library {target} is damaged ({problem}) and "
                                                 f"cannot be removed ({exc.strerror}); delete it or set "
                                                 f"SPARSEDECODING_CACHE to a writable folder") from None
        compile_library(nvcc, source_path, arch, defines, target)
    return target


def open_library(source_path: Path = SOURCE, min_major: int = 9, defines: tuple[str, ...] = ()) -> ctypes.CDLL:
    """`build` the source (or find it cached) and load the shared library; CudaKernelUnavailableError if either
    fails."""
    path = build(source_path, min_major, defines)
    try:
        return ctypes.CDLL(str(path))
    except OSError as exc:
        raise CudaKernelUnavailableError(f"could not load the built kernel {path}: {exc}") from exc


def _load() -> ctypes.CDLL:
    """The library of the geometry SPARSEDECODING_NM_MMA_GEOMETRY names now (built or loaded once per geometry, so
    a process that changes the setting gets the other library for launches built after the change)."""
    geometry = geometry_setting()
    defines = tuple(geometry_defines(geometry))
    with _lock:
        library = _libraries.get(defines)
        if library is None:
            library = open_library(defines=defines)
            library.nm_mma_launch.restype = ctypes.c_int
            library.nm_mma_launch.argtypes = [ctypes.c_void_p] * 6 + [ctypes.c_int] * 8 + [ctypes.c_void_p]
            library.nm_mma_codes_launch.restype = ctypes.c_int
            library.nm_mma_codes_launch.argtypes = [ctypes.c_void_p] * 7 + [ctypes.c_int] * 10 + [ctypes.c_void_p]
            library.nm_mma_error_string.restype = ctypes.c_char_p
            library.nm_mma_error_string.argtypes = [ctypes.c_int]
            library.nm_mma_rows_per_block.restype = ctypes.c_int
            library.nm_mma_chunk_words.restype = ctypes.c_int
            library.nm_mma_ctas_per_sm.restype = ctypes.c_int
            library.nm_mma_ctas_per_sm.argtypes = [ctypes.c_int, ctypes.c_int]
            expected = (16 * geometry.get("warps", ROWS_PER_BLOCK // 16), geometry.get("chunk_words", CHUNK_WORDS))
            if (library.nm_mma_rows_per_block(), library.nm_mma_chunk_words()) != expected:
                raise CudaKernelUnavailableError("nm_mma.cu and cuda_mma.py disagree on the tile size; rebuild")
            _libraries[defines] = library
        return library


def check_inputs(x: torch.Tensor, packed: PackedNM) -> None:
    """Raise KernelInputError for anything the tensor-core kernel does not take: pattern, dtype, device, layout,
    shape, batch size."""
    if values_per_word(packed.n, packed.m) != 16:
        raise KernelInputError(f"the tensor-core kernel runs 50% patterns (2:4, 4:8, 8:16, 16:32); got "
                               f"{packed.pattern}: use nm_spmv")
    values, bitmask = packed.values, packed.bitmask
    if x.dtype not in _DTYPES:
        raise KernelInputError(f"x is {x.dtype}; the tensor-core kernel takes bfloat16 or float16 activations")
    if values.dtype != x.dtype:
        raise KernelInputError(f"x is {x.dtype} but the packed values are {values.dtype}; cast x to {values.dtype}")
    out, in_features = packed.shape
    if out == 0 or in_features == 0:
        raise KernelInputError(f"empty packed weight of shape {packed.shape}")
    if x.dim() not in (1, 2) or x.shape[-1] != in_features:
        raise KernelInputError(f"x has shape {tuple(x.shape)}; expected [{in_features}] or [batch, {in_features}]")
    batch = x.shape[0] if x.dim() == 2 else 1
    if not 1 <= batch <= MAX_BATCH:
        raise KernelInputError(f"batch {batch} is outside 1..{MAX_BATCH}; for more rows multiply by "
                               "packed.to_dense()")
    if x.device.type != "cuda" or values.device != x.device or bitmask.device != x.device:
        raise KernelInputError(f"x on {x.device}, values on {values.device}, bitmask on {bitmask.device}; the "
                               "tensor-core kernel needs all three on one CUDA device")
    for name, t in (("x", x), ("values", values), ("bitmask", bitmask)):
        if not t.is_contiguous():
            raise KernelInputError(f"{name} is not contiguous; call .contiguous() first")
        if t.data_ptr() % 16:
            raise KernelInputError(f"{name} does not start on a 16-byte boundary; pass a fresh .clone()")


def check_codes_inputs(x: torch.Tensor, packed) -> None:
    """Raise KernelInputError for anything the kernel does not take from a `PackedNMQ`: pattern (2:4 only), code
    width, dtype, device, layout, shape, batch size."""
    if (packed.n, packed.m) != (2, 4):
        raise KernelInputError(f"the tensor-core kernel runs quantized values for 2:4 only; got {packed.pattern}: "
                               "use nmq_spmv's Triton kernel")
    out, in_features = packed.shape
    if out == 0 or in_features == 0:
        raise KernelInputError(f"empty packed weight of shape {packed.shape}")
    if packed.quantize == "int4" and in_features % 64:
        raise KernelInputError(f"int4 codes need in_features a multiple of 64 for the tensor-core kernel (16-byte "
                               f"rows); got {in_features}: use nmq_spmv's Triton kernel")
    group_words = packed.group_size // 32
    if packed.scales.shape[1] > 1 and group_words & (group_words - 1):
        raise KernelInputError(f"group size {packed.group_size}: the tensor-core kernel needs a power-of-two multiple "
                               "of 32 columns a scale; use nmq_spmv's Triton kernel")
    if x.dtype not in _DTYPES:
        raise KernelInputError(f"x is {x.dtype}; the tensor-core kernel takes bfloat16 or float16 activations")
    if packed.scales.dtype != torch.bfloat16:
        raise KernelInputError(f"scales are {packed.scales.dtype}; the kernel reads bfloat16 scales")
    if x.dim() not in (1, 2) or x.shape[-1] != in_features:
        raise KernelInputError(f"x has shape {tuple(x.shape)}; expected [{in_features}] or [batch, {in_features}]")
    batch = x.shape[0] if x.dim() == 2 else 1
    if not 1 <= batch <= MAX_BATCH:
        raise KernelInputError(f"batch {batch} is outside 1..{MAX_BATCH}")
    tensors = (("x", x), ("codes", packed.codes), ("scales", packed.scales), ("bitmask", packed.bitmask))
    if x.device.type != "cuda" or any(t.device != x.device for _, t in tensors):
        raise KernelInputError("x, codes, scales and bitmask must all be on one CUDA device; got "
                               + ", ".join(f"{name} on {t.device}" for name, t in tensors))
    for name, t in tensors:
        if not t.is_contiguous():
            raise KernelInputError(f"{name} is not contiguous; call .contiguous() first")
        if t.data_ptr() % 16:
            raise KernelInputError(f"{name} does not start on a 16-byte boundary; pass a fresh .clone()")


def check_two_per_group(bitmask: torch.Tensor) -> None:
    """Raise KernelInputError unless every 4-column group of the bitmask keeps exactly two columns (what mma.sp's
    metadata can express; `pack_nm` guarantees it, a hand-made or damaged bitmask may not). One pass over the
    bitmask and a host sync, so not inside CUDA-graph capture: there the eager call before capture has checked."""
    if torch.cuda.is_available() and bitmask.is_cuda and torch.cuda.is_current_stream_capturing():
        return
    words = bitmask.to(torch.int64) & 0xFFFFFFFF
    nibbles = torch.stack([(words >> (4 * k)) & 0xF for k in range(8)])
    counts = (nibbles & 1) + ((nibbles >> 1) & 1) + ((nibbles >> 2) & 1) + ((nibbles >> 3) & 1)
    if bool((counts != 2).any()):
        raise KernelInputError("sparse_mma runs 2:4 weights whose every group of 4 columns keeps exactly 2; this "
                               "bitmask has groups that do not (repack it with pack_nm)")


def default_splits(out: int, words: int, sms: int, rows_per_block: int = ROWS_PER_BLOCK,
                   chunk_words: int = CHUNK_WORDS, ctas_per_sm: int = DEFAULT_CTAS_PER_SM) -> int:
    """Column splits per row block: as many as keep the CTAs within one wave (`ctas_per_sm` per multiprocessor:
    two in the default geometry at the default pipeline depth), each split with at least two pipeline chunks; read
    off the H200 sweep of the 8B shapes in benchmarks/results/cuda_kernel_h200_8b_sweep.md."""
    row_blocks = -(-out // rows_per_block)
    chunks = -(-words // chunk_words)
    return max(1, min(ctas_per_sm * sms // row_blocks, chunks // 2))


def geometry() -> tuple[int, int]:
    """(rows a CTA, mask words a stage) of the loaded library; loads it first."""
    library = _load()
    return library.nm_mma_rows_per_block(), library.nm_mma_chunk_words()


def split_k_counters(store: dict[int, torch.Tensor], device: torch.device, device_index: int, out: int,
                     rows_per_block: int, caller: str) -> torch.Tensor:
    """The device's zeroed split-K counters in `store` (one int a row block; the last CTA of a block resets its
    own), allocated on the first split-K launch, which therefore must not be under CUDA graph capture."""
    if -(-out // rows_per_block) > _COUNTER_SLOTS:
        raise KernelInputError(f"{out} output rows exceed the split-K counters; pass splits=1")
    counters = store.get(device_index)
    if counters is None:
        if torch.cuda.is_current_stream_capturing():
            raise KernelInputError("the first split-K call on a device must run outside CUDA graph capture (it "
                                   f"allocates the kernel's counters); call {caller} once eagerly first")
        counters = store[device_index] = torch.zeros(_COUNTER_SLOTS, dtype=torch.int32, device=device)
    return counters


def launch_outputs(launch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """y, and the split-K partials (None without split-K), for one call of a launch with `out`, `batch`, `vector`,
    `splits`, `dtype` and `device` (`Launch`, `nm_scatter.ScatterLaunch`)."""
    shape = (launch.out,) if launch.vector else (launch.batch, launch.out)
    y = torch.empty(shape, dtype=launch.dtype, device=launch.device)
    partials = None
    if launch.splits > 1:
        partials = torch.empty(launch.splits * launch.batch * launch.out, dtype=torch.float32, device=launch.device)
    return y, partials


class Launch:
    """The tensor-core kernel for one problem (shapes, dtype, device, pattern of the first x and packed weight),
    with everything but the tensors fixed: a call allocates y (and split-K partials) and launches on torch's
    current stream of the device, so it is recorded by CUDA graph capture. Construction checks the inputs,
    builds or loads the library and allocates the device's split-K counters, so it must run outside capture the
    first time a device uses split-K. A call checks only the 16-byte alignment of the three pointers; the caller
    passes tensors of the first call's shapes, dtypes and device, contiguous (`op._run` compares exactly that).

    `splits` (column ranges reduced in the kernel) defaults to `default_splits`; `stages` is the depth of the
    kernel's copy pipeline (one of STAGES). `sparse_mma` runs 2:4 on sparse tensor cores (`mma.sp`, two stages
    only) instead of expanding each mask nibble for dense MMAs; not yet measured, so off by default."""

    def __init__(self, x: torch.Tensor, packed: PackedNM, splits: int | None = None, stages: int = DEFAULT_STAGES,
                 sparse_mma: bool = False):
        check_inputs(x, packed)
        self._init_common(x, packed.shape, int(packed.n == 2 and packed.m == 4), splits, stages, sparse_mma)
        if sparse_mma:
            check_two_per_group(packed.bitmask)

    def _init_common(self, x: torch.Tensor, shape: tuple[int, int], fast24: int, splits: int | None,
                     stages: int, sparse_mma: bool = False) -> None:
        if sparse_mma and (not fast24 or stages != 2):
            raise KernelInputError("sparse_mma (mma.sp) runs the 2:4 pattern with stages=2 only; got "
                                   f"{'2:4' if fast24 else 'another pattern'} with stages={stages}")
        if not torch.cuda.is_available():
            raise CudaKernelUnavailableError("the tensor-core kernel needs a CUDA GPU; use nm_spmv")
        self.library = _load()
        self.vector = x.dim() == 1
        self.batch = 1 if self.vector else x.shape[0]
        self.out, in_features = shape
        self.words = in_features // 32
        self.device = x.device
        self.device_index = x.device.index if x.device.index is not None else torch.cuda.current_device()
        self.rows_per_block = self.library.nm_mma_rows_per_block()
        if splits is None:
            with _on_device(self.device_index):
                ctas = self.library.nm_mma_ctas_per_sm(1 if self.batch <= 8 else 2, stages)
            splits = default_splits(self.out, self.words,
                                    torch.cuda.get_device_properties(self.device).multi_processor_count,
                                    self.rows_per_block, self.library.nm_mma_chunk_words(),
                                    ctas or DEFAULT_CTAS_PER_SM)
        if splits < 1:
            raise KernelInputError(f"splits = {splits}; it must be at least 1")
        if stages not in STAGES:
            raise KernelInputError(f"stages = {stages}; the kernel is built for {STAGES}")
        self.splits, self.stages = splits, stages
        self.dtype, self.dtype_code = x.dtype, _DTYPES[x.dtype]
        self.fast24 = fast24
        self.sparse_mma = int(sparse_mma)
        self.counters = split_k_counters(_counters, self.device, self.device_index, self.out, self.rows_per_block,
                                         "nm_mm_cuda") if splits > 1 else None

    def _outputs(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """y, and the split-K partials (None without split-K), for one call."""
        return launch_outputs(self)


    def __call__(self, x: torch.Tensor, values: torch.Tensor, bitmask: torch.Tensor) -> torch.Tensor:
        for name, t in (("x", x), ("values", values), ("bitmask", bitmask)):
            if t.data_ptr() % 16:
                raise KernelInputError(f"{name} does not start on a 16-byte boundary; pass a fresh .clone()")
        y, partials = self._outputs()
        with _on_device(self.device_index):
            err = self.library.nm_mma_launch(x.data_ptr(), values.data_ptr(), bitmask.data_ptr(), y.data_ptr(),
                                             partials.data_ptr() if partials is not None else None,
                                             self.counters.data_ptr() if self.counters is not None else None,
                                             self.batch, self.out, self.words, self.dtype_code, self.fast24,
                                             self.splits, self.stages, self.sparse_mma,
                                             _current_raw_stream(self.device_index))
        if err:
            raise RuntimeError(f"nm_mma kernel launch failed: {self.library.nm_mma_error_string(err).decode()}")
        return y


@contextlib.contextmanager
def _on_device(device_index: int):
    """Launches go to the current device's runtime context: switch only when the caller is elsewhere."""
    previous = torch.cuda.current_device()
    if previous == device_index:
        yield
        return
    torch.cuda.set_device(device_index)
    try:
        yield
    finally:
        torch.cuda.set_device(previous)


class CodesLaunch(Launch):
    """`Launch` for a 2:4 `PackedNMQ`: the same tile, pipeline and split-K, with int8 or int4 codes streamed in
    place of 16-bit values and dequantized in registers (`nm_mma.cu`, CODE 8 or 4)."""

    def __init__(self, x: torch.Tensor, packed, splits: int | None = None, stages: int = DEFAULT_STAGES,
                 sparse_mma: bool = False):
        check_codes_inputs(x, packed)
        self._init_common(x, packed.shape, 1, splits, stages, sparse_mma)
        if sparse_mma:
            check_two_per_group(packed.bitmask)
        self.code_bits = 8 if packed.quantize == "int8" else 4
        self.groups = packed.scales.shape[1]
        self.group_words = packed.group_size // 32

    def __call__(self, x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor,
                 bitmask: torch.Tensor) -> torch.Tensor:
        for name, t in (("x", x), ("codes", codes), ("scales", scales), ("bitmask", bitmask)):
            if t.data_ptr() % 16:
                raise KernelInputError(f"{name} does not start on a 16-byte boundary; pass a fresh .clone()")
        y, partials = self._outputs()
        with _on_device(self.device_index):
            err = self.library.nm_mma_codes_launch(
                x.data_ptr(), codes.data_ptr(), scales.data_ptr(), bitmask.data_ptr(), y.data_ptr(),
                partials.data_ptr() if partials is not None else None,
                self.counters.data_ptr() if self.counters is not None else None, self.batch, self.out, self.words,
                self.dtype_code, self.code_bits, self.groups, self.group_words, self.splits, self.stages,
                self.sparse_mma, _current_raw_stream(self.device_index))
        if err:
            raise RuntimeError(f"nm_mma kernel launch failed: {self.library.nm_mma_error_string(err).decode()}")
        return y


def _current_raw_stream(device_index: int) -> int:
    """The cudaStream_t of torch's current stream on the device (the stream a graph capture records)."""
    return torch._C._cuda_getCurrentRawStream(device_index)


def nm_mm_cuda(x: torch.Tensor, packed: PackedNM, splits: int | None = None, stages: int = DEFAULT_STAGES,
               sparse_mma: bool = False) -> torch.Tensor:
    """y[b, o] = Σ_i W[o, i]·x[b, i] for x [in] or [b, in], b ≤ 16, bf16/fp16, fp32 accumulation, y in x's dtype,
    W a 50% N:M packed weight. `splits` (column ranges reduced in the kernel) defaults to `default_splits`;
    `stages` is the depth of the kernel's copy pipeline (2-4).
    `sparse_mma`: 2:4 on sparse tensor cores (see `Launch`). Compiles the kernel on first use; raises
    CudaKernelUnavailableError if it cannot."""
    return Launch(x, packed, splits, stages, sparse_mma)(x, packed.values, packed.bitmask)


def nmq_mm_cuda(x: torch.Tensor, packed, splits: int | None = None, stages: int = DEFAULT_STAGES,
                sparse_mma: bool = False) -> torch.Tensor:
    """`nm_mm_cuda` for a 2:4 `PackedNMQ` (int8 or int4 codes with bf16 scales): y = x·Wᵀ with W dequantized in
    registers, fp32 accumulation, y in x's dtype."""
    return CodesLaunch(x, packed, splits, stages, sparse_mma)(x, packed.codes, packed.scales, packed.bitmask)


def load() -> None:
    """Build (or find cached) and load the library for the current device; raises CudaKernelUnavailableError with
    the reason when it cannot run here."""
    if not torch.cuda.is_available():
        raise CudaKernelUnavailableError("no CUDA GPU: the tensor-core kernel runs on compute capability 9.0+")
    _load()


def compile_log() -> str:
    """nvcc's register and spill report for every kernel instance (builds once more, uncached, with -v)."""
    nvcc = _nvcc()
    if nvcc is None:
        raise CudaKernelUnavailableError("nvcc not found")
    arch = _arch()
    result = subprocess.run([nvcc, "-O3", "-std=c++17", f"-gencode=arch=compute_{arch},code=sm_{arch}",
                             *geometry_defines(geometry_setting()), "--ptxas-options=-v", "-c", "-o", os.devnull,
                             str(SOURCE)], capture_output=True, text=True)
    lines = (result.stderr + result.stdout).splitlines()
    return "\n".join(line for line in lines if re.search(r"registers|spill|entry function", line))
