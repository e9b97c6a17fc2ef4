"""Model arguments of the decode engine: one dataclass, the named presets as data, and construction from an HF
`config.json` for the architectures the engine implements (Llama-3.x, Qwen2, Qwen3, Mistral)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..errors import EngineError, ModelFileError, ModelNotFoundError, UnsupportedArchitectureError
from ..models import check_loadable, check_model_files, describe_error, read_config


@dataclass(frozen=True)
class Llama3RopeScaling:
    """Llama-3.1's frequency-dependent RoPE scaling: wavelengths longer than `original_max_position_embeddings /
    low_freq_factor` are stretched by `factor`, shorter than `original_max_position_embeddings / high_freq_factor`
    are kept, and the band in between is interpolated linearly in `original_max_position_embeddings / wavelength`."""

    factor: float
    low_freq_factor: float
    high_freq_factor: float
    original_max_position_embeddings: int


@dataclass(frozen=True)
class ModelArgs:
    """Shape and flavour of a pre-norm decoder: RMSNorm, rotary attention with grouped KV heads, SwiGLU MLP.

    `qkv_bias` adds a bias to the q, k and v projections (Qwen2); `qk_norm` applies an RMSNorm over the head dimension
    to queries and keys before RoPE (Qwen3); `tie_embeddings` makes lm_head share the embedding matrix;
    `sliding_window`, when set, is the attention window of the checkpoint (Mistral): the engine attends to the whole
    cache, which is the same computation as long as its cache is no longer than the window, so the engine refuses
    longer caches instead of approximating."""

    architecture: str
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float
    rope_theta: float
    rope_scaling: Llama3RopeScaling | None = None
    qkv_bias: bool = False
    qk_norm: bool = False
    tie_embeddings: bool = False
    sliding_window: int | None = None

    @property
    def qkv_size(self) -> int:
        """Rows of the fused q|k|v projection."""
        return (self.n_heads + 2 * self.n_kv_heads) * self.head_dim

    def n_params(self) -> int:
        """Parameter count as transformers reports it (a tied lm_head is counted once)."""
        attention = self.dim * self.qkv_size + self.n_heads * self.head_dim * self.dim
        attention += self.qkv_size if self.qkv_bias else 0
        attention += 2 * self.head_dim if self.qk_norm else 0
        mlp = 3 * self.dim * self.intermediate_size
        layer = attention + mlp + 2 * self.dim
        embeddings = self.vocab_size * self.dim * (1 if self.tie_embeddings else 2)
        return self.n_layers * layer + embeddings + self.dim


_LLAMA3_ROPE = Llama3RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                                 original_max_position_embeddings=8192)

# Architecture configs of the published checkpoints (their config.json files), for random-weight speed runs.
PRESETS: dict[str, ModelArgs] = {
    "llama-3.1-8b": ModelArgs(
        architecture="llama", vocab_size=128256, dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, head_dim=128,
        intermediate_size=14336, norm_eps=1e-5, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE),
    "llama-3.3-70b": ModelArgs(
        architecture="llama", vocab_size=128256, dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, head_dim=128,
        intermediate_size=28672, norm_eps=1e-5, rope_theta=500000.0, rope_scaling=_LLAMA3_ROPE),
    "qwen3-14b": ModelArgs(
        architecture="qwen3", vocab_size=151936, dim=5120, n_layers=40, n_heads=40, n_kv_heads=8, head_dim=128,
        intermediate_size=17408, norm_eps=1e-6, rope_theta=1000000.0, qk_norm=True),
    "qwen3-32b": ModelArgs(
        architecture="qwen3", vocab_size=151936, dim=5120, n_layers=64, n_heads=64, n_kv_heads=8, head_dim=128,
        intermediate_size=25600, norm_eps=1e-6, rope_theta=1000000.0, qk_norm=True),
    "qwen2.5-coder-1.5b": ModelArgs(
        architecture="qwen2", vocab_size=151936, dim=1536, n_layers=28, n_heads=12, n_kv_heads=2, head_dim=128,
        intermediate_size=8960, norm_eps=1e-6, rope_theta=1000000.0, qkv_bias=True, tie_embeddings=True),
    "smollm2-135m": ModelArgs(
        architecture="llama", vocab_size=49152, dim=576, n_layers=30, n_heads=9, n_kv_heads=3, head_dim=64,
        intermediate_size=1536, norm_eps=1e-5, rope_theta=100000.0, tie_embeddings=True),
}

# What each supported HF `model_type` implies beyond its config.json fields.
_ARCHITECTURES: dict[str, dict[str, bool]] = {
    "llama": {"qkv_bias": False, "qk_norm": False},
    "mistral": {"qkv_bias": False, "qk_norm": False},
    "qwen2": {"qkv_bias": True, "qk_norm": False},
    "qwen3": {"qkv_bias": False, "qk_norm": True},
}


def preset(name: str) -> ModelArgs:
    """The architecture config of a named checkpoint, e.g. `llama-3.1-8b`."""
    if name not in PRESETS:
        raise EngineError(f"unknown preset {name!r}; choose one of {', '.join(PRESETS)}")
    return PRESETS[name]


def from_hf_config(config: dict[str, Any]) -> ModelArgs:
    """ModelArgs from the dict of an HF `config.json` (transformers 4 `rope_scaling` or 5 `rope_parameters`)."""
    model_type = config.get("model_type")
    if model_type not in _ARCHITECTURES:
        raise UnsupportedArchitectureError(
            f"model_type {model_type!r} is not supported by the engine; supported: {', '.join(_ARCHITECTURES)}")
    _refuse_unsupported_features(config)
    n_heads = config["num_attention_heads"]
    if config.get("num_key_value_heads") is None and model_type != "llama":
        # transformers' default differs by family (Mistral 8, Qwen 32, Llama the head count): not guessed here
        raise UnsupportedArchitectureError(f"config.json of this {model_type} model lacks num_key_value_heads; add "
                                           "it (the checkpoint's k_proj rows / head_dim)")
    return ModelArgs(
        architecture=model_type,
        vocab_size=config["vocab_size"],
        dim=config["hidden_size"],
        n_layers=config["num_hidden_layers"],
        n_heads=n_heads,
        n_kv_heads=config.get("num_key_value_heads") or n_heads,
        head_dim=config.get("head_dim") or config["hidden_size"] // n_heads,
        intermediate_size=config["intermediate_size"],
        norm_eps=config["rms_norm_eps"],
        rope_theta=_rope(config).get("rope_theta", config.get("rope_theta", 10000.0)),
        rope_scaling=_llama3_scaling(config),
        tie_embeddings=config.get("tie_word_embeddings", False),
        sliding_window=_sliding_window(config),
        **_ARCHITECTURES[model_type],
    )


def load_hf_config(folder: str | Path) -> ModelArgs:
    """ModelArgs from `folder/config.json`; ModelFileError when the file does not parse or lacks a field."""
    path = Path(folder) / "config.json"
    if not path.is_file():
        raise ModelNotFoundError(f"{path} does not exist; pass an HF model folder (config.json + *.safetensors)")
    try:
        return from_hf_config(read_config(path.parent))
    except KeyError as exc:
        raise ModelFileError(f"{path} lacks {exc}; restore it from the model's source") from None
    except (TypeError, ZeroDivisionError, AttributeError) as exc:  # a field of the wrong kind, or 0 heads
        raise ModelFileError(f"{path} holds a value the engine cannot use ({describe_error(exc)}); restore it from "
                             f"the model's source") from None


def check_model_folder(folder: str | Path, tokenizer: bool = True) -> ModelArgs:
    """ModelArgs of an HF or packed checkpoint folder whose files are checked first, as `models.resolve_model`
    checks them before pruning: config.json parses, names an architecture the engine runs and is accepted by
    transformers, the other JSON files parse, the special-token ids are ids, every safetensors file (packed shards
    included) has a whole header, an HF folder's tensors have the shapes its config implies and, with `tokenizer`,
    the tokenizer loads; so that a truncated or mismatched copy fails before any loading. Only headers are read."""
    from ..packed import packed_manifest

    folder = Path(folder)
    if not folder.is_dir():
        raise ModelNotFoundError(f"{folder} is not a folder; pass an HF model folder or a packed checkpoint")
    args = load_hf_config(folder)
    manifest = packed_manifest(folder)  # the packed loader checks its manifest, with advice of its own
    shards = check_model_files(folder, skip=manifest)
    check_loadable(folder, None if manifest else shards, tokenizer)
    return args


def _rope(config: dict[str, Any]) -> dict[str, Any]:
    return config.get("rope_parameters") or config.get("rope_scaling") or {}


def _llama3_scaling(config: dict[str, Any]) -> Llama3RopeScaling | None:
    rope = _rope(config)
    if rope.get("rope_type", rope.get("type", "default")) != "llama3":
        return None
    return Llama3RopeScaling(
        factor=rope["factor"], low_freq_factor=rope["low_freq_factor"], high_freq_factor=rope["high_freq_factor"],
        original_max_position_embeddings=rope["original_max_position_embeddings"])


def _sliding_window(config: dict[str, Any]) -> int | None:
    # Qwen configs carry a `sliding_window` value that only applies when `use_sliding_window` is set.
    if config["model_type"].startswith("qwen") and not config.get("use_sliding_window", False):
        return None
    if config["model_type"] == "mistral" and "sliding_window" not in config:
        return 4096  # transformers' MistralConfig default, which a config without the key gets there
    return config.get("sliding_window")


def _refuse_unsupported_features(config: dict[str, Any]) -> None:
    model_type = config["model_type"]
    rope = _rope(config)
    rope_type = rope.get("rope_type", rope.get("type", "default"))
    problems = []
    if rope_type not in ("default", "llama3"):
        problems.append(f"RoPE type {rope_type!r} (supported: default, llama3)")
    if rope.get("partial_rotary_factor", 1.0) != 1.0:
        problems.append("partial rotary embeddings")
    if config.get("hidden_act", "silu") != "silu":
        problems.append(f"activation {config['hidden_act']!r} (supported: silu)")
    if model_type != "qwen2" and config.get("attention_bias", False):
        problems.append("attention_bias=true")
    if config.get("mlp_bias", False):
        problems.append("mlp_bias=true")
    if problems:
        raise UnsupportedArchitectureError(f"{model_type} with {', '.join(problems)} is not supported by the engine")
