"""Batched generation with transformers: left padding, greedy or seeded sampling, sequences cut at the first stop
token. Used by decode-time calibration and by the evaluation suite."""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch
from tqdm.auto import tqdm

from .models import stop_token_ids

log = logging.getLogger(__name__)


@dataclass
class Generation:
    """One prompt's tokens and the model's continuation (cut after the first stop token, which is kept)."""

    prompt_ids: list[int]
    new_ids: list[int]
    stopped: bool  # True when the continuation ended with a stop token, False when it hit max_new_tokens

    @property
    def consumed_ids(self) -> list[int]:
        """The generated tokens that the model read back as inputs at later decode steps: all but the last one
        (the last token produced, stop token or not, is never fed to the model)."""
        return self.new_ids[:-1]


def tokenize_prompts(tokenizer, texts: list[str]) -> list[list[int]]:
    """Token ids of already-formatted prompts; special tokens come from the chat template, not added again."""
    return [tokenizer(text, add_special_tokens=False)["input_ids"] for text in texts]


def left_pad(sequences: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Stack token lists into [B, T] ids and attention mask, padded on the left."""
    width = max(len(seq) for seq in sequences)
    ids = torch.full((len(sequences), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(sequences), width), dtype=torch.long)
    for row, seq in enumerate(sequences):
        if seq:
            ids[row, width - len(seq):] = torch.tensor(seq, dtype=torch.long)
            mask[row, width - len(seq):] = 1
    return ids, mask


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """Positions count real tokens only, so a left-padded row starts at position 0 (pads get 0 too)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompt_ids: list[list[int]],
    max_new_tokens: int,
    batch_size: int = 32,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    seed: int = 0,
    progress: bool = True,
) -> list[Generation]:
    """Continue every prompt with the model (KV-cached `model.generate`), batched by similar length to waste little
    padding. Greedy unless `do_sample`; sampling is seeded per batch so results do not depend on batch order."""
    stops = stop_token_ids(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    device = next(model.parameters()).device
    order = sorted(range(len(prompt_ids)), key=lambda index: len(prompt_ids[index]))
    results: list[Generation | None] = [None] * len(prompt_ids)
    batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    for batch_index, batch in enumerate(tqdm(batches, desc="generating", unit="batch", disable=not progress)):
        ids, mask = left_pad([prompt_ids[index] for index in batch], pad_id)
        sampling = {"do_sample": False}
        if do_sample:
            torch.manual_seed(seed + batch_index)
            sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
        output = model.generate(
            input_ids=ids.to(device), attention_mask=mask.to(device), max_new_tokens=max_new_tokens,
            eos_token_id=stops, pad_token_id=pad_id, **sampling,
        )
        new_tokens = output[:, ids.shape[1]:].tolist()
        for row, index in enumerate(batch):
            tokens = new_tokens[row]
            cut = next((pos for pos, token in enumerate(tokens) if token in stops), None)
            kept = tokens if cut is None else tokens[:cut + 1]
            results[index] = Generation(list(prompt_ids[index]), kept, cut is not None)
    return results  # type: ignore[return-value]
