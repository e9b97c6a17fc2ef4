"""Self-written decode data: prompt cleaning, meta-prompts, the dev split, source mixing, the held-out guard, and a
resumable end-to-end build with a tiny model; plus the large-batch generator it runs on."""

from __future__ import annotations

import pytest
import torch

from sparsedecoding import batchgen, selfdata
from sparsedecoding.errors import CalibrationError, PromptsError, SparseDecodingError
from sparsedecoding.generation import generate
from sparsedecoding.models import load_model
from sparsedecoding.selfdata import (KINDS, LEVELS, TOPICS, SelfDataConfig, build, calibration_sets, check_no_heldout,
                                     clean_prompt, is_dev, meta_prompts, plan_answers)
from helpers import make_tiny_model


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    model, tokenizer, _ = load_model(make_tiny_model(tmp_path_factory.mktemp("selfdata") / "dense", seed=0))
    return model, tokenizer


# --- cleaning, meta-prompts, split, mix -----------------------------------------------------------------------------

def test_clean_prompt_strips_wrappers_and_drops_unusable_replies():
    assert clean_prompt("Sure! Here is a task:\nSort a list of tuples by their second item.", "task", 16, 200) == \
        "Sort a list of tuples by their second item."
    assert clean_prompt('**Question:** "How do I reverse a string in Python?"', "question", 16, 200) == \
        "How do I reverse a string in Python?"
    stub = "def add(a: int, b: int) -> int:\n    \"\"\"Sum.\n    >>> add(1, 2)\n    3\n    \"\"\""
    assert clean_prompt(f"Here it is:\n```python\n{stub}\n```\nDone.", "function", 16, 500) == stub
    assert clean_prompt("Write a function that sums numbers.", "function", 16, 500) is None  # no def line
    assert clean_prompt("Reverse the words of a sentence.\n\n**Solution:**\n```python\nx = 1\n```", "task", 16, 200) == \
        "Reverse the words of a sentence."
    assert clean_prompt("Answer the following: what is a closure?", "question", 16, 200) == \
        "Answer the following: what is a closure?"
    assert clean_prompt("Parse a date string.\nHere is a possible solution:\nimport datetime", "task", 16, 200) == \
        "Parse a date string."
    assert clean_prompt("   ", "task", 16, 200) is None
    assert clean_prompt("too short", "task", 16, 200) is None
    assert clean_prompt("x" * 201, "task", 16, 200) is None


def test_meta_prompts_cover_every_combination_before_repeating():
    combos = len(TOPICS) * len(KINDS) * len(LEVELS)
    metas = meta_prompts(combos + 10, seed=1)
    first = {(m["topic"], m["kind"], m["level"]) for m in metas[:combos]}
    assert len(first) == combos
    assert metas == meta_prompts(combos + 10, seed=1) and metas != meta_prompts(combos + 10, seed=2)
    assert all(m["topic"] in m["text"] for m in metas)


def test_dev_split_is_a_stable_share_keyed_by_normalized_text():
    prompts = [f"task number {index}" for index in range(4000)]
    share = sum(is_dev(prompt, 0.1) for prompt in prompts) / len(prompts)
    assert 0.085 < share < 0.115
    assert all(is_dev(p, 0.1) == is_dev("  " + p.upper() + " ", 0.1) for p in prompts[:200])


@pytest.mark.parametrize("sources, words", [
    ("self=0.9,humaneval:eval=0.1", "held-out"), ("humaneval:all=1", "held-out"), ("self", "name=weight"),
    ("self=-1", "positive"), ("self=abc", "name=weight"), ("self=nan", "finite"), ("self=inf", "finite"),
])
def test_bad_sources_give_one_line_errors(sources, words):
    with pytest.raises(PromptsError, match=words) as caught:
        SelfDataConfig(sources=sources).validate()
    assert "\n" not in str(caught.value)


def test_other_bad_settings_are_refused():
    for bad in ({"dev_share": 0.0}, {"n_answers": 0}, {"min_prompt_chars": 50, "max_prompt_chars": 40},
                {"decode_tokens": 0}):
        with pytest.raises(PromptsError):
            SelfDataConfig(**bad).validate()
    with pytest.raises(SparseDecodingError, match="backend 'vllm' is unknown"):
        SelfDataConfig(backend="vllm").validate()


