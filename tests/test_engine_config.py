"""Engine model arguments: presets as data, construction from HF configs, refusal of what the engine lacks."""

import pytest
from helpers import tiny_config

from sparsedecoding.engine.config import PRESETS, Llama3RopeScaling, from_hf_config, load_hf_config, preset
from sparsedecoding.errors import EngineError, ModelNotFoundError, UnsupportedArchitectureError

# Parameter counts of the published checkpoints as transformers reports them.
PUBLISHED_PARAMS = {
    "llama-3.1-8b": 8_030_261_248,
    "llama-3.3-70b": 70_553_706_496,
    "qwen3-14b": 14_768_307_200,
    "qwen3-32b": 32_762_123_264,
    "qwen2.5-coder-1.5b": 1_543_714_304,
    "smollm2-135m": 134_515_008,
}


def test_presets_have_the_published_parameter_counts():
    assert set(PRESETS) == set(PUBLISHED_PARAMS)
    for name, count in PUBLISHED_PARAMS.items():
        assert preset(name).n_params() == count, name


def test_engine_model_of_every_preset_has_the_published_parameter_count():
    import torch

    from sparsedecoding.engine.model import Transformer

    for name, count in PUBLISHED_PARAMS.items():
        with torch.device("meta"):
            model = Transformer(preset(name))
        tied = preset(name).tie_embeddings
        assert sum(p.numel() for p in model.parameters()) - tied * model.output.weight.numel() == count, name


def test_preset_parameter_count_matches_transformers_model_of_same_config():
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    args = preset("qwen3-14b")
    config = Qwen3Config(vocab_size=args.vocab_size, hidden_size=args.dim, num_hidden_layers=2,
                         num_attention_heads=args.n_heads, num_key_value_heads=args.n_kv_heads,
                         head_dim=args.head_dim, intermediate_size=args.intermediate_size, tie_word_embeddings=False)
    with torch.device("meta"):
        model = Qwen3ForCausalLM(config)
    two_layers = from_hf_config(config.to_dict())
    assert two_layers.n_params() == sum(p.numel() for p in model.parameters())


def test_unknown_preset_names_the_choices():
    with pytest.raises(EngineError, match="unknown preset 'llama-9b'.*llama-3.1-8b"):
        preset("llama-9b")


@pytest.mark.parametrize("arch, qkv_bias, qk_norm", [("llama", False, False), ("mistral", False, False),
                                                       ("qwen2", True, False), ("qwen3", False, True)])
def test_architecture_features_follow_model_type(arch, qkv_bias, qk_norm):
    args = from_hf_config(tiny_config(arch).to_dict())
    assert (args.architecture, args.qkv_bias, args.qk_norm) == (arch, qkv_bias, qk_norm)
    assert (args.dim, args.n_layers, args.n_heads, args.n_kv_heads, args.vocab_size) == (64, 2, 4, 2, 128)


def test_head_dim_defaults_to_hidden_over_heads_and_is_read_when_given():
    assert from_hf_config(tiny_config("llama").to_dict()).head_dim == 16
    assert from_hf_config(tiny_config("qwen3", head_dim=32).to_dict()).head_dim == 32


def test_llama3_rope_scaling_from_transformers_5_config():
    rope = {"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}
    args = from_hf_config(tiny_config("llama", rope_parameters=rope).to_dict())
    assert args.rope_theta == 500000.0
    assert args.rope_scaling == Llama3RopeScaling(8.0, 1.0, 4.0, 8192)


def test_llama3_rope_scaling_from_transformers_4_config():
    config = tiny_config("llama").to_dict()
    config.pop("rope_parameters", None)
    config["rope_theta"] = 500000.0
    config["rope_scaling"] = {"type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                              "original_max_position_embeddings": 8192}
    args = from_hf_config(config)
    assert args.rope_theta == 500000.0
    assert args.rope_scaling.factor == 32.0


def test_sliding_window_is_kept_for_mistral_and_ignored_when_qwen_disables_it():
    assert from_hf_config(tiny_config("mistral", sliding_window=4096).to_dict()).sliding_window == 4096
    assert from_hf_config(tiny_config("qwen2", sliding_window=4096, use_sliding_window=False).to_dict()) \
        .sliding_window is None


def test_a_mistral_config_without_a_sliding_window_gets_transformers_default():
    config = tiny_config("mistral").to_dict()
    config.pop("sliding_window", None)
    assert from_hf_config(config).sliding_window == 4096


@pytest.mark.parametrize("change, message", [
    ({"model_type": "gpt2"}, "model_type 'gpt2' is not supported"),
    ({"rope_parameters": {"rope_type": "yarn", "rope_theta": 1e6, "factor": 4.0}}, "RoPE type 'yarn'"),
    ({"attention_bias": True}, "attention_bias=true"),
    ({"hidden_act": "gelu"}, "activation 'gelu'"),
])
def test_unsupported_configs_fail_with_one_clear_error(change, message):
    config = tiny_config("llama").to_dict() | change
    with pytest.raises(UnsupportedArchitectureError, match=message):
        from_hf_config(config)


@pytest.mark.parametrize("family", ["mistral", "qwen2", "qwen3"])
def test_a_config_without_kv_heads_is_refused_where_transformers_would_not_take_the_head_count(family):
    """transformers' default for a missing num_key_value_heads is 8 for Mistral and 32 for Qwen, not the head count
    that Llama's is: the engine says so instead of building other shapes than the checkpoint's."""
    config = tiny_config(family).to_dict()
    config.pop("num_key_value_heads")
    with pytest.raises(UnsupportedArchitectureError, match="lacks num_key_value_heads"):
        from_hf_config(config)
    llama = tiny_config("llama").to_dict()
    llama.pop("num_key_value_heads")
    assert from_hf_config(llama).n_kv_heads == llama["num_attention_heads"]


def test_missing_config_json(tmp_path):
    with pytest.raises(ModelNotFoundError, match="config.json"):
        load_hf_config(tmp_path)
