"""Calibration sources: which token positions' layer inputs enter the Hessians.

`decode` (the paper's idea): the dense model continues chat-formatted task prompts; in a causal decoder the input of a
layer at the decode step that reads token t equals its input at position t when prompt + generated tokens are replayed
teacher-forced. So we generate once, then replay the sequences with a mask that keeps exactly the positions the model
read at decode steps: generated tokens that were fed back (not the prompt, not the padding, not the final token, nothing
after a stop token). `text` (the baseline): fixed natural text, chunked, teacher-forced, every position kept. `mix`:
both, with a share of the token budget each.
"""

from __future__ import annotations

import json
import logging
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from .data import chat_format
from .errors import CalibrationError
from .generation import BatchStore, Generation, generate, left_pad, tokenize_prompts

log = logging.getLogger(__name__)


@dataclass
class CalibrationSet:
    """Sequences to replay teacher-forced and the positions whose activations count.

    input_ids [S, T] (left-padded), attention_mask [S, T] (1 on real tokens), keep [S, T] bool (positions that enter
    the Hessians; always a subset of the real tokens)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    keep: torch.Tensor
    source: str

    @property
    def tokens(self) -> int:
        return int(self.keep.sum())

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def with_first(self, count: int) -> CalibrationSet:
        """This set with each sequence's first `count` real positions kept as well (all of a shorter sequence)."""
        if count < 0:
            raise CalibrationError(f"first positions = {count}: give a count of 0 or more")
        opening = (self.attention_mask.cumsum(1) <= count) & self.attention_mask.bool()
        return CalibrationSet(self.input_ids, self.attention_mask, self.keep | opening, self.source)

    def batches(self, batch_size: int):
        """Yield (input_ids, attention_mask, keep) slices, trimming the columns that are padding in every row."""
        for start in range(0, len(self), batch_size):
            mask = self.attention_mask[start:start + batch_size]
            first = int((mask.sum(0) > 0).nonzero()[0]) if mask.any() else mask.shape[1] - 1
            rows = slice(start, start + batch_size)
            yield self.input_ids[rows, first:], mask[:, first:], self.keep[rows, first:]

    def save(self, path: Path) -> None:
        tensors = {"input_ids": self.input_ids, "attention_mask": self.attention_mask, "keep": self.keep.to(torch.uint8)}
        save_file(tensors, str(path), metadata={"source": self.source})

    @classmethod
    def load(cls, path: Path) -> CalibrationSet:
        from safetensors import safe_open

        with safe_open(str(path), "pt") as handle:
            source = handle.metadata()["source"]
        tensors = load_file(str(path))
        return cls(tensors["input_ids"], tensors["attention_mask"], tensors["keep"].bool(), source)


def from_segments(sequences: list[list[int]], kept_from: list[int], kept_count: list[int], pad_id: int,
                  source: str) -> CalibrationSet:
    """Build a set from token lists where sequence i keeps `kept_count[i]` positions starting at `kept_from[i]`."""
    input_ids, attention_mask = left_pad(sequences, pad_id)
    keep = torch.zeros_like(attention_mask, dtype=torch.bool)
    width = input_ids.shape[1]
    for row, (seq, start, count) in enumerate(zip(sequences, kept_from, kept_count)):
        offset = width - len(seq)
        keep[row, offset + start:offset + start + count] = True
    return CalibrationSet(input_ids, attention_mask, keep, source)


def budget_counts(available: list[int], token_budget: int | None) -> list[int]:
    """Take whole sequences in order until the budget is met; the last one is cut so the total is exact."""
    if token_budget is None:
        return list(available)
    counts, left = [], token_budget
    for count in available:
        take = min(count, left)
        if take <= 0:
            break
        counts.append(take)
        left -= take
    return counts


def decode_set_from_generations(generations: list[Generation], pad_id: int,
                                token_budget: int | None = None) -> CalibrationSet:
    """Sequences = prompt + consumed generated tokens; kept = the consumed generated tokens (see module docstring)."""
    usable = [gen for gen in generations if gen.consumed_ids]
    counts = budget_counts([len(gen.consumed_ids) for gen in usable], token_budget)
    if not counts:
        raise CalibrationError("generation produced no decode tokens to calibrate on (every continuation stopped at "
                               "its first token); use other prompts or a larger --max-new-tokens")
    usable = usable[:len(counts)]
    sequences = [gen.prompt_ids + gen.consumed_ids for gen in usable]
    return from_segments(sequences, [len(gen.prompt_ids) for gen in usable], counts, pad_id, "decode")


