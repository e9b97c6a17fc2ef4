"""`save_packed`: a sparsified (or `load_packed`) transformers model written as a packed checkpoint folder that
`load_packed` reads back to the same model (tensors and logits bit for bit), with bf16 or quantized values, tied
or untied output embeddings, a quantized lm_head, tiled `Sp24Linear`s; the tokenizer and pruning record carried
over; bad calls refused before anything is written. Also `DenseQuantized.to_dense`, which the quantized head needs,
in each of its layouts."""

import json

import pytest
import torch
from torch import nn

from sparsedecoding import load_packed, save_packed, sparsify
from sparsedecoding.errors import OutputExistsError, OutputNotWritableError, PackingError
from sparsedecoding.kernels.quantized_linear import DenseQuantizedLinear, QuantizedPackedLinear
from sparsedecoding.packed import pack_checkpoint

from helpers import make_tiny_model
from test_sparsify import TILEABLE, TOKENS, prune_all_but_one, quantized_tiny


def pruned_folder(tmp_path, arch: str, tied: bool):
    """A tiny model folder (tokenizer included) pruned 2:4 by magnitude but for DENSE_LEFT, and the model loaded
    from it in bfloat16."""
    from transformers import AutoModelForCausalLM

    make_tiny_model(tmp_path / f"{arch}-dense", arch=arch, tie_word_embeddings=tied)
    model = AutoModelForCausalLM.from_pretrained(tmp_path / f"{arch}-dense", dtype=torch.bfloat16)
    prune_all_but_one(model)
    model.generation_config.eos_token_id = [3]
    folder = tmp_path / f"{arch}-pruned"
    model.save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (folder / name).write_bytes((tmp_path / f"{arch}-dense" / name).read_bytes())
    return folder, AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).eval()


def assert_same_model(loaded: nn.Module, expected: nn.Module) -> None:
    want, got = expected.state_dict(), loaded.state_dict()
    assert set(got) == set(want)
    assert all(got[key].dtype == want[key].dtype and torch.equal(got[key], want[key]) for key in want)
    assert [type(m) for m in loaded.modules()] == [type(m) for m in expected.modules()]
    with torch.no_grad():
        assert torch.equal(loaded(TOKENS).logits, expected(TOKENS).logits)


@pytest.mark.parametrize("arch,tied", [("qwen2", True), ("llama", False), ("qwen3", True), ("mistral", False)])
def test_a_sparsified_model_saved_loads_back_as_the_same_model(tmp_path, arch, tied):
    """sparsify → save_packed → load_packed gives the same modules, tensors, logits and generation config, the tie
    restored; the folder holds the tokenizer and model card of the folder the model came from (not its weight
    index) and the same packed tensors as `sparsedecoding pack` of that folder."""
    folder, model = pruned_folder(tmp_path, arch, tied)
    (folder / "README.md").write_text("a model card")
    (folder / "pytorch_model.bin.index.json").write_text("{}")  # a stale index of weights the folder lacks
    model, _ = sparsify(model)
    assert save_packed(model, tmp_path / "saved") == tmp_path / "saved"
    loaded = load_packed(tmp_path / "saved")
    assert_same_model(loaded, model)
    assert (loaded.lm_head.weight is loaded.model.embed_tokens.weight) == tied
    assert loaded.generation_config.eos_token_id == [3]
    files = {path.name for path in (tmp_path / "saved").iterdir()}
    assert {"tokenizer.json", "tokenizer_config.json", "README.md"} <= files
    assert "pytorch_model.bin.index.json" not in files and "sparsedecoding.json" not in files
    assert not list(tmp_path.glob("*.partial"))
    pack_checkpoint(folder, tmp_path / "packed")
    ours = json.loads((tmp_path / "saved" / "packed.json").read_text())["tensors"]
    theirs = json.loads((tmp_path / "packed" / "packed.json").read_text())["tensors"]
    assert {name: info.get("pattern") for name, info in ours.items()} == \
        {name: info.get("pattern") for name, info in theirs.items()}
    assert sum("pattern" in info for info in ours.values()) == 13


