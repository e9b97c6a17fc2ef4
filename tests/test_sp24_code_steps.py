"""int8 and int4 codes in steps of 8 k-tiles on the sp24 kernel (SPARSEDECODING_SP24_INT8_STEP / _INT4_STEP = 8,
sp24.cu's SP24_INT8_KS / SP24_INT4_KS = 8): twice the steps a row tile, half the 16-byte loads a lane and step. On
CPU: the tiled values' (and int4 scales') bytes are those of steps of 16 (only the metadata is laid out per step), the
tiles read back to the packed weight (plain, GLU, with overflow slots; int4 at group sizes 32-1024), `untile` inverts
them, slotted weights take steps of 8 by default and plain ones 16, the weight names the build that runs it, dense
weights keep 16, and a bad setting is one error. The GPU tests are in test_sp24_code_steps_gpu.py."""

from __future__ import annotations

import pytest
import torch

from sparsedecoding.kernels.overflow import split_overflow_quantized
from sparsedecoding.kernels.sp24 import tile, tile_overflow, tiled_to_dense, untile

from helpers import coded_24, fake_sp24_libraries, slotted_codes, tile_overflow_step

SHAPES = [("int8", 16, 256, 0), ("int8", 40, 96, 0), ("int8", 128, 544, 0), ("int8", 24, 1024, 0),
          ("int8", 48, 1536, 0), ("int4", 16, 256, 128), ("int4", 40, 128, 64), ("int4", 128, 544, 32),
          ("int4", 24, 1024, 256), ("int4", 48, 1536, 512), ("int4", 32, 2048, 1024)]


def _int8(out, in_features, seed=0):
    return coded_24("int8", out, in_features, seed=seed)


