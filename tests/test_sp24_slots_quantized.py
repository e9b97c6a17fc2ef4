"""16:32+2 with quantized values on the sp24 kernel: a 16:32 `PackedNMQ` (int8 codes, or int4 codes with 128 columns
a scale) whose mask fits 16:32+2, split into a quantized 2:4 part and two slots a row and word (`overflow.
split_overflow_quantized`, `sp24.tile_overflow`). On CPU: the split and its inverse, the tiles read back through the
lane semantics against the packed weight, the kernel's slot arithmetic emulated with codes' steps (16 k-tiles, two
slot steps each), the linear's save / load / forward, and the refusals. On GPU: every launch shape and loop order,
plain, GLU and with the RMSNorm in front, against float64."""

from __future__ import annotations

import pytest
import torch

from sparsedecoding.engine.loading import random_quantized
from sparsedecoding.errors import KernelInputError, PackingError
from sparsedecoding.kernels.overflow import merge_overflow_quantized, split_overflow_quantized
from sparsedecoding.kernels.quantized import PackedNMQ
from sparsedecoding.kernels.quantized_linear import QuantizedPackedLinear
from sparsedecoding.kernels.sp24 import (slot_weights, tile_overflow, tiled_to_dense, untile_slots)
from sparsedecoding.kernels.sp24_linear import Sp24Linear, tileable
from sparsedecoding.patterns import SparsityPattern

from test_sp24_overflow import float64_error, stage


def quantized(out, in_features, quantize, pattern="16:32+2", group_size=128, seed=0, device="cpu"):
    generator = torch.Generator(device).manual_seed(seed)
    return random_quantized(out, in_features, SparsityPattern.parse(pattern), quantize, group_size, torch.bfloat16,
                            device, generator)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
@pytest.mark.parametrize("out,in_features", [(48, 512), (13, 640), (64, 256)])
def test_split_and_merge_keep_the_weight(quantize, out, in_features):
    packed = quantized(out, in_features, quantize, seed=out)
    split = split_overflow_quantized(packed)
    assert split.quantized and split.values.dtype == torch.int8 and (split.w24.n, split.w24.m) == (2, 4)
    assert torch.equal(split.to_dense(torch.bfloat16), packed.to_dense(torch.bfloat16))
    assert torch.equal(split.to_dense(), packed.to_dense())  # float32: code·scale exact
    merged = merge_overflow_quantized(split.w24, split.values, split.columns)
    assert (merged.n, merged.m, merged.quantize, merged.group_size) == (16, 32, quantize, packed.group_size)
    assert torch.equal(merged.to_dense(), packed.to_dense())
    # 2:4 codes and scales, the bitmask, and two slots of an int8 code and a column byte a row and word
    per_row = in_features // 2 * (1 if quantize == "int8" else 0.5) + packed.scales.shape[1] * 2 + in_features // 8
    assert split.nbytes() == out * per_row + out * in_features // 32 * 2 * 2


