"""`prune --dense-linears`: the named linears stay exactly as they were, the others are pruned as before, the record
names them, `pack` keeps them dense, and a pattern that names nothing is one error line before any work."""

import json

import pytest
import torch
from safetensors.torch import load_file

from sparsedecoding.errors import SparseDecodingError
from sparsedecoding.hessian import prunable_linears
from sparsedecoding.kernels.format import PackedNM
from sparsedecoding.models import DECODER_LINEARS, decoder_linear_names, load_model, read_config
from sparsedecoding.packed import load_packed_checkpoint, pack_checkpoint
from sparsedecoding.pipeline import PruneConfig, prune
import test_pipeline
from helpers import straight_and_resumed

tiny_folder, prompts_file = test_pipeline.tiny_folder, test_pipeline.prompts_file  # the same fixtures


def config(folder, out, prompts, **overrides):
    return test_pipeline.config(folder, out, prompts, **{"solver": "sparsegpt", **overrides})


def linear_names(layers: int = 3) -> list[str]:
    return [f"model.layers.{index}.{leaf}" for index in range(layers) for leaf in DECODER_LINEARS]


def test_the_names_read_from_config_json_are_the_loaded_models_prunable_linears(tiny_folder):
    """check_dense_linears matches patterns against names built from config.json; prune_layers against the loaded
    model's: they must be the same names, or a pattern could pass the check and then leave nothing dense."""
    model, _, _ = load_model(tiny_folder, torch.device("cpu"))
    loaded = [f"model.layers.{index}.{name}" for index, layer in enumerate(model.model.layers)
              for name in prunable_linears(layer)]
    assert sorted(loaded) == sorted(decoder_linear_names(read_config(tiny_folder))) == sorted(linear_names())


DENSE = "model.layers.1.*, *.mlp.down_proj"


def expected_dense(name: str) -> bool:
    return name.startswith("model.layers.1.") or name.endswith("mlp.down_proj")


@pytest.mark.parametrize("propagation,target", [("dense", "self"), ("sequential", "dense")])
def test_the_named_linears_stay_as_they_were_and_the_rest_are_pruned(tiny_folder, prompts_file, tmp_path,
                                                                     propagation, target):
    out = prune(config(tiny_folder, tmp_path / "out", prompts_file, dense_linears=DENSE, propagation=propagation,
                       target=target), progress=False)
    dense, pruned = load_file(str(tiny_folder / "model.safetensors")), load_file(str(out / "model.safetensors"))
    kept = [name for name in linear_names() if expected_dense(name)]
    for name in linear_names():
        weight = pruned[f"{name}.weight"]
        if expected_dense(name):
            assert torch.equal(weight, dense[f"{name}.weight"]), name
        else:
            counts = (weight != 0).reshape(weight.shape[0], -1, 4).sum(-1)
            assert torch.all(counts == 2), name
    manifest = json.loads((out / "sparsedecoding.json").read_text())
    assert manifest["dense_linears"] == kept
    assert sorted(manifest["layers"]) == sorted(name for name in linear_names() if not expected_dense(name))
    assert manifest["config"]["dense_linears"] == DENSE


def test_the_same_run_without_the_option_prunes_layer_1_and_differs_after_it(tiny_folder, prompts_file, tmp_path):
    """With dense propagation every layer's Hessians come from the dense model, so the linears pruned in both runs
    come out the same; sequential propagation carries the dense layer 1 into layer 2's Hessians."""
    plain = load_file(str(prune(config(tiny_folder, tmp_path / "plain", prompts_file, propagation="sequential"),
                                progress=False) / "model.safetensors"))
    partial = load_file(str(prune(config(tiny_folder, tmp_path / "partial", prompts_file, propagation="sequential",
                                         dense_linears="model.layers.1.*"), progress=False) / "model.safetensors"))
    layer0 = [f"{name}.weight" for name in linear_names() if name.startswith("model.layers.0.")]
    layer2 = [f"{name}.weight" for name in linear_names() if name.startswith("model.layers.2.")]
    assert all(torch.equal(plain[name], partial[name]) for name in layer0)
    assert not all(torch.equal(plain[name], partial[name]) for name in layer2)


