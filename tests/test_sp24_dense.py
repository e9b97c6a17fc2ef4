"""Dense int8 / int4 weights on the sparse tensor-core kernel (`sp24.tile_dense`, sp24.cu DENSE): on CPU, the tiled
layout read back through mma.sp's register semantics (with the constant metadata the kernel uses) equals the dense
weight, the layout round-trips, `DenseQuantized` under SPARSEDECODING_DENSE_INT4=sp24 multiplies like the grid it
came from, and bad shapes raise one line; on GPU, the kernel against a float64 product (batch 1-16, split-K,
slices), the dense expansion, and the engine's dense int4 path."""

from __future__ import annotations

import pytest
import torch

from sparsedecoding import solvers
from sparsedecoding.errors import KernelInputError
from sparsedecoding.kernels.sp24 import (compact, dense_from_parts, tile_dense, tiled_to_dense, to_dense, untile)

from helpers import sp24_outputs
from test_cuda_mma_codes import float64_error

SHAPES = [(16, 256), (48, 96), (128, 544), (32, 1040)]


def grid(out: int, in_features: int, quantize: str, group: int = 32, seed: int = 0) -> solvers.QuantizedCodes:
    """Random codes over the whole range and solver-rounded scales (int8: one a row)."""
    g = torch.Generator().manual_seed(seed)
    low, high = solvers.CODE_RANGES[quantize]
    group = in_features if quantize == "int8" else group
    codes = torch.randint(low, high + 1, (out, in_features), generator=g).to(torch.int8)
    scales = solvers.grid_scale(torch.rand(out, in_features // group, generator=g) * 4 + 1e-2, quantize)
    return solvers.QuantizedCodes(codes, scales, quantize, group)


def tiled(codes: solvers.QuantizedCodes):
    return tile_dense(codes.codes, codes.scales, codes.quantize, codes.group_size)


# --- CPU ---------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("out,in_features,quantize,group", [
    (out, in_features, quantize, group) for out, in_features in SHAPES
    for quantize, group in [("int8", 0), ("int4", 16), ("int4", 32), ("int4", 16 * 4)]
    if quantize == "int8" or in_features % group == 0])  # int4 groups that divide the row
def test_tiled_dense_codes_read_back_to_the_weight(out, in_features, quantize, group):
    codes = grid(out, in_features, quantize, group, seed=out + in_features)
    w = tiled(codes)
    assert w.dense and w.meta is None and w.shape == (out, in_features) and w.tiled_in == 2 * in_features
    assert torch.equal(tiled_to_dense(w), codes.dequantize(torch.float64))


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_untile_gives_the_two_to_four_form_of_twice_the_columns(quantize):
    codes = grid(32, 256, quantize, seed=3)
    packed = untile(tiled(codes))
    assert packed.shape == (32, 512) and (packed.n, packed.m) == (2, 4)
    assert bool((packed.bitmask == 0x33333333).all())
    assert torch.equal(compact(packed.to_dense(torch.float64)), codes.dequantize(torch.float64))


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_parts_rebuild_the_weight(quantize):
    codes = grid(64, 1024, quantize, 128, seed=4)
    w = tiled(codes)
    scales = w.row_scales if quantize == "int8" else w.scales
    again = dense_from_parts(w.a, scales, 1024, quantize, codes.group_size)
    for field in ("shape", "code", "steps", "gk_shift", "groups", "dense", "dtype"):
        assert getattr(again, field) == getattr(w, field), field
    assert torch.equal(to_dense(again), codes.dequantize(torch.float64).bfloat16())


def test_parts_of_another_width_raise_one_line():
    codes = grid(64, 1024, "int4", 128, seed=15)
    w = tiled(codes)
    with pytest.raises(KernelInputError, match="not a dense int4 weight of 768 columns"):
        dense_from_parts(w.a, w.scales, 768, "int4", 128)
    with pytest.raises(KernelInputError, match="not a dense int4 weight"):
        dense_from_parts(w.a, w.scales[:-16], 1024, "int4", 128)


def test_to_dense_on_cpu_is_the_dense_weight():
    codes = grid(48, 544, "int4", 32, seed=5)
    assert torch.equal(to_dense(tiled(codes)), codes.dequantize(torch.float64).bfloat16())


