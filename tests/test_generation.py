import logging

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
