"""16:32+2 linears in the engine: a 16:32 `PackedLinear` whose mask fits 16:32+2 becomes a slotted `Sp24Linear`
(its 2:4 part plus two overflow slots a row and word). On CPU: the slotted model computes what the packed one does,
saves and loads the 16:32 packed state dict, counts the slots' bytes, goes back to packed modules, and refuses masks
beyond the cap in one line; the engine's setting decides; random 16:32+2 weights fit their pattern. On GPU: the
kernel with the RMSNorm in front and slots together against float64."""

from __future__ import annotations

import pytest
import torch

from sparsedecoding.engine.config import ModelArgs
from sparsedecoding.errors import PackingError
from sparsedecoding.engine.loading import build_model, random_packed, random_state, weight_bytes, weight_format
from sparsedecoding.kernels import PackedLinear, PackedNM
from sparsedecoding.kernels.overflow import split_overflow, words_over_cap
from sparsedecoding.kernels.sp24_linear import Sp24Linear, tile_for_kernel, tile_model, untile_model
from sparsedecoding.patterns import SparsityPattern

# every in_features a multiple of 256 and out_features of 16: no padding in the tiled layout
SMALL = ModelArgs(architecture="llama", vocab_size=96, dim=512, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=64,
                  intermediate_size=1024, norm_eps=1e-5, rope_theta=10000.0)
LINEARS = 2 * 4


def _model(pattern="16:32+2", seed=0):
    return build_model(SMALL, random_state(SMALL, SparsityPattern.parse(pattern), device="cpu", seed=seed))


def _assert_same_weights(expected: dict, state: dict):
    """Equal state dicts, except that a packed linear's mask may place a kept weight of value zero elsewhere in its
    word (the tiles record nonzeros only: random bf16 weights hold a few exact zeros): its dense weight is equal."""
    assert expected.keys() == state.keys()
    for key, value in state.items():
        if key.endswith(".values"):
            stem = key[:-len("values")]
            shape = (value.shape[0], state[stem + "bitmask"].shape[1] * 32)
            dense = [PackedNM(s[stem + "values"], s[stem + "bitmask"], 16, 32, shape).to_dense() for s in (expected,
                                                                                                           state)]
            assert torch.equal(*dense), key
        elif not key.endswith(".bitmask"):
            assert torch.equal(expected[key], value), key


@pytest.mark.parametrize("overflow", [0, 1, 2, 8])
def test_random_weights_of_an_overflow_pattern_fit_it(overflow):
    generator = torch.Generator().manual_seed(overflow)
    pattern = SparsityPattern.parse(f"16:32+{overflow}")
    weight = random_packed(64, 1024, pattern, torch.bfloat16, "cpu", generator).to_dense()
    fours = (weight != 0).view(64, 256, 4).sum(-1)
    assert ((weight != 0).view(64, 32, 32).sum(-1) == 16).all()
    assert words_over_cap(weight, overflow) == 0
    if overflow == 0:  # 16:32+0 is the 2:4 mask
        assert (fours == 2).all()
    else:  # the pool uses its freedom (a pool of 2:4 words would pass the cap too): some words need all of K, or,
        # for the plain 16:32 mask (K = 8), more than the two slots the kernel holds
        assert words_over_cap(weight, overflow - 1 if overflow < 8 else 2) > 0


def test_words_over_cap_counts_what_split_overflow_refuses():
    """Words built by hand: kept weights beyond two in their groups of four, 3 / 2 in row 0's words, 3 / 2 in row
    1's; only the words beyond the cap count, and split_overflow refuses with that count."""
    weight = torch.zeros(2, 64, dtype=torch.bfloat16)
    for row, groups in ((0, {0: 4, 1: 3, 8: 4}), (1, {0: 3, 1: 3, 2: 3, 8: 3, 9: 3})):
        for group, kept in groups.items():
            weight[row, 4 * group:4 * group + kept] = 1.0
    assert [words_over_cap(weight, slots) for slots in (1, 2, 3)] == [4, 2, 0]
    with pytest.raises(PackingError, match="^2 words keep more than 2 weights beyond two"):
        split_overflow(weight, 2)
    assert split_overflow(weight, 3).slots == 3
    generator = torch.Generator().manual_seed(0)
    weight = random_packed(32, 512, SparsityPattern.parse("16:32"), torch.bfloat16, "cpu", generator).to_dense()
    assert 0 < words_over_cap(weight, 2) < 32 * 16  # random 16:32 masks do not fit 16:32+2


