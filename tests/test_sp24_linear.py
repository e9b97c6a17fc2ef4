"""`Sp24Linear` and the engine's tiling of 2:4 linears (`tile_model`, `tile_for_kernel`): on CPU, a tiled model
computes what the packed one does, saves the same state dict, counts the same weight bytes and goes back to packed
modules; the kernel setting decides whether the engine tiles; on GPU, the engine's tiled 2:4 model (bf16, int8,
int4) decodes the same logits as its packed twin within the kernels' rounding."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from sparsedecoding.engine.config import ModelArgs
from sparsedecoding.errors import KernelInputError
from sparsedecoding.engine.loading import build_model, keep_dense_copies, random_state, weight_bytes
from sparsedecoding.kernels import PackedLinear
from sparsedecoding.kernels.op import SETTINGS
from sparsedecoding.kernels.quantized_linear import QuantizedPackedLinear
from sparsedecoding.kernels.sp24_linear import Sp24Linear, tile_for_kernel, tile_model, tileable, untile_model
from sparsedecoding.patterns import SparsityPattern

TINY = ModelArgs(architecture="llama", vocab_size=96, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, head_dim=16,
                 intermediate_size=96, norm_eps=1e-5, rope_theta=10000.0)
# every in_features a multiple of 512 and out_features of 16: no padding in the tiled layout
SMALL = ModelArgs(architecture="llama", vocab_size=96, dim=512, n_layers=2, n_heads=8, n_kv_heads=2, head_dim=64,
                  intermediate_size=1024, norm_eps=1e-5, rope_theta=10000.0)
KINDS = [(None, 128), ("int8", 128), ("int4", 32)]


def _model(quantize, group_size, device="cpu", pattern="2:4", args=SMALL):
    state = random_state(args, SparsityPattern.parse(pattern), device=device, quantize=quantize, group_size=group_size)
    return build_model(args, state)


@pytest.mark.parametrize("quantize,group_size", KINDS)
def test_tiled_model_matches_packed_state_output_and_bytes(quantize, group_size):
    packed = _model(quantize, group_size)
    tiled = _model(quantize, group_size)
    before = {k: v.clone() for k, v in tiled.state_dict().items()}
    assert tile_model(tiled, require_cuda=False) == 2 * 4
    assert all(not isinstance(m, (PackedLinear, QuantizedPackedLinear)) for m in tiled.modules())
    after = tiled.state_dict()
    assert before.keys() == after.keys()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert weight_bytes(tiled) == weight_bytes(packed)
    for name, module in packed.named_modules():
        if isinstance(module, (PackedLinear, QuantizedPackedLinear)):
            other = tiled.get_submodule(name)
            assert isinstance(other, Sp24Linear) and other.quantize == getattr(module, "quantize", None)
            inputs = torch.randn(3, module.in_features).bfloat16()
            torch.testing.assert_close(other(inputs), module(inputs), rtol=1e-2, atol=1e-2)
    assert untile_model(tiled) == 2 * 4
    assert all(not isinstance(m, Sp24Linear) for m in tiled.modules())
    assert all(torch.equal(before[k], v) for k, v in tiled.state_dict().items())


def test_tiled_state_dict_loads_into_a_packed_model():
    tiled = _model(None, 128)
    tile_model(tiled, require_cuda=False)
    packed = _model(None, 128)
    packed.load_state_dict(tiled.state_dict())
    for name, module in packed.named_modules():
        if isinstance(module, PackedLinear):
            assert torch.equal(module.values, tiled.get_submodule(name).packed.values)


@pytest.mark.parametrize("quantize,group_size", KINDS)
def test_tiled_model_loads_a_packed_state_dict(quantize, group_size):
    source = _model(quantize, group_size)
    target = build_model(SMALL, random_state(SMALL, SparsityPattern.parse("2:4"), device="cpu", seed=1,
                                             quantize=quantize, group_size=group_size))
    tile_model(target, require_cuda=False)
    target.load_state_dict(source.state_dict())
    expected = source.state_dict()
    assert all(torch.equal(expected[k], v) for k, v in target.state_dict().items())
    with pytest.raises(RuntimeError, match="Missing key"):
        target.load_state_dict({k: v for k, v in expected.items() if not k.endswith("mlp.down.bitmask")})


@pytest.mark.parametrize("quantize,group_size", KINDS)
def test_glu_tiled_mlps_compute_the_packed_mlps_and_save_the_same_state(quantize, group_size):
    packed = _model(quantize, group_size)
    fused = _model(quantize, group_size)
    assert tile_model(fused, require_cuda=False, glu=True) == 2 * 4
    gate_ups = [m for name, m in fused.named_modules() if name.endswith("mlp.gate_up")]
    assert len(gate_ups) == 2 and all(m.glu and m.out_features == SMALL.intermediate_size for m in gate_ups)
    assert not any(m.glu for name, m in fused.named_modules() if isinstance(m, Sp24Linear)
                   and not name.endswith("mlp.gate_up"))
    expected = packed.state_dict()
    assert all(torch.equal(expected[k], v) for k, v in fused.state_dict().items())
    x = torch.randn(3, SMALL.dim).bfloat16()
    for layer in range(SMALL.n_layers):
        torch.testing.assert_close(fused.layers[layer].mlp(x), packed.layers[layer].mlp(x), rtol=2e-2, atol=2e-2)
    assert untile_model(fused) == 2 * 4
    torch.testing.assert_close(fused.layers[0].mlp(x), packed.layers[0].mlp(x), rtol=0, atol=0)


def test_glu_tiled_model_loads_a_packed_state_dict():
    source = _model(None, 128)
    target = build_model(SMALL, random_state(SMALL, SparsityPattern.parse("2:4"), device="cpu", seed=1))
    tile_model(target, require_cuda=False, glu=True)
    target.load_state_dict(source.state_dict())
    x = torch.randn(2, SMALL.dim).bfloat16()
    torch.testing.assert_close(target.layers[1].mlp(x), source.layers[1].mlp(x), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("variable,bad,count", [
    ("SPARSEDECODING_FUSE_GLU", "yes", lambda model: sum(isinstance(m, Sp24Linear) and m.glu
                                                          for m in model.modules())),
    ("SPARSEDECODING_FUSE_NORM", "on", lambda model: sum(bool(block.fuse_norms) for block in model.layers))])
def test_fusion_settings_decide_whether_the_engine_fuses(variable, bad, count, monkeypatch):
    """Unset and "1" fuse (both fusions are on by default), "0" does not, anything else is refused by name."""
    import sparsedecoding.kernels.sp24_linear as sl
    from sparsedecoding.kernels.op import KernelChoiceError

    monkeypatch.setattr(sl, "sp24_problem", lambda: None)
    original = sl.tileable
    monkeypatch.setattr(sl, "tileable", lambda module, require_cuda=True, slots=False: original(module, False, slots))
    monkeypatch.setenv("SPARSEDECODING_KERNEL", "auto")
    for setting, fused in (("", 2), ("0", 0), ("1", 2)):
        monkeypatch.setenv(variable, setting)
        assert count(_model(None, 128)) == fused
    monkeypatch.setenv(variable, bad)
    with pytest.raises(KernelChoiceError, match=f"{variable}='{bad}'"):
        tile_for_kernel(_model(None, 128))


def test_fuse_norm_setting_sets_how_many_rows_the_kernels_norm(monkeypatch):
    """Unset and "auto" fuse the RMSNorm in calls of up to 8192 // hidden size rows (4 for this model's 2048), "1" up
    to 16, "0" never; a bad value is refused before any block is touched."""
    import sparsedecoding.kernels.sp24_linear as sl
    from sparsedecoding.kernels.op import MAX_BATCH, KernelChoiceError

    monkeypatch.setattr(sl, "sp24_problem", lambda: None)
    original = sl.tileable
    monkeypatch.setattr(sl, "tileable", lambda module, require_cuda=True, slots=False: original(module, False, slots))
    monkeypatch.setenv("SPARSEDECODING_KERNEL", "auto")
    wide = dataclasses.replace(SMALL, dim=2048, n_heads=32)
    for setting, rows in (("", 4), ("auto", 4), ("AUTO", 4), ("1", MAX_BATCH), ("0", 0)):
        monkeypatch.setenv("SPARSEDECODING_FUSE_NORM", setting)
        model = _model(None, 128, args=wide)  # build_model tiles it as the engine does (tile_for_kernel)
        assert all(isinstance(block.attention.qkv, Sp24Linear) for block in model.layers)
        assert [block.fuse_norms for block in model.layers] == [rows, rows]
    monkeypatch.setenv("SPARSEDECODING_FUSE_NORM", "2")
    with pytest.raises(KernelChoiceError, match="auto .*, 1 .* or 0"):
        tile_for_kernel(_model(None, 128))
    monkeypatch.delenv("SPARSEDECODING_FUSE_NORM")
    with pytest.raises(ValueError, match="1..16 rows"):
        sl.fuse_norms(_model(None, 128), 17)


def test_tiling_says_where_the_norms_run(monkeypatch, caplog):
    """`tile_for_kernel` logs the rows up to which the kernels take the RMSNorm, or, under auto on a model wider than
    its bound, that the norms stay in the compiled blocks."""
    import logging

    import sparsedecoding.kernels.op as op
    import sparsedecoding.kernels.sp24_linear as sl

    monkeypatch.setattr(sl, "sp24_problem", lambda: None)
    original = sl.tileable
    monkeypatch.setattr(sl, "tileable", lambda module, require_cuda=True, slots=False: original(module, False, slots))
    monkeypatch.setenv("SPARSEDECODING_KERNEL", "auto")
    monkeypatch.setenv("SPARSEDECODING_FUSE_NORM", "auto")
    wide = dataclasses.replace(SMALL, dim=2048, n_heads=32)
    with caplog.at_level(logging.INFO, logger=sl.log.name):
        _model(None, 128, args=wide)
    assert "in calls of up to 4 rows (SPARSEDECODING_FUSE_NORM=auto, hidden size 2048)" in caplog.text
    caplog.clear()
    monkeypatch.setattr(op, "FUSE_NORM_AUTO_MAX_DIM", 1024)
    with caplog.at_level(logging.INFO, logger=sl.log.name):
        model = _model(None, 128, args=wide)
    assert [block.fuse_norms for block in model.layers] == [0, 0]
    assert "the RMSNorms stay in the compiled blocks" in caplog.text and "up to 1024 only (this model's: 2048" in \
        caplog.text


@pytest.mark.parametrize("setting,rows", [("auto", 0), ("1", 16)])
def test_auto_leaves_the_norms_of_a_slotted_model_unfused(setting, rows, monkeypatch, caplog):
    """A 16:32+2 model tiled with overflow slots keeps its RMSNorms in the compiled blocks under auto (fused, the
    8B preset's 16:32+2 decoded 4% slower at batch 1 and 2 on an H100), and fuses them when asked to ("1")."""
    import logging

    import sparsedecoding.kernels.sp24_linear as sl

    monkeypatch.setattr(sl, "sp24_problem", lambda: None)
    original = sl.tileable
    monkeypatch.setattr(sl, "tileable", lambda module, require_cuda=True, slots=False: original(module, False, slots))
    monkeypatch.setattr(sl, "_load_columns_build", lambda builds: None)  # no CUDA build on this machine
    monkeypatch.setenv("SPARSEDECODING_KERNEL", "auto")
    monkeypatch.delenv("SPARSEDECODING_SP24_SLOTS", raising=False)
    monkeypatch.setenv("SPARSEDECODING_FUSE_NORM", setting)
    with caplog.at_level(logging.INFO, logger=sl.log.name):
        model = _model(None, 128, pattern="16:32+2")
    assert all(isinstance(block.attention.qkv, Sp24Linear) and block.attention.qkv.slotted for block in model.layers)
    assert [block.fuse_norms for block in model.layers] == [rows, rows]
    assert ("not fuse them in front of linears with overflow slots" in caplog.text) == (setting == "auto")


@pytest.mark.parametrize("dim,rows", [(512, 16), (1536, 5), (2048, 4), (3584, 2), (4096, 2), (5120, 0), (8192, 0)])
def test_auto_norm_fusion_rows_fall_with_the_hidden_size(dim, rows):
    """Under auto the fusion spans at most 8192 rows x hidden size (the norm each CTA repeats grows with both) and
    never more than 16 rows, on hidden states up to 4096 wide (the 14B's 5120 measured slower fused at batch 1 and
    2); "1" and "0" ignore the size."""
    from sparsedecoding.kernels.op import fuse_norm_rows

    assert fuse_norm_rows("auto", dim) == rows
    assert (fuse_norm_rows("1", dim), fuse_norm_rows("0", dim)) == (16, 0)
    assert (fuse_norm_rows("auto", dim, slotted=True), fuse_norm_rows("1", dim, slotted=True)) == (0, 16)


@pytest.mark.parametrize("rows,fused_calls", [(2, 2 * 2), (1, 0)])
def test_blocks_hand_the_norm_to_the_kernels_only_up_to_their_rows(rows, fused_calls, monkeypatch):
    """A block whose `fuse_norms` is `rows` routes calls of at most that many tokens through `Sp24Linear.normed`
    (qkv and gate_up, each layer) and larger ones through the plain add, RMSNorm and linear; the logits are the
    plain model's bit for bit either way (off the GPU `normed` computes exactly what the plain block does)."""
    from sparsedecoding.kernels.sp24_linear import fuse_norms

    plain, fused = _model(None, 128), _model(None, 128)
    tile_model(plain, require_cuda=False)
    tile_model(fused, require_cuda=False)
    assert fuse_norms(fused, rows) == 2
    calls = []
    original = Sp24Linear.normed
    monkeypatch.setattr(Sp24Linear, "normed", lambda self, *a: calls.append(a[0].shape) or original(self, *a))
    for model in (plain, fused):
        model.setup_caches(2, 16)
    tokens = torch.randint(0, SMALL.vocab_size, (2, 1))  # one decode step of batch 2: two rows a call
    positions = torch.arange(1)
    assert torch.equal(fused(tokens, positions), plain(tokens, positions))
    assert len(calls) == fused_calls


@pytest.mark.parametrize("quantize,group_size", KINDS)
def test_blocks_with_fused_norms_compute_what_the_plain_blocks_do(quantize, group_size):
    """Off the GPU, `Sp24Linear.normed` adds, norms and multiplies exactly as a plain block does, so a model whose
    blocks hand their residual additions and RMSNorms to qkv and gate_up (`fuse_norms`) gives the same logits bit
    for bit: the blocks' routing through `attend` and `finish` is the plain one. `untile_model` turns it off."""
    from sparsedecoding.kernels.sp24_linear import fuse_norms

    plain = _model(quantize, group_size)
    fused = _model(quantize, group_size)
    tile_model(plain, require_cuda=False)
    tile_model(fused, require_cuda=False)
    assert fuse_norms(fused) == 2 and all(block.fuse_norms for block in fused.layers)
    tokens = torch.randint(0, SMALL.vocab_size, (2, 5))
    for model in (plain, fused):
        model.setup_caches(2, 16)
    positions = torch.arange(5)
    assert torch.equal(fused(tokens, positions), plain(tokens, positions))
    untile_model(fused)
    assert not any(block.fuse_norms for block in fused.layers)


def test_normed_refuses_mismatched_shapes():
    model = _model(None, 128)
    tile_model(model, require_cuda=False)
    qkv = model.layers[0].attention.qkv
    x = torch.randn(2, 1, qkv.in_features).bfloat16()
    with pytest.raises(KernelInputError, match="this Sp24Linear takes both"):
        qkv.normed(x, x[:1], model.layers[0].attention_norm.weight, 1e-5)


@pytest.mark.parametrize("variable", SETTINGS)
def test_cli_refuses_a_bad_switch_before_any_work(variable, monkeypatch, capsys):
    from sparsedecoding.cli import main

    monkeypatch.setenv(variable, "yes")
    assert main(["bench", "--preset", "llama-3.1-8b"]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"{variable}='yes'" in errors[0]


def test_reports_name_every_kernel_setting(monkeypatch):
    from sparsedecoding.kernels.op import settings_line

    monkeypatch.setenv("SPARSEDECODING_FUSE_GLU", "0")
    monkeypatch.setenv("SPARSEDECODING_SP24_PDL", "0")
    monkeypatch.delenv("SPARSEDECODING_KERNEL", raising=False)
    monkeypatch.delenv("SPARSEDECODING_FUSE_NORM", raising=False)
    monkeypatch.delenv("SPARSEDECODING_SPARSE_MMA", raising=False)
    monkeypatch.setenv("SPARSEDECODING_COMBO_KERNELS", "1")
    monkeypatch.delenv("SPARSEDECODING_INDUCTOR_PDL", raising=False)
    monkeypatch.setenv("SPARSEDECODING_INDUCTOR_ATTENTION", "1")
    monkeypatch.delenv("SPARSEDECODING_FUSED_ATTENTION", raising=False)
    monkeypatch.delenv("SPARSEDECODING_ATTENTION_MIN_SPAN", raising=False)
    monkeypatch.delenv("SPARSEDECODING_NM_MMA_GEOMETRY", raising=False)
    monkeypatch.delenv("SPARSEDECODING_SP24_OVER_LOOP", raising=False)
    monkeypatch.delenv("SPARSEDECODING_SP24_SLOTS", raising=False)
    monkeypatch.delenv("SPARSEDECODING_SP24_HALF_META", raising=False)
    monkeypatch.delenv("SPARSEDECODING_SP24_EARLY_TRIGGER", raising=False)
    monkeypatch.delenv("SPARSEDECODING_SP24_MMA_CTAS", raising=False)
    monkeypatch.delenv("SPARSEDECODING_SP24_MULTICAST", raising=False)
    monkeypatch.delenv("SPARSEDECODING_SP24_STREAM_K", raising=False)
    monkeypatch.delenv("SPARSEDECODING_SP24_HALVES_ACC", raising=False)
    monkeypatch.delenv("SPARSEDECODING_SP24_GROUPED_CTAS", raising=False)
    monkeypatch.delenv("SPARSEDECODING_SP24_HANDOFF", raising=False)
    monkeypatch.delenv("SPARSEDECODING_SP24_MIXED", raising=False)
    monkeypatch.delenv("SPARSEDECODING_SP24_INT8_STEP", raising=False)
    monkeypatch.delenv("SPARSEDECODING_SP24_INT4_STEP", raising=False)
    monkeypatch.delenv("SPARSEDECODING_STEP_TUNE", raising=False)
    monkeypatch.delenv("SPARSEDECODING_STEP_TUNE_PAIRS", raising=False)
    monkeypatch.delenv("SPARSEDECODING_DENSE_INT4", raising=False)
    monkeypatch.delenv("SPARSEDECODING_DENSE_INT8", raising=False)
    monkeypatch.delenv("SPARSEDECODING_ATTENTION_EARLY_READS", raising=False)
    monkeypatch.delenv("SPARSEDECODING_FUSED_GREEDY", raising=False)
    assert settings_line() == ("Kernel settings: SPARSEDECODING_KERNEL=auto, SPARSEDECODING_SPARSE_MMA=0, "
                               "SPARSEDECODING_FUSE_GLU=0, SPARSEDECODING_FUSE_NORM=auto, SPARSEDECODING_SP24_PDL=0, "
                               "SPARSEDECODING_COMBO_KERNELS=1, SPARSEDECODING_INDUCTOR_PDL=1, "
                               "SPARSEDECODING_INDUCTOR_ATTENTION=1, SPARSEDECODING_FUSED_ATTENTION=1, "
                               "SPARSEDECODING_ATTENTION_MIN_SPAN=64, SPARSEDECODING_ATTENTION_EARLY_READS=1, "
                               "SPARSEDECODING_NM_MMA_GEOMETRY=default, "
                               "SPARSEDECODING_SP24_OVER_LOOP=auto, SPARSEDECODING_SP24_SLOTS=1, "
                               "SPARSEDECODING_SP24_HALF_META=1, SPARSEDECODING_SP24_EARLY_TRIGGER=timed, "
                               "SPARSEDECODING_SP24_MMA_CTAS=2, SPARSEDECODING_SP24_MULTICAST=2, "
                               "SPARSEDECODING_SP24_STREAM_K=1, SPARSEDECODING_SP24_HALVES_ACC=1, "
                               "SPARSEDECODING_SP24_GROUPED_CTAS=timed, "
                               "SPARSEDECODING_SP24_HANDOFF=1, "
                               "SPARSEDECODING_SP24_MIXED=1, SPARSEDECODING_SP24_INT8_STEP=auto, "
                               "SPARSEDECODING_SP24_INT4_STEP=auto, "
                               "SPARSEDECODING_STEP_TUNE=1, SPARSEDECODING_STEP_TUNE_PAIRS=0, "
                               "SPARSEDECODING_DENSE_INT4=auto, SPARSEDECODING_DENSE_INT8=auto, "
                               "SPARSEDECODING_FUSED_GREEDY=1.")
    monkeypatch.setenv("SPARSEDECODING_NM_MMA_GEOMETRY", "chunk_words=4, warps=4")
    monkeypatch.setenv("SPARSEDECODING_SP24_OVER_LOOP", "rows")
    monkeypatch.setenv("SPARSEDECODING_SP24_SLOTS", "0")
    monkeypatch.setenv("SPARSEDECODING_SP24_HALF_META", "0")
    monkeypatch.setenv("SPARSEDECODING_SP24_EARLY_TRIGGER", "1")
    monkeypatch.setenv("SPARSEDECODING_SP24_STREAM_K", "0")
    monkeypatch.setenv("SPARSEDECODING_SP24_HALVES_ACC", "2")
    monkeypatch.setenv("SPARSEDECODING_SP24_GROUPED_CTAS", "1")
    monkeypatch.setenv("SPARSEDECODING_SP24_HANDOFF", "0")
    monkeypatch.setenv("SPARSEDECODING_SP24_MIXED", "0")
    monkeypatch.setenv("SPARSEDECODING_SP24_INT8_STEP", "8")
    monkeypatch.setenv("SPARSEDECODING_SP24_INT4_STEP", "16")
    monkeypatch.setenv("SPARSEDECODING_STEP_TUNE", "0")
    monkeypatch.setenv("SPARSEDECODING_STEP_TUNE_PAIRS", "1")
    monkeypatch.setenv("SPARSEDECODING_DENSE_INT4", "triton")
    monkeypatch.setenv("SPARSEDECODING_DENSE_INT8", "sp24")
    monkeypatch.setenv("SPARSEDECODING_ATTENTION_EARLY_READS", "0")
    monkeypatch.setenv("SPARSEDECODING_FUSED_GREEDY", "0")
    assert "SPARSEDECODING_ATTENTION_EARLY_READS=0, SPARSEDECODING_NM_MMA_GEOMETRY" in settings_line()
    assert settings_line().endswith(", SPARSEDECODING_NM_MMA_GEOMETRY=chunk_words=4,warps=4, "
                                    "SPARSEDECODING_SP24_OVER_LOOP=rows, SPARSEDECODING_SP24_SLOTS=0, "
                                    "SPARSEDECODING_SP24_HALF_META=0, SPARSEDECODING_SP24_EARLY_TRIGGER=1, "
                                    "SPARSEDECODING_SP24_MMA_CTAS=2, SPARSEDECODING_SP24_MULTICAST=2, "
                                    "SPARSEDECODING_SP24_STREAM_K=0, SPARSEDECODING_SP24_HALVES_ACC=2, "
                                    "SPARSEDECODING_SP24_GROUPED_CTAS=1, "
                                    "SPARSEDECODING_SP24_HANDOFF=0, "
                                    "SPARSEDECODING_SP24_MIXED=0, SPARSEDECODING_SP24_INT8_STEP=8, "
                                    "SPARSEDECODING_SP24_INT4_STEP=16, "
                                    "SPARSEDECODING_STEP_TUNE=0, SPARSEDECODING_STEP_TUNE_PAIRS=1, "
                                    "SPARSEDECODING_DENSE_INT4=triton, SPARSEDECODING_DENSE_INT8=sp24, "
                                    "SPARSEDECODING_FUSED_GREEDY=0.")


def test_only_2of4_packed_linears_of_little_padding_are_tileable():
    tiny = _model(None, 128, args=TINY)
    assert {tileable(m, require_cuda=False) for m in tiny.modules() if isinstance(m, PackedLinear)} == {
        "shape 128x64 pads to the kernel's tiles with 300% more bytes",
        "shape 64x64 pads to the kernel's tiles with 300% more bytes",
        "shape 192x64 pads to the kernel's tiles with 300% more bytes",
        "shape 64x96 pads to the kernel's tiles with 167% more bytes"}
    model = _model(None, 128, pattern="16:32")
    reasons = {tileable(m, require_cuda=False) for m in model.modules() if isinstance(m, PackedLinear)}
    assert reasons == {"pattern 16:32 (on sparse tensor cores only as 16:32+2 with overflow slots, not asked for "
                       "here)"}
    assert tile_model(model, require_cuda=False) == 0
    reasons = {tileable(m, require_cuda=False, slots=True) for m in model.modules() if isinstance(m, PackedLinear)}
    assert all(" mask words beyond 16:32+2 (prune with --pattern 16:32+2, 16:32g or 16:32g8 " in reason
               for reason in reasons)
    assert tile_model(model, require_cuda=False, slots=True) == 0
    assert {tileable(m, require_cuda=False) for m in _model(None, 128, pattern="8:16").modules()
            if isinstance(m, PackedLinear)} == {"pattern 8:16 (sparse tensor cores run 2:4, and 16:32 masks that fit "
                                                "16:32+2)"}
    on_cpu = _model(None, 128)
    assert {tileable(m) for m in on_cpu.modules() if isinstance(m, PackedLinear)} == {
        "on cpu (the kernel runs on CUDA)"}


def test_kernel_setting_decides_whether_the_engine_tiles(monkeypatch):
    """With the kernel available (stubbed: this is a CPU test), the engine's `build_model` under `auto` tiles every
    2:4 linear; `triton` and `cuda` keep the packed modules; anything else is refused."""
    import sparsedecoding.kernels.sp24_linear as sl
    from sparsedecoding.kernels.op import KernelChoiceError

    monkeypatch.setattr(sl, "sp24_problem", lambda: None)
    original = sl.tileable
    monkeypatch.setattr(sl, "tileable", lambda module, require_cuda=True, slots=False: original(module, False, slots))
    for setting, tiled in (("triton", 0), ("cuda", 0), ("auto", 2 * 4)):
        monkeypatch.setenv("SPARSEDECODING_KERNEL", setting)
        model = _model(None, 128)  # build_model applies tile_for_kernel
        assert sum(isinstance(m, Sp24Linear) for m in model.modules()) == tiled
        assert sum(isinstance(m, PackedLinear) for m in model.modules()) == 2 * 4 - tiled
    monkeypatch.setenv("SPARSEDECODING_KERNEL", "fast")
    with pytest.raises(KernelChoiceError):
        tile_for_kernel(_model(None, 128))


def test_a_kernel_that_cannot_run_warns_once(monkeypatch, caplog):
    import sparsedecoding.kernels.sp24_linear as sl

    monkeypatch.setattr(sl, "_warned", False)
    monkeypatch.setattr(sl, "sp24_problem", lambda: "no CUDA GPU")
    monkeypatch.setattr(sl, "tileable", lambda module, require_cuda=True, slots=False: None
                        if isinstance(module, PackedLinear) else "not a packed linear")
    monkeypatch.setenv("SPARSEDECODING_KERNEL", "auto")
    with caplog.at_level("WARNING", logger="sparsedecoding.kernels.sp24_linear"):
        assert tile_for_kernel(_model(None, 128)) == 0
        assert tile_for_kernel(_model(None, 128)) == 0
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "no CUDA GPU" in warnings[0] and "SPARSEDECODING_KERNEL=triton" in warnings[0]


@pytest.mark.parametrize("command", [["bench", "--preset", "llama-3.1-8b"], ["generate", "--model", "nowhere",
                                                                             "--prompt", "hi"]])
def test_cli_refuses_a_bad_kernel_setting_before_any_work(command, monkeypatch, capsys):
    from sparsedecoding.cli import main

    monkeypatch.setenv("SPARSEDECODING_KERNEL", "fast")
    assert main(command) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "SPARSEDECODING_KERNEL='fast'" in errors[0]


@pytest.mark.parametrize("pattern,glu", [("2:4", False), ("2:4", True), ("16:32+2", True)])
def test_dense_copies_stay_tiled_serve_wide_batches_and_cost_their_memory(pattern, glu):
    """`keep_dense_copies` on a tiled model keeps its Sp24Linear modules (batches below the threshold stay on the
    sparse tensor cores) and gives each a dense copy of the packed weight that wider batches multiply by (off the
    GPU every batch takes the separate add and norm, so `normed` routes through forward there; the kernel-side
    routing is the GPU test's); the copies are never saved, count in the held bytes and replace the tiles' bytes in
    the bytes a wide step reads."""
    from sparsedecoding.engine.loading import resident_weight_bytes
    from sparsedecoding.kernels.sp24 import to_dense
    from sparsedecoding.kernels.sp24_linear import fuse_norms

    model = _model(None, 128, pattern=pattern)
    weights = {name: m.packed.to_dense() for name, m in model.named_modules() if isinstance(m, PackedLinear)}
    assert tile_model(model, require_cuda=False, glu=glu, slots=pattern != "2:4") == 2 * 4
    fuse_norms(model)
    tiled = [m for m in model.modules() if isinstance(m, Sp24Linear)]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    read, held = weight_bytes(model, 4), resident_weight_bytes(model)
    assert keep_dense_copies(model, 4) == len(tiled)
    assert [m for m in model.modules() if isinstance(m, Sp24Linear)] == tiled
    assert all(torch.equal(m.dense, weights[name]) for name, m in model.named_modules() if isinstance(m, Sp24Linear))
    after = model.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(before[k], after[k]) for k in before)
    copies = sum(m.dense.numel() * m.dense.element_size() for m in tiled)
    tiles = sum(b.numel() * b.element_size() for m in tiled for n, b in m.named_buffers(recurse=False)
                if n != "dense")
    assert resident_weight_bytes(model) == held + copies
    assert weight_bytes(model, 3) == read and weight_bytes(model, 4) == read - tiles + copies
    assert "dense copy from 4 rows" in repr(tiled[0])
    # routing: the copy (zeroed here to tell it apart) serves 4 or more rows, the tiles fewer
    layer = next(m for m in tiled if m.glu) if glu else tiled[0]
    x = torch.randn(4, layer.in_features, dtype=torch.bfloat16)
    narrow = layer(x[:3])
    layer.dense.zero_()
    assert torch.equal(layer(x[:3]), narrow) and not narrow.eq(0).all()
    assert layer(x).eq(0).all()
    norm_weight = torch.ones(layer.in_features, dtype=torch.bfloat16)
    y, total = layer.normed(x, x, norm_weight, 1e-5)
    assert y.eq(0).all() and torch.equal(total, x + x)
    # loading a state dict refreshes the copy
    model.load_state_dict(after)
    assert torch.equal(layer.dense, to_dense(layer.weight).to(layer.value_dtype))


def test_dense_copy_bytes_count_the_bias():
    from torch import nn

    weight = torch.randn(32, 512, dtype=torch.bfloat16)
    weight[:, 1::2] = 0
    bias = torch.randn(32, dtype=torch.bfloat16)
    holder = nn.Module()
    holder.layer = Sp24Linear.from_module(PackedLinear.from_dense(weight, 2, 4, bias))
    tiles = sum(b.numel() * b.element_size() for b in holder.layer.buffers())
    assert weight_bytes(holder, 2) == tiles  # the bias among the buffers
    holder.layer.keep_dense_copy(2)
    assert weight_bytes(holder, 1) == tiles and weight_bytes(holder, 2) == (32 * 512 + 32) * 2


def test_dense_copies_refuse_quantized_tiles_and_narrow_thresholds():
    from sparsedecoding.errors import EngineError

    model = _model("int8", 128)
    tile_model(model, require_cuda=False)
    with pytest.raises(EngineError, match="16-bit values"):
        keep_dense_copies(model, 4)
    layer = next(m for m in model.modules() if isinstance(m, Sp24Linear))
    with pytest.raises(KernelInputError, match="int8 codes"):
        layer.keep_dense_copy(4)
    bf16 = _model(None, 128)
    tile_model(bf16, require_cuda=False)
    with pytest.raises(KernelInputError, match="use 2 or more"):
        next(m for m in bf16.modules() if isinstance(m, Sp24Linear)).keep_dense_copy(1)


def _packed_and_tiled(quantize, group_size, monkeypatch, pattern="2:4", **settings):
    """Qwen2.5-Coder-1.5B's shapes (every linear tileable), 4 layers, random `pattern` weights: the model on the
    packed kernels (SPARSEDECODING_KERNEL=triton) and the same weights built under `auto` with `settings`
    (environment variables) set, on the GPU."""
    from dataclasses import replace

    from sparsedecoding.engine import PRESETS

    args = replace(PRESETS["qwen2.5-coder-1.5b"], n_layers=4)
    pattern = SparsityPattern.parse(pattern)
    monkeypatch.setenv("SPARSEDECODING_KERNEL", "triton")
    packed = build_model(args, random_state(args, pattern, device="cuda", quantize=quantize, group_size=group_size))
    monkeypatch.setenv("SPARSEDECODING_KERNEL", "auto")
    for name, value in settings.items():
        monkeypatch.setenv(name, value)
    tiled = build_model(args, random_state(args, pattern, device="cuda", quantize=quantize, group_size=group_size))
    return args, packed, tiled


def _assert_compiled_decode_gives_the_eager_tokens(args, packed, tiled):
    """The tiled model's compiled CUDA-graph decode gives the packed model's eager tokens (divergence only at a
    logit tie)."""
    from sparsedecoding.engine import Engine
    from sparsedecoding.evaluation.engine_check import compare_tokens, replay_logits

    prompt = torch.randint(0, args.vocab_size, (3, 8))
    eager = Engine(packed, 3, 40, compile=False).generate(prompt, 32).tokens
    compiled = Engine(tiled, 3, 40, compile=True).generate(prompt, 32).tokens
    for row in range(3):
        logits = replay_logits(packed, prompt[row], eager[row])[7:]
        assert compare_tokens(eager[row], compiled[row], logits, logits).passed


@pytest.mark.gpu
@pytest.mark.parametrize("glu", ["0", "1"])
@pytest.mark.parametrize("quantize,group_size", KINDS)
def test_engine_tiles_2of4_on_gpu_and_decodes_the_packed_models_tokens(quantize, group_size, glu, monkeypatch):
    """The engine built under `auto` holds Sp24Linear modules (gate_up with the GLU epilogue when asked), and its
    compiled CUDA-graph decode gives the eager tokens of the same weights on the packed kernels."""
    args, packed, tiled = _packed_and_tiled(quantize, group_size, monkeypatch, SPARSEDECODING_FUSE_GLU=glu)
    assert sum(isinstance(m, Sp24Linear) for m in tiled.modules()) == 4 * 4
    assert sum(isinstance(m, Sp24Linear) and m.glu for m in tiled.modules()) == (4 if glu == "1" else 0)
    _assert_compiled_decode_gives_the_eager_tokens(args, packed, tiled)


@pytest.mark.gpu
@pytest.mark.parametrize("quantize,group_size", KINDS)
def test_engine_with_fused_norms_decodes_the_packed_models_tokens(quantize, group_size, monkeypatch):
    """As above with SPARSEDECODING_FUSE_NORM=1 (and the GLU epilogue): every block's qkv and gate_up kernels take
    its residual additions and RMSNorms, and the compiled decode still gives the packed model's eager tokens."""
    args, packed, tiled = _packed_and_tiled(quantize, group_size, monkeypatch, SPARSEDECODING_FUSE_GLU="1",
                                            SPARSEDECODING_FUSE_NORM="1")
    assert all(block.fuse_norms for block in tiled.layers)
    _assert_compiled_decode_gives_the_eager_tokens(args, packed, tiled)


@pytest.mark.gpu
@pytest.mark.parametrize("norm", ["0", "1"])
def test_engine_runs_16of32_plus_2_with_slots_and_decodes_the_packed_models_tokens(norm, monkeypatch):
    """A 16:32+2 model under `auto` (SPARSEDECODING_SP24_SLOTS unset: on) holds slotted Sp24Linear modules, gate_up
    with the GLU epilogue and, with SPARSEDECODING_FUSE_NORM=1, qkv and gate_up with the RMSNorm in front (sp24.cu's
    NORM and OVER together); its compiled CUDA-graph decode gives the packed 16:32 model's eager tokens."""
    monkeypatch.delenv("SPARSEDECODING_SP24_SLOTS", raising=False)
    args, packed, tiled = _packed_and_tiled(None, 128, monkeypatch, pattern="16:32+2", SPARSEDECODING_FUSE_GLU="1",
                                            SPARSEDECODING_FUSE_NORM=norm)
    assert sum(isinstance(m, Sp24Linear) and m.slotted for m in tiled.modules()) == 4 * 4
    assert all(bool(block.fuse_norms) == (norm == "1") for block in tiled.layers)
    _assert_compiled_decode_gives_the_eager_tokens(args, packed, tiled)


@pytest.mark.gpu
@pytest.mark.parametrize("pattern", ["2:4", "16:32+2"])
def test_dense_copy_serves_exactly_the_wide_calls_on_gpu(pattern):
    """On the GPU an Sp24Linear with a dense copy from 4 rows multiplies 4 or more rows by the copy (zeroed here to
    tell it apart), in `forward` and `normed` (GLU included), and fewer rows on the kernel."""
    from sparsedecoding.kernels.sp24_linear import fuse_norms

    model = _model(None, 128, device="cuda", pattern=pattern)
    tile_model(model, glu=True, slots=pattern != "2:4")
    fuse_norms(model)
    keep_dense_copies(model, 4)
    for layer in [m for m in model.modules() if isinstance(m, Sp24Linear)][:3]:
        x = torch.randn(4, layer.in_features, dtype=torch.bfloat16, device="cuda")
        norm_weight = torch.ones(layer.in_features, dtype=torch.bfloat16, device="cuda")
        layer.dense.zero_()
        assert not layer(x[:3]).eq(0).all() and not layer.normed(x[:3], x[:3], norm_weight, 1e-5)[0].eq(0).all()
        assert layer(x).eq(0).all() and layer.normed(x, x, norm_weight, 1e-5)[0].eq(0).all()


@pytest.mark.gpu
@pytest.mark.parametrize("from_batch", [3, 4])
@pytest.mark.parametrize("pattern", ["2:4", "16:32+2"])
def test_engine_with_dense_copies_keeps_its_tiles_and_decodes_the_packed_models_tokens(pattern, from_batch,
                                                                                      monkeypatch):
    """Dense copies on a tiled model (GLU epilogue and fused norms on) leave its Sp24Linear modules in place; its
    compiled decode at batch 3, on the copies (from batch 3) or on the tiles beside them (from 4), gives the eager
    tokens of the packed model with its own dense copies."""
    monkeypatch.delenv("SPARSEDECODING_SP24_SLOTS", raising=False)
    args, packed, tiled = _packed_and_tiled(None, 128, monkeypatch, pattern=pattern, SPARSEDECODING_FUSE_GLU="1",
                                            SPARSEDECODING_FUSE_NORM="1")
    keep_dense_copies(packed, from_batch)
    assert keep_dense_copies(tiled, from_batch) == sum(isinstance(m, Sp24Linear) for m in tiled.modules()) == 4 * 4
    _assert_compiled_decode_gives_the_eager_tokens(args, packed, tiled)


def _quantized_tiled(quantize, group_size, n=2, m=4, seed=0):
    """(the weight on its grid, dense; the same as an Sp24Linear) for a 48 x 256 weight."""
    from helpers import random_nm_weight
    from sparsedecoding.kernels.quantized import pack_nm_quantized
    from sparsedecoding.solvers import sparsegpt

    weight = random_nm_weight(48, 256, n, m, seed=seed).float()
    pattern = f"{n}:{m}" + ("+2" if m == 32 else "")  # a 16:32 mask the 2:4 tiles hold with two slots a word
    on_grid = sparsegpt(weight, torch.eye(256), pattern, quantize=quantize, group_size=group_size).bfloat16()
    module = QuantizedPackedLinear(pack_nm_quantized(on_grid, n, m, quantize, group_size))
    return on_grid, Sp24Linear.from_module(module)


@pytest.mark.parametrize("quantize, group_size, n, m", [("int8", 128, 2, 4), ("int4", 64, 2, 4),
                                                        ("int4", 128, 16, 32)])
def test_half_keeps_the_tiled_formats_dtypes_and_the_product(quantize, group_size, n, m):
    """`model.half()` converts the bias and activations, not the tiled values and bfloat16 scales: the product
    in float16 is the grid weight's (a 16:32 weight here has nonzeros beyond 2:4, so its slots are used)."""
    weight, tiled = _quantized_tiled(quantize, group_size, n, m)
    dtypes = {name: buffer.dtype for name, buffer in tiled.named_buffers()}
    tiled.half()
    assert {name: buffer.dtype for name, buffer in tiled.named_buffers()} == dtypes
    x = torch.randn(3, 256).half()
    expected = x.double() @ weight.double().T
    assert (tiled(x).double() - expected).abs().max() <= 2e-3 * expected.abs().max()
    assert tiled.state_dict().keys()  # the packed format still reads back


def test_a_tiled_state_dict_with_a_wrong_bias_is_refused():
    _, tiled = _quantized_tiled("int8", 128)
    state = tiled.state_dict()
    with pytest.raises(RuntimeError, match="Unexpected key"):
        tiled.load_state_dict({**state, "bias": torch.zeros(48)})
    with_bias = Sp24Linear(tiled.weight, torch.zeros(48, dtype=torch.bfloat16))
    with pytest.raises(RuntimeError, match="size mismatch for bias"):
        with_bias.load_state_dict({**state, "bias": torch.ones(1, dtype=torch.bfloat16)})


def test_held_buffers_move_with_to_empty_and_survive_a_failed_apply():
    """The tiled buffers held aside from dtype changes still move (`to_empty` from meta, as models built on meta
    are materialised) and are back in place even when the apply raises."""
    _, tiled = _quantized_tiled("int8", 128)
    dtypes = {name: buffer.dtype for name, buffer in tiled.named_buffers()}
    tiled.to("meta").to_empty(device="cpu")
    assert {name: (buffer.dtype, buffer.device.type) for name, buffer in tiled.named_buffers()} == \
        {name: (dtype, "cpu") for name, dtype in dtypes.items()}

    def failing(tensor):
        raise RuntimeError("out of memory")

    with pytest.raises(RuntimeError, match="out of memory"):
        tiled._apply(failing)
    assert all(tiled._buffers[name] is not None for name in dtypes)