@pytest.mark.parametrize("shape,quantize,group,message", [
    ((40, 256), "int4", 32, "multiples of 16; got 40 x 256"),
    ((32, 264), "int8", 0, "multiples of 16; got 32 x 264"),
    ((32, 256), "int4", 48, "group size 48"),
    ((32, 256), "int4", 8, "group size 8"),
])
def test_bad_shapes_raise_one_line(shape, quantize, group, message):
    codes = torch.zeros(shape, dtype=torch.int8)
    scales = torch.ones(shape[0], 1 if quantize == "int8" else max(1, shape[1] // group))
    with pytest.raises(KernelInputError, match=message) as error:
        tile_dense(codes, scales, quantize, group or shape[1])
    assert "\n" not in str(error.value)


def test_dense_quantized_under_the_setting_multiplies_like_its_grid(monkeypatch):
    from sparsedecoding.kernels.quantized import DenseQuantized
    from sparsedecoding.kernels.quantized_linear import DenseQuantizedLinear

    monkeypatch.setenv("SPARSEDECODING_DENSE_INT4", "sp24")
    codes = grid(64, 512, "int4", 128, seed=6)
    dense = DenseQuantized.from_codes(codes)
    assert dense.layout == "sp24" and dense.scales.dim() == 1
    layer = DenseQuantizedLinear(dense)
    assert layer.layout_device is None
    x = torch.randn(3, 512).bfloat16()
    expected = torch.nn.functional.linear(x, codes.dequantize(torch.float64).bfloat16())
    assert torch.equal(layer(x), expected)


def test_the_layer_keeps_bf16_scales_through_dtype_moves(monkeypatch):
    """`.half()` / `.float()` leave the sp24 layout's scales bfloat16 (the kernel reads them so); prefill rows of
    any dtype multiply by the dequantized weight."""
    from sparsedecoding.kernels.quantized import DenseQuantized
    from sparsedecoding.kernels.quantized_linear import DenseQuantizedLinear

    monkeypatch.setenv("SPARSEDECODING_DENSE_INT4", "sp24")
    monkeypatch.setenv("SPARSEDECODING_DENSE_INT8", "sp24")
    for quantize in ("int4", "int8"):
        codes = grid(32, 256, quantize, 64, seed=13)
        layer = DenseQuantizedLinear(DenseQuantized.from_codes(codes))
        assert layer.layout == "sp24"
        layer.half()
        assert layer.scales.dtype == torch.bfloat16 and layer.qweight.dtype == torch.uint8
        x = torch.randn(20, 256).half()
        expected = torch.nn.functional.linear(x, codes.dequantize(torch.float64).bfloat16().half())
        assert torch.equal(layer(x), expected)


def test_the_setting_takes_sp24_and_refuses_other_activations(monkeypatch):
    from sparsedecoding.kernels.op import KernelChoiceError, dense_int4_setting
    from sparsedecoding.kernels.quantized import DenseQuantized

    monkeypatch.setenv("SPARSEDECODING_DENSE_INT4", "sp24")
    assert dense_int4_setting() == "sp24"
    with pytest.raises(KernelInputError, match="bfloat16 activations"):
        DenseQuantized.from_codes(grid(16, 256, "int4"), torch.float16)
    monkeypatch.setenv("SPARSEDECODING_DENSE_INT4", "marlin")
    with pytest.raises(KernelChoiceError, match="sp24"):
        dense_int4_setting()


def test_auto_takes_sp24_only_for_bf16_cuda_weights_it_fits(monkeypatch):
    """On CPU (and for fp16, or a shape off the tiles) "auto" builds tinygemm's layout; the GPU test below sees it
    take sp24 where the kernel loads."""
    from sparsedecoding.kernels.quantized import dense_kernel

    monkeypatch.delenv("SPARSEDECODING_DENSE_INT4", raising=False)
    assert dense_kernel(grid(32, 256, "int4"), torch.bfloat16) == "tinygemm"  # CPU tensors
    monkeypatch.setenv("SPARSEDECODING_DENSE_INT4", "sp24")
    assert dense_kernel(grid(32, 256, "int4"), torch.bfloat16) == "sp24"
    monkeypatch.delenv("SPARSEDECODING_DENSE_INT8", raising=False)
    assert dense_kernel(grid(32, 256, "int8"), torch.bfloat16) == "triton"  # CPU tensors


def test_every_dense_kernel_setting_has_a_report_description(monkeypatch):
    """quant_e2e_bench.py names the dense kernels in its report; a value it cannot name failed a GPU run once."""
    from sparsedecoding.kernels.op import DENSE_INT4_CHOICES, DENSE_INT8_CHOICES

    from helpers import benchmark_module

    module = benchmark_module(monkeypatch, "quant_e2e_bench")
    assert set(DENSE_INT4_CHOICES) | set(DENSE_INT8_CHOICES) <= set(module.DENSE_KERNELS)


def test_dense_int8_under_the_setting_multiplies_like_its_grid(monkeypatch):
    from sparsedecoding.kernels.op import KernelChoiceError, dense_int8_setting
    from sparsedecoding.kernels.quantized import DenseQuantized

    monkeypatch.setenv("SPARSEDECODING_DENSE_INT8", "sp24")
    codes = grid(48, 544, "int8", seed=10)
    dense = DenseQuantized.from_codes(codes)
    assert dense.layout == "sp24" and dense.weight.dim() == 1 and dense.scales.shape == (48,)
    x = torch.randn(2, 544).bfloat16()
    assert torch.equal(dense(x), torch.nn.functional.linear(x, codes.dequantize(torch.float64).bfloat16()))
    monkeypatch.setenv("SPARSEDECODING_DENSE_INT8", "tinygemm")
    with pytest.raises(KernelChoiceError, match="SPARSEDECODING_DENSE_INT8='tinygemm'"):
        dense_int8_setting()


# --- GPU ---------------------------------------------------------------------------------------------------------

GPU_SHAPES = [(16, 256), (48, 544), (1024, 4096), (4096, 14336)]


def tiled_on_gpu(codes: solvers.QuantizedCodes):
    return tile_dense(codes.codes.cuda(), codes.scales.cuda(), codes.quantize, codes.group_size)


@pytest.mark.gpu
@pytest.mark.parametrize("out,in_features", GPU_SHAPES)
@pytest.mark.parametrize("quantize,group", [("int8", 0), ("int4", 32), ("int4", 128)])
def test_kernel_matches_float64(out, in_features, quantize, group):
    if quantize == "int4" and in_features % group:
        pytest.skip("the group does not divide the row")
    codes = grid(out, in_features, quantize, group, seed=out % 97)
    w = tiled_on_gpu(codes)
    weight = codes.dequantize(torch.float64)
    for batch, splits, slices, x, y in sp24_outputs(w, in_features, torch.bfloat16):
        assert float64_error(y, x, weight) <= 1, (quantize, out, in_features, batch, splits, slices)


@pytest.mark.gpu
@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_an_lm_head_matches_float64(quantize):
    """Llama-3.1-8B's lm_head shape (128256 x 4096) on its tuned launch (checked against float64 by the tuner too)."""
    from sparsedecoding.kernels.sp24 import sp24_mm

    codes = grid(128256, 4096, quantize, 128, seed=9)
    w = tiled_on_gpu(codes)
    weight = codes.dequantize(torch.float64)
    for batch in (1, 4, 16):
        x = torch.randn(batch, 4096, device="cuda").bfloat16()
        assert float64_error(sp24_mm(x, w), x, weight) <= 1, batch


@pytest.mark.gpu
@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_dense_expansion_on_the_gpu_is_the_weight(quantize):
    codes = grid(1024, 1536, quantize, 64, seed=7)
    assert torch.equal(to_dense(tiled_on_gpu(codes)).cpu(), codes.dequantize(torch.float64).bfloat16())


@pytest.mark.gpu
def test_auto_takes_sp24_on_the_gpu(monkeypatch):
    from sparsedecoding.kernels.quantized import DenseQuantized

    monkeypatch.delenv("SPARSEDECODING_DENSE_INT4", raising=False)
    codes = grid(64, 512, "int4", 128, seed=11)
    cuda = solvers.QuantizedCodes(codes.codes.cuda(), codes.scales.cuda(), "int4", 128)
    assert DenseQuantized.from_codes(cuda).layout == "sp24"
    assert DenseQuantized.from_codes(cuda, torch.float16).layout == "torch"
    monkeypatch.delenv("SPARSEDECODING_DENSE_INT8", raising=False)
    codes8 = grid(64, 512, "int8", seed=12)
    cuda8 = solvers.QuantizedCodes(codes8.codes.cuda(), codes8.scales.cuda(), "int8", 512)
    assert DenseQuantized.from_codes(cuda8).layout == "sp24"


@pytest.mark.gpu
@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_tuned_op_inside_a_graph_matches_float64(quantize, monkeypatch):
    """The engine's call: `dense_quantized_mm` on the sp24 layout through the custom op, tuned eagerly, then replayed
    from a CUDA graph."""
    from sparsedecoding.kernels.quantized import DenseQuantized, dense_quantized_mm

    monkeypatch.setenv("SPARSEDECODING_DENSE_INT4", "sp24")
    monkeypatch.setenv("SPARSEDECODING_DENSE_INT8", "sp24")
    codes = grid(4096, 4096, quantize, 128, seed=8)
    group = codes.group_size
    dense = DenseQuantized.from_codes(solvers.QuantizedCodes(codes.codes.cuda(), codes.scales.cuda(), quantize,
                                                             group))
    assert dense.layout == "sp24"
    weight = codes.dequantize(torch.float64)
    for batch in (1, 4, 16, 20):
        x = torch.randn(batch, 4096, device="cuda").bfloat16()
        y = dense_quantized_mm(x, dense.weight, dense.scales, quantize, group)
        assert float64_error(y, x, weight) <= 1, batch
        if batch > 16:
            continue  # prefill: the dequantized weight, no graph
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            replayed = dense_quantized_mm(x, dense.weight, dense.scales, quantize, group)
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        assert float64_error(replayed, x, weight) <= 1, batch


@pytest.mark.gpu
def test_decode_rows_of_other_activations_are_one_error(monkeypatch):
    from sparsedecoding.kernels.quantized import DenseQuantized, dense_quantized_mm

    monkeypatch.setenv("SPARSEDECODING_DENSE_INT4", "sp24")
    codes = grid(64, 512, "int4", 128, seed=14)
    dense = DenseQuantized.from_codes(solvers.QuantizedCodes(codes.codes.cuda(), codes.scales.cuda(), "int4", 128))
    with pytest.raises(KernelInputError, match="takes bfloat16 activations"):
        dense_quantized_mm(torch.randn(2, 512, device="cuda").half(), dense.weight, dense.scales, "int4", 128)