@pytest.mark.parametrize("quantize", ["int8", "int4"])
@pytest.mark.parametrize("tied", [False, True])
def test_quantized_values_and_head_are_saved_and_rebuilt(tmp_path, quantize, tied):
    """A model with codes in its packed linears and an int8 lm_head (sparsify(quantize=, head="int8")) saves as
    codes, and its head as the dequantized weight with `quantize_head` recorded, so that load_packed rebuilds both
    exactly (a model loaded by from_pretrained: its rotary buffers are float32, as load_packed's)."""
    from transformers import AutoModelForCausalLM

    quantized_tiny(quantize, tied=tied).save_pretrained(tmp_path / "grid")
    grid = AutoModelForCausalLM.from_pretrained(tmp_path / "grid", dtype=torch.bfloat16).eval()
    model, _ = sparsify(grid, quantize=quantize, group_size=32, head="int8")
    save_packed(model, tmp_path / "saved")
    record = json.loads((tmp_path / "saved" / "sparsedecoding.json").read_text())
    assert record["solver_options"]["quantize_head"] == "int8"
    manifest = json.loads((tmp_path / "saved" / "packed.json").read_text())
    assert manifest["quantize"] == quantize and manifest["tensors"]["lm_head.weight"]["dtype"] == "bfloat16"
    loaded = load_packed(tmp_path / "saved")
    assert isinstance(loaded.lm_head, DenseQuantizedLinear)
    assert sum(isinstance(m, QuantizedPackedLinear) for m in loaded.modules()) == 14
    assert_same_model(loaded, model)


def test_a_head_kept_bf16_is_recorded_so_and_tiled_linears_are_saved_untiled(tmp_path):
    """From a folder whose pruning record says lm_head is on the int8 grid, sparsify(head=None) keeps it bf16:
    the saved record says so (load_packed would otherwise quantize it). Sp24Linears (tiled on the CPU here) save
    as the packed weights they were tiled from."""
    from transformers import AutoModelForCausalLM

    from sparsedecoding.kernels.sp24_linear import Sp24Linear, tile_model

    quantized_tiny("int8", **TILEABLE).save_pretrained(tmp_path / "grid")
    record = {"solver_options": {"quantize": "int8", "quantize_head": "int8", "group_size": 128}, "seed": 7}
    (tmp_path / "grid" / "sparsedecoding.json").write_text(json.dumps(record))
    grid = AutoModelForCausalLM.from_pretrained(tmp_path / "grid", dtype=torch.bfloat16).eval()
    model, summary = sparsify(grid, head=None)
    assert summary.quantize == "int8" and type(model.lm_head) is nn.Linear
    untiled = load_packed(save_packed(model, tmp_path / "untiled"))
    assert tile_model(model, require_cuda=False) == 14
    assert sum(isinstance(m, Sp24Linear) for m in model.modules()) == 14
    save_packed(model, tmp_path / "saved")
    saved = json.loads((tmp_path / "saved" / "sparsedecoding.json").read_text())
    assert saved["solver_options"]["quantize_head"] == "none" and saved["seed"] == 7
    loaded = load_packed(tmp_path / "saved")
    assert type(loaded.lm_head) is nn.Linear
    assert_same_model(loaded, untiled)


