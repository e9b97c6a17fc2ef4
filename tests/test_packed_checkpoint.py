"""Packed checkpoints: which tensors get packed, exact round trip, manifest contents, atomic output, CLI."""

import hashlib
import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from sparsedecoding.cli import main
from sparsedecoding.errors import ModelNotFoundError, OutputExistsError, PackingError
from sparsedecoding.kernels import PackedNM
from sparsedecoding.packed import PACKED_MANIFEST, load_packed_checkpoint, pack_checkpoint

from helpers import make_tiny_model, prune_in_place, random_nm_weight

LINEARS = ["self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj",
           "mlp.up_proj", "mlp.down_proj"]


def write_model(folder, dense_linear: str | None = None, sparse_pattern=(2, 4), layer1_pattern=(2, 4)):
    """A two-shard HF-style folder: layer 0 in one shard, layer 1 plus embeddings and head in the other.
    Every decoder linear is N:M sparse except `dense_linear` of layer 0; norms, embeddings, lm_head dense."""
    folder.mkdir()
    tensors = {}
    for layer, pattern in ((0, sparse_pattern), (1, layer1_pattern)):
        for i, linear in enumerate(LINEARS):
            name = f"model.layers.{layer}.{linear}.weight"
            weight = random_nm_weight(32, 64, *pattern, seed=10 * layer + i)
            if layer == 0 and linear == dense_linear:
                weight = torch.randn(32, 64).bfloat16()
            tensors[name] = weight
        tensors[f"model.layers.{layer}.input_layernorm.weight"] = torch.ones(64).bfloat16()
    tensors["model.embed_tokens.weight"] = torch.randn(100, 64).bfloat16()
    tensors["lm_head.weight"] = torch.zeros(100, 64).bfloat16()  # all zero: N:M sparse, but not prunable
    save_file({k: v for k, v in tensors.items() if ".layers.0." in k}, str(folder / "model-00001-of-00002.safetensors"))
    save_file({k: v for k, v in tensors.items() if ".layers.0." not in k},
              str(folder / "model-00002-of-00002.safetensors"))
    (folder / "config.json").write_text(json.dumps({"model_type": "llama", "hidden_size": 64}))
    return tensors


def test_auto_packs_exactly_the_sparse_decoder_linears_and_round_trips(tmp_path):
    tensors = write_model(tmp_path / "hf", dense_linear="mlp.up_proj", layer1_pattern=(8, 16))
    manifest = pack_checkpoint(tmp_path / "hf", tmp_path / "packed")
    state, loaded_manifest = load_packed_checkpoint(tmp_path / "packed")
    assert loaded_manifest == manifest and set(state) == set(tensors)
    for name, original in tensors.items():
        packed_expected = ".layers." in name and name.endswith("_proj.weight") and "layers.0.mlp.up_proj" not in name
        assert isinstance(state[name], PackedNM) == packed_expected, name
        restored = state[name].to_dense() if packed_expected else state[name]
        assert torch.equal(restored, original), name
    assert state["model.layers.0.mlp.gate_proj.weight"].pattern == "2:4"
    assert state["model.layers.1.mlp.gate_proj.weight"].pattern == "8:16"  # 8:16 but not 2:4 sparse
    assert manifest["patterns"] == ["2:4", "8:16"] and manifest["pattern"] == "auto"
    assert manifest["tensors"]["model.layers.0.self_attn.q_proj.weight"] == {
        "file": "model-00001-of-00002.safetensors", "shape": [32, 64], "dtype": "bfloat16", "pattern": "2:4"}
    for shard, digest in manifest["source"]["safetensors_sha256"].items():
        assert digest == hashlib.sha256((tmp_path / "hf" / shard).read_bytes()).hexdigest()
    assert json.loads((tmp_path / "packed" / "config.json").read_text())["model_type"] == "llama"


def test_explicit_pattern_fails_on_a_dense_linear_and_leaves_nothing(tmp_path):
    write_model(tmp_path / "hf", dense_linear="self_attn.o_proj")
    with pytest.raises(PackingError, match=r"model\.layers\.0\.self_attn\.o_proj\.weight: weight is not 2:4 sparse"):
        pack_checkpoint(tmp_path / "hf", tmp_path / "packed", pattern="2:4")
    assert not (tmp_path / "packed").exists() and not (tmp_path / "packed.partial").exists()


def test_existing_output_needs_overwrite(tmp_path):
    write_model(tmp_path / "hf")
    (tmp_path / "packed").mkdir()
    (tmp_path / "packed" / "old.txt").write_text("old")
    with pytest.raises(OutputExistsError, match="--overwrite"):
        pack_checkpoint(tmp_path / "hf", tmp_path / "packed", pattern="2:4")
    pack_checkpoint(tmp_path / "hf", tmp_path / "packed", pattern="2:4", overwrite=True)
    assert not (tmp_path / "packed" / "old.txt").exists()
    assert (tmp_path / "packed" / PACKED_MANIFEST).is_file()


