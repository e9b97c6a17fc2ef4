"""Tensor-core kernel (`kernels/cuda_mma.py`, `csrc/nm_mma.cu`): input validation and an emulation of its tile
expansion on CPU; the real kernel against a float64 product on GPU (every 50% pattern, batch 1..16, odd shapes,
split-K, fp16, graph replay)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from sparsedecoding.errors import KernelInputError
from sparsedecoding.kernels import PackedNM, pack_nm
from sparsedecoding.kernels import cuda_mma
from sparsedecoding.kernels.cuda_mma import (GEOMETRY_SETTING, check_inputs, default_splits, geometry_defines,
                                             geometry_setting, nm_mm_cuda)
from sparsedecoding.kernels.op import KernelChoiceError

PATTERNS = [(2, 4), (4, 8), (8, 16), (16, 32)]


def random_nm(out: int, in_features: int, n: int, m: int, dtype=torch.bfloat16, device="cpu") -> torch.Tensor:
    """Standard-normal weight with n random survivors in every group of m columns."""
    keys = torch.rand(out, in_features // m, m)
    kept = keys.argsort(-1).argsort(-1) < n
    weight = torch.randn(out, in_features // m, m) * kept
    return weight.view(out, in_features).to(dtype).to(device)


def float64_error(y: torch.Tensor, x: torch.Tensor, weight: torch.Tensor) -> float:
    """Largest |y - x·Wᵀ| over its bound u·|x·Wᵀ| + in·2⁻²⁴·|x|·|W|ᵀ (output rounding plus any fp32 sum order)."""
    x64, w64 = x.double(), weight.double()
    exact = x64 @ w64.T
    bound = torch.finfo(y.dtype).eps / 2 * exact.abs() + w64.shape[1] * 2.0**-24 * (x64.abs() @ w64.abs().T)
    return float(((y.double() - exact).abs() / bound.clamp_min(1e-30)).max())


# --- CPU: emulation of the kernel's column order and nibble expansion ------------------------------------------

def _selectors(nib: int) -> list[int]:
    """Per column of a nibble, the window element its permute takes: its rank if kept, else element 3."""
    codes, rank = [], 0
    for c in range(4):
        kept = (nib >> c) & 1
        codes.append(rank if kept else 3)
        rank += kept
    return codes


def emulated_weight(values: torch.Tensor, bitmask: torch.Tensor, fast24: bool) -> torch.Tensor:
    """W as the kernel's lanes rebuild it: lane t of word pair p owns columns 64p + 16t .. +15 (a half of mask
    word 2p + t/2); nibble s of that half is expanded from a 4-value window (its kept values in order, the rest
    zero) taken at the nibble's rank, or for 2:4 from the lane's value word s. Anything read past a row is NaN,
    as garbage would be on the GPU."""
    out, words = bitmask.shape
    pairs = -(-words // 2)
    vals = torch.full((out, pairs * 32 + 8), float("nan"), dtype=torch.float64)
    vals[:, :words * 16] = values.double()
    weight = torch.full((out, pairs * 64), float("nan"), dtype=torch.float64)
    masks = bitmask.to(torch.int64) & 0xFFFFFFFF
    for o in range(out):
        for p in range(pairs):
            row = vals[o, 32 * p:32 * p + 40]
            for t in range(4):
                w = 2 * p + t // 2
                word = int(masks[o, w]) if w < words else 0
                half = (word >> (16 * (t % 2))) & 0xFFFF
                rank = 16 * (t // 2) + (bin(word & 0xFFFF).count("1") if t % 2 else 0)
                for s in range(4):
                    nib = (half >> (4 * s)) & 0xF
                    count = bin(nib).count("1")
                    if fast24:
                        window = [row[16 * (t // 2) + 8 * (t % 2) + 2 * s + i] for i in (0, 1)] + [0.0, 0.0]
                    else:
                        window = [row[rank + i] if i < count else 0.0 for i in range(4)]
                        rank += count
                    for c, element in enumerate(_selectors(nib)):
                        weight[o, 64 * p + 16 * t + 4 * s + c] = window[element]
    return weight[:, :words * 32]


@pytest.mark.parametrize("n,m", PATTERNS)
def test_emulated_expansion_rebuilds_the_weight(n, m):
    weight = random_nm(5, 96, n, m)  # 3 words: the last word pair is half past the end
    packed = pack_nm(weight, n, m)
    rebuilt = emulated_weight(packed.values, packed.bitmask, fast24=(n, m) == (2, 4))
    assert torch.equal(rebuilt, weight.double())


def test_emulated_fast_path_needs_two_per_group():
    """A 16:32 weight whose nibbles keep 0-4 values is rebuilt wrongly by the 2:4 expansion: the test can fail."""
    weight = torch.zeros(1, 32)
    weight[0, :16] = torch.arange(1, 17).float()
    packed = pack_nm(weight.bfloat16(), 16, 32)
    assert not torch.equal(emulated_weight(packed.values, packed.bitmask, fast24=True), weight.double())
    assert torch.equal(emulated_weight(packed.values, packed.bitmask, fast24=False), weight.double())


# --- CPU: validation --------------------------------------------------------------------------------------------

def _prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 (default mode): byte i of the result is byte (sel >> 4i) & 7 of the 8 bytes b:a."""
    pool = a | b << 32
    return sum(((pool >> 8 * ((sel >> 4 * i) & 7)) & 0xFF) << 8 * i for i in range(4))


