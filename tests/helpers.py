"""Shared test helpers: tiny random models and a character-level tokenizer built from configs (no download), random
N:M weights, and in-memory magnitude pruning. Test files import from here, never from each other."""

from __future__ import annotations

import importlib
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


def random_hf_model(arch: str, **overrides):
    """A tiny transformers model with every parameter random (norm weights near 1, biases nonzero)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(tiny_config(arch, **overrides), dtype=torch.float32).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.2 * torch.randn_like(p) if "norm" in name else 0.15 * torch.randn_like(p))
    return model.requires_grad_(False)


def saved(model, folder: Path) -> Path:
    model.save_pretrained(folder)
    return folder


@torch.no_grad()
def prune_in_place(hf_model, pattern) -> None:
    """Magnitude-prunes every linear inside the decoder layers of a transformers model (embeddings and lm_head stay
    dense): a pruned model for engine tests without a calibration run."""
    from sparsedecoding.solvers import magnitude

    for name, module in hf_model.named_modules():
        if isinstance(module, torch.nn.Linear) and ".layers." in name:
            module.weight.copy_(magnitude(module.weight, None, pattern))


# The N:M patterns the kernels are tested on.
PATTERNS = [(2, 4), (4, 8), (8, 16), (16, 32)]


def random_nm_weight(rows: int, cols: int, n: int, m: int, dtype=torch.bfloat16, seed: int = 0) -> torch.Tensor:
    """Random weight with at most n nonzeros per group of m; about a quarter of the groups keep fewer."""
    g = torch.Generator().manual_seed(seed)
    weight = torch.randn(rows, cols // m, m, generator=g).to(dtype)
    order = torch.rand(rows, cols // m, m, generator=g).argsort(-1)
    kept = torch.randint(0, n + 1, (rows, cols // m, 1), generator=g)
    kept = torch.where(torch.rand(rows, cols // m, 1, generator=g) < 0.75, n, kept)
    weight[order >= kept] = 0
    return weight.view(rows, cols)


SP24_BATCHES = (1, 2, 5, 8, 9, 16)  # one and two n-tiles, batches no tile divides
SP24_LAUNCHES = ((None, None), (1, 1), (3, 1), (1, 2), (3, 4), (2, 8))  # (splits, slices): tuned, split-K, slices


def sp24_outputs(w, in_features: int, dtype: torch.dtype):
    """(batch, splits, slices, x, y) for every batch of SP24_BATCHES and launch of SP24_LAUNCHES of the tiled weight
    `w` on the GPU (`sp24.sp24_mm`), skipping only the splits too few for that batch's staged x (which must be
    refused with KernelInputError)."""
    from sparsedecoding.errors import KernelInputError
    from sparsedecoding.kernels.sp24 import min_splits, sp24_mm

    for batch in SP24_BATCHES:
        x = torch.randn(batch, in_features, device="cuda").to(dtype)
        for splits, slices in SP24_LAUNCHES:
            try:
                y = sp24_mm(x, w, splits, slices)
            except KernelInputError:
                assert splits is not None and splits < min_splits(w, batch)
                continue
            yield batch, splits, slices, x, y


def fake_sp24_libraries(monkeypatch) -> list[tuple[str, ...]]:
    """Replace the sp24 library build with a stand-in (no nvcc, no GPU) and empty sp24's library cache; returns the
    list that receives the nvcc -D flags of every library built from then on, in order."""
    import sparsedecoding.kernels.sp24 as sp24
    from sparsedecoding.kernels import cuda_mma

    built: list[tuple[str, ...]] = []

    class Library:
        def __init__(self, defines):
            built.append(defines)
            self.sp24_call, self.sp24_dense_launch, self.sp24_error_string = (lambda: 0,) * 3
            self.sp24_rows_per_block = lambda: sp24.ROWS_PER_BLOCK
            self.sp24_max_smem = lambda: sp24.MAX_SMEM

    monkeypatch.setattr(cuda_mma, "open_library", lambda source, min_major, defines: Library(defines))
    monkeypatch.setattr(sp24, "_libraries", {})
    return built


BENCHMARKS = Path(__file__).parent.parent / "benchmarks"


def benchmark_module(monkeypatch, name: str):
    """The script benchmarks/NAME.py imported as a module, its folder on sys.path for the calling test only."""
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    return importlib.import_module(name)



def coded_24(quantize: str, out: int, in_features: int, group_size: int = 128, seed: int = 0, device: str = "cpu"):
    """A 2:4 `PackedNMQ` on the `quantize` grid (`test_cuda_mma_codes.grid_weight`; int8: one scale a row)."""
    from sparsedecoding.kernels.quantized import pack_nm_quantized
    from test_cuda_mma_codes import grid_weight

    group = in_features if quantize == "int8" else group_size
    return pack_nm_quantized(grid_weight(out, in_features, quantize, group, seed=seed).to(device), 2, 4, quantize,
                             group)


def slotted_codes(quantize: str, out: int, in_features: int, seed: int = 0, device: str = "cpu"):
    """A random 16:32 int8 / int4 weight (int4: 128 columns a scale) whose mask fits 16:32+2 (the engine's slotted
    weights)."""
    from sparsedecoding.engine.loading import random_quantized
    from sparsedecoding.patterns import SparsityPattern

    generator = torch.Generator(device).manual_seed(seed)
    return random_quantized(out, in_features, SparsityPattern.parse("16:32+2"), quantize, 128, torch.bfloat16, device,
                            generator)


def tile_overflow_step(split, glu: bool, step: int, quantize: str):
    """`sp24.tile_overflow` with steps of `step` k-tiles for the codes (the setting, as the engine tiles)."""
    import pytest

    from sparsedecoding.kernels.sp24 import tile_overflow

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv(f"SPARSEDECODING_SP24_{quantize.upper()}_STEP", str(step))
        return tile_overflow(split, glu)


def straight_and_resumed(monkeypatch, run, folder: Path, interrupt_on_call: int):
    """The weights of `run(folder / "straight")`, and those of `run(folder / "resumed")` first interrupted by
    `pipeline.solve_layer` raising KeyboardInterrupt on its `interrupt_on_call`-th call (after the layers solved
    before it) and then run again with the real solver, with the resumed run's record: (straight, resumed, record)."""
    import json

    import pytest
    from safetensors.torch import load_file

    from sparsedecoding import pipeline

    straight = load_file(str(run(folder / "straight") / "model.safetensors"))
    solve, calls = pipeline.solve_layer, []

    def interrupting(*args):
        calls.append(1)
        if len(calls) == interrupt_on_call:
            raise KeyboardInterrupt
        return solve(*args)

    monkeypatch.setattr(pipeline, "solve_layer", interrupting)
    with pytest.raises(KeyboardInterrupt):
        run(folder / "resumed")
    monkeypatch.setattr(pipeline, "solve_layer", solve)
    out = run(folder / "resumed")
    return straight, load_file(str(out / "model.safetensors")), json.loads((out / "sparsedecoding.json").read_text())