def test_a_folder_packed_under_the_old_manifest_name_still_loads(tmp_path):
    write_model(tmp_path / "hf")
    pack_checkpoint(tmp_path / "hf", tmp_path / "packed", pattern="2:4")
    expected, _ = load_packed_checkpoint(tmp_path / "packed")
    (tmp_path / "packed" / PACKED_MANIFEST).rename(tmp_path / "packed" / "manifest.json")
    state, manifest = load_packed_checkpoint(tmp_path / "packed")
    assert manifest["patterns"] == ["2:4"] and state.keys() == expected.keys()
    assert all(torch.equal(state[k].values, expected[k].values) and torch.equal(state[k].bitmask, expected[k].bitmask)
               if isinstance(state[k], PackedNM) else torch.equal(state[k], expected[k]) for k in state)


def test_missing_model_folder(tmp_path):
    with pytest.raises(ModelNotFoundError, match="safetensors"):
        pack_checkpoint(tmp_path / "nowhere", tmp_path / "packed")


def test_load_rejects_a_manifest_whose_tensor_is_missing(tmp_path):
    write_model(tmp_path / "hf")
    manifest = pack_checkpoint(tmp_path / "hf", tmp_path / "packed", pattern="2:4")
    manifest["tensors"]["model.extra.weight"] = {"file": "model-00002-of-00002.safetensors", "shape": [2],
                                                 "dtype": "bfloat16"}
    (tmp_path / "packed" / PACKED_MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(PackingError, match="lacks model.extra.weight"):
        load_packed_checkpoint(tmp_path / "packed")


def test_cli_pack(tmp_path, capsys):
    """On a whole pruned model: the command checks that what it packs loads (config, shapes, tokenizer) first."""
    from transformers import AutoModelForCausalLM

    folder = make_tiny_model(tmp_path / "hf")
    model = AutoModelForCausalLM.from_pretrained(folder)
    prune_in_place(model, "2:4")
    model.save_pretrained(folder)
    args = ["pack", "--model", str(folder), "--out", str(tmp_path / "packed"), "--pattern", "2:4"]
    assert main(args) == 0
    assert "packed 14 of 21 tensors (patterns: 2:4)" in capsys.readouterr().out
    assert main(args) == 2
    assert "OutputExistsError" in capsys.readouterr().err
    assert main([*args[:-1], "50%", "--overwrite"]) == 2
    assert "SparsityPatternError" in capsys.readouterr().err
    again = ["pack", "--model", str(tmp_path / "packed"), "--out", str(tmp_path / "twice")]
    assert main(again) == 2
    assert "is already a packed checkpoint (packed.json)" in capsys.readouterr().err
    assert not (tmp_path / "twice").exists()


def damage(folder, how: str) -> None:
    """Break a packed folder one way a copy or an edit can."""
    manifest_path = folder / PACKED_MANIFEST
    manifest = json.loads(manifest_path.read_text())
    q_proj = manifest["tensors"]["model.layers.0.self_attn.q_proj.weight"]
    shard = folder / q_proj["file"]
    if how == "truncated json":
        manifest_path.write_text(manifest_path.read_text()[:50])
    elif how == "a list":
        manifest_path.write_text("[]")
    elif how == "no tensors":
        manifest_path.write_text(json.dumps({key: value for key, value in manifest.items() if key != "tensors"}))
    elif how == "a bad pattern":
        q_proj["pattern"] = "2-4"
        manifest_path.write_text(json.dumps(manifest))
    elif how == "a dtype torch has not":
        q_proj["dtype"] = "int7"
        manifest_path.write_text(json.dumps(manifest))
    elif how == "a version that is a bool":
        manifest["version"] = True
        manifest_path.write_text(json.dumps(manifest))
    elif how == "a missing shard":
        shard.unlink()
    elif how == "a truncated shard":
        shard.write_bytes(shard.read_bytes()[:-100])
    elif how == "a pattern of non-ASCII digits":
        q_proj["pattern"] = "\u00b2:4"  # "²" passes str.isdigit, but int() refuses it
        manifest_path.write_text(json.dumps(manifest))
    elif how == "a packed weight listed as float64":
        q_proj["dtype"] = "float64"
        manifest_path.write_text(json.dumps(manifest))
    elif how == "a shard name too long to exist":
        q_proj["file"] = "x" * 300 + ".safetensors"
        manifest_path.write_text(json.dumps(manifest))
    elif how in ("values relabelled as int16", "a dense tensor relabelled as int16"):
        tensors = load_file(str(shard))
        name = ("model.layers.0.self_attn.q_proj.weight.values" if how.startswith("values")
                else "model.layers.0.input_layernorm.weight")
        tensors[name] = tensors[name].view(torch.int16)  # the very bytes, read as integers
        save_file(tensors, str(shard), metadata={"format": "sparsedecoding-packed-nm"})


@pytest.mark.parametrize("how, match", [
    ("truncated json", "damaged.*not valid JSON"), ("a list", "damaged.*a JSON list"),
    ("no tensors", "damaged.*no \"tensors\""), ("a bad pattern", "damaged.*pattern '2-4'"),
    ("a dtype torch has not", "damaged.*dtype 'int7'"),
    ("a version that is a bool", "manifest version True"), ("a missing shard", "is missing, though"),
    ("a truncated shard", "not a readable safetensors file"),
    ("a pattern of non-ASCII digits", "damaged.*pattern '\u00b2:4'"),
    ("a packed weight listed as float64", "damaged.*dtype 'float64'; packed weights are"),
    ("a shard name too long to exist", "lists a file that cannot exist"),
    ("values relabelled as int16", "stores .*q_proj.weight.values as int16, but .* lists bfloat16"),
    ("a dense tensor relabelled as int16", "stores .*input_layernorm.weight as int16, but .* lists bfloat16")])
def test_a_damaged_packed_folder_is_one_packing_error(tmp_path, capsys, how, match):
    write_model(tmp_path / "hf")
    pack_checkpoint(tmp_path / "hf", tmp_path / "packed", pattern="2:4")
    damage(tmp_path / "packed", how)
    with pytest.raises(PackingError, match=match):
        load_packed_checkpoint(tmp_path / "packed")


@pytest.mark.parametrize("pattern", ["auto", "2:4"])
def test_a_float8_decoder_linear_is_one_packing_error(tmp_path, pattern):
    """float8 has no isfinite kernel: the finiteness check must not be what fails first."""
    write_model(tmp_path / "hf")
    shard = tmp_path / "hf" / "model-00001-of-00002.safetensors"
    tensors = load_file(str(shard))
    name = "model.layers.0.self_attn.q_proj.weight"
    tensors[name] = tensors[name].to(torch.float8_e4m3fn)
    save_file(tensors, str(shard))
    with pytest.raises(PackingError, match=f"{name}: .*float8_e4m3fn"):
        pack_checkpoint(tmp_path / "hf", tmp_path / "packed", pattern=pattern)
    assert not (tmp_path / "packed").exists()


def test_an_hf_folder_with_another_manifest_json_is_not_taken_for_a_packed_one(tmp_path):
    from sparsedecoding.packed import packed_manifest

    write_model(tmp_path / "hf")
    (tmp_path / "hf" / "manifest.json").write_text('{"name": "someone else\'s"}')
    assert packed_manifest(tmp_path / "hf") is None
    pack_checkpoint(tmp_path / "hf", tmp_path / "packed", pattern="2:4")
    (tmp_path / "packed" / PACKED_MANIFEST).rename(tmp_path / "packed" / "manifest.json")
    assert packed_manifest(tmp_path / "packed") == tmp_path / "packed" / "manifest.json"


def test_packing_a_dense_model_fails_before_writing_anything(tmp_path, monkeypatch):
    import sparsedecoding.packed as packed

    folder = tmp_path / "hf"
    write_model(folder)
    for shard in folder.glob("*.safetensors"):  # every decoder linear dense
        tensors = load_file(str(shard))
        save_file({k: torch.randn_like(v) if "_proj" in k else v for k, v in tensors.items()}, str(shard))
    written = []
    monkeypatch.setattr(packed, "save_file", lambda *args, **kwargs: written.append(args))
    with pytest.raises(PackingError, match=r"no decoder linear .* is N:M sparse.*down_proj.weight: a group of 32 "
                                           r"columns keeps 32 weights"):
        pack_checkpoint(folder, tmp_path / "packed")
    assert written == [] and not (tmp_path / "packed.partial").exists()


@pytest.mark.parametrize("record", ['[]', '{"solver_options": [1]}',
                                    '{"solver_options": {"quantize": "int4", "group_size": "abc"}}',
                                    '{"solver_options": {"quantize": "int3"}}'])
def test_a_malformed_pruning_record_is_one_clear_error(tmp_path, record):
    from sparsedecoding.errors import ModelFileError
    from sparsedecoding.packed import recorded_quantization

    write_model(tmp_path / "hf")
    (tmp_path / "hf" / "sparsedecoding.json").write_text(record)
    with pytest.raises(ModelFileError, match="sparsedecoding.json"):
        recorded_quantization(tmp_path / "hf")
