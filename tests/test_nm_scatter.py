"""Scatter-expansion kernel (`kernels/nm_scatter.py`, `csrc/nm_scatter.cu`): on CPU, an emulation of one warp's
tile (its zeroing, the scatter of each lane's words by count-leading-zeros, ldmatrix's fragments as the PTX ISA lays
them out for mma.m16n8k16) and of the CTA's x copy against the dense product, the bank-group claims of its shared
memory layout, the split choice, input checks and an offline compile; on GPU, the kernel against float64."""

from __future__ import annotations

import subprocess
from types import SimpleNamespace

import pytest
import torch

from sparsedecoding.errors import KernelInputError
from sparsedecoding.kernels import PackedNM, pack_nm
from sparsedecoding.kernels import cuda_mma, nm_scatter
from sparsedecoding.kernels.nm_scatter import (ScatterLaunch, check_sixteen_per_word, default_row_ctas, default_splits,
                                               nm_mm_scatter)
from test_cuda_mma import float64_error, random_nm

PATTERNS = [(2, 4), (4, 8), (8, 16), (16, 32)]
# nm_scatter.cu's layout constants (the C file is the source; the emulation below restates them)
STEP_WORDS, RANGE_WORDS = 4, 64
TILE_ROW_BYTES = STEP_WORDS * 64 + 16
X_ROW_BYTES = RANGE_WORDS * 64 + 16


# --- CPU: emulation of a warp's tile and the CTA's x copy ------------------------------------------------------

def _clz(v: int) -> int:
    return 32 - v.bit_length()


def _bf16(half: int) -> float:
    """The bfloat16 whose bits are the low 16 of `half`."""
    return torch.tensor([half & 0xFFFF], dtype=torch.int32).to(torch.int16).view(torch.bfloat16).item()