def test_held_out_problems_are_refused_wherever_they_appear():
    problem = 'def f(x):\n    """Return x."""'
    check_no_heldout(["def g(y):\n    pass"], [problem])
    with pytest.raises(PromptsError, match="held-out HumanEval"):
        check_no_heldout(["ok", f"Complete this:\n{problem}\n"], [problem])


def test_held_out_problems_are_caught_in_another_layout():
    problem = 'def f(x):\n    """Return x."""'
    for layout in ('def f(x):\n  """Return x."""', 'def f(x):\r\n\t"""Return x."""', 'def f (x):\n """Return x."""'):
        with pytest.raises(PromptsError, match="held-out HumanEval"):
            check_no_heldout([layout], [problem])


def test_answer_shards_that_are_damaged_or_answer_other_prompts_are_refused(tiny, tmp_path):
    model, tokenizer = tiny
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("\n".join(f"Question {i} about lists?" for i in range(10)))
    config = small_config(sources=f"{prompt_file}=1", n_answers=10)
    build(model, tokenizer, tmp_path / "data", config, progress=False, held_out=[])
    shard = tmp_path / "data" / "answers" / "00001.jsonl"
    lines = shard.read_text().splitlines()
    shard.write_text("\n".join(lines[:-1]) + "\n")  # one answer short: no longer the plan's shard
    with pytest.raises(CalibrationError, match="00001.jsonl holds answers to other prompts"):
        build(model, tokenizer, tmp_path / "data", config, progress=False, held_out=[])
    shard.write_text(lines[0][:30])
    with pytest.raises(CalibrationError, match="00001.jsonl is damaged"):
        build(model, tokenizer, tmp_path / "data", config, progress=False, held_out=[])
    shard.unlink()  # deleted, it is answered again
    assert build(model, tokenizer, tmp_path / "data", config, progress=False, held_out=[]).stats["answered"] == 10


@pytest.mark.integration
def test_the_real_held_out_half_is_caught_and_the_calibration_half_passes():
    from sparsedecoding.data import humaneval_problems, humaneval_prompts

    held_out = selfdata.heldout_markers()
    assert held_out[:82] == [problem["prompt"].strip() for problem in humaneval_problems("eval")]
    assert "def string_xor(" in held_out and "def correct_bracketing(" not in held_out  # the latter names a calib one
    check_no_heldout(humaneval_prompts("calib"), held_out)
    with pytest.raises(PromptsError, match="held-out"):
        check_no_heldout(humaneval_prompts("eval")[:1], held_out)


def test_plan_mixes_sources_by_weight_and_repeats_only_when_sampling():
    sources = {"self": [f"self prompt {i}" for i in range(30)], "few.txt": ["a prompt", "b prompt", "c prompt"]}
    config = SelfDataConfig(sources="self=3,few.txt=1", n_answers=40, dev_share=0.3)
    plan, counts = plan_answers(sources, config)
    assert counts == {"self": {"available": 30, "answered": 30}, "few.txt": {"available": 3, "answered": 10}}
    few = [entry["prompt"] for entry in plan if entry["source"] == "few.txt"]
    assert sorted(few.count(p) for p in sources["few.txt"]) == [3, 3, 4]  # each once, then again, ...
    assert all(entry["split"] == ("dev" if is_dev(entry["prompt"], 0.3) else "train") for entry in plan)
    greedy = SelfDataConfig(sources="self=3,few.txt=1", n_answers=40, answer_do_sample=False)
    _, counts = plan_answers(sources, greedy)
    assert counts["few.txt"] == {"available": 3, "answered": 3}