def test_a_load_packed_model_saves_to_the_folder_it_came_from_only_by_refusal(tmp_path):
    """load_packed → save_packed elsewhere round-trips; over its own folder, over an existing folder without
    overwrite, or of a model with no packed linear, one error and nothing written or changed."""
    from transformers import AutoModelForCausalLM

    folder, _ = pruned_folder(tmp_path, "llama", False)
    pack_checkpoint(folder, tmp_path / "packed")
    model = load_packed(tmp_path / "packed")
    assert_same_model(load_packed(save_packed(model, tmp_path / "again")), model)
    before = sorted((path.name, path.stat().st_mtime_ns) for path in (tmp_path / "packed").iterdir())
    with pytest.raises(OutputNotWritableError, match="would overwrite the input"):
        save_packed(model, tmp_path / "packed", overwrite=True)
    with pytest.raises(OutputExistsError, match="pass --overwrite"):
        save_packed(model, tmp_path / "again")
    assert sorted((path.name, path.stat().st_mtime_ns) for path in (tmp_path / "packed").iterdir()) == before
    save_packed(model, tmp_path / "again", overwrite=True)
    dense = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16)
    with pytest.raises(PackingError, match="holds no packed linear: sparsify it first"):
        save_packed(dense, tmp_path / "dense")
    assert not (tmp_path / "dense").exists() and not list(tmp_path.glob("*.partial"))


def test_a_model_without_a_source_folder_saves_with_the_tokenizer_given(tmp_path, caplog):
    """A model built in memory has no folder to take a tokenizer from: save_packed warns, or writes the one given."""
    from helpers import char_tokenizer

    model, _ = sparsify(quantized_tiny("int8"), quantize="int8", group_size=32)
    with caplog.at_level("WARNING", logger="sparsedecoding.swap"):
        save_packed(model, tmp_path / "bare")
    assert "no tokenizer given" in caplog.text
    assert not any(path.name.startswith("tokenizer") for path in (tmp_path / "bare").iterdir())
    caplog.clear()
    with caplog.at_level("WARNING", logger="sparsedecoding.swap"):
        save_packed(model, tmp_path / "with", tokenizer=char_tokenizer())
    assert "no tokenizer" not in caplog.text and (tmp_path / "with" / "tokenizer_config.json").is_file()
    assert isinstance(load_packed(tmp_path / "with").model.layers[0].mlp.up_proj, QuantizedPackedLinear)


@pytest.mark.parametrize("quantize,layout", [("int8", "triton"), ("int8", "sp24"), ("int4", "tinygemm"),
                                             ("int4", "triton"), ("int4", "sp24")])
def test_dense_quantized_to_dense_is_the_grid_in_every_layout(monkeypatch, quantize, layout):
    """`DenseQuantized.to_dense` gives back the weight it was built from, exactly, in each layout the dense int8 /
    int4 kernels use (chosen by their settings; all of them build on the CPU), three row tiles of 16 and
    columns beyond the 1024 identity rows tinygemm's reader takes at a time."""
    from sparsedecoding import solvers
    from sparsedecoding.kernels.quantized import DenseQuantized

    monkeypatch.setenv("SPARSEDECODING_DENSE_INT8" if quantize == "int8" else "SPARSEDECODING_DENSE_INT4", layout)
    torch.manual_seed(0)
    weight = solvers.gptq(torch.randn(48, 1280), torch.eye(1280), quantize, group_size=64).bfloat16()
    dense = DenseQuantized.from_codes(solvers.quantization_codes(weight, quantize, 64))
    expected = {"triton": "torch" if quantize == "int8" else "w4", "tinygemm": "torch", "sp24": "sp24"}[layout]
    assert dense.layout == expected
    back = dense.to_dense(torch.bfloat16)
    assert back.dtype == torch.bfloat16 and back.shape == weight.shape and torch.equal(back, weight)