def decode_calibration(model, tokenizer, prompts: list[str], *, max_new_tokens: int = 512,
                       n_prompts: int | None = None, token_budget: int | None = None, batch_size: int = 32,
                       do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                       samples_per_prompt: int = 1, progress: bool = True,
                       store: BatchStore | None = None) -> CalibrationSet:
    """The dense model continues the chat-formatted prompts; its decode steps become the calibration set.
    `samples_per_prompt` > 1 (sampling only) draws several continuations per prompt: all prompts once, then again,
    so a token budget that cuts the list keeps the prompt mix balanced. Generation stops once the budget is met;
    `store` keeps finished generation batches for a resumed run."""
    if samples_per_prompt > 1 and not do_sample:
        raise CalibrationError("several samples per prompt need sampling (--sample); greedy would repeat itself")
    if n_prompts is not None:
        prompts = prompts[:n_prompts]
    prompts = prompts * samples_per_prompt
    prompt_ids = tokenize_prompts(tokenizer, chat_format(tokenizer, prompts))
    generations = generate(model, tokenizer, prompt_ids, max_new_tokens, batch_size=batch_size, do_sample=do_sample,
                           temperature=temperature, top_p=top_p, seed=seed, progress=progress,
                           token_budget=token_budget, store=store)
    calib = decode_set_from_generations(generations, tokenizer.pad_token_id, token_budget)
    if token_budget is not None and calib.tokens < token_budget:
        log.warning("decode calibration produced %d tokens, below the budget of %d; add prompts or new tokens",
                    calib.tokens, token_budget)
    return calib


def text_windows(tokenizer, text: str, token_budget: int, seq_len: int) -> list[list[int]]:
    """The text's non-overlapping windows of `seq_len` tokens; CalibrationError if they hold fewer than
    `token_budget` tokens. Cheap (one tokenization), so callers check a text this way before generating anything."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    windows = [ids[start:start + seq_len] for start in range(0, len(ids) - seq_len + 1, seq_len)]
    check_windows(windows, token_budget, seq_len, f"the calibration text has {len(ids)} tokens,")
    return windows


def check_windows(windows: list[list[int]], token_budget: int, seq_len: int, what: str) -> None:
    """CalibrationError, beginning with `what`, if the windows hold fewer than `token_budget` tokens."""
    if sum(len(window) for window in windows) < token_budget:
        raise CalibrationError(f"{what} fewer than the budget of {token_budget} in windows of {seq_len}; give a "
                               f"longer --text file or a smaller --tokens")


def text_calibration(tokenizer, text: str | list[list[int]], *, token_budget: int, seq_len: int = 512,
                     seed: int = 0) -> CalibrationSet:
    """Fixed text, teacher-forced: `token_budget` tokens in chunks of `seq_len` drawn (seeded) from the text's
    non-overlapping windows; every position is kept. `text` may be its windows already (`text_windows`, from a check
    made before generating), which are then not tokenized again."""
    if isinstance(text, list):
        windows = list(text)
        check_windows(windows, token_budget, seq_len,
                      f"the calibration text's windows hold {sum(map(len, windows))} tokens,")
    else:
        windows = text_windows(tokenizer, text, token_budget, seq_len)
    random.Random(seed).shuffle(windows)
    counts = budget_counts([len(window) for window in windows], token_budget)
    chosen = [window[:count] for window, count in zip(windows, counts)]
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    return from_segments(chosen, [0] * len(chosen), counts, pad_id, "text")


def concat(sets: list[CalibrationSet], pad_id: int, source: str) -> CalibrationSet:
    """Stack several sets (re-padding on the left to the widest)."""
    width = max(calib.input_ids.shape[1] for calib in sets)

    def widen(tensor: torch.Tensor, fill) -> torch.Tensor:
        pad = torch.full((tensor.shape[0], width - tensor.shape[1]), fill, dtype=tensor.dtype)
        return torch.cat([pad, tensor], dim=1)

    return CalibrationSet(
        torch.cat([widen(calib.input_ids, pad_id) for calib in sets]),
        torch.cat([widen(calib.attention_mask, 0) for calib in sets]),
        torch.cat([widen(calib.keep, False) for calib in sets]),
        source,
    )


def describe(calib: CalibrationSet) -> dict:
    """Counts recorded next to every pruned model."""
    return {"source": calib.source, "sequences": len(calib), "tokens": calib.tokens,
            "positions_replayed": int(calib.attention_mask.sum())}


def save_generations_text(path: Path, tokenizer, calib: CalibrationSet) -> None:
    """The kept text of each sequence, one JSON line each, for inspection."""
    with open(path, "w", encoding="utf-8") as handle:
        for ids, keep in zip(calib.input_ids, calib.keep):
            handle.write(json.dumps({"kept": tokenizer.decode(ids[keep].tolist())}) + "\n")