def test_pack_keeps_the_dense_linears_dense(tiny_folder, prompts_file, tmp_path):
    out = prune(config(tiny_folder, tmp_path / "out", prompts_file, dense_linears="*.self_attn.o_proj"),
                progress=False)
    pack_checkpoint(out, tmp_path / "packed")
    state, _ = load_packed_checkpoint(tmp_path / "packed")
    for name in linear_names():
        weight = state[f"{name}.weight"]
        if name.endswith("o_proj"):
            assert isinstance(weight, torch.Tensor) and not isinstance(weight, PackedNM), name
        else:
            assert isinstance(weight, PackedNM), name


@pytest.mark.slow
def test_a_run_interrupted_after_a_dense_layer_resumes_to_the_same_weights(tiny_folder, prompts_file, tmp_path,
                                                                           monkeypatch):
    settings = dict(dense_linears="model.layers.1.*", propagation="sequential")
    # layer 1 solves nothing: solve_layer's second call is layer 2's
    straight, resumed, record = straight_and_resumed(
        monkeypatch, lambda out: prune(config(tiny_folder, out, prompts_file, **settings), progress=False), tmp_path,
        interrupt_on_call=2)
    assert record["timing"]["resumed_from_layer"] == 2
    assert all(torch.equal(straight[name], resumed[name]) for name in straight)


@pytest.mark.parametrize("value,expected", [
    ("model.layers.7.*", "--dense-linears pattern 'model.layers.7.*' matches no linear of this model"),
    ("*.q_proj,*.mlp.up_proj_typo", "'*.mlp.up_proj_typo' matches no linear"),
    ("*", "leaves every linear dense: nothing is left to prune"),
])
def test_a_pattern_that_names_nothing_or_everything_is_one_line_and_writes_nothing(tiny_folder, prompts_file,
                                                                                   tmp_path, capsys, value, expected):
    from sparsedecoding.cli import main

    argv = ["prune", "--model", str(tiny_folder), "--out", str(tmp_path / "out"), "--prompts", str(prompts_file),
            "--pattern", "2:4", "--tokens", "36", "--dense-linears", value]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and expected in err[0], err
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def test_an_empty_pattern_is_refused_before_anything_is_loaded(tmp_path):
    with pytest.raises(SparseDecodingError, match="holds an empty pattern"):
        PruneConfig(model="nowhere", out=str(tmp_path / "out"), dense_linears="*.q_proj,,*.k_proj").check_values()
    assert PruneConfig(model="nowhere", out=str(tmp_path / "out"),
                       dense_linears=" *.q_proj , *.k_proj ").dense_linear_patterns() == ("*.q_proj", "*.k_proj")


def test_the_engine_runs_a_fused_linear_dense_when_a_part_of_it_is_dense(tiny_folder, prompts_file, tmp_path):
    from sparsedecoding.engine import load_model as load_engine_model
    from sparsedecoding.kernels import PackedLinear

    out = prune(config(tiny_folder, tmp_path / "out", prompts_file,
                       dense_linears="*.self_attn.k_proj,model.layers.1.mlp.down_proj"), progress=False)
    model = load_engine_model(out, sparse="auto", dtype=torch.bfloat16, device="cpu")
    assert len(model.layers) == 3
    for index, block in enumerate(model.layers):
        assert not isinstance(block.attention.qkv, PackedLinear), index  # k_proj dense: q|k|v dense
        assert isinstance(block.attention.out, PackedLinear), index
        assert isinstance(block.mlp.gate_up, PackedLinear), index
        assert isinstance(block.mlp.down, PackedLinear) == (index != 1), index