# --- the generator --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("batch_size, check_every, prefill_rows", [(8, 3, 64), (5, 2, 2), (64, 4, 64)])
def test_large_batch_greedy_equals_the_hf_generate_path(tiny, batch_size, check_every, prefill_rows):
    """Rows leave and join at different times (small batches and checks), or all decode at once (64)."""
    model, tokenizer = tiny
    prompts = [[5 + index % 50] * (3 + (index * 7) % 11) for index in range(21)]
    reference = generate(model, tokenizer, prompts, 24, batch_size=4, progress=False)
    ours = batchgen.generate_many(model, tokenizer, prompts, 24, batch_size=batch_size, check_every=check_every,
                                  prefill_rows=prefill_rows, progress=False)
    assert [g.new_ids for g in ours] == [g.new_ids for g in reference]
    assert [g.stopped for g in ours] == [g.stopped for g in reference]
    assert [g.prompt_ids for g in ours] == prompts
    assert any(g.stopped for g in ours) and any(not g.stopped for g in ours)


def test_grouped_decode_attention_equals_hf_sdpa_with_repeated_heads(tiny):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    model, tokenizer = tiny
    module = model.model.layers[0].self_attn  # 4 query heads share 2 KV heads
    query, key, value = torch.randn(3, 4, 1, 16), torch.randn(3, 2, 9, 16), torch.randn(3, 2, 9, 16)
    mask = torch.ones(3, 1, 1, 9, dtype=torch.bool)
    mask[0, ..., :4] = False
    mask[2, ..., :7] = False
    ours, _ = batchgen.grouped_decode_attention(module, query, key, value, mask, scaling=0.25)
    reference, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    torch.testing.assert_close(ours, reference, rtol=1e-5, atol=1e-6)
    before = model.config._attn_implementation
    batchgen.generate_many(model, tokenizer, [[5, 6, 7]], 3, progress=False)
    assert model.config._attn_implementation == before


