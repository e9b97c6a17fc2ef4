"""A slotted 16:32+2 weight in two launches (`sp24_split`: sp24 on the 2:4 part, then csrc/slots.cu adds the slots).
On CPU: the slots kernel's index arithmetic, emulated, gives the overflow's product in the tiled row order (odd
shapes, padded words and GLU order included); the GLU epilogue pairs the right tiles; the refusals. On GPU: the
slots kernel against float64 at batch 1-16 (one and several step ranges), the whole split product (GLU too) against
the whole weight."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from sparsedecoding.errors import KernelInputError
from sparsedecoding.kernels.overflow import split_overflow
from sparsedecoding.kernels.sp24 import glu_order, tile, tile_overflow
from sparsedecoding.kernels.sp24_split import check, emulated_slots_add, glu, slots_add, transposed, width
from sparsedecoding.patterns import SparsityPattern
from sparsedecoding.solvers import keep_mask


def capped_weight(out, in_features, dtype=torch.bfloat16, seed=0, device="cpu"):
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(out, in_features, generator=g)
    return (weight * keep_mask(weight.abs(), SparsityPattern.parse("16:32+2"))).to(dtype).to(device)


def overflow_of(weight):
    split = split_overflow(weight)
    return weight.double() - split.w24.to_dense().double().to(weight.device)


@pytest.mark.parametrize("out,in_features,glu_tiled", [(48, 512, False), (13, 320, False), (40, 96, False),
                                                       (64, 256, True), (96, 1024, True)])
@pytest.mark.parametrize("batch", [1, 5, 16])
def test_the_kernels_arithmetic_emulated_adds_the_overflow_in_tiled_rows(out, in_features, glu_tiled, batch):
    weight = capped_weight(out, in_features, seed=out + batch)
    w = tile_overflow(split_overflow(weight), glu=glu_tiled)
    over = overflow_of(weight)
    assert over.abs().sum() > 0  # the weights do hold slots
    x = torch.randn(batch, in_features).bfloat16()
    y = torch.randn(batch, out, dtype=torch.float64)
    order = glu_order(out) if glu_tiled else torch.arange(out)
    expected = y + (x.double() @ over.T)[:, order]
    assert torch.allclose(emulated_slots_add(y, x, w), expected, rtol=1e-12, atol=1e-12)


def test_glu_epilogue_pairs_gate_and_up_tiles():
    out, batch = 96, 3
    y = torch.randn(batch, out)
    tiled = y[:, glu_order(out)]
    gate, up = y.chunk(2, dim=1)
    assert torch.allclose(glu(tiled), F.silu(gate) * up, rtol=1e-6, atol=1e-6)


def test_x_is_transposed_and_padded_to_the_kernels_width():
    assert [width(b) for b in (1, 4, 5, 8, 9, 16)] == [4, 4, 8, 8, 16, 16]
    x = torch.randn(6, 64).bfloat16()
    xt = transposed(x)
    assert xt.shape == (64, 8) and xt.is_contiguous()
    assert torch.equal(xt[:, :6], x.t()) and not xt[:, 6:].any()


@pytest.mark.parametrize("out,in_features", [(4096, 4096), (28672, 4096), (4096, 14336), (128, 256), (40, 96)])
@pytest.mark.parametrize("batch", [1, 8, 16])
def test_step_ranges_fit_shared_memory_and_fill_the_gpu(out, in_features, batch):
    from types import SimpleNamespace

    from sparsedecoding.kernels.sp24_split import MAX_SMEM, ROWS_PER_CTA, splits

    steps, sms = -(-in_features // 256), 132
    count = splits(SimpleNamespace(shape=(out, in_features), steps=steps), batch, sms)
    per_split = -(-steps // count)
    assert 1 <= count <= steps
    assert per_split * 256 * 2 * width(batch) <= MAX_SMEM  # the staged range of xt fits
    ctas = -(-out // ROWS_PER_CTA) * -(-steps // per_split)
    assert ctas >= 2 * sms or count == steps  # two CTAs a multiprocessor, unless every step has its own already


def test_refusals_are_one_clear_error():
    weight = capped_weight(32, 256)
    w = tile_overflow(split_overflow(weight))
    x = torch.randn(2, 256).bfloat16()
    with pytest.raises(KernelInputError, match="no overflow slots"):
        check(torch.zeros(2, 32).bfloat16(), x, tile(split_overflow(weight).w24))
    with pytest.raises(KernelInputError, match=r"\[1..16, 256\]"):
        check(torch.zeros(17, 32).bfloat16(), torch.randn(17, 256).bfloat16(), w)
    with pytest.raises(KernelInputError, match="y has shape"):
        check(torch.zeros(2, 31).bfloat16(), x, w)
    with pytest.raises(KernelInputError, match="one 16-bit dtype"):
        check(torch.zeros(2, 32).half(), x, w)
    with pytest.raises(KernelInputError, match="one CUDA device"):
        slots_add(torch.zeros(2, 32).bfloat16(), x, w)


def _slots_error(result, y, x, over_tiled):
    """|result − (y + x·W_overᵀ)| over half an ulp of the exact sum plus an fp32 sum of the slots' products."""
    x64 = x.double().cpu()
    exact = y.double().cpu() + x64 @ over_tiled.T
    bound = (torch.finfo(x.dtype).eps / 2 * exact.abs() + 2 * x.shape[1] * 2.0**-24 * (x64.abs() @ over_tiled.abs().T)
             + 1e-300)
    return float(((result.double().cpu() - exact).abs() / bound).max())