@pytest.mark.parametrize("quantize,out,in_features,group_size", SHAPES)
def test_steps_of_8_read_back_and_keep_the_values_bytes(quantize, out, in_features, group_size):
    packed = coded_24(quantize, out, in_features, group_size, seed=out)
    step = f"{quantize}_step"
    w8, w16 = tile(packed, **{step: 8}), tile(packed, **{step: 16})
    builds = (w8.build_ks, w16.build_ks) if quantize == "int8" else (w8.build_int4_ks, w16.build_int4_ks)
    assert (w8.ks, w16.ks) == builds == (8, 16)
    assert w8.steps == -(-(in_features // 32) // 8)
    assert torch.equal(tiled_to_dense(w8), packed.to_dense(torch.float64))
    back = untile(w8)
    assert all(torch.equal(getattr(back, f), getattr(packed, f)) for f in ("codes", "scales", "bitmask"))
    assert (back.shape, back.quantize, back.group_size) == (packed.shape, packed.quantize, packed.group_size)
    if (in_features // 32) % 16 == 0:  # no step padding either way: a step's loads follow the last step's
        assert torch.equal(w8.a, w16.a) and not torch.equal(w8.meta, w16.meta)
        assert quantize == "int8" or torch.equal(w8.scales, w16.scales)


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_glu_and_slots_in_steps_of_8_read_back(quantize):
    packed = coded_24(quantize, 64, 768, seed=3)
    w = tile(packed, glu=True, **{f"{quantize}_step": 8})
    assert w.ks == 8 and w.glu and torch.equal(tiled_to_dense(w), packed.to_dense(torch.float64))
    assert torch.equal(untile(w).codes, packed.codes)
    for (out, in_features), glu in (((40, 640), False), ((64, 768), True)):
        slotted = slotted_codes(quantize, out, in_features, seed=out)
        w = tile_overflow_step(split_overflow_quantized(slotted), glu, 8, quantize)
        assert w.ks == 8 and torch.equal(tiled_to_dense(w), slotted.to_dense(torch.float64))


@pytest.mark.parametrize("quantize", ["int8", "int4"])
@pytest.mark.parametrize("setting", [None, "auto", "16", "8"])
def test_by_default_slotted_weights_take_steps_of_8_and_plain_ones_16(monkeypatch, quantize, setting):
    name = f"SPARSEDECODING_SP24_{quantize.upper()}_STEP"
    if setting is None:
        monkeypatch.delenv(name, raising=False)
    else:
        monkeypatch.setenv(name, setting)
    forced = None if setting in (None, "auto") else int(setting)
    slotted = tile_overflow(split_overflow_quantized(slotted_codes(quantize, 32, 1024, seed=1)))
    plain = tile(coded_24(quantize, 32, 1024))
    assert (slotted.ks, plain.ks) == ((8, 16) if forced is None else (forced, forced))
    builds = [(w.build_ks, w.build_int4_ks) for w in (plain, slotted)]
    assert builds == ([(plain.ks, 16), (slotted.ks, 16)] if quantize == "int8" else [(16, plain.ks), (16, slotted.ks)])


def test_other_values_and_dense_weights_keep_their_steps(monkeypatch):
    from sparsedecoding.kernels.sp24 import STEP_TILES, tile_dense

    monkeypatch.setenv("SPARSEDECODING_SP24_INT8_STEP", "8")
    monkeypatch.setenv("SPARSEDECODING_SP24_INT4_STEP", "8")
    assert tile(_int8(32, 512)).ks == 8
    int4 = coded_24("int4", 32, 512)
    assert tile(int4).ks == 8 and tile(int4).build_ks == STEP_TILES[8]
    assert tile(_int8(32, 512)).build_int4_ks == STEP_TILES[4]
    codes = torch.randint(-127, 128, (32, 256), dtype=torch.int8)
    dense = tile_dense(codes, torch.ones(32, dtype=torch.bfloat16), "int8", 256)
    assert dense.ks == STEP_TILES[8] and dense.build_ks == STEP_TILES[8]
    codes4 = torch.randint(-8, 8, (32, 256), dtype=torch.int8)
    dense4 = tile_dense(codes4, torch.ones(32, 2, dtype=torch.bfloat16), "int4", 128)
    assert dense4.ks == STEP_TILES[4] and dense4.build_int4_ks == STEP_TILES[4]


@pytest.mark.parametrize("quantize", ["int8", "int4"])
def test_the_weight_picks_its_build_and_a_bad_setting_is_one_error(monkeypatch, quantize):
    import sparsedecoding.kernels.sp24 as sp24
    from sparsedecoding.errors import KernelInputError
    from sparsedecoding.kernels.op import KernelChoiceError, settings

    built = fake_sp24_libraries(monkeypatch)
    monkeypatch.delenv("SPARSEDECODING_SP24_HALF_META", raising=False)
    step, ks, define = f"{quantize}_step", f"{quantize}_ks", f"-DSP24_{quantize.upper()}_KS=8"
    packed = coded_24(quantize, 32, 1024)
    w8, w16 = tile(packed, **{step: 8}), tile(packed, **{step: 16})
    default = sp24._load()
    eight = sp24._load(**{ks: w8.build_ks if quantize == "int8" else w8.build_int4_ks})
    assert eight is not default and sp24._load(**{ks: 8}) is eight
    sp24._load(columns=True, **{ks: 8})
    assert built == [(), (define,), ("-DSP24_COLUMNS", define)]
    x = torch.zeros(1, 1024, dtype=torch.bfloat16)
    assert sp24.problem_key(x, w8) != sp24.problem_key(x, w16)
    assert sp24.min_splits(w8, 16) >= sp24.min_splits(w16, 16)
    with pytest.raises(KernelInputError, match=f"{step} = 4"):
        tile(packed, **{step: 4})
    monkeypatch.setenv(f"SPARSEDECODING_SP24_{quantize.upper()}_STEP", "32")
    with pytest.raises(KernelChoiceError, match=f"SPARSEDECODING_SP24_{quantize.upper()}_STEP='32'"):
        settings()