@pytest.mark.gpu
@pytest.mark.parametrize("quantize", [None, "int4"])
def test_cuda_tiled_model_with_an_sp24_head_saves_and_loads_back(tmp_path, quantize):
    """On CUDA: a model sparsify tiled for the sparse tensor-core kernel (bf16 or int4 values; int4 with an int8
    lm_head in that kernel's dense layout, read back through one expansion launch) saves and loads back on CUDA
    to the same tiled modules and logits."""
    from transformers import AutoModelForCausalLM

    from sparsedecoding.kernels.sp24_linear import Sp24Linear
    from test_sparsify import pruned_tiny

    if quantize is None:
        pruned_tiny("qwen2", overrides=TILEABLE).save_pretrained(tmp_path / "grid")
    else:
        quantized_tiny(quantize, **TILEABLE).save_pretrained(tmp_path / "grid")
    grid = AutoModelForCausalLM.from_pretrained(tmp_path / "grid", dtype=torch.bfloat16).cuda().eval()
    head = None if quantize is None else "int8"
    model, summary = sparsify(grid, quantize=quantize, group_size=32, head=head, tile=True)
    assert summary.tiled == len(summary.swapped)
    if head is not None:
        assert model.lm_head.layout == "sp24"
    loaded = load_packed(save_packed(model, tmp_path / "saved"), device="cuda", tile=True)
    assert {name for name, m in loaded.named_modules() if isinstance(m, Sp24Linear)} == set(summary.swapped)
    tokens = TOKENS.cuda()
    with torch.no_grad():
        assert torch.equal(loaded(tokens).logits, model(tokens).logits)


def test_a_given_tokenizer_replaces_the_source_folders_and_a_compiled_model_saves_as_itself(tmp_path):
    """With tokenizer= none of the source folder's tokenizer files is carried (its chat template would otherwise
    outlive the given tokenizer's); a torch.compile wrapper saves the model it wraps."""
    from helpers import char_tokenizer

    folder, model = pruned_folder(tmp_path, "llama", False)
    (folder / "chat_template.jinja").write_text("{{ messages }}")
    tokenizer = char_tokenizer()
    tokenizer.chat_template = None
    model, _ = sparsify(model)
    save_packed(torch.compile(model), tmp_path / "saved", tokenizer=tokenizer)
    files = {path.name for path in (tmp_path / "saved").iterdir()}
    assert "chat_template.jinja" not in files and "tokenizer_config.json" in files
    assert not [name for name in json.loads((tmp_path / "saved" / "packed.json").read_text())["tensors"]
                if name.startswith("_orig_mod")]
    assert_same_model(load_packed(tmp_path / "saved"), model)


def test_what_cannot_be_saved_is_refused_before_writing(tmp_path):
    """A model that is not a transformers model, and a source pruning record that is not one: one error, nothing
    written."""
    from sparsedecoding.errors import ModelFileError
    from sparsedecoding.kernels import PackedLinear

    bare = nn.Sequential(PackedLinear.from_dense(torch.zeros(16, 64, dtype=torch.bfloat16), 2, 4))
    with pytest.raises(PackingError, match="writes transformers models; this Sequential is not one"):
        save_packed(bare, tmp_path / "bare")
    folder, model = pruned_folder(tmp_path, "llama", False)
    (folder / "sparsedecoding.json").write_text(json.dumps({"solver_options": "int8"}))
    model, _ = sparsify(model, quantize=None, head=None)
    with pytest.raises(ModelFileError, match="is not a pruning record"):
        save_packed(model, tmp_path / "saved")
    assert not [path for path in tmp_path.iterdir() if path.name.startswith(("bare", "saved"))]


