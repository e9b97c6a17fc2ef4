"""Edges of the quantized kernels' host code found in the eighty-second session's review: the tensor-core launch
cache keyed by pattern too, non-contiguous packed parts refused by the Triton path, the dense int8 / int4 tuners
given the very tensors that launch, an x at an odd element offset for int4's word loads, int4 rows with an odd
count of kept codes, tinygemm's shape limits, and a PackedLinear's dense copy given the wrong dtype. Under the
Triton interpreter on CPU (TRITON_INTERPRET=1 set before the kernel modules are imported); the tuners' and the
launch cache's GPU behaviour is reproduced by standing in for the GPU-only parts."""

import os

import pytest
import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":
    os.environ["TRITON_INTERPRET"] = "1"

from sparsedecoding import solvers  # noqa: E402
from sparsedecoding.errors import KernelInputError, PackingError  # noqa: E402
from sparsedecoding.kernels import autotune, cuda_mma, quantized, triton_w4, triton_w8  # noqa: E402
from sparsedecoding.kernels.format import bits_to_bitmask  # noqa: E402
from sparsedecoding.kernels.quantized import (DenseQuantized, PackedNMQ, nmq_spmv, nmq_spmv_reference,  # noqa: E402
                                              pack_int4, pack_nm_quantized)


def random_nmq(out: int, in_features: int, n: int, m: int, seed: int = 0) -> PackedNMQ:
    """An int8 N:M weight with random kept positions, codes and positive scales."""
    g = torch.Generator().manual_seed(seed)
    order = torch.rand(out, in_features // m, m, generator=g).argsort(-1)[..., :n]
    keep = torch.zeros(out, in_features // m, m, dtype=torch.bool).scatter_(2, order, True).view(out, in_features)
    codes = torch.randint(-128, 128, (out, in_features * n // m), generator=g).to(torch.int8)
    scales = (torch.rand(out, 1, generator=g) + 0.5).bfloat16()
    return PackedNMQ(codes, scales, bits_to_bitmask(keep), n, m, (out, in_features), "int8", in_features)


def test_the_tensor_core_launch_cache_tells_patterns_apart(monkeypatch):
    """A 2:4-only launch, cached for one shape, must not serve a 4:8 weight of that shape: each pattern is built
    (and so checked) on its own. The launch stands in for the CUDA one and keeps its pattern check."""
    built = []

    class Launch:
        def __init__(self, x, packed, sparse_mma=False):
            if (packed.n, packed.m) != (2, 4):
                raise KernelInputError(f"the tensor-core kernel runs quantized values for 2:4 only; got "
                                       f"{packed.pattern}")
            built.append(packed.pattern)
            self.packed = packed

        def __call__(self, x, codes, scales, bitmask):
            return nmq_spmv_reference(x, self.packed)

    monkeypatch.setattr(cuda_mma, "CodesLaunch", Launch)
    monkeypatch.setattr(torch.cuda, "is_current_stream_capturing", lambda: False)
    monkeypatch.setattr(quantized, "_cuda_launches", {})
    x = torch.randn(1, 128).bfloat16()
    quantized._nmq_cuda(x, random_nmq(16, 128, 2, 4, seed=1))
    with pytest.raises(KernelInputError, match="2:4 only; got 4:8"):
        quantized._nmq_cuda(x, random_nmq(16, 128, 4, 8, seed=2))
    assert built == ["2:4"]


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a CUDA GPU")
def test_non_contiguous_packed_parts_are_refused_on_the_gpu():
    packed = random_nmq(16, 256, 2, 4).to("cuda")
    wide = torch.zeros(16, 16, dtype=torch.int32, device="cuda")
    wide[:, :8] = packed.bitmask
    sliced = PackedNMQ(packed.codes, packed.scales, wide[:, :8], 2, 4, packed.shape, "int8", 256)
    x = torch.randn(1, 256, device="cuda").bfloat16()
    with pytest.raises(KernelInputError, match="contiguous parts"):
        nmq_spmv(x, sliced)


@pytest.fixture
def tuner_as_on_a_gpu(monkeypatch):
    """The tuners time and check every candidate, as on a GPU (the interpreter takes the first one untimed)."""
    import triton.testing

    monkeypatch.setattr(autotune, "interpreted", lambda: False)
    monkeypatch.setattr(triton.testing, "do_bench", lambda fn, *args, **kwargs: (fn(), 1.0)[1])
    monkeypatch.setattr(triton_w8, "_tuner", autotune.Tuner("w8_mm"))
    monkeypatch.setattr(triton_w4, "_tuner", autotune.Tuner("w4_mm"))


def test_the_dense_tuners_run_the_contiguous_tensors_that_launch(tuner_as_on_a_gpu):
    """A column slice of a weight (valid input, copied before the launch) must be tuned as that copy: tuned on the
    strided original, every candidate read it wrong and the call raised."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 256, generator=g).bfloat16()
    wide = torch.randint(-128, 128, (8, 512), generator=g).to(torch.int8)
    scales = (torch.rand(8, generator=g) + 0.5).bfloat16()
    y = triton_w8.w8_mm(x, wide[:, :256], scales)
    assert triton_w8.float64_reference(x, wide[:, :256].contiguous(), scales).error(y) <= 1
    codes = torch.randint(-8, 8, (8, 512), generator=g)
    weight, group_scales = triton_w4.pack_w4(codes, torch.rand(8, 8, generator=g) + 0.5, torch.bfloat16)
    y = triton_w4.w4_mm(x, weight[:, :128], group_scales[:, :4])
    assert triton_w4.float64_reference(x, weight[:, :128].contiguous(), group_scales[:, :4].contiguous()).error(y) <= 1


def test_int4_word_loads_take_an_x_at_an_odd_element_offset(tuner_as_on_a_gpu):
    g = torch.Generator().manual_seed(0)
    weight, scales = triton_w4.pack_w4(torch.randint(-8, 8, (8, 256), generator=g),
                                       torch.rand(8, 4, generator=g) + 0.5, torch.bfloat16)
    x = torch.randn(1, 257, generator=g).bfloat16()[:, 1:]  # contiguous, storage offset 1: not 4-byte aligned
    assert x.is_contiguous() and x.data_ptr() % 4
    reference = triton_w4.float64_reference(x, weight, scales)
    for config in (triton_w4.W4Config(8, 4, 1, 4, x_words=True), None):  # a word-load config, then the tuner's
        assert reference.error(triton_w4.w4_mm(x, weight, scales, config)) <= 1


def test_int4_rows_with_an_odd_count_of_kept_codes_are_one_packing_error():
    """Two codes a byte: 1:32 or 5:32 on 32 columns keeps 1 or 5 values a row, which int4 cannot pack."""
    for n in (1, 3, 5):
        weight = torch.zeros(2, 32)
        weight[:, :n] = 0.5
        with pytest.raises(PackingError, match="odd count"):
            pack_nm_quantized(weight, n, 32, "int4", 32)
    with pytest.raises(PackingError, match="odd count"):
        PackedNMQ(pack_int4(torch.zeros(2, 4, dtype=torch.int8)), torch.ones(2, 1).bfloat16(),
                  torch.zeros(2, 1, dtype=torch.int32), 5, 32, (2, 32), "int4", 32)


def test_tinygemm_shapes_it_cannot_hold_go_to_triton_under_auto_and_are_refused_when_asked_for(monkeypatch):
    g = torch.Generator().manual_seed(0)
    on_grid = solvers.gptq(torch.randn(13, 128, generator=g), torch.eye(128), "int4", group_size=32)
    grid = solvers.quantization_codes(on_grid, "int4", 32)
    monkeypatch.delenv("SPARSEDECODING_DENSE_INT4", raising=False)
    assert quantized.dense_kernel(grid, torch.bfloat16) == "triton"  # 13 rows: not a multiple of 16
    built = DenseQuantized.from_codes(grid, torch.bfloat16)
    x = torch.randn(2, 128).bfloat16()
    torch.testing.assert_close(built(x).float(), x.float() @ on_grid.float().T, rtol=2e-2, atol=2e-2)
    monkeypatch.setenv("SPARSEDECODING_DENSE_INT4", "tinygemm")
    with pytest.raises(PackingError, match="out_features a multiple of 16, not 13"):
        DenseQuantized.from_codes(grid, torch.bfloat16)


def test_a_dense_copy_meets_the_wrong_dtype_with_the_kernels_error():
    from sparsedecoding.kernels.linear import PackedLinear

    weight = torch.randn(16, 64).bfloat16() * (torch.arange(64) % 2 == 0)
    linear = PackedLinear.from_dense(weight, 2, 4)
    linear.keep_dense_copy(2)
    for rows in (1, 4):  # the kernel's side, then the dense copy's
        with pytest.raises(KernelInputError, match="float16"):
            linear(torch.randn(rows, 64).half())
