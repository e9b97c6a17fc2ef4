"""Scatter-expansion kernel (`kernels/nm_scatter.py`, `csrc/nm_scatter.cu`): on CPU, an emulation of one warp's
tile (its zeroing, the scatter of each lane's words by count-leading-zeros, ldmatrix's fragments as the PTX ISA lays
them out for mma.m16n8k16) and of the CTA's x copy against the dense product, the bank-group claims of its shared
memory layout, the split choice, input checks and an offline compile; on GPU, the kernel against float64."""

from __future__ import annotations

import subprocess

import pytest
import torch

from sparsedecoding.errors import KernelInputError
from sparsedecoding.kernels import PackedNM, pack_nm
from sparsedecoding.kernels import cuda_mma, nm_scatter
from sparsedecoding.kernels.nm_scatter import ScatterLaunch, check_sixteen_per_word, default_splits, nm_mm_scatter
from test_cuda_mma import float64_error, random_nm

PATTERNS = [(2, 4), (4, 8), (8, 16), (16, 32)]
# nm_scatter.cu's layout constants (the C file is the source; the emulation below restates them)
STEP_WORDS, RANGE_WORDS = 4, 64
TILE_ROW_BYTES = STEP_WORDS * 64 + 16
X_ROW_BYTES = RANGE_WORDS * 64 + 16


# --- CPU: emulation of a warp's tile and the CTA's x copy ------------------------------------------------------

def _clz(v: int) -> int:
    return 32 - v.bit_length()


