"""int8 and int4 codes in steps of 8 k-tiles on the sp24 kernel (SPARSEDECODING_SP24_INT8_STEP / _INT4_STEP = 8, the
builds with SP24_INT8_KS / SP24_INT4_KS = 8), on the GPU: the kernel against float64 (every launch; int4 at group
sizes 64-1024), the RMSNorm in front and GLU bit for bit the products of steps of 16 with one split and one slice,
slots in each loop order, the dense expansion. The CPU tests are in test_sp24_code_steps.py."""

from __future__ import annotations

import pytest
import torch

from sparsedecoding.kernels.overflow import split_overflow_quantized
from sparsedecoding.kernels.sp24 import tile, tiled_to_dense

from helpers import coded_24, slotted_codes, sp24_outputs, tile_overflow_step
from test_cuda_mma_codes import float64_error

pytestmark = pytest.mark.gpu


def _tile(packed, glu, step):
    return tile(packed, glu, **{f"{packed.quantize}_step": step})


@pytest.mark.parametrize("quantize,out,in_features,group_size", [
    ("int8", 40, 96, 0), ("int8", 1000, 1536, 0), ("int8", 1024, 4096, 0), ("int8", 6144, 4096, 0),
    ("int8", 4096, 14336, 0), ("int4", 40, 128, 64), ("int4", 1000, 1536, 128), ("int4", 1024, 4096, 32),
    ("int4", 6144, 4096, 128), ("int4", 4096, 14336, 256), ("int4", 256, 2048, 512), ("int4", 256, 2048, 1024)])
def test_kernel_in_steps_of_8_matches_float64(quantize, out, in_features, group_size):
    packed = coded_24(quantize, out, in_features, group_size, seed=5, device="cuda")
    weight = packed.to_dense(torch.float64)
    w = _tile(packed, False, 8)
    assert w.ks == 8
    for batch, splits, slices, x, y in sp24_outputs(w, in_features, torch.bfloat16):
        assert float64_error(y, x, weight) <= 1, (quantize, out, in_features, group_size, batch, splits, slices)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
@pytest.mark.parametrize("glu", [False, True])
def test_norm_and_glu_in_steps_of_8_give_the_steps_of_16_bit_for_bit(quantize, glu):
    """With one split and one slice one warp sums the same k-tiles in the same order (int4: each group's sum scaled
    alike), so steps of 8 and 16 agree bit for bit; against float64 both must hold."""
    from sparsedecoding.kernels.sp24 import GluReference, NormReference, Sp24Launch, sp24_norm_linear

    out, in_features = (2 * 8960, 1536) if glu else (2048, 1536)
    packed = coded_24(quantize, out, in_features, seed=13, device="cuda")
    weight = packed.to_dense(torch.float64)
    w8, w16 = _tile(packed, glu, 8), _tile(packed, glu, 16)
    norm_weight = (1 + torch.randn(in_features, device="cuda") / 4).bfloat16()
    for batch in (1, 4, 9, 16):
        x = torch.randn(batch, in_features, device="cuda").bfloat16()
        res = torch.randn(batch, in_features, device="cuda").bfloat16()
        reference = NormReference(x, res, norm_weight, 1e-6, out, lambda r0, r1: weight[r0:r1].double())
        if glu:
            reference = GluReference(reference, torch.bfloat16)
        y8, s8 = Sp24Launch(x, w8, 1, 1, norm=True)(x, w8, res, norm_weight, 1e-6)
        y16, s16 = Sp24Launch(x, w16, 1, 1, norm=True)(x, w16, res, norm_weight, 1e-6)
        assert torch.equal(y8, y16) and torch.equal(s8, s16), (quantize, glu, batch)
        y, _ = sp24_norm_linear(x, w8, res, norm_weight, 1e-6)  # the tuner's choice, checked inside against float64
        assert reference.error(y) <= 1 and reference.error(y8) <= 1, (quantize, glu, batch)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
@pytest.mark.parametrize("loop", ["rows", "slots", "columns"])
def test_slots_in_steps_of_8_match_float64(quantize, loop, monkeypatch):
    from sparsedecoding.kernels.op import SP24_OVER_LOOP_SETTING
    from sparsedecoding.kernels.sp24 import to_dense

    monkeypatch.setenv(SP24_OVER_LOOP_SETTING, loop)
    for out, in_features in ((40, 640), (1000, 4096), (2048, 1536)):
        slotted = slotted_codes(quantize, out, in_features, seed=out, device="cuda")
        w = tile_overflow_step(split_overflow_quantized(slotted), False, 8, quantize)
        assert w.ks == 8
        weight = tiled_to_dense(w)
        for batch, splits, slices, x, y in sp24_outputs(w, in_features, torch.bfloat16):
            assert float64_error(y, x, weight) <= 1, (quantize, loop, out, in_features, batch, splits, slices)
        if loop == "rows":
            assert torch.equal(to_dense(w), slotted.to_dense(torch.bfloat16))


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_dense_expansion_in_steps_of_8(quantize):
    from sparsedecoding.kernels.sp24 import to_dense

    for out, in_features in ((40, 128), (1000, 1536), (4096, 4096)):
        packed = coded_24(quantize, out, in_features, seed=8, device="cuda")
        assert torch.equal(to_dense(_tile(packed, False, 8)), packed.to_dense(torch.bfloat16))