def _sp_meta_expression() -> str:
    """The bit expression `sp_meta_codes` returns, read from nm_mma.cu (the hex literals without their `u`), so that
    the tests below check the kernel's own code, not a copy of it."""
    import re

    body = re.search(r"uint32_t sp_meta_codes\(uint32_t m\) \{\s*const uint32_t u = m >> 1, v = m << 1;\s*"
                     r"return (.*?);\s*\}", cuda_mma.SOURCE.read_text(encoding="utf-8"), re.S)
    assert body, "sp_meta_codes in nm_mma.cu no longer has the form these tests read"
    expression = re.sub(r"(0x[0-9A-Fa-f]+)u", r"\1", " ".join(body.group(1).split()))
    assert re.fullmatch(r"[muv0-9A-Fa-fx&|~() ]+", expression), expression  # bit operations on m, u, v only
    return expression


def _sp_meta_codes(m: int) -> int:
    """nm_mma.cu `sp_meta_codes` on Python integers (32-bit words: each term is masked by a 32-bit constant)."""
    return eval(_SP_META, {"__builtins__": {}}, {"m": m, "u": m >> 1, "v": (m << 1) & 0xFFFFFFFF}) & 0xFFFFFFFF


_SP_META = _sp_meta_expression()


def test_sp_metadata_codes_every_two_of_four_nibble():
    """Each nibble with two bits set becomes (lower position) | (upper position) << 2, in all eight places."""
    for low, high in [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3)]:
        nibble = 1 << low | 1 << high
        for place in range(8):
            word = nibble << 4 * place | 0x3 << 4 * ((place + 1) % 8)  # a neighbour keeping positions 0, 1
            assert (_sp_meta_codes(word) >> 4 * place) & 0xF == low | high << 2


