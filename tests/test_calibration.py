import pytest
import torch

from sparsedecoding.calibration import (CalibrationSet, concat, decode_calibration, decode_set_from_generations,
                                        text_calibration)
from sparsedecoding.errors import CalibrationError
from sparsedecoding.generation import Generation
from sparsedecoding.models import load_model
from helpers import make_tiny_model

PAD = 0


def test_masks_keep_exactly_the_consumed_generated_tokens():
    generations = [
        Generation([5, 6, 7], [10, 11, 12, 3], stopped=True),   # stop token 3 ends it: 10, 11, 12 were read back
        Generation([5], [20, 21], stopped=False),               # hit max tokens: only 20 was read back
        Generation([5, 6, 7, 8, 9], [30], stopped=True),        # stopped at once: nothing read back, dropped
        Generation([8, 9], [40, 41, 42], stopped=False),
    ]
    calib = decode_set_from_generations(generations, PAD)
    assert len(calib) == 3 and calib.source == "decode"
    kept_tokens = [row[keep].tolist() for row, keep in zip(calib.input_ids, calib.keep)]
    assert kept_tokens == [[10, 11, 12], [20], [40, 41]]
    # By construction: nothing kept on padding, prompt tokens, the final token, or after a stop.
    assert not (calib.keep & (calib.attention_mask == 0)).any()
    assert calib.input_ids[0].tolist() == [5, 6, 7, 10, 11, 12]
    assert calib.input_ids[1].tolist() == [PAD, PAD, PAD, PAD, 5, 20]
    assert calib.attention_mask[1].tolist() == [0, 0, 0, 0, 1, 1]
    assert calib.tokens == 6


def test_budget_is_exact_and_cuts_the_last_sequence():
    generations = [Generation([1, 2], list(range(10, 20)), False), Generation([1], list(range(30, 40)), False)]
    calib = decode_set_from_generations(generations, PAD, token_budget=12)
    assert calib.tokens == 12
    assert calib.input_ids[1][calib.keep[1]].tolist() == [30, 31, 32]


def test_no_decode_tokens_is_an_error():
    with pytest.raises(CalibrationError, match="no decode tokens"):
        decode_set_from_generations([Generation([1, 2], [3], True)], PAD)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    folder = make_tiny_model(tmp_path_factory.mktemp("tiny") / "model")
    return load_model(folder)


def test_decode_calibration_on_a_real_generation(tiny):
    model, tokenizer, _ = tiny
    prompts = ["def f(x):", "hello", "a longer prompt than the others", "z"]
    calib = decode_calibration(model, tokenizer, prompts, max_new_tokens=12, batch_size=3, do_sample=True, seed=1,
                               progress=False)
    stops = set(model.generation_config.eos_token_id)
    for ids, mask, keep in zip(calib.input_ids, calib.attention_mask, calib.keep):
        assert not (keep & (mask == 0)).any()
        kept = ids[keep].tolist()
        assert kept and not stops & set(kept)  # stop tokens are never read back
        first_kept = int(keep.nonzero()[0])
        assert keep[first_kept:].all()  # the kept run is contiguous and ends the sequence
        prompt_part = tokenizer.decode(ids[mask.bool() & ~keep].tolist())
        assert prompt_part.endswith("<|im_start|>assistant\n")
    assert calib.tokens <= len(prompts) * 11


def test_text_calibration_matches_a_budget(tiny):
    _, tokenizer, _ = tiny
    text = "The quick brown fox jumps over the lazy dog. " * 40
    calib = text_calibration(tokenizer, text, token_budget=300, seq_len=64)
    assert calib.tokens == 300 and calib.source == "text"
    assert torch.equal(calib.keep, calib.attention_mask.bool())
    with pytest.raises(CalibrationError, match="fewer than the budget"):
        text_calibration(tokenizer, "short", token_budget=300, seq_len=64)


def test_concat_and_save_load_roundtrip(tmp_path):
    first = decode_set_from_generations([Generation([1, 2, 3], [4, 5, 6], False)], PAD)
    second = decode_set_from_generations([Generation([1], [7, 8], False)], PAD)
    both = concat([first, second], PAD, "mix")
    assert both.tokens == first.tokens + second.tokens
    assert both.input_ids[1].tolist() == [PAD, PAD, PAD, 1, 7]
    both.save(tmp_path / "calib.safetensors")
    loaded = CalibrationSet.load(tmp_path / "calib.safetensors")
    assert loaded.source == "mix"
    for name in ("input_ids", "attention_mask", "keep"):
        assert torch.equal(getattr(loaded, name), getattr(both, name))


def test_batches_trim_shared_padding():
    calib = concat([decode_set_from_generations([Generation([1, 2, 3, 4], [5, 6], False)], PAD),
                    decode_set_from_generations([Generation([1], [7, 8], False)], PAD)], PAD, "decode")
    (first_ids, _, _), (second_ids, second_mask, second_keep) = calib.batches(1)
    assert first_ids.tolist() == [[1, 2, 3, 4, 5]]
    assert second_ids.tolist() == [[1, 7]] and second_keep.tolist() == [[False, True]]


def test_with_first_keeps_each_sequences_opening_positions_as_well():
    calib = decode_set_from_generations([Generation([5, 6, 7], [10, 11, 12], False), Generation([8], [20, 21], False)],
                                        PAD)
    # the final generated token is never read back: rows [5, 6, 7, 10, 11] and, left-padded, [8, 20]
    assert calib.attention_mask[1].tolist() == [0, 0, 0, 1, 1]
    one = calib.with_first(1)
    assert [row[keep].tolist() for row, keep in zip(one.input_ids, one.keep)] == [[5, 10, 11], [8, 20]]
    assert one.tokens == calib.tokens + 2 and torch.equal(calib.with_first(0).keep, calib.keep)
    three = calib.with_first(3)  # all of the second sequence's two positions, one of them kept already
    assert [row[keep].tolist() for row, keep in zip(three.input_ids, three.keep)] == [[5, 6, 7, 10, 11], [8, 20]]
    assert not (three.keep & (three.attention_mask == 0)).any()  # never a padding column
    assert torch.equal(three.with_first(3).keep, three.keep)  # a set reused with the option gains nothing more
    with pytest.raises(CalibrationError, match="0 or more"):
        calib.with_first(-1)