@pytest.mark.parametrize("quantize", ["int8", "int4"])
@pytest.mark.parametrize("glu", [False, True])
def test_tiles_read_back_to_the_packed_weight(quantize, glu):
    out, in_features = (64, 768) if glu else (40, 640)  # 640 and 768 columns: steps of codes padded
    packed = quantized(out, in_features, quantize, seed=3)
    w = tile_overflow(split_overflow_quantized(packed), glu)
    assert w.code == {"int8": 8, "int4": 4}[quantize] and w.over_v.dtype == torch.int8  # one byte a slot value
    # the slots hold codes, which the kernel multiplies by their scales in fp32: the weight exactly
    assert torch.equal(tiled_to_dense(w), packed.to_dense(torch.float64))
    codes, _ = untile_slots(w)
    split = split_overflow_quantized(packed)
    assert torch.equal(codes, split.values)
    weights, columns = slot_weights(w, torch.float64)
    assert weights.shape == columns.shape == (out, in_features // 32, 2)
    assert torch.equal(weights, split.slot_values().double())


def emulate_slots(w, out, rows, x_of, scale_of):
    """sp24.cu's OVER path with codes: a step of w.ks k-tiles holds w.ks / 8 slot steps, lane (g, t) of row tile r
    reading 8 bytes of int8 codes at over_v + (r·slot steps + slot step)·256 + 8·lane and 8 of offsets at over_o +
    (same)·256 + 8·lane; slot k's code times scale_of(row, group) (the row's 128-column group 2·(slot step) + k / 4,
    i.e. the slot step's half that slot k's word lies in) times x_of(slot step, j, k, offset k) (j = (t - g) % 4, the
    lane's first word) goes into row g + 8·((k / 2) % 2)."""
    values = w.over_v.view(-1)
    offsets = w.over_o.view(-1)
    slot_steps = w.steps * w.ks // 8
    y = torch.zeros(rows, -(-out // 16) * 16, dtype=torch.float64)
    for r in range(-(-out // 16)):
        for step in range(slot_steps):
            for lane in range(32):
                g, t = lane // 4, lane % 4
                base = r * slot_steps + step
                v = values[base * 256 + 8 * lane: base * 256 + 8 * lane + 8].double()
                o = offsets[base * 256 + 8 * lane: base * 256 + 8 * lane + 8].long()
                for k in range(8):
                    row = 16 * r + g + 8 * ((k >> 1) & 1)
                    scale = scale_of(row, 2 * step + (k >> 2))
                    y[:, row] += v[k] * scale * x_of(step, (t - g) & 3, k, int(o[k])).double()
    return y


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_the_kernels_slot_arithmetic_with_codes_gives_the_overflow(quantize):
    """The slots of a codes weight, read per slot step as the kernel does (two a step of codes), multiply the
    staged x into the overflow's product: times the row scale for int8 (applied with the rest of the sum), for int4
    times the scale of the group the lane's slots lie in, which the kernel picks from the step's scale words."""
    out, in_features, batch = 24, 640, 3
    packed = quantized(out, in_features, quantize, seed=11)
    split = split_overflow_quantized(packed)
    w = tile_overflow(split)
    x = torch.randn(batch, in_features).bfloat16()
    columns = w.steps * w.ks * 32
    staged = stage(torch.cat([x.float(), torch.zeros(batch, columns - in_features)], 1)).float()
    scales = packed.scales.double()
    if quantize == "int8":
        def scale_of(row, group):
            return 1.0
    else:
        def scale_of(row, group):
            return float(scales[row, group]) if row < out and group < scales.shape[1] else 0.0
    y = emulate_slots(w, out, batch, lambda step, j, k, o: staged[:, (64 * (8 * step + j + 4 * (k >> 2)) + o) // 2],
                      scale_of)[:, :out]
    if quantize == "int8":
        y = y * scales.view(1, out)
    over = tiled_to_dense(w) - split.w24.to_dense(torch.float64)
    assert torch.allclose(y, x.double() @ over.T, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_slotted_quantized_linear_saves_loads_and_computes_the_packed_one(quantize):
    packed = quantized(64, 512, quantize, seed=5)
    module = QuantizedPackedLinear(packed)
    assert tileable(module, require_cuda=False) is not None  # slots not asked for
    assert tileable(module, require_cuda=False, slots=True) is None
    tiled = Sp24Linear.from_module(module)
    assert tiled.slotted and (tiled.n, tiled.m, tiled.quantize) == (16, 32, quantize)
    back = tiled.packed
    assert (back.n, back.m) == (16, 32) and torch.equal(back.to_dense(), packed.to_dense())
    state = tiled.state_dict()
    assert set(state) == {"codes", "scales", "bitmask"}
    fresh = Sp24Linear.from_module(QuantizedPackedLinear(quantized(64, 512, quantize, seed=6)))
    fresh.load_state_dict(state)
    assert torch.equal(fresh.packed.to_dense(), packed.to_dense())
    x = torch.randn(3, 512).bfloat16()
    torch.testing.assert_close(tiled(x), module(x), rtol=1e-2, atol=1e-2)
    assert f"pattern=16:32+2 (2:4 tiles + 2 overflow slots a word), {quantize}" in repr(tiled)


def test_refusals_are_one_clear_error():
    packed = quantized(32, 512, "int4", group_size=64)
    reason = tileable(QuantizedPackedLinear(packed), require_cuda=False, slots=True)
    assert "group size 64" in reason and "128" in reason
    with pytest.raises(KernelInputError, match="int4 group size 64: overflow slots with int4 codes run 128"):
        tile_overflow(split_overflow_quantized(packed))
    plain = quantized(32, 512, "int8", pattern="16:32", seed=1)
    assert "beyond 16:32+2" in tileable(QuantizedPackedLinear(plain), require_cuda=False, slots=True)
    with pytest.raises(PackingError, match="words keep more than 2 weights beyond two"):
        split_overflow_quantized(plain)
    with pytest.raises(PackingError, match="split a 16:32 weight; this one is 2:4"):
        split_overflow_quantized(quantized(32, 512, "int8", pattern="2:4"))


@pytest.mark.gpu
@pytest.mark.parametrize("loop", ["rows", "slots", "columns"])
@pytest.mark.parametrize("quantize", ["int8", "int4"])
@pytest.mark.parametrize("out,in_features", [(128, 512), (40, 640), (4096, 4096), (1000, 14336)])
def test_kernel_with_codes_and_slots_matches_float64(out, in_features, quantize, loop, monkeypatch):
    from helpers import sp24_outputs
    from sparsedecoding.kernels.op import SP24_OVER_LOOP_SETTING

    monkeypatch.setenv(SP24_OVER_LOOP_SETTING, loop)
    w = tile_overflow(split_overflow_quantized(quantized(out, in_features, quantize, seed=out, device="cuda")))
    weight = tiled_to_dense(w)
    for batch, splits, slices, x, y in sp24_outputs(w, in_features, torch.bfloat16):
        assert float64_error(y, x, weight) <= 1, (out, in_features, batch, splits, slices)


@pytest.mark.gpu
@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_glu_and_norm_with_codes_and_slots_match_float64(quantize):
    """The tuned launches (each checked against float64 inside `tuned_launch`: a mismatch raises) with GLU and with
    the RMSNorm in front, at batches across the loop orders' ranges."""
    from sparsedecoding.kernels.sp24 import sp24_linear, sp24_norm_linear

    packed = quantized(512, 1024, quantize, seed=7, device="cuda")
    for glu in (False, True):
        w = tile_overflow(split_overflow_quantized(packed), glu=glu)
        norm_weight = torch.rand(1024, device="cuda").bfloat16() + 0.5
        for batch in (1, 3, 6, 11, 16):
            x = torch.randn(batch, 1024, device="cuda").bfloat16()
            res = torch.randn(batch, 1024, device="cuda").bfloat16()
            sp24_linear(x, w)
            sp24_norm_linear(x, w, res, norm_weight, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_dense_expansion_with_codes_and_slots(quantize):
    from sparsedecoding.kernels.sp24 import to_dense

    packed = quantized(1000, 1536, quantize, seed=2, device="cuda")
    w = tile_overflow(split_overflow_quantized(packed))
    assert torch.equal(to_dense(w), packed.to_dense(torch.bfloat16))


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_a_quantized_16of32p2_model_tiles_with_slots_and_computes_the_packed_one(quantize):
    """The engine's swap (`tile_model` with slots and GLU) takes every quantized 16:32+2 linear; the MLPs compute
    what the packed ones do, and the state dict is the packed one."""
    from sparsedecoding.engine.loading import build_model, random_state, weight_format
    from sparsedecoding.kernels.sp24_linear import tile_model
    from test_sp24_slots import LINEARS, SMALL

    def model():
        state = random_state(SMALL, SparsityPattern.parse("16:32+2"), device="cpu", seed=4, quantize=quantize)
        return build_model(SMALL, state)

    packed, tiled = model(), model()
    assert tile_model(tiled, require_cuda=False, glu=True) == 0  # slots not asked for: 16:32 stays packed
    assert tile_model(tiled, require_cuda=False, glu=True, slots=True) == LINEARS
    modules = [m for m in tiled.modules() if isinstance(m, Sp24Linear)]
    assert all(m.slotted and m.quantize == quantize for m in modules)
    label = f"16:32+2 {quantize}" + (" g128" if quantize == "int4" else "") + " (2:4 tiles + overflow slots)"
    assert weight_format(modules[0]) == label
    before, after = packed.state_dict(), tiled.state_dict()
    assert before.keys() == after.keys()
    for key in before:
        if key.endswith(".codes"):
            stem = key[:-len("codes")]
            shape = (after[stem + "bitmask"].shape[0], after[stem + "bitmask"].shape[1] * 32)
            group = shape[1] if quantize == "int8" else 128
            dense = [PackedNMQ(s[stem + "codes"], s[stem + "scales"], s[stem + "bitmask"], 16, 32, shape, quantize,
                               group).to_dense() for s in (before, after)]
            assert torch.equal(*dense), key
    x = torch.randn(3, SMALL.dim).bfloat16()
    for layer in range(SMALL.n_layers):
        torch.testing.assert_close(tiled.layers[layer].mlp(x), packed.layers[layer].mlp(x), rtol=2e-2, atol=2e-2)


def test_the_engine_warns_about_quantized_16of32_left_on_the_scan_kernel(monkeypatch, caplog):
    """A quantized model with plain 16:32 masks stays on the packed scan kernel (slower than dense from batch 4), and
    the engine's build says so once, with the way out; capped to 16:32+2 every linear is tiled and nothing is
    said."""
    import logging

    import sparsedecoding.kernels.sp24_linear as sl
    from sparsedecoding.engine.loading import build_model, random_state
    from test_sp24_slots import LINEARS, SMALL

    monkeypatch.setattr(sl, "sp24_problem", lambda: None)
    monkeypatch.setattr(sl, "_load_columns_build", lambda wanted: None)
    monkeypatch.setattr(sl, "_on_cuda", lambda module: True)  # as if the model were on a GPU
    original = sl.tileable
    monkeypatch.setattr(sl, "tileable", lambda module, require_cuda=True, slots=False: original(module, False, slots))
    monkeypatch.setenv("SPARSEDECODING_KERNEL", "auto")
    monkeypatch.delenv("SPARSEDECODING_SP24_SLOTS", raising=False)
    for pattern, tiled, warned in (("16:32", 0, True), ("16:32+2", LINEARS, False)):
        state = random_state(SMALL, SparsityPattern.parse(pattern), device="cpu", seed=1, quantize="int8")
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger=sl.log.name):
            model = build_model(SMALL, state)  # the engine's build tiles (`tile_for_kernel`)
        assert sum(isinstance(m, Sp24Linear) for m in model.modules()) == tiled
        messages = [r.getMessage() for r in caplog.records if "packed scan kernel" in r.getMessage()]
        assert messages == ([f"{LINEARS} quantized 16:32 linears stay on the packed scan kernel, which decodes slower "
                             "than dense bf16 from batch 4; pruned with --pattern 16:32+2 (and "
                             "SPARSEDECODING_SP24_SLOTS=1) they run on the 2:4 sparse tensor-core kernel"]
                            if warned else [])
    monkeypatch.undo()  # on the CPU (no kernel), nothing is said
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=sl.log.name):
        build_model(SMALL, random_state(SMALL, SparsityPattern.parse("16:32"), device="cpu", seed=1, quantize="int8"))
    assert not [r for r in caplog.records if "packed scan kernel" in r.getMessage()]