def _ldmatrix_x4(memory: list[float], row_bytes_of_lane) -> list[list[list[float]]]:
    """ldmatrix.m8n8.x4 on a memory of 2-byte elements (one entry each): lanes 8q..8q+7 give the byte addresses of
    matrix q's rows; returns the four 8x8 matrices."""
    matrices = []
    for q in range(4):
        rows = []
        for r in range(8):
            address = row_bytes_of_lane(8 * q + r)
            assert address % 16 == 0, "ldmatrix rows start on 16 bytes"
            rows.append(memory[address // 2: address // 2 + 8])
        matrices.append(rows)
    return matrices


def emulate(x: torch.Tensor, packed: PackedNM, splits: int, warps: int = 8) -> torch.Tensor:
    """y as the kernel computes it (float64 sums): every CTA of `warps` warps, split and warp strip, step by step."""
    out, in_features = packed.shape
    words = in_features // 32
    batch = x.shape[0]
    nt = 1 if batch <= 8 else 2
    values = packed.values.double().view(out, words, 16)
    masks = packed.bitmask.to(torch.int64) & 0xFFFFFFFF
    per_split = -(-words // splits)
    assert per_split <= RANGE_WORDS
    y = torch.zeros(batch, out, dtype=torch.float64)
    rows_per_block = 16 * warps
    for row0 in range(0, out, rows_per_block):
        for split in range(-(-words // per_split)):
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
                acc = torch.zeros(16, 8 * nt, dtype=torch.float64)
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
                            m = int(masks[row, word]) if ok else 0xFFFF
                            vals = values[row, word].tolist() if ok else [0.] * 16
                            segment = (lr + 8 * e) * TILE_ROW_BYTES + lw * 64
                            for i in range(15, -1, -1):
                                z = _clz(m)
                                m &= 0x7FFFFFFF >> z
                                tile[(segment + 62 - 2 * z) // 2] = vals[i]
                    a_at = lambda lane: ((lane & 7) + 8 * ((lane >> 3) & 1)) * TILE_ROW_BYTES + 16 * (lane >> 4)
                    b_at = lambda lane: (lane & 7) * X_ROW_BYTES + 16 * (lane >> 3)
                    for kp in range(STEP_WORDS):
                        for half in range(2):
                            mats = _ldmatrix_x4(tile, lambda lane: a_at(lane) + 64 * kp + 32 * half)
                            # mma.m16n8k16 A: a0 rows 0-7 / k 0-7, a1 rows 8-15 / k 0-7, a2 rows 0-7 / k 8-15,
                            # a3 rows 8-15 / k 8-15
                            a = torch.zeros(16, 16, dtype=torch.float64)
                            for q, (r0, k0) in enumerate(((0, 0), (8, 0), (0, 8), (8, 8))):
                                a[r0:r0 + 8, k0:k0 + 8] = torch.tensor(mats[q], dtype=torch.float64)
                            for j in range(nt):
                                column = s * STEP_WORDS * 32 + 32 * kp
                                bm = _ldmatrix_x4(xs, lambda lane: b_at(lane) + j * 8 * X_ROW_BYTES + 2 * column)
                                # B: b0 k 0-7 / n = row, b1 k 8-15; the second k-step takes matrices 2 and 3
                                b = torch.zeros(16, 8, dtype=torch.float64)
                                b[0:8] = torch.tensor(bm[2 * half], dtype=torch.float64).T
                                b[8:16] = torch.tensor(bm[2 * half + 1], dtype=torch.float64).T
                                acc[:, 8 * j:8 * j + 8] += a @ b
                for r in range(16):
                    if strip + r < out:
                        y[:, strip + r] += acc[r, :batch]
    return y


@pytest.mark.parametrize("n,m", PATTERNS)
@pytest.mark.parametrize("out,in_features,batch,splits,warps", [(20, 96, 3, 1, 8), (130, 320, 11, 2, 8),
                                                                 (16, 4160, 1, 3, 8), (300, 160, 16, 1, 16)])
def test_emulated_kernel_equals_the_dense_product(n, m, out, in_features, batch, splits, warps):
    """Every step's tile, A and B fragments as the kernel builds them give x·Wᵀ exactly (float64 sums of bf16
    products): partial steps (3 and 5 words a split), rows past the end, a second n-tile, and a tile that held NaNs
    before its first zeroing."""
    torch.manual_seed(n * 100 + out)
    weight = random_nm(out, in_features, n, m)
    packed = pack_nm(weight, n, m)
    x = torch.randn(batch, in_features).bfloat16()
    y = emulate(x, packed, splits, warps)
    exact = x.double() @ weight.double().T
    assert torch.allclose(y, exact, rtol=1e-12, atol=1e-12)


def test_emulation_fails_with_the_a_fragments_swapped():
    """The emulation is sensitive to the fragment layout: with A's middle two matrices exchanged it is wrong."""
    torch.manual_seed(0)
    weight = random_nm(16, 128, 16, 32)
    packed = pack_nm(weight, 16, 32)
    x = torch.randn(2, 128).bfloat16()
    original = _ldmatrix_x4

    def swapped(memory, row_bytes_of_lane):
        mats = original(memory, row_bytes_of_lane)
        return [mats[0], mats[2], mats[1], mats[3]]

    globals()["_ldmatrix_x4"] = swapped
    try:
        y = emulate(x, packed, 1)
    finally:
        globals()["_ldmatrix_x4"] = original
    assert not torch.allclose(y, x.double() @ weight.double().T)


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
    quarter = pack_nm(random_nm(8, 64, 1, 4), 1, 4)
    with pytest.raises(KernelInputError, match="50% patterns"):
        ScatterLaunch(torch.randn(2, 64).bfloat16(), quarter)


def test_both_builds_compile_without_spills(tmp_path):
    """nvcc (where this machine has one) builds nm_scatter.cu for sm_90 with no GPU, the kernel, its probe without
    the expansion and the other CTA sizes, every instance without register spills (ptxas' report)."""
    nvcc = cuda_mma._nvcc()
    if nvcc is None:
        pytest.skip("no nvcc on this machine")
    for defines in ((), (nm_scatter.PROBE_DEFINE,), ("-DNM_SCATTER_WARPS=16",), ("-DNM_SCATTER_WARPS=4",)):
        result = subprocess.run([nvcc, "-O3", "-std=c++17", "-gencode=arch=compute_90,code=sm_90", *defines,
                                 "--ptxas-options=-v", "-cubin", "-o", str(tmp_path / "k.cubin"),
                                 str(nm_scatter.SOURCE)], capture_output=True, text=True)
        assert result.returncode == 0, result.stderr[-2000:]
        report = result.stderr + result.stdout
        assert report.count("0 bytes spill stores") == 4, report[-2000:]


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
    for _ in range(3):
        x.copy_(torch.randn(12, 4096, device="cuda").bfloat16())
        graph.replay()
        torch.cuda.synchronize()
        assert float64_error(y1, x, weight) <= 1 and float64_error(y2, x, weight) <= 1


@pytest.mark.gpu
def test_kernel_refuses_batch_17_and_too_few_splits():
    packed = pack_nm(random_nm(64, 4096, 16, 32, device="cuda"), 16, 32)
    with pytest.raises(KernelInputError, match="batch 17"):
        nm_mm_scatter(torch.randn(17, 4096, device="cuda").bfloat16(), packed)
    with pytest.raises(KernelInputError, match="at least 2 splits"):
        nm_mm_scatter(torch.randn(2, 4096, device="cuda").bfloat16(), packed, splits=1)
