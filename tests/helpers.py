"""Tiny random models and a character-level tokenizer, built from configs, so tests need no download."""

from __future__ import annotations

import string
from pathlib import Path

import torch

SPECIALS = ["<pad>", "<eos>", "<|im_start|>", "<|im_end|>"]
CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def char_tokenizer():
    """A fast tokenizer with one token per printable character plus chat special tokens (vocab < 128)."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    chars = list(dict.fromkeys(string.printable))
    vocab = {token: index for index, token in enumerate(SPECIALS + chars)}
    core = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="<eos>",
                                        additional_special_tokens=SPECIALS[2:])
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


def tiny_config(arch: str = "llama", **overrides):
    """2 layers, hidden 64, GQA (4 heads, 2 kv heads), vocab 128, in the named architecture."""
    from transformers import LlamaConfig, MistralConfig, Qwen2Config, Qwen3Config

    classes = {"llama": LlamaConfig, "qwen2": Qwen2Config, "qwen3": Qwen3Config, "mistral": MistralConfig}
    values = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=512, pad_token_id=0, eos_token_id=[1, 3],
                  bos_token_id=None, tie_word_embeddings=False)
    if arch in ("qwen3",):
        values["head_dim"] = 16
    values.update(overrides)
    return classes[arch](**values)


def make_tiny_model(folder: Path, arch: str = "llama", seed: int = 0, **overrides) -> Path:
    """Save a random tiny causal LM (float32) and the character tokenizer as an HF folder."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(tiny_config(arch, **overrides), dtype=torch.float32)
    model.generation_config.eos_token_id = [1, 3]
    model.generation_config.pad_token_id = 0
    model.save_pretrained(folder)
    char_tokenizer().save_pretrained(folder)
    return folder