def test_shared_biases_save_and_the_record_follows_the_values_the_model_holds(tmp_path):
    """Two packed linears sharing one bias (safetensors refuses shared storage) save as two copies. The record
    says how the values are held: bf16 values from a folder whose record said int8 make "none", int8 values of a
    model with no record make a record saying int8, so that sparsify of the folder's dense weights (quantize
    "auto") makes the modules load_packed makes."""
    from transformers import AutoModelForCausalLM

    from sparsedecoding.models import unpacked_state
    from test_sparsify import pruned_tiny

    model = pruned_tiny("qwen2")
    model.model.layers[1].self_attn.q_proj.bias = model.model.layers[0].self_attn.q_proj.bias
    model, _ = sparsify(model)
    loaded = load_packed(save_packed(model, tmp_path / "shared"))
    assert torch.equal(loaded.model.layers[1].self_attn.q_proj.bias, model.model.layers[0].self_attn.q_proj.bias)

    quantized_tiny("int8").save_pretrained(tmp_path / "grid")
    (tmp_path / "grid" / "sparsedecoding.json").write_text(json.dumps({"solver_options": {"quantize": "int8"}}))
    grid = AutoModelForCausalLM.from_pretrained(tmp_path / "grid", dtype=torch.bfloat16)
    bf16, _ = sparsify(grid, quantize=None)
    codes, _ = sparsify(quantized_tiny("int8"), quantize="int8", group_size=32)
    for name, model, expected in (("bf16", bf16, "none"), ("codes", codes, "int8")):
        save_packed(model, tmp_path / name)
        record = json.loads((tmp_path / name / "sparsedecoding.json").read_text())
        assert record["solver_options"]["quantize"] == expected
        dense = AutoModelForCausalLM.from_config(load_packed(tmp_path / name).config, dtype=torch.bfloat16)
        dense.load_state_dict(unpacked_state(tmp_path / name), strict=False)
        dense.name_or_path = str(tmp_path / name)
        again, summary = sparsify(dense)
        assert summary.quantize == (None if expected == "none" else expected), name
        types = {type(m) for m in load_packed(tmp_path / name).modules()}
        assert types >= {type(m) for m in again.modules()} - {nn.Linear}


def test_each_tiled_linear_is_untiled_once(tmp_path, monkeypatch):
    """save_packed reads each Sp24Linear's packed weight once (state_dict would untile every one a second time)."""
    from sparsedecoding.kernels.sp24_linear import Sp24Linear, tile_model

    model, _ = sparsify(quantized_tiny("int8", **TILEABLE), quantize="int8", group_size=32)
    assert tile_model(model, require_cuda=False) == 14
    calls = []
    original = Sp24Linear.packed
    monkeypatch.setattr(Sp24Linear, "packed", property(lambda self: calls.append(1) or original.fget(self)))
    save_packed(model, tmp_path / "saved", overwrite=True)
    assert len(calls) == 14


@pytest.mark.gpu
def test_a_tinygemm_head_built_on_the_cpu_and_moved_to_cuda_saves_its_own_weight(tmp_path, monkeypatch):
    """tinygemm's int4 layout is the device's: a head sparsify laid out on the CPU and then moved to CUDA (with the
    model) is read on the CPU, where its layout is known, and saves the weight it was built from."""
    monkeypatch.setenv("SPARSEDECODING_DENSE_INT4", "tinygemm")
    from sparsedecoding import solvers

    grid = quantized_tiny("int8")
    with torch.no_grad():
        grid.lm_head.weight.copy_(solvers.gptq(grid.lm_head.weight.float(), torch.eye(64), "int4", group_size=32))
    expected = grid.lm_head.weight.detach().clone()
    model, _ = sparsify(grid, quantize="int8", group_size=32, head="int4", tile=False)
    assert model.lm_head.layout_device == "cpu"
    model.cuda()
    save_packed(model, tmp_path / "saved")
    from safetensors.torch import load_file

    assert torch.equal(load_file(str(tmp_path / "saved" / "model.safetensors"))["lm_head.weight"], expected)


def test_load_packed_of_a_folder_whose_config_transformers_refuses_is_one_error(tmp_path):
    from sparsedecoding.errors import ModelFileError

    _, model = pruned_folder(tmp_path, "llama", False)
    save_packed(sparsify(model)[0], tmp_path / "saved")
    config = json.loads((tmp_path / "saved" / "config.json").read_text())
    (tmp_path / "saved" / "config.json").write_text(json.dumps({**config, "num_attention_heads": 0}))
    with pytest.raises(ModelFileError, match="the config cannot be loaded"):
        load_packed(tmp_path / "saved")