def _ldmatrix_x4(memory: list[float], row_address) -> list[list[tuple[float, float]]]:
    """ldmatrix.sync.aligned.m8n8.x4.b16 per the PTX ISA, on a memory of 2-byte elements (one entry each): lane 8i + r
    gives the byte address of row r of matrix i (`row_address(lane)`); lane l receives in register i the pair at
    row l / 4, elements 2(l % 4) and + 1, of matrix i. Returns each lane's four registers as value pairs."""
    registers = [[None] * 4 for _ in range(32)]
    for i in range(4):
        for lane in range(32):
            address = row_address(8 * i + lane // 4)
            assert address % 16 == 0, "ldmatrix rows start on 16 bytes"
            first = address // 2 + 2 * (lane % 4)
            registers[lane][i] = (memory[first], memory[first + 1])
    return registers


def _mma16816(acc: list[list[float]], a: list, b: list) -> None:
    """mma.sync.aligned.m16n8k16.row.col with fp32 accumulation (here float64) per the PTX ISA's fragment layouts:
    lane (g, t) = (l / 4, l % 4) holds A registers a0..a3 = (row g, k 2t..2t+1), (g + 8, 2t), (g, 2t + 8),
    (g + 8, 2t + 8), B registers b0, b1 = (k 2t..2t+1, n g), (k 2t + 8.., n g), and accumulators c0..c3 = (row g,
    n 2t..2t+1), (g + 8, 2t..2t+1). `a[l]`, `b[l]`: lane l's registers as value pairs; `acc[l]`: its four sums."""
    A = torch.zeros(16, 16, dtype=torch.float64)
    B = torch.zeros(16, 8, dtype=torch.float64)
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for (row, k), pair in zip(((g, 2 * t), (g + 8, 2 * t), (g, 2 * t + 8), (g + 8, 2 * t + 8)), a[lane]):
            A[row, k], A[row, k + 1] = pair
        for k, pair in zip((2 * t, 2 * t + 8), b[lane]):
            B[k, g], B[k + 1, g] = pair
    D = A @ B
    for lane in range(32):
        g, t = lane // 4, lane % 4
        for e, (row, n) in enumerate(((g, 2 * t), (g, 2 * t + 1), (g + 8, 2 * t), (g + 8, 2 * t + 1))):
            acc[lane][e] += float(D[row, n])


def emulate(x: torch.Tensor, packed: PackedNM, splits: int, warps: int = 8) -> torch.Tensor:
    """y as the kernel computes it, lane by lane (float64 sums): every CTA of `warps` warps and split, each warp
    strip's steps (its lanes' value registers, zeroing, scatter, ldmatrix registers and MMAs in the kernel's operand
    order), the epilogue's lane-to-output map, and the split-K sum of the splits' partials."""
    out, in_features = packed.shape
    words = in_features // 32
    batch = x.shape[0]
    nt = 1 if batch <= 8 else 2
    halves = (packed.values.view(torch.int16).to(torch.int32) & 0xFFFF).view(out, words, 16).tolist()
    masks = (packed.bitmask.to(torch.int64) & 0xFFFFFFFF).tolist()
    per_split = -(-words // splits)
    assert per_split <= RANGE_WORDS
    used_splits = -(-words // per_split)
    partials = torch.zeros(used_splits, batch, out, dtype=torch.float64)
    rows_per_block = 16 * warps
    for row0 in range(0, out, rows_per_block):
        for split in range(used_splits):
            w_begin = split * per_split
            n_words = max(0, min(words, w_begin + per_split) - w_begin)
            steps = -(-n_words // STEP_WORDS)
            # the CTA's x copy: rows past the batch and pieces past the range are zero, the rest never read
            xs = [float("nan")] * (8 * nt * X_ROW_BYTES // 2)
            for b in range(8 * nt):
                for q in range(steps * STEP_WORDS * 4):
                    for k in range(8):
                        ok = b < batch and q < n_words * 4
                        xs[(b * X_ROW_BYTES + q * 16) // 2 + k] = float(x[b, w_begin * 32 + q * 8 + k]) if ok else 0.
            for warp in range(warps):
                strip = row0 + 16 * warp
                if strip >= out:  # the kernel runs it on the last row, and stores nothing
                    continue
                tile = [float("nan")] * (16 * TILE_ROW_BYTES // 2)  # whatever shared memory held before
                acc = [[[0.] * 4 for _ in range(32)] for _ in range(nt)]
                for s in range(steps):
                    for lane in range(32):  # zeroing: piece j·32 + lane, 16 bytes
                        zero_at = (lane >> 4) * TILE_ROW_BYTES + (lane & 15) * 16
                        for j in range(8):
                            at = (zero_at + 2 * j * TILE_ROW_BYTES) // 2
                            tile[at:at + 8] = [0.] * 8
                    for lane in range(32):  # scatter: word lane & 3 of rows lane >> 2 and + 8
                        lw, lr = lane & 3, lane >> 2
                        for e in range(2):
                            row = min(strip + lr + 8 * e, out - 1)
                            local = s * STEP_WORDS + lw
                            word = w_begin + min(local, max(n_words - 1, 0))
                            ok = local < n_words
                            m = masks[row][word] if ok else 0xFFFF
                            h = halves[row][word] if ok else [0] * 16
                            registers = [h[2 * k] | h[2 * k + 1] << 16 for k in range(8)]  # value 2k in the low half
                            segment = (lr + 8 * e) * TILE_ROW_BYTES + lw * 64
                            for i in range(15, -1, -1):
                                z = _clz(m)
                                m &= 0x7FFFFFFF >> z
                                value = registers[i >> 1] >> 16 if i & 1 else registers[i >> 1]
                                tile[(segment + 62 - 2 * z) // 2] = _bf16(value)
                    a_at = lambda lane: ((lane & 7) + 8 * ((lane >> 3) & 1)) * TILE_ROW_BYTES + 16 * (lane >> 4)
                    b_at = lambda lane: (lane & 7) * X_ROW_BYTES + 16 * (lane >> 3)
                    for kp in range(STEP_WORDS):
                        a0 = _ldmatrix_x4(tile, lambda lane: a_at(lane) + 64 * kp)
                        a1 = _ldmatrix_x4(tile, lambda lane: a_at(lane) + 64 * kp + 32)
                        for j in range(nt):
                            column = s * STEP_WORDS * 32 + 32 * kp
                            b = _ldmatrix_x4(xs, lambda lane: b_at(lane) + j * 8 * X_ROW_BYTES + 2 * column)
                            _mma16816(acc[j], a0, [(r[0], r[1]) for r in b])
                            _mma16816(acc[j], a1, [(r[2], r[3]) for r in b])
                for j in range(nt):  # the epilogue: c_e of lane (g, t) is row g + 8(e >> 1), batch 8j + 2t + (e & 1)
                    for lane in range(32):
                        g, t = lane // 4, lane % 4
                        for e in range(4):
                            b, row = 8 * j + 2 * t + (e & 1), strip + g + 8 * (e >> 1)
                            if b < batch and row < out:
                                partials[split, b, row] = acc[j][lane][e]
    return partials.sum(0)


@pytest.mark.parametrize("n,m,out,in_features,batch,splits,warps", [
    (2, 4, 20, 96, 3, 1, 8), (16, 32, 20, 96, 3, 1, 4), (4, 8, 130, 320, 11, 2, 8), (8, 16, 130, 320, 11, 2, 8),
    (16, 32, 40, 4160, 9, 3, 4), (2, 4, 16, 4160, 1, 3, 8), (16, 32, 300, 160, 16, 1, 16)])
def test_emulated_kernel_equals_the_dense_product(n, m, out, in_features, batch, splits, warps):
    """Every step's tile, ldmatrix registers and MMAs as the kernel's lanes build them, and its epilogue and split
    sums, give x·Wᵀ exactly (float64 sums of bf16 products): partial steps (3 and 5 words a split, 9 and 11 steps),
    rows past the end, a second n-tile, CTAs of 4, 8 and 16 warps, and a tile that held NaNs before its first
    zeroing."""
    torch.manual_seed(n * 100 + out)
    weight = random_nm(out, in_features, n, m)
    packed = pack_nm(weight, n, m)
    x = torch.randn(batch, in_features).bfloat16()
    y = emulate(x, packed, splits, warps)
    exact = x.double() @ weight.double().T
    assert torch.allclose(y, exact, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("swap", ["A registers a1 and a2", "the value halves"])
def test_emulation_fails_with_a_layout_mistake(swap, monkeypatch):
    """The emulation is sensitive to what it models: with a lane's A registers a1 and a2 exchanged (rows 8-15 and
    columns 8-15 crossed), or each register's two values read the other way round, the product is wrong."""
    torch.manual_seed(0)
    weight = random_nm(16, 128, 16, 32)
    packed = pack_nm(weight, 16, 32)
    x = torch.randn(2, 128).bfloat16()
    if swap == "the value halves":
        packed = PackedNM(packed.values.view(-1, 2).flip(-1).reshape(packed.values.shape), packed.bitmask, 16, 32,
                          packed.shape)
    else:
        original = _mma16816
        monkeypatch.setitem(globals(), "_mma16816", lambda acc, a, b: original(
            acc, [[r[0], r[2], r[1], r[3]] for r in a], b))
    assert not torch.allclose(emulate(x, packed, 1), x.double() @ weight.double().T)


def test_shared_memory_accesses_fall_on_distinct_bank_groups():
    """The layout's claims: each ldmatrix phase (8 rows of 16 bytes) of A and of B and each quarter-warp of the
    zeroing stores touch 8 different 16-byte bank groups (addr / 16 mod 8), so none of them conflicts."""
    def groups(addresses):
        return len({(a // 16) % 8 for a in addresses})

    for kp in range(STEP_WORDS):
        for half in range(2):
            for q in range(4):
                rows = [((lane & 7) + 8 * ((lane >> 3) & 1)) * TILE_ROW_BYTES + 16 * (lane >> 4) + 64 * kp + 32 * half
                        for lane in range(8 * q, 8 * q + 8)]
                assert groups(rows) == 8
    for column in range(0, RANGE_WORDS * 32, 32):
        for q in range(4):
            assert groups([(lane & 7) * X_ROW_BYTES + 16 * (lane >> 3) + 2 * column
                           for lane in range(8 * q, 8 * q + 8)]) == 8
    for j in range(8):
        for quarter in range(4):
            assert groups([(lane >> 4) * TILE_ROW_BYTES + (lane & 15) * 16 + 2 * j * TILE_ROW_BYTES
                           for lane in range(8 * quarter, 8 * quarter + 8)]) == 8


def test_default_splits_cover_the_x_copy_and_fill_one_wave():
    assert default_splits(4096, 448, 132, 128, 64, 2) == 8  # 14336 columns: 7 splits at least, a wave allows 8
    assert default_splits(28672, 128, 132, 128, 64, 2) == 2  # 224 row blocks: the x copy asks for 2
    assert default_splits(4096, 128, 132, 128, 64, 2) == 8  # 32 row blocks: 8 splits of 16 words
    assert default_splits(64, 3, 132, 128, 64, 2) == 1


def test_default_row_ctas_fill_the_gpu_with_even_shares():
    assert default_row_ctas(28672, 2, 128, 264) == 112  # 224 blocks, 132 slots a split: 2 blocks each
    assert default_row_ctas(4096, 8, 128, 264) == 32  # 32 blocks, 33 slots a split: one each
    assert default_row_ctas(34816, 3, 128, 264) == 68  # 272 blocks, 88 slots a split: 4 each
    assert default_row_ctas(100, 1, 128, 264) == 1
    for out, splits in ((28672, 2), (5120, 6), (34816, 3), (4096, 1)):
        ctas = default_row_ctas(out, splits, 128, 264)
        blocks = -(-out // 128)
        assert ctas * splits <= max(264, splits) and -(-blocks // ctas) * ctas - blocks < -(-blocks // ctas)


def test_a_mask_without_sixteen_a_word_is_refused():
    packed = pack_nm(random_nm(8, 64, 16, 32), 16, 32)
    check_sixteen_per_word(packed.bitmask)
    bad = packed.bitmask.clone()
    bad[3, 1] = 0x0000FFFF ^ 1  # 15 bits
    with pytest.raises(KernelInputError, match="exactly 16 kept columns"):
        check_sixteen_per_word(bad)


def test_cpu_tensors_and_other_patterns_are_refused_before_any_build():
    packed = pack_nm(random_nm(8, 64, 16, 32), 16, 32)
    with pytest.raises(KernelInputError, match="one CUDA device"):
        nm_mm_scatter(torch.randn(2, 64).bfloat16(), packed)
    with pytest.raises(KernelInputError, match="warps = 5; the scatter kernel is built for"):
        ScatterLaunch(torch.randn(2, 64).bfloat16(), packed, warps=5)
    with pytest.raises(KernelInputError, match="prefetch = 3; the scatter kernel is built for"):
        ScatterLaunch(torch.randn(2, 64).bfloat16(), packed, prefetch=3)
    quarter = pack_nm(random_nm(8, 64, 1, 4), 1, 4)
    with pytest.raises(KernelInputError, match="50% patterns"):
        ScatterLaunch(torch.randn(2, 64).bfloat16(), quarter)


def test_a_weight_past_32_bit_word_offsets_is_refused(monkeypatch):
    monkeypatch.setattr(nm_scatter, "check_inputs", lambda x, packed: None)  # its CUDA checks, not this one
    huge = SimpleNamespace(shape=(1 << 16, 1 << 20))  # 2^31 mask words: too big to build here, only its shape
    with pytest.raises(KernelInputError, match="2\\^31 mask words or more"):
        ScatterLaunch(torch.randn(2, 64).bfloat16(), huge)


def test_every_build_compiles_without_spills(tmp_path):
    """nvcc (where this machine has one) builds nm_scatter.cu for sm_90 with no GPU, the kernel, its probe without
    the expansion and the other CTA sizes, every instance without register spills (ptxas' report)."""
    nvcc = cuda_mma._nvcc()
    if nvcc is None:
        pytest.skip("no nvcc on this machine")
    for defines in ((), (nm_scatter.PROBE_DEFINE,), ("-DNM_SCATTER_WARPS=16",), ("-DNM_SCATTER_WARPS=4",),
                    *((f"-DNM_SCATTER_PREFETCH={d}",) for d in nm_scatter.PREFETCH if d)):
        result = subprocess.run([nvcc, "-O3", "-std=c++17", "-gencode=arch=compute_90,code=sm_90", *defines,
                                 "--ptxas-options=-v", "-cubin", "-o", str(tmp_path / "k.cubin"),
                                 str(nm_scatter.SOURCE)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]
        report = result.stderr + result.stdout
        assert report.count("0 bytes spill stores") == 4, (defines, report[-2000:])


# --- GPU ---------------------------------------------------------------------------------------------------------

SHAPES = [(16, 32), (77, 96), (130, 416), (1000, 4096), (200, 4128), (4096, 14336)]


@pytest.mark.gpu
@pytest.mark.parametrize("n,m", PATTERNS)
@pytest.mark.parametrize("out,in_features", SHAPES)
def test_kernel_matches_float64(n, m, out, in_features):
    weight = random_nm(out, in_features, n, m, device="cuda")
    packed = pack_nm(weight, n, m)
    fewest = -(-in_features // 32 // RANGE_WORDS)
    for batch in (1, 2, 5, 8, 9, 13, 16):
        x = torch.randn(batch, in_features, device="cuda").bfloat16()
        for splits in sorted({fewest, fewest + 2, None} - {None}) + [None]:
            y = nm_mm_scatter(x, packed, splits=splits)
            assert y.shape == (batch, out) and y.dtype == torch.bfloat16
            error = float64_error(y, x, weight)
            assert error <= 1, (batch, splits, error)


@pytest.mark.gpu
@pytest.mark.parametrize("warps", [4, 16])
def test_other_cta_sizes_match_float64(warps):
    weight = random_nm(1000, 4128, 16, 32, device="cuda")
    packed = pack_nm(weight, 16, 32)
    for batch in (1, 8, 16):
        x = torch.randn(batch, 4128, device="cuda").bfloat16()
        for splits in (3, None):
            launch = ScatterLaunch(x, packed, splits, warps=warps)
            assert launch.rows_per_block == 16 * warps
            assert float64_error(launch(x, packed.values, packed.bitmask), x, weight) <= 1, (batch, splits)


@pytest.mark.gpu
@pytest.mark.parametrize("prefetch", nm_scatter.PREFETCH)
def test_row_blocks_shared_by_ctas_and_prefetch_match_float64(prefetch):
    """A CTA that runs several row blocks (its loads running on from one into the next, the split-K sum of each
    block by its last CTA) gives the same products as one CTA a block, with every L2 prefetch distance; a graph
    replays it (the counters reset block by block)."""
    weight = random_nm(1000, 4128, 16, 32, device="cuda")  # 8 row blocks of 128, the last partial
    packed = pack_nm(weight, 16, 32)
    for batch in (1, 8, 16):
        x = torch.randn(batch, 4128, device="cuda").bfloat16()
        # 11, 7 and 4 steps a split: both parities of the steps' pairs across a CTA's blocks
        for splits, row_ctas in ((3, 1), (3, 3), (5, 2), (9, 2), (3, 8), (None, None)):
            launch = ScatterLaunch(x, packed, splits, prefetch=prefetch, row_ctas=row_ctas)
            error = float64_error(launch(x, packed.values, packed.bitmask), x, weight)
            assert error <= 1, (batch, splits, row_ctas, error)
    # one step a split (33 splits of 4 words, the last of 1), and one split (its blocks' warps run apart: no barrier)
    for splits, row_ctas in ((33, 2), (33, 3)):
        launch = ScatterLaunch(x, packed, splits, prefetch=prefetch, row_ctas=row_ctas)
        assert float64_error(launch(x, packed.values, packed.bitmask), x, weight) <= 1, (splits, row_ctas)
    narrow = random_nm(1000, 2048, 16, 32, device="cuda")
    packed_narrow = pack_nm(narrow, 16, 32)
    for batch in (1, 16):
        xn = torch.randn(batch, 2048, device="cuda").bfloat16()
        for row_ctas in (2, 3):
            launch = ScatterLaunch(xn, packed_narrow, 1, prefetch=prefetch, row_ctas=row_ctas)
            error = float64_error(launch(xn, packed_narrow.values, packed_narrow.bitmask), xn, narrow)
            assert error <= 1, (batch, row_ctas, error)
    launch = ScatterLaunch(x, packed, 3, prefetch=prefetch, row_ctas=3)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = launch(x, packed.values, packed.bitmask)
    for _ in range(3):
        x.copy_(torch.randn(16, 4128, device="cuda").bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        assert float64_error(y, x, weight) <= 1
    with pytest.raises(KernelInputError, match="row_ctas = 9; 1000 rows make 8 row blocks"):
        ScatterLaunch(x, packed, 3, row_ctas=9)


@pytest.mark.gpu
def test_kernel_float16_vector_and_graph_replay():
    weight = random_nm(300, 640, 16, 32, dtype=torch.float16, device="cuda")
    packed = pack_nm(weight, 16, 32)
    x = torch.randn(640, device="cuda").half()
    y = nm_mm_scatter(x, packed)
    assert y.shape == (300,) and y.dtype == torch.float16
    assert float64_error(y[None], x[None], weight) <= 1
    weight = random_nm(4096, 4096, 16, 32, device="cuda")
    packed = pack_nm(weight, 16, 32)
    copy = PackedNM(packed.values.clone(), packed.bitmask.clone(), 16, 32, packed.shape)
    x = torch.randn(12, 4096, device="cuda").bfloat16()
    launch = ScatterLaunch(x, packed, splits=4)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y1 = launch(x, packed.values, packed.bitmask)
        y2 = launch(x, copy.values, copy.bitmask)
        y3 = nm_mm_scatter(x, copy, splits=4)  # a launch built under capture skips the mask check's host sync
    for _ in range(3):
        x.copy_(torch.randn(12, 4096, device="cuda").bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        assert all(float64_error(y, x, weight) <= 1 for y in (y1, y2, y3))


@pytest.mark.gpu
def test_kernel_refuses_batch_17_and_too_few_splits():
    packed = pack_nm(random_nm(64, 4096, 16, 32, device="cuda"), 16, 32)
    with pytest.raises(KernelInputError, match="batch 17"):
        nm_mm_scatter(torch.randn(17, 4096, device="cuda").bfloat16(), packed)
    with pytest.raises(KernelInputError, match="at least 2 splits"):
        nm_mm_scatter(torch.randn(2, 4096, device="cuda").bfloat16(), packed, splits=1)