def test_slotted_model_matches_packed_state_output_and_bytes():
    packed = _model()
    tiled = _model()
    before = {k: v.clone() for k, v in tiled.state_dict().items()}
    assert tile_model(tiled, require_cuda=False) == 0  # slots not asked for: 16:32 stays packed
    assert tile_model(tiled, require_cuda=False, slots=True) == LINEARS
    modules = [m for m in tiled.modules() if isinstance(m, Sp24Linear)]
    assert len(modules) == LINEARS and all(m.slotted and (m.n, m.m) == (16, 32) for m in modules)
    assert weight_format(modules[0]) == "16:32+2 (2:4 tiles + overflow slots)"
    _assert_same_weights(before, tiled.state_dict())
    # the 2:4 tiles hold the packed format's bytes; each row and word adds two slots of a bf16 value and a byte
    slot_bytes = sum(m.rows * m.in_features // 32 * 2 * 3 for m in modules)
    assert weight_bytes(tiled) == weight_bytes(packed) + slot_bytes
    for name, module in packed.named_modules():
        if isinstance(module, PackedLinear):
            inputs = torch.randn(3, module.in_features).bfloat16()
            torch.testing.assert_close(tiled.get_submodule(name)(inputs), module(inputs), rtol=1e-2, atol=1e-2)
    assert "pattern=16:32+2 (2:4 tiles + 2 overflow slots a word)" in repr(modules[0])
    assert untile_model(tiled) == LINEARS
    assert all(isinstance(m, PackedLinear) and (m.n, m.m) == (16, 32) for name, m in tiled.named_modules()
               if name.endswith(("qkv", ".out", "gate_up", "down")))
    _assert_same_weights(before, tiled.state_dict())


def test_slotted_glu_mlps_compute_the_packed_mlps():
    packed = _model()
    fused = _model()
    assert tile_model(fused, require_cuda=False, glu=True, slots=True) == LINEARS
    gate_ups = [m for name, m in fused.named_modules() if name.endswith("mlp.gate_up")]
    assert all(m.glu and m.slotted and m.out_features == SMALL.intermediate_size for m in gate_ups)
    _assert_same_weights(packed.state_dict(), fused.state_dict())
    x = torch.randn(3, SMALL.dim).bfloat16()
    for layer in range(SMALL.n_layers):
        torch.testing.assert_close(fused.layers[layer].mlp(x), packed.layers[layer].mlp(x), rtol=2e-2, atol=2e-2)


def test_slotted_model_loads_a_packed_state_dict_and_refuses_one_beyond_the_cap():
    source = _model(seed=1)
    target = _model(seed=0)
    tile_model(target, require_cuda=False, glu=True, slots=True)
    target.load_state_dict(source.state_dict())
    _assert_same_weights(source.state_dict(), target.state_dict())
    x = torch.randn(2, SMALL.dim).bfloat16()
    torch.testing.assert_close(target.layers[1].mlp(x), source.layers[1].mlp(x), rtol=2e-2, atol=2e-2)
    plain = _model("16:32", seed=2).state_dict()
    with pytest.raises(RuntimeError, match="words keep more than 2 weights beyond two in their groups of four"):
        target.load_state_dict(plain)


def test_a_kept_zero_saves_as_the_same_weight():
    """The tiles record nonzeros only: a kept weight of value zero comes back as `pack_nm` places it, and the saved
    16:32 weight is the same dense weight."""
    model = _model()
    linear = model.layers[0].attention.out
    values = linear.values.clone()
    values[0, 0] = 0  # the first kept weight of row 0 (its word's first kept column)
    linear.values.copy_(values)
    dense = linear.packed.to_dense()
    tile_model(model, require_cuda=False, slots=True)
    saved = model.layers[0].attention.out.packed
    assert (saved.n, saved.m) == (16, 32) and torch.equal(saved.to_dense(), dense)


def test_the_slots_setting_decides_whether_the_engine_tiles_16of32(monkeypatch):
    """Unset and "1" tile every 16:32 linear whose mask fits 16:32+2, "0" none; plain 16:32 masks never; anything
    else is refused by name."""
    import sparsedecoding.kernels.sp24_linear as sl
    from sparsedecoding.kernels.op import KernelChoiceError

    monkeypatch.setattr(sl, "sp24_problem", lambda: None)
    builds = []
    monkeypatch.setattr(sl, "_load_columns_build", lambda wanted: builds.append(wanted))
    original = sl.tileable
    monkeypatch.setattr(sl, "tileable", lambda module, require_cuda=True, slots=False: original(module, False, slots))
    monkeypatch.setenv("SPARSEDECODING_KERNEL", "auto")
    for setting, slotted in (("", LINEARS), ("1", LINEARS), ("0", 0)):
        monkeypatch.setenv("SPARSEDECODING_SP24_SLOTS", setting)
        builds.clear()
        assert sum(isinstance(m, Sp24Linear) and m.slotted for m in _model().modules()) == slotted
        # the columns build comes with slotted linears, at load: bf16 values name the default step sizes
        assert builds == ([{(16, 16)}] if slotted else [])
        assert not any(isinstance(m, Sp24Linear) for m in _model("16:32").modules())
    monkeypatch.setenv("SPARSEDECODING_SP24_SLOTS", "yes")
    with pytest.raises(KernelChoiceError, match="SPARSEDECODING_SP24_SLOTS='yes'"):
        tile_for_kernel(_model())


def test_a_failed_columns_build_is_one_engine_error_at_load(monkeypatch):
    import sparsedecoding.kernels.sp24 as sp24
    from sparsedecoding.errors import EngineError
    from sparsedecoding.kernels import cuda_mma
    from sparsedecoding.kernels.op import SP24_OVER_LOOP_SETTING
    from sparsedecoding.kernels.sp24_linear import _load_columns_build

    def fail(columns=False, int8_ks=16, int4_ks=16):
        raise cuda_mma.CudaKernelUnavailableError("nvcc failed")

    monkeypatch.setattr(sp24, "_load", fail)
    for setting in ("", "auto", "columns", "mma"):
        monkeypatch.setenv(SP24_OVER_LOOP_SETTING, setting)
        with pytest.raises(EngineError, match="nvcc failed.*SPARSEDECODING_SP24_OVER_LOOP=rows"):
            _load_columns_build({(16, 16)})
    for setting in ("rows", "slots"):  # orders of the default build: nothing more to build
        monkeypatch.setenv(SP24_OVER_LOOP_SETTING, setting)
        _load_columns_build({(16, 16)})


@pytest.mark.gpu
@pytest.mark.parametrize("loop", ["rows", "slots", "columns", "mma"])
@pytest.mark.parametrize("glu", [False, True])
@pytest.mark.parametrize("out,in_features", [(256, 512), (4096, 4096), (1024, 14336)])
def test_norm_in_front_with_slots_matches_float64(out, in_features, glu, loop, monkeypatch):
    """sp24.cu's NORM and OVER together: every candidate launch the tuner tries at batch 1-16 is checked against
    `NormReference` over the whole 16:32+2 weight (and `GluReference` for a gate|up weight), and its residual sums
    against torch's, inside `tuned_launch`; the fresh launches are checked here once more."""
    from sparsedecoding.kernels.op import SP24_OVER_LOOP_SETTING
    from sparsedecoding.kernels.sp24 import _reference, sp24_norm_linear, tile_overflow

    monkeypatch.setenv(SP24_OVER_LOOP_SETTING, loop)
    generator = torch.Generator(device="cuda").manual_seed(out)
    weight = random_packed(out, in_features, SparsityPattern.parse("16:32+2"), torch.bfloat16, "cuda",
                           generator).to_dense()
    w = tile_overflow(split_overflow(weight), glu)
    norm_weight = (torch.rand(in_features, device="cuda", generator=generator) + 0.5).bfloat16()
    for batch in (1, 2, 5, 8, 9, 16):
        x = torch.randn(batch, in_features, device="cuda", generator=generator).bfloat16()
        res = torch.randn(batch, in_features, device="cuda", generator=generator).bfloat16()
        y, total = sp24_norm_linear(x, w, res, norm_weight, 1e-5)
        reference = _reference(x, w, (res, norm_weight, 1e-5))
        assert reference.error(y) <= 1, (out, in_features, batch)
        assert torch.equal(total, (x.float() + res.float()).bfloat16())


def test_slotted_blocks_with_fusions_give_the_packed_models_logits():
    """The whole model, slotted linears with the GLU epilogue and fused norms (the engine's defaults), against the
    packed 16:32 model on CPU: the same logits up to the order of bf16 roundings in the MLP."""
    from sparsedecoding.kernels.sp24_linear import fuse_norms

    packed = _model()
    slotted = _model()
    assert tile_model(slotted, require_cuda=False, glu=True, slots=True) == LINEARS
    assert fuse_norms(slotted) == SMALL.n_layers
    tokens = torch.randint(0, SMALL.vocab_size, (2, 5))
    for model in (packed, slotted):
        model.setup_caches(2, 16)
    positions = torch.arange(5)
    torch.testing.assert_close(slotted(tokens, positions).float(), packed(tokens, positions).float(), rtol=0.05,
                               atol=0.05)