@pytest.mark.gpu
@pytest.mark.parametrize("out,in_features", [(128, 256), (40, 96), (4096, 4096), (1000, 14336), (6144, 1024)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("glu_tiled", [False, True])
def test_slots_kernel_matches_float64(out, in_features, dtype, glu_tiled):
    if glu_tiled and out % 32:
        pytest.skip("a GLU weight has a multiple of 32 rows")
    weight = capped_weight(out, in_features, dtype, seed=out, device="cuda")
    w = tile_overflow(split_overflow(weight), glu=glu_tiled)
    order = glu_order(out) if glu_tiled else torch.arange(out)
    over_tiled = overflow_of(weight).cpu()[order]
    for batch in (1, 3, 4, 5, 8, 9, 16):
        x = torch.randn(batch, in_features, device="cuda").to(dtype)
        y = torch.randn(batch, out, device="cuda").to(dtype)
        result = slots_add(y, x, w)
        assert result.dtype == dtype and result.shape == (batch, out)
        assert _slots_error(result, y, x, over_tiled) <= 1, (out, in_features, batch)


@pytest.mark.gpu
@pytest.mark.parametrize("glu_tiled", [False, True])
def test_split_product_matches_the_whole_weight(glu_tiled):
    """sp24 on the 2:4 part rounds y once before the slots are added: the split's error stays within those two
    roundings (plus the GLU's), and far below what leaving the slots out costs, so a lost slot cannot pass."""
    from sparsedecoding.kernels.sp24 import sp24_linear
    from sparsedecoding.kernels.sp24_split import base, split_linear

    out, in_features = 1024, 2048
    weight = capped_weight(out, in_features, seed=11, device="cuda")
    w = tile_overflow(split_overflow(weight), glu=glu_tiled)
    order = glu_order(out).cuda() if glu_tiled else torch.arange(out, device="cuda")
    eps = torch.finfo(torch.bfloat16).eps
    for batch in (1, 9, 16):
        x = torch.randn(batch, in_features, device="cuda").bfloat16()
        exact = (x.double() @ weight.double().T)[:, order]  # the tiled rows, before any GLU
        without_slots = sp24_linear(x, base(w)).double()
        if glu_tiled:
            def act(y):
                pairs = y.view(batch, -1, 2, 16)
                return (F.silu(pairs[:, :, 0]) * pairs[:, :, 1]).reshape(batch, -1)
            exact, without_slots = act(exact), act(without_slots)
        y = split_linear(x, w).double()
        assert y.shape == exact.shape
        error = float((y - exact).abs().max())
        scale = float(exact.abs().max())
        assert error <= 4 * eps * scale, (batch, error, scale)  # a few bf16 roundings of the largest entry
        assert error * 10 < float((without_slots - exact).abs().max()), batch