def test_emulated_sparse_mma_word_equals_the_dense_product():
    """`strip_word_sp` in nm_mma.cu: one 2:4 mask word of a 16-row strip on mma.sp m16n8k32. Built here lane by
    lane as the kernel builds its registers (A: kept values 4t..4t+3 of rows g and g+8; metadata from
    sp_meta_codes, even or odd nibbles by t & 1, rows merged by prmt; B: x columns 8(t>>1) + 2(t&1) + {0, 16, 4,
    20}), then multiplied with mma.sp's semantics as we read the PTX ISA (compressed A as m16n8k16's A; B register
    i of lane (n, t) = k 2t + 8i + {0, 1}; metadata of rows g and g+8 in lanes t = 0 (k 0-15) and 1 (k 16-31), low
    and high halves, 4 bits a group of 4 k): the result must be the dense W·x."""
    g_ = torch.Generator().manual_seed(3)
    weight = random_nm(16, 32, 2, 4, torch.float32)
    weight = torch.where(weight != 0, torch.randint(-9, 10, (16, 32), generator=g_).float().clamp(min=1), weight)
    x = torch.randint(-5, 6, (32, 8), generator=g_).float()
    packed = pack_nm(weight, 2, 4)
    values = packed.values.float()  # [16 rows, 16 kept]
    masks = [int(v) & 0xFFFFFFFF for v in packed.bitmask[:, 0].tolist()]
    compressed = torch.zeros(16, 16)
    meta = {}
    b_regs = {}
    for g in range(8):
        for t in range(4):
            for half, row in ((0, g), (1, g + 8)):  # a0/a2 (row g), a1/a3 (row g + 8)
                compressed[row, 2 * t:2 * t + 2] = values[row, 4 * t:4 * t + 2]
                compressed[row, 2 * t + 8:2 * t + 10] = values[row, 4 * t + 2:4 * t + 4]
            shift = 4 * (t & 1)
            folded = []
            for row in (g, g + 8):
                f = (_sp_meta_codes(masks[row]) >> shift) & 0x0F0F0F0F
                folded.append(f | f >> 4)
            meta[g, t] = _prmt(folded[0], folded[1], 0x6420)
            c0 = 8 * (t >> 1) + 2 * (t & 1)
            b_regs[g, t] = [c0, c0 + 16, c0 + 4, c0 + 20]  # first x column of B registers 0..3 (batch row g)
    b = torch.zeros(32, 8)  # the MMA's B, k by n
    for (n, t), columns in b_regs.items():
        for i, column in enumerate(columns):
            for e in (0, 1):
                b[2 * t + 8 * i + e, n] = x[column + e, n]
    d = torch.zeros(16, 8)
    for row in range(16):
        for q in range(8):  # MMA group q: k 4q..4q+3
            e = meta[row % 8, q // 4] >> 16 * (row // 8) + 4 * (q % 4)
            for slot in (0, 1):
                position = (e >> 2 * slot) & 3
                d[row] += compressed[row, 2 * q + slot] * b[4 * q + position]
    assert torch.equal(d, weight @ x)


def _packed(out=32, in_features=64, n=2, m=4, dtype=torch.bfloat16):
    return pack_nm(random_nm(out, in_features, n, m, dtype), n, m)


@pytest.mark.parametrize("x_shape,packed_args,message", [
    ((1, 64), dict(n=1, m=4), "50% patterns"),
    ((1, 64), dict(n=6, m=8), "50% patterns"),
    ((1, 32), {}, "expected [64] or [batch, 64]"),
    ((17, 64), {}, "batch 17 is outside 1..16"),
    ((2, 3, 64), {}, "expected [64] or [batch, 64]"),
    ((1, 64), {}, "CUDA device"),
])
def test_bad_inputs_raise_one_line(x_shape, packed_args, message):
    packed = _packed(**packed_args)
    x = torch.randn(x_shape).bfloat16()
    with pytest.raises(KernelInputError) as info:
        check_inputs(x, packed)
    assert message in str(info.value) and "\n" not in str(info.value)


def test_dtype_mismatch_raises():
    with pytest.raises(KernelInputError, match="float32"):
        check_inputs(torch.randn(1, 64), _packed())
    with pytest.raises(KernelInputError, match="cast x to torch.float16"):
        check_inputs(torch.randn(1, 64).bfloat16(), _packed(dtype=torch.float16))


def test_default_splits_fill_the_gpu_without_tiny_ranges():
    assert default_splits(28672, 128, 132) == 1      # 224 row blocks: one wave already
    assert default_splits(4096, 128, 132) == 8       # 32 row blocks, 16 chunks: 2 chunks a split
    assert default_splits(4096, 448, 132) == 8       # 264 CTAs
    assert default_splits(16, 1, 132) == 1


def test_default_splits_follow_the_geometry():
    """Smaller CTAs: more row blocks and chunks, and more CTAs a multiprocessor, in the same one-wave rule."""
    assert default_splits(28672, 128, 132, rows_per_block=64, chunk_words=4, ctas_per_sm=7) == 2  # 448 blocks
    assert default_splits(4096, 128, 132, rows_per_block=64, chunk_words=8, ctas_per_sm=4) == 8  # 64 blocks
    assert default_splits(4096, 128, 132, rows_per_block=128, chunk_words=4, ctas_per_sm=3) == 12  # 32 chunks
    assert default_splits(4096, 128, 132, ctas_per_sm=1) == 4


def test_geometry_setting_parses_and_rejects_in_one_line(monkeypatch):
    monkeypatch.delenv(GEOMETRY_SETTING, raising=False)
    assert geometry_setting() == {} and geometry_defines({}) == []
    monkeypatch.setenv(GEOMETRY_SETTING, " Warps=4 , chunk_words=4 ")
    assert geometry_setting() == {"warps": 4, "chunk_words": 4}
    assert geometry_defines(geometry_setting()) == ["-DNM_MMA_CHUNK_WORDS=4", "-DNM_MMA_WARPS=4"]
    for bad in ("warps=2", "warps=4,warps=8", "rows=64", "warps", "warps=four", "chunk_words=16"):
        monkeypatch.setenv(GEOMETRY_SETTING, bad)
        with pytest.raises(KernelChoiceError) as info:
            geometry_setting()
        assert GEOMETRY_SETTING in str(info.value) and "\n" not in str(info.value)


def test_each_geometry_gets_its_own_library(monkeypatch):
    """`_load` builds one library per geometry the setting names, reuses it, and refuses one whose tile size is not
    the geometry's (a fake library: no nvcc or GPU needed)."""
    class Function:  # a ctypes function: settable restype / argtypes, and a value when called
        def __init__(self, value=0):
            self.value, self.restype, self.argtypes = value, None, None

        def __call__(self, *args):
            return self.value

    class Library:
        def __init__(self, rows, words):
            for name in ("nm_mma_launch", "nm_mma_codes_launch", "nm_mma_error_string", "nm_mma_ctas_per_sm"):
                setattr(self, name, Function())
            self.nm_mma_rows_per_block, self.nm_mma_chunk_words = Function(rows), Function(words)

    built = []

    def fake_open_library(defines=(), lie=False):
        built.append(defines)
        settings = dict(d.removeprefix("-DNM_MMA_").split("=") for d in defines)
        rows = 16 * int(settings.get("WARPS", 8))
        return Library(rows + (16 if lie else 0), int(settings.get("CHUNK_WORDS", 8)))

    monkeypatch.setattr(cuda_mma, "_libraries", {})
    monkeypatch.setattr(cuda_mma, "open_library", fake_open_library)
    monkeypatch.delenv(GEOMETRY_SETTING, raising=False)
    default = cuda_mma._load()
    assert cuda_mma._load() is default and cuda_mma.geometry() == (128, 8)
    monkeypatch.setenv(GEOMETRY_SETTING, "warps=4,chunk_words=4")
    small = cuda_mma._load()
    assert small is not default and cuda_mma.geometry() == (64, 4)
    monkeypatch.delenv(GEOMETRY_SETTING)
    assert cuda_mma._load() is default and built == [(), ("-DNM_MMA_CHUNK_WORDS=4", "-DNM_MMA_WARPS=4")]
    monkeypatch.setattr(cuda_mma, "open_library", lambda defines=(): fake_open_library(defines, lie=True))
    monkeypatch.setenv(GEOMETRY_SETTING, "warps=4")
    with pytest.raises(cuda_mma.CudaKernelUnavailableError, match="disagree on the tile size"):
        cuda_mma._load()


def test_every_geometry_compiles(tmp_path):
    """nvcc (where this machine has one) compiles nm_mma.cu to PTX in each geometry for sm_90, with no GPU: the
    static checks of the copy assignments hold for every choice."""
    nvcc = cuda_mma._nvcc()
    if nvcc is None:
        pytest.skip("no nvcc on this machine")
    import itertools
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    def compile_ptx(choice: tuple[int, int]) -> tuple[list[str], subprocess.CompletedProcess]:
        defines = geometry_defines({"warps": choice[0], "chunk_words": choice[1]})
        # no ptxas, and cicc unoptimized (a quarter of the time): the static checks fire in the front end
        return defines, subprocess.run([nvcc, "-std=c++17", "-arch=sm_90", *defines, "-ptx", "-Xcicc", "-O0",
                                        "-o", str(tmp_path / f"nm_mma_{choice[0]}_{choice[1]}.ptx"),
                                        str(cuda_mma.SOURCE)], capture_output=True, text=True)

    choices = itertools.product(cuda_mma.GEOMETRY_CHOICES["warps"], cuda_mma.GEOMETRY_CHOICES["chunk_words"])
    with ThreadPoolExecutor(max_workers=4) as pool:
        for defines, result in pool.map(compile_ptx, choices):
            assert result.returncode == 0, (defines, result.stderr[-2000:])


# --- GPU ---------------------------------------------------------------------------------------------------------

SHAPES = [(16, 32), (77, 96), (130, 416), (1000, 4096), (200, 4128)]


@pytest.mark.gpu
@pytest.mark.parametrize("n,m", PATTERNS)
@pytest.mark.parametrize("out,in_features", SHAPES)
def test_kernel_matches_float64(n, m, out, in_features):
    weight = random_nm(out, in_features, n, m, device="cuda")
    packed = pack_nm(weight, n, m)
    for batch in range(1, 17):
        x = torch.randn(batch, in_features, device="cuda").bfloat16()
        for splits, stages in ((1, 4), (3, 2), (3, 3), (None, 4)):
            y = nm_mm_cuda(x, packed, splits=splits, stages=stages)
            assert y.shape == (batch, out) and y.dtype == torch.bfloat16
            error = float64_error(y, x, weight)
            assert error <= 1, (batch, splits, stages, error)


@pytest.mark.gpu
@pytest.mark.parametrize("n,m", [(2, 4), (16, 32)])
def test_kernel_float16_and_vector_input(n, m):
    weight = random_nm(300, 640, n, m, dtype=torch.float16, device="cuda")
    packed = pack_nm(weight, n, m)
    x = torch.randn(640, device="cuda").half()
    y = nm_mm_cuda(x, packed)
    assert y.shape == (300,) and y.dtype == torch.float16
    assert float64_error(y[None], x[None], weight) <= 1


@pytest.mark.gpu
def test_kernel_in_graph_replay_with_split_k():
    weight = random_nm(4096, 4096, 2, 4, device="cuda")
    packed = pack_nm(weight, 2, 4)
    copy = PackedNM(packed.values.clone(), packed.bitmask.clone(), 2, 4, packed.shape)
    x = torch.randn(8, 4096, device="cuda").bfloat16()
    nm_mm_cuda(x, packed, splits=4)  # builds and allocates the split-K counters eagerly
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y1 = nm_mm_cuda(x, packed, splits=4)
        y2 = nm_mm_cuda(x, copy, splits=4)
    for _ in range(3):
        x.copy_(torch.randn(8, 4096, device="cuda").bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        assert float64_error(y1, x, weight) <= 1 and float64_error(y2, x, weight) <= 1


@pytest.mark.gpu
def test_kernel_rejects_batch_17_on_gpu():
    packed = _packed().to("cuda")
    with pytest.raises(KernelInputError, match="batch 17"):
        nm_mm_cuda(torch.randn(17, 64, device="cuda").bfloat16(), packed)


@pytest.mark.gpu
@pytest.mark.parametrize("out,in_features", SHAPES)
def test_sparse_mma_matches_float64(out, in_features):
    """2:4 on sparse tensor cores (mma.sp, `sparse_mma=True`), every batch 1..16, split-K on and off."""
    weight = random_nm(out, in_features, 2, 4, device="cuda")
    packed = pack_nm(weight, 2, 4)
    for batch in range(1, 17):
        x = torch.randn(batch, in_features, device="cuda").bfloat16()
        for splits in (1, 3, None):
            y = nm_mm_cuda(x, packed, splits=splits, stages=2, sparse_mma=True)
            assert float64_error(y, x, weight) <= 1, (batch, splits)


@pytest.mark.gpu
def test_sparse_mma_float16_and_bad_settings():
    weight = random_nm(300, 640, 2, 4, dtype=torch.float16, device="cuda")
    packed = pack_nm(weight, 2, 4)
    x = torch.randn(3, 640, device="cuda").half()
    assert float64_error(nm_mm_cuda(x, packed, sparse_mma=True), x, weight) <= 1
    with pytest.raises(KernelInputError, match="stages=2 only"):
        nm_mm_cuda(x, packed, stages=3, sparse_mma=True)
    with pytest.raises(KernelInputError, match="2:4 pattern"):
        nm_mm_cuda(x, pack_nm(random_nm(300, 640, 16, 32, torch.float16, "cuda"), 16, 32), sparse_mma=True)


def test_sparse_mma_refuses_a_mask_without_two_per_group():
    """mma.sp metadata can only say which 2 of 4 columns are kept; a mask word with 16 set bits but a 3 + 1 split
    (which the per-word count cannot see) is refused before launch."""
    from sparsedecoding.kernels.cuda_mma import check_two_per_group

    packed = _packed(out=8, in_features=64)
    check_two_per_group(packed.bitmask)
    damaged = packed.bitmask.clone()
    word = 0x3333331B  # nibble 0: 0b1011 (3 kept), nibble 1: 0b0001 (1 kept), six nibbles of 2: 16 set bits
    assert bin(word).count("1") == 16
    damaged[3, 1] = word - (1 << 32) if word >= 1 << 31 else word
    with pytest.raises(KernelInputError, match="exactly 2"):
        check_two_per_group(damaged)


@pytest.mark.gpu
@pytest.mark.parametrize("geometry", ["warps=8,chunk_words=4", "warps=4,chunk_words=8", "warps=4,chunk_words=4"])
def test_kernel_in_each_geometry_matches_float64(geometry, monkeypatch):
    """SPARSEDECODING_NM_MMA_GEOMETRY builds a library of smaller CTAs: generic and FAST24 paths, batch 1, 5 and
    16, odd shapes (rows past a CTA, a partial last chunk, words not a multiple of 4), split-K, against float64.
    The process's default library comes back after the test."""
    monkeypatch.setenv(GEOMETRY_SETTING, geometry)
    monkeypatch.setattr(cuda_mma, "_libraries", {})
    expected = geometry_setting()
    assert cuda_mma.geometry() == (16 * expected["warps"], expected["chunk_words"])
    for n, m in ((16, 32), (2, 4)):
        for out, in_features in ((77, 96), (130, 416), (1000, 4096), (200, 4128)):
            weight = random_nm(out, in_features, n, m, device="cuda")
            packed = pack_nm(weight, n, m)
            for batch in (1, 5, 16):
                x = torch.randn(batch, in_features, device="cuda").bfloat16()
                for splits, stages in ((1, 2), (3, 2), (None, 3)):
                    error = float64_error(nm_mm_cuda(x, packed, splits=splits, stages=stages), x, weight)
                    assert error <= 1, (geometry, n, m, out, in_features, batch, splits, stages, error)



# --- The kernel library cache (no GPU: a stand-in nvcc "builds" by copying a real shared library) ------------------

def _a_shared_library() -> Path:
    import _ctypes

    return Path(_ctypes.__file__)


def _fake_toolkit(folder: Path, delay: float = 0.0, fail: bool = False) -> Path:
    """A CUDA_HOME whose bin/nvcc answers --version and otherwise copies a real ELF shared library to its -o path
    (after `delay` seconds), logging each build; with `fail`, every build exits 1 after writing half a file."""
    import sys

    nvcc = folder / "bin" / "nvcc"
    nvcc.parent.mkdir(parents=True)
    nvcc.write_text(f"""#!{sys.executable}
import shutil, sys, time
if "--version" in sys.argv:
    print("Cuda compilation tools, release 99.9, V99.9.0")
    raise SystemExit(0)
with open({str(folder / 'builds.log')!r}, "a") as log:
    log.write("build\\n")
out = sys.argv[sys.argv.index("-o") + 1]
time.sleep({delay})
if {fail}:
    open(out, "wb").write(open({str(_a_shared_library())!r}, "rb").read()[:1000])
    print("error: the stand-in compiler failed", file=sys.stderr)
    raise SystemExit(1)
shutil.copyfile({str(_a_shared_library())!r}, out)
""")
    nvcc.chmod(0o755)
    return folder


def _builds(toolkit: Path) -> int:
    log = toolkit / "builds.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


@pytest.fixture
def fake_build(tmp_path, monkeypatch):
    toolkit = _fake_toolkit(tmp_path / "cuda")
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    monkeypatch.setenv("SPARSEDECODING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cuda_mma, "_arch", lambda min_major=9: "90")
    return toolkit


def test_damaged_names_a_cut_short_or_foreign_library_and_passes_a_whole_one(tmp_path):
    whole = _a_shared_library()
    assert cuda_mma.damaged(whole) is None
    data = whole.read_bytes()
    for keep in (0, 40, 64, 4096, len(data) // 2, len(data) - 1):
        cut = tmp_path / f"cut{keep}.so"
        cut.write_bytes(data[:keep])
        assert cuda_mma.damaged(cut), keep
    foreign = tmp_path / "foreign.so"
    foreign.write_bytes(b"#!/bin/sh\n" * 100)
    assert "not a 64-bit ELF" in cuda_mma.damaged(foreign)


def test_a_build_is_cached_and_a_damaged_cached_library_is_built_again(fake_build, caplog):
    target = cuda_mma.build(cuda_mma.SOURCE)
    assert target.is_file() and cuda_mma.damaged(target) is None and _builds(fake_build) == 1
    assert target.stat().st_mode & 0o777 == 0o755  # readable by the users a cache built by root may serve
    assert cuda_mma.build(cuda_mma.SOURCE) == target and _builds(fake_build) == 1  # found in the cache
    target.write_bytes(target.read_bytes()[:5000])  # a crash or full disk cut it short
    with caplog.at_level("WARNING"):
        assert cuda_mma.build(cuda_mma.SOURCE) == target
    assert _builds(fake_build) == 2 and cuda_mma.damaged(target) is None
    assert "is damaged (cut short at 5000 bytes" in caplog.text
    assert sorted(path.suffix for path in target.parent.iterdir()) == [".json", ".lock", ".so"]  # no temporary file


def test_a_failed_build_leaves_nothing_under_the_library_name(tmp_path, monkeypatch):
    toolkit = _fake_toolkit(tmp_path / "cuda", fail=True)
    monkeypatch.setenv("CUDA_HOME", str(toolkit))
    monkeypatch.setenv("SPARSEDECODING_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(cuda_mma, "_arch", lambda min_major=9: "90")
    with pytest.raises(cuda_mma.CudaKernelUnavailableError, match="(?s)nvcc failed to build nm_mma.cu .exit 1.*"
                                                                    "stand-in compiler failed"):
        cuda_mma.build(cuda_mma.SOURCE)
    assert [path.suffix for path in (tmp_path / "cache" / "cuda_build").iterdir()] == [".lock"]


def test_split_k_counters_are_allocated_once_outside_capture_and_outputs_sized(monkeypatch):
    from types import SimpleNamespace
    capturing = [False]
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: capturing[0])
    cpu, store = torch.device("cpu"), {}
    capturing[0] = True
    with pytest.raises(KernelInputError, match="outside CUDA graph capture .*call nm_mm_scatter once eagerly first"):
        cuda_mma.split_k_counters(store, cpu, 0, 1000, 128, "nm_mm_scatter")
    assert store == {}
    capturing[0] = False
    counters = cuda_mma.split_k_counters(store, cpu, 0, 1000, 128, "nm_mm_scatter")
    assert counters.dtype == torch.int32 and not counters.any() and store[0] is counters
    capturing[0] = True  # allocated already: capture may reuse it
    assert cuda_mma.split_k_counters(store, cpu, 0, 1000, 128, "nm_mm_scatter") is counters
    with pytest.raises(KernelInputError, match="output rows exceed the split-K counters"):
        cuda_mma.split_k_counters(store, cpu, 0, 128 * counters.numel() + 1, 128, "nm_mm_scatter")
    launch = SimpleNamespace(out=5, batch=3, vector=False, splits=4, dtype=torch.float16, device=cpu)
    y, partials = cuda_mma.launch_outputs(launch)
    assert y.shape == (3, 5) and y.dtype == torch.float16 and partials.shape == (60,)
    launch.vector, launch.batch, launch.splits = True, 1, 1
    y, partials = cuda_mma.launch_outputs(launch)
    assert y.shape == (5,) and partials is None


def test_the_library_name_follows_the_included_header(fake_build, tmp_path):
    """A source that includes a header from its folder gets a new library name when only the header changes; a
    source without one is hashed as before (its bytes alone)."""
    nvcc = str(fake_build / "bin" / "nvcc")
    (tmp_path / "k.cu").write_text('#include <stdint.h>\n#include "common.cuh"\nint f() { return g(); }\n')
    (tmp_path / "common.cuh").write_text("inline int g() { return 1; }\n")
    before = cuda_mma.library_path(tmp_path / "k.cu", "90", (), nvcc)
    (tmp_path / "common.cuh").write_text("inline int g() { return 2; }\n")
    assert cuda_mma.library_path(tmp_path / "k.cu", "90", (), nvcc) != before
    assert cuda_mma.source_bytes(tmp_path / "k.cu").endswith(b"return 2; }\n")
    (tmp_path / "plain.cu").write_text("int f() { return 1; }\n")
    assert cuda_mma.source_bytes(tmp_path / "plain.cu") == (tmp_path / "plain.cu").read_bytes()
    assert b"mma16816" in cuda_mma.source_bytes(cuda_mma.SOURCE)  # nm_mma.cu's shared helpers come with it


def test_the_library_name_follows_the_build_flags(fake_build, monkeypatch):
    nvcc = str(fake_build / "bin" / "nvcc")
    before = cuda_mma.library_path(cuda_mma.SOURCE, "90", (), nvcc)
    assert cuda_mma.library_path(cuda_mma.SOURCE, "90", ("-DX=1",), nvcc) != before
    original = cuda_mma.build_command
    monkeypatch.setattr(cuda_mma, "build_command", lambda *args: [*original(*args), "--use_fast_math"])
    assert cuda_mma.library_path(cuda_mma.SOURCE, "90", (), nvcc) != before


@pytest.mark.parametrize("problem", ["cache is a file", "nvcc cannot run", "no home"])
def test_a_cache_or_compiler_that_cannot_be_used_is_one_clear_error(fake_build, tmp_path, monkeypatch, problem):
    """CudaKernelUnavailableError, which auto mode turns into the stated Triton fallback, not a traceback."""
    if problem == "cache is a file":
        (tmp_path / "file").write_text("")
        monkeypatch.setenv("SPARSEDECODING_CACHE", str(tmp_path / "file"))
        match = "cannot write the kernel cache .* set SPARSEDECODING_CACHE to a writable folder"
    elif problem == "nvcc cannot run":
        (fake_build / "bin" / "nvcc").chmod(0o644)
        match = "nvcc cannot be run .*CUDA_HOME"
    else:
        monkeypatch.delenv("SPARSEDECODING_CACHE")
        monkeypatch.setattr(Path, "home", classmethod(lambda cls: (_ for _ in ()).throw(RuntimeError("no home"))))
        match = "HOME is not set; set SPARSEDECODING_CACHE"
    with pytest.raises(cuda_mma.CudaKernelUnavailableError, match=match):
        cuda_mma.build(cuda_mma.SOURCE)


def test_processes_sharing_the_cache_build_a_library_once(tmp_path):
    """Two processes asking at once: one builds while the other waits on the lock, then loads the same file."""
    import subprocess
    import sys

    toolkit = _fake_toolkit(tmp_path / "cuda", delay=1.5)
    driver = tmp_path / "driver.py"
    driver.write_text("from sparsedecoding.kernels import cuda_mma\n"
                      "cuda_mma._arch = lambda min_major=9: '90'\n"
                      "print(cuda_mma.build(cuda_mma.SOURCE))\n")
    env = {**os.environ, "CUDA_HOME": str(toolkit), "SPARSEDECODING_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join([str(Path(cuda_mma.__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    runs = [subprocess.Popen([sys.executable, str(driver)], env=env, stdout=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [run.communicate(timeout=120)[0].strip() for run in runs]
    assert [run.returncode for run in runs] == [0, 0] and outputs[0] == outputs[1]
    assert _builds(toolkit) == 1 and cuda_mma.damaged(Path(outputs[0])) is None


def test_without_nvcc_a_library_prebuilt_into_the_cache_is_found_by_its_record(fake_build, monkeypatch):
    """A serving image without nvcc, given a cache filled elsewhere: the library built from this source with these
    flags is used; for other settings, or a library cut short, the error says nothing was prebuilt."""
    import json

    target = cuda_mma.build(cuda_mma.SOURCE, defines=("-DNM_MMA_WARPS=4",))
    record = json.loads(target.with_suffix(".json").read_text())
    assert record["source"] == "nm_mma.cu" and record["arch"] == "90" and "-DNM_MMA_WARPS=4" in record["flags"]
    assert record["nvcc"] == "Cuda compilation tools, release 99.9, V99.9.0"
    monkeypatch.setattr(cuda_mma, "_nvcc", lambda: None)
    assert cuda_mma.build(cuda_mma.SOURCE, defines=("-DNM_MMA_WARPS=4",)) == target
    with pytest.raises(cuda_mma.CudaKernelUnavailableError, match="nvcc not found .* holds no library of nm_mma.cu "
                                                                    "prebuilt for sm_90"):
        cuda_mma.build(cuda_mma.SOURCE, defines=("-DNM_MMA_WARPS=8",))
    target.write_bytes(target.read_bytes()[:3000])
    with pytest.raises(cuda_mma.CudaKernelUnavailableError, match="holds no library"):
        cuda_mma.build(cuda_mma.SOURCE, defines=("-DNM_MMA_WARPS=4",))


def test_every_launch_class_is_callable():
    """A launch is called once built. A helper once pasted inside `Launch` between its methods left `__call__` nested
    under the helper's return, unreachable, and every tensor-core launch failed with "'Launch' object is not
    callable" on the GPU while every CPU test passed."""
    from sparsedecoding.kernels import nm_scatter, sp24
    for cls in (cuda_mma.Launch, cuda_mma.CodesLaunch, nm_scatter.ScatterLaunch, sp24.Sp24Launch):
        assert callable(object.__new__(cls)), cls.__name__


def test_no_function_of_the_package_has_code_after_its_return():
    """Statements after a function's top-level return or raise never run: the shape of the fault above."""
    import ast
    import sparsedecoding
    found = []
    for path in Path(sparsedecoding.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                ends = [index for index, stmt in enumerate(node.body) if isinstance(stmt, (ast.Return, ast.Raise))]
                if ends and ends[0] < len(node.body) - 1:
                    found.append(f"{path.name}:{node.body[ends[0] + 1].lineno} ({node.name})")
    assert not found, found
