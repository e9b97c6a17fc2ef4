"""The compiled decode engine: one compact transformer for Llama-3.x, Qwen2, Qwen3 and Mistral with a static KV
cache, fused qkv and gate/up linears that are dense or packed N:M, and a decode step captured in a CUDA graph."""

from .config import PRESETS, ModelArgs, from_hf_config, load_hf_config, preset
from .generate import Engine, Generation, Sampling
from .loading import (build_model, keep_dense_copies, load_model, model_from_hf, random_state,
                      resident_weight_bytes, weight_bytes)
from .model import Transformer

__all__ = [
    "PRESETS", "Engine", "Generation", "ModelArgs", "Sampling", "Transformer", "build_model", "from_hf_config",
    "keep_dense_copies", "load_hf_config", "load_model", "model_from_hf", "preset", "random_state",
    "resident_weight_bytes", "weight_bytes",
]