def test_sampling_is_seeded_and_top_p_keeps_the_nucleus(tiny):
    logits = torch.tensor([[5.0, 4.0, -10.0, -10.0]]).repeat(500, 1)
    draws = batchgen.next_tokens(logits, True, 1.0, 0.5, torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {0}  # token 0 alone holds more than half the mass
    draws = batchgen.next_tokens(logits, True, 1.0, 0.99, torch.Generator().manual_seed(0))
    assert set(draws.tolist()) == {0, 1}
    model, tokenizer = tiny
    prompts = [[7] * 4, [9] * 6, [11] * 3]
    first, again, other = (batchgen.generate_many(model, tokenizer, prompts, 10, do_sample=True, seed=seed,
                                                  progress=False) for seed in (1, 1, 2))
    assert [g.new_ids for g in first] == [g.new_ids for g in again] != [g.new_ids for g in other]


def test_rows_respect_the_kv_budget_and_an_impossible_prompt_is_refused():
    assert batchgen.row_capacity(50, 10, per_token=1, kv_budget_bytes=130, batch_size=4) == 2
    assert batchgen.row_capacity(20, 10, per_token=1, kv_budget_bytes=1000, batch_size=4) == 4
    with pytest.raises(SparseDecodingError, match="budget"):
        batchgen.row_capacity(200, 10, per_token=1, kv_budget_bytes=130, batch_size=4)


# --- end to end -----------------------------------------------------------------------------------------------------

def small_config(**overrides) -> SelfDataConfig:
    values = dict(sources="self=2,PROMPTS=1", n_meta=12, prompt_max_new_tokens=30, min_prompt_chars=4,
                  n_answers=15, answer_max_new_tokens=12, dev_share=0.4, shard_size=5, batch_size=4)
    values.update(overrides)
    return SelfDataConfig(**values)


def test_build_resumes_by_shard_and_yields_decode_only_sets(tiny, tmp_path, monkeypatch):
    model, tokenizer = tiny
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("Explain recursion.\nWrite a haiku about tests.\nSort a list.\n")
    config = small_config(sources=f"self=2,{prompt_file}=1")
    calls = []
    real = batchgen.generate_many
    monkeypatch.setattr(selfdata, "generate_many", lambda *a, **k: calls.append(1) or real(*a, **k))

    first = build(model, tokenizer, tmp_path / "data", config, progress=False, held_out=[])
    assert len(calls) == 3 + 3  # 12 meta-prompts and 15 answers in shards of 5
    assert first.stats["answered"] == 15 and len(first.train) + len(first.dev) == 15
    (tmp_path / "data" / "answers" / "00001.jsonl").unlink()
    calls.clear()
    second = build(model, tokenizer, tmp_path / "data", config, progress=False, held_out=[])
    assert len(calls) == 1  # only the missing shard is generated again, with the same seed
    assert [g.new_ids for g in second.train] == [g.new_ids for g in first.train]
    calls.clear()
    other_backend = build(model, tokenizer, tmp_path / "data", small_config(sources=f"self=2,{prompt_file}=1",
                                                                             backend="hf"), progress=False, held_out=[])
    assert not calls and [g.new_ids for g in other_backend.train] == [g.new_ids for g in first.train]  # resumable

    train_prompts = {tuple(g.prompt_ids) for g in first.train}
    assert not train_prompts & {tuple(g.prompt_ids) for g in first.dev}
    train, dev = calibration_sets(first, tokenizer.pad_token_id)
    assert train.tokens == sum(len(g.consumed_ids) for g in first.train)
    assert dev.tokens == sum(len(g.consumed_ids) for g in first.dev)
    assert first.stats["decode_tokens"] == {"train": train.tokens, "dev": dev.tokens}

    with pytest.raises(CalibrationError, match="other settings"):
        build(model, tokenizer, tmp_path / "data", small_config(sources=f"self=2,{prompt_file}=1", seed=5),
              progress=False, held_out=[])


def test_build_stops_at_the_decode_token_target(tiny, tmp_path):
    model, tokenizer = tiny
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("\n".join(f"Question {i} about lists?" for i in range(20)))
    config = small_config(sources=f"{prompt_file}=1", n_answers=20, decode_tokens=1, dev_share=0.2)
    data = build(model, tokenizer, tmp_path / "data", config, progress=False, held_out=[])
    assert data.stats["answered"] == 5  # the first shard already passes one token
    assert len(list((tmp_path / "data" / "answers").glob("*.jsonl"))) == 1


def test_self_written_prompts_that_touch_held_out_markers_are_dropped(tiny, tmp_path):
    model, tokenizer = tiny
    marker = "e"  # common in the tiny model's random replies
    data = build(model, tokenizer, tmp_path / "data", small_config(sources="self=1", n_meta=20), progress=False,
                 held_out=[marker])
    assert data.stats["self_prompts_dropped"]["held_out"] > 0
    plan = selfdata.read_jsonl(tmp_path / "data" / "plan.jsonl")
    assert plan and not any(marker in entry["prompt"] for entry in plan)


def test_build_refuses_prompts_that_contain_held_out_problems(tiny, tmp_path):
    model, tokenizer = tiny
    prompt_file = tmp_path / "prompts.txt"
    prompt_file.write_text("Fix this: def secret(x): return x\nSomething else entirely.\n")
    config = small_config(sources=f"{prompt_file}=1")
    with pytest.raises(PromptsError, match="held-out"):
        build(model, tokenizer, tmp_path / "data", config, progress=False, held_out=["def secret(x)"])
    assert not list((tmp_path / "data" / "answers").glob("*.jsonl"))


@pytest.mark.gpu
def test_large_batch_generation_on_cuda_matches_hf_generate(tmp_path):
    """The CUDA path (memory-efficient SDPA with a boolean mask, CUDA generator) on a tiny float32 model."""
    model, tokenizer, _ = load_model(make_tiny_model(tmp_path / "dense", seed=0), device="cuda", dtype=torch.float32)
    prompts = [[5 + index % 50] * (3 + (index * 7) % 11) for index in range(40)]
    reference = generate(model, tokenizer, prompts, 32, batch_size=8, progress=False)
    ours = batchgen.generate_many(model, tokenizer, prompts, 32, batch_size=16, check_every=4, prefill_rows=8,
                                  progress=False)
    assert [g.new_ids for g in ours] == [g.new_ids for g in reference]
    sampled = batchgen.generate_many(model, tokenizer, prompts, 32, batch_size=16, do_sample=True, top_p=0.9,
                                     progress=False)
    assert all(len(g.new_ids) <= 32 for g in sampled)
