import logging
from contextlib import nullcontext

import pytest

from sparsedecoding.generation import BatchStore, generate
from sparsedecoding.models import load_model
from helpers import make_tiny_model

PROMPTS = [[5 + index, 20 + index, 40 + (index % 7)] for index in range(12)]  # 6 batches of 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, tokenizer, _ = load_model(make_tiny_model(tmp_path_factory.mktemp("tiny") / "model"))
    model.generation_config.eos_token_id = [1]  # rarely chosen: continuations run to max_new_tokens
    return model, tokenizer


@pytest.fixture
def counted(tiny, monkeypatch):
    """The tiny model with its `generate` calls counted (and, when `fail_at` is set, interrupted at that call)."""
    model, _ = tiny
    calls, original = [], model.generate
    fail_at = []

    def counting(*args, **kwargs):
        calls.append(kwargs["generation_config"].max_new_tokens)
        if fail_at and len(calls) == fail_at[0]:
            raise KeyboardInterrupt
        return original(*args, **kwargs)

    monkeypatch.setattr(model, "generate", counting)
    return calls, fail_at


def consumed(generations):
    return sum(len(generation.consumed_ids) for generation in generations)


def test_a_token_budget_stops_generating_once_reached(tiny, counted):
    model, tokenizer = tiny
    calls, _ = counted
    everything = generate(model, tokenizer, PROMPTS, 8, batch_size=2, progress=False)
    assert len(calls) == 6 and all(generation is not None for generation in everything)
    calls.clear()
    budget = 20
    bounded = generate(model, tokenizer, PROMPTS, 64, batch_size=2, progress=False, token_budget=budget)
    assert len(calls) < 6  # stopped scheduling batches
    assert calls == [budget + 1] * len(calls)  # no continuation longer than the budget needs
    assert consumed(bounded) >= budget > consumed(bounded[:-2])  # the last batch was the one that reached it
    assert [generation.prompt_ids for generation in bounded] == PROMPTS[:len(bounded)]  # a prefix, in prompt order


def test_an_interrupted_generation_resumes_with_its_finished_batches(tiny, counted, tmp_path, caplog):
    model, tokenizer = tiny
    calls, fail_at = counted
    straight = generate(model, tokenizer, PROMPTS, 6, batch_size=2, progress=False, token_budget=40)
    batches = len(calls)
    assert batches >= 3
    store = BatchStore(tmp_path / "generation")
    calls.clear()
    fail_at.append(3)
    with pytest.raises(KeyboardInterrupt):
        generate(model, tokenizer, PROMPTS, 6, batch_size=2, progress=False, token_budget=40, store=store)
    assert len(list(store.folder.glob("batch-*.json"))) == 2
    calls.clear()
    fail_at.clear()
    with caplog.at_level(logging.INFO, logger="sparsedecoding.generation"):
        resumed = generate(model, tokenizer, PROMPTS, 6, batch_size=2, progress=False, token_budget=40, store=store)
    assert len(calls) == batches - 2  # the two finished batches were not generated again
    assert "resuming generation at batch 3 of 6" in caplog.text
    assert resumed == straight


def test_stored_batches_of_other_prompts_are_not_reused(tiny, counted, tmp_path):
    model, tokenizer = tiny
    calls, _ = counted
    store = BatchStore(tmp_path / "generation")
    generate(model, tokenizer, PROMPTS[:2], 4, batch_size=2, progress=False, token_budget=1, store=store)
    generate(model, tokenizer, PROMPTS[2:4], 4, batch_size=2, progress=False, token_budget=1, store=store)
    assert len(calls) == 2


def test_greedy_is_the_argmax_whatever_the_folders_generation_config_adds(tiny):
    """A repetition penalty in the model's generation config (as some HF folders ship) must not change greedy
    decoding: each new token is the argmax of the model's logits for the sequence so far."""
    import torch

    model, tokenizer = tiny
    saved = model.generation_config.repetition_penalty
    model.generation_config.repetition_penalty = 1.5
    try:
        generations = generate(model, tokenizer, PROMPTS[:3], max_new_tokens=6, batch_size=3, progress=False)
    finally:
        model.generation_config.repetition_penalty = saved
    for prompt, generation in zip(PROMPTS[:3], generations):
        ids = list(prompt)
        with torch.no_grad():
            for _ in range(6):
                ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
                if ids[-1] == 1:  # the fixture's stop token
                    break
        assert generation.new_ids == ids[len(prompt):]
    assert any(len(generation.new_ids) == 6 for generation in generations)


def test_gqa_attention_matches_sdpa_on_repeated_heads_with_a_padding_mask():
    import torch

    from sparsedecoding.generation import _gqa_sdpa

    torch.manual_seed(0)
    query, key, value = torch.randn(3, 6, 1, 16), torch.randn(3, 2, 9, 16), torch.randn(3, 2, 9, 16)
    mask = torch.ones(3, 1, 1, 9, dtype=torch.bool)
    mask[0, ..., :4] = False  # left padding of the first row
    module = torch.nn.Module()
    out, _ = _gqa_sdpa(module, query, key, value, mask, scaling=0.3)
    expected = torch.nn.functional.scaled_dot_product_attention(
        query.double(), key.double().repeat_interleave(3, 1), value.double().repeat_interleave(3, 1),
        attn_mask=mask, scale=0.3).transpose(1, 2)
    assert out.shape == (3, 1, 6, 16)
    torch.testing.assert_close(out.double(), expected, rtol=1e-5, atol=1e-6)


def test_cpu_generation_shares_key_value_heads_and_gives_the_same_tokens(tiny, monkeypatch):
    """A left-padded CPU batch generates through `_gqa_sdpa` (grouped heads, mask or not), token for token as through
    transformers' own SDPA, and the model's implementation is restored after."""
    from sparsedecoding import generation

    model, tokenizer = tiny
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]  # unequal lengths: a padded batch
    assert model.config._attn_implementation == "sdpa" and model.config.num_key_value_heads == 2
    calls = []
    original = generation._gqa_sdpa
    monkeypatch.setattr(generation, "_gqa_sdpa", lambda *args, **kwargs: calls.append(1) or original(*args, **kwargs))
    grouped = generate(model, tokenizer, prompts, max_new_tokens=12, batch_size=3, progress=False)
    assert calls and model.config._attn_implementation == "sdpa"
    calls.clear()
    monkeypatch.setattr(generation, "cpu_gqa_attention", lambda *args: nullcontext())
    plain = generate(model, tokenizer, prompts, max_new_tokens=12, batch_size=3, progress=False)
    assert not calls
    assert [g.new_ids for g in grouped] == [g.new_ids for g in plain]


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "mistral"])
def test_grouped_head_attention_gives_the_same_tokens_in_every_supported_family(arch, tmp_path, monkeypatch):
    from sparsedecoding import generation

    model, tokenizer, _ = load_model(make_tiny_model(tmp_path / arch, arch=arch))
    model.generation_config.eos_token_id = [1]
    prompts = [[5, 6, 7, 8, 9, 10, 11], [12, 13], [14, 15, 16, 17]]
    grouped = generate(model, tokenizer, prompts, max_new_tokens=10, batch_size=3, progress=False)
    monkeypatch.setattr(generation, "cpu_gqa_attention", lambda *args: nullcontext())
    plain = generate(model, tokenizer, prompts, max_new_tokens=10, batch_size=3, progress=False)
    assert [g.new_ids for g in grouped] == [g.new_ids for g in plain]
    assert model.config._attn_implementation == "sdpa"
