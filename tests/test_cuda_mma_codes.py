"""The tensor-core kernel on 2:4 weights with quantized kept values (`cuda_mma.nmq_mm_cuda`, `nm_mma.cu` CODE 8 and
4): on CPU, the input checks and an emulation of where a lane finds its codes (which must be the packer's order);
on GPU, the real kernel against a float64 product (int8 and int4, bf16 and fp16, batch 1-16, odd shapes, split-K,
graph replay) and the SPARSEDECODING_KERNEL=cuda route of `nmq_spmv`."""

from __future__ import annotations

import pytest
import torch

from sparsedecoding import solvers
from sparsedecoding.errors import KernelInputError
from sparsedecoding.kernels.cuda_mma import check_codes_inputs, nmq_mm_cuda
from sparsedecoding.kernels.quantized import pack_nm_quantized

from helpers import random_nm_weight


def grid_weight(out, in_features, quantize, group_size=128, dtype=torch.bfloat16, seed=0):
    """A 2:4 weight on the `quantize` grid (random codes and solver-rounded scales, exact in bf16 and fp16)."""
    g = torch.Generator().manual_seed(seed)
    low, high = solvers.CODE_RANGES[quantize]
    group = in_features if quantize == "int8" else group_size
    codes = torch.randint(low, high + 1, (out, in_features), generator=g).float()
    codes *= random_nm_weight(out, in_features, 2, 4, torch.float32, seed) != 0
    scales = solvers.grid_scale(torch.rand(out, in_features // group, generator=g) * 4 + 1e-2, quantize)
    return (codes * scales.repeat_interleave(group, dim=1)).to(dtype)


def float64_error(y, x, weight):
    """Largest |y − x·Wᵀ| over u·|x·Wᵀ| + in·2⁻²⁴·|x|·|W|ᵀ (output rounding plus any fp32 sum order); ≤ 1
    passes."""
    x64, w64 = x.double().cpu(), weight.double().cpu()
    exact = x64 @ w64.T
    bound = torch.finfo(y.dtype).eps / 2 * exact.abs() + w64.shape[1] * 2.0**-24 * (x64.abs() @ w64.abs().T)
    return float(((y.double().cpu() - exact).abs() / bound.clamp_min(1e-30)).max())


# --- CPU ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_emulated_lane_codes_are_the_packers_values(quantize):
    """`lane_values` in nm_mma.cu: lane t of word pair p reads the pair's kept values 8t..8t+7 (FAST24), from
    bytes 8t.. of the pair's 16 int8 bytes per word, or nibbles 8t.. (byte 4t, low nibble first) of int4, scaled by
    the scale of the group holding word 2p + t/2. Emulated here on the packed tensors, it must give the packer's
    kept values in order."""
    out, in_features, group = 8, 256, 64
    packed = pack_nm_quantized(grid_weight(out, in_features, quantize, group), 2, 4, quantize, group)
    kept = packed.kept_values().float()
    codes = packed.codes
    words, group_words = in_features // 32, packed.group_size // 32
    for row in range(out):
        for p in range(words // 2):
            for t in range(4):
                if quantize == "int8":
                    lane = codes[row, 32 * p + 8 * t: 32 * p + 8 * t + 8].to(torch.int32).tolist()
                else:
                    pieces = codes[row, 16 * p + 4 * t: 16 * p + 4 * t + 4].to(torch.int32).tolist()
                    nibbles = [(b >> (4 * k)) & 0xF for b in pieces for k in (0, 1)]
                    lane = [v - 16 if v >= 8 else v for v in nibbles]
                scale = float(packed.scales[row, (2 * p + t // 2) // group_words])
                expected = kept[row, 32 * p + 8 * t: 32 * p + 8 * t + 8].tolist()
                assert [c * scale for c in lane] == expected, (row, p, t)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_emulated_sparse_mma_lane_codes_are_the_packers_values(quantize):
    """`strip_word_sp` with codes: lane t of mask word w reads the word's kept values 4t..4t+3 (its A registers), from
    bytes 4t.. of the word's 16 int8 bytes, or bytes 2t, 2t+1 (low nibble first) of its 8 int4 bytes, scaled by the
    scale of the group holding word w; emulated on the packed tensors, the packer's kept values in order."""
    out, in_features, group = 8, 256, 64
    packed = pack_nm_quantized(grid_weight(out, in_features, quantize, group), 2, 4, quantize, group)
    kept = packed.kept_values().float()
    words, group_words = in_features // 32, packed.group_size // 32
    for row in range(out):
        for w in range(words):
            for t in range(4):
                if quantize == "int8":
                    lane = packed.codes[row, 16 * w + 4 * t: 16 * w + 4 * t + 4].to(torch.int32).tolist()
                else:
                    pieces = packed.codes[row, 8 * w + 2 * t: 8 * w + 2 * t + 2].to(torch.int32).tolist()
                    nibbles = [(b >> (4 * k)) & 0xF for b in pieces for k in (0, 1)]
                    lane = [v - 16 if v >= 8 else v for v in nibbles]
                scale = float(packed.scales[row, w // group_words])
                assert [c * scale for c in lane] == kept[row, 16 * w + 4 * t: 16 * w + 4 * t + 4].tolist()


def _prmt(a: int, b: int, sel: int) -> int:
    """PTX prmt.b32 (default mode): byte i of the result is byte (sel >> 4i) & 7 of the 8 bytes b:a."""
    pool = a | b << 32
    return sum(((pool >> 8 * ((sel >> 4 * i) & 7)) & 0xFF) << 8 * i for i in range(4))


def test_emulated_int8_exponent_trick_is_exact():
    """nm_mma.cu `int8_code`: the offset-binary byte below 2^23's exponent, minus 2^23 + 128, is the code."""
    import struct

    for code in range(-128, 128):
        piece = (code & 0xFF) << 8 | 0x11  # the code in byte 1 of a piece, another byte beside it
        offset = piece ^ 0x80808080
        bits = _prmt(offset, 0x4B000000, 0x7440 | 1)
        value = struct.unpack("<f", struct.pack("<I", bits))[0]
        assert value - 8388736.0 == code


def test_emulated_int4_bf16_trick_is_exact():
    """nm_mma.cu `int4_pair_bf16`: the lane's 8 int4 codes of a 32-bit piece become word s = (value 2s, value 2s+1)
    as bf16 128 + q, and minus 136 the codes, for every code in every position."""
    g = torch.Generator().manual_seed(0)
    pieces = [int(v) for v in torch.randint(0, 2**32, (64,), generator=g, dtype=torch.int64)]
    pieces += [0x01234567, 0x89ABCDEF, 0xFFFFFFFF, 0]
    for piece in pieces:
        codes = [((piece >> 4 * k) & 0xF) - 16 * ((piece >> 4 * k + 3) & 1) for k in range(8)]
        q = piece ^ 0x88888888
        even, odd = q & 0x0F0F0F0F, (q >> 4) & 0x0F0F0F0F
        for s in range(4):
            word = (_prmt(even, odd, s | (4 + s) << 8) & 0x00FF00FF) | 0x43004300
            halves = torch.tensor([word & 0xFFFF, word >> 16], dtype=torch.int32).to(torch.int16)
            values = halves.view(torch.bfloat16).float() - 136
            assert values.tolist() == [codes[2 * s], codes[2 * s + 1]], (hex(piece), s)


def test_bad_inputs_raise_one_line():
    int8 = pack_nm_quantized(grid_weight(16, 96, "int8"), 2, 4, "int8")
    int4 = pack_nm_quantized(grid_weight(16, 96, "int4", group_size=32), 2, 4, "int4", 32)
    x = torch.randn(1, 96).bfloat16()
    cases = [
        (x, int4, "multiple of 64"),
        (x.float(), int8, "float32"),
        (torch.randn(1, 64).bfloat16(), int8, "expected [96] or [batch, 96]"),
        (torch.randn(17, 96).bfloat16(), int8, "batch 17 is outside 1..16"),
        (x, int8, "CUDA device"),
    ]
    for x_bad, packed, message in cases:
        with pytest.raises(KernelInputError) as info:
            check_codes_inputs(x_bad, packed)
        assert message in str(info.value) and "\n" not in str(info.value)


def test_group_widths_the_kernel_cannot_shift_are_refused():
    packed = pack_nm_quantized(grid_weight(16, 192, "int4", group_size=96), 2, 4, "int4", 96)
    with pytest.raises(KernelInputError, match="power-of-two multiple of 32"):
        check_codes_inputs(torch.randn(1, 192).bfloat16(), packed)


def test_other_patterns_are_refused():
    from sparsedecoding.kernels.quantized import PackedNMQ

    packed = pack_nm_quantized(grid_weight(16, 128, "int8"), 2, 4, "int8")
    as_4of8 = PackedNMQ(packed.codes, packed.scales, packed.bitmask, 4, 8, packed.shape, "int8", packed.group_size)
    with pytest.raises(KernelInputError, match="2:4 only"):
        check_codes_inputs(torch.randn(1, 128).bfloat16(), as_4of8)


# --- GPU ---------------------------------------------------------------------------------------------------------

SHAPES = [(16, 64), (77, 128), (130, 448), (1000, 4096), (200, 4160)]


@pytest.mark.gpu
@pytest.mark.parametrize("sparse_mma", [False, True])
@pytest.mark.parametrize("quantize", ["int8", "int4"])
@pytest.mark.parametrize("out,in_features", SHAPES)
def test_kernel_matches_float64(quantize, out, in_features, sparse_mma):
    group = 64 if in_features % 128 else 128
    weight = grid_weight(out, in_features, quantize, group, seed=out)
    packed = pack_nm_quantized(weight, 2, 4, quantize, group).to("cuda")
    settings = ((1, 2), (3, 2), (None, 2)) if sparse_mma else ((1, 2), (3, 2), (None, 3))
    for batch in (1, 2, 5, 8, 9, 16):
        x = torch.randn(batch, in_features, device="cuda").bfloat16()
        for splits, stages in settings:
            y = nmq_mm_cuda(x, packed, splits=splits, stages=stages, sparse_mma=sparse_mma)
            assert y.shape == (batch, out) and y.dtype == torch.bfloat16
            assert float64_error(y, x, weight) <= 1, (batch, splits, stages)


@pytest.mark.gpu
@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_kernel_float16_vector_and_graph_replay(quantize):
    weight = grid_weight(4096, 4096, quantize, dtype=torch.float16)
    packed = pack_nm_quantized(weight, 2, 4, quantize).to("cuda")
    x = torch.randn(4096, device="cuda").half()
    assert float64_error(nmq_mm_cuda(x, packed)[None], x[None], weight) <= 1
    xb = torch.randn(4, 4096, device="cuda").half()
    nmq_mm_cuda(xb, packed, splits=4)  # builds and allocates the split-K counters eagerly
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = nmq_mm_cuda(xb, packed, splits=4)
    for _ in range(2):
        xb.copy_(torch.randn(4, 4096, device="cuda").half())
        graph.replay()
        torch.cuda.synchronize()
        assert float64_error(y, xb, weight) <= 1


@pytest.mark.gpu
def test_kernel_setting_cuda_routes_nmq_spmv(monkeypatch):
    from sparsedecoding.kernels import quantized

    weight = grid_weight(512, 1024, "int4")
    packed = pack_nm_quantized(weight, 2, 4, "int4").to("cuda")
    x = torch.randn(3, 1024, device="cuda").bfloat16()
    monkeypatch.setenv("SPARSEDECODING_KERNEL", "cuda")
    monkeypatch.setattr(quantized, "_cuda_launches", {})
    assert float64_error(quantized.nmq_spmv(x, packed), x, weight) <= 1
    assert len(quantized._cuda_launches) == 1  # the tensor-core kernel served it, once checked
