"""Large-batch generation for building data: hundreds of rows per forward pass, so the per-step cost (kernel launches,
Python) is shared by many tokens.

`generation.generate` calls `model.generate` at batch 32; one decode step of a 1.5B model costs about the same at
batch 32 as at 512 because the step is bound by launch overhead, not arithmetic. Here prompts are sorted by length
(longest first, so a batch that does not fit in memory fails at once, not after an hour), left-padded, prefilled in one
pass that sends only the last position through the output layer, then decoded with the model's own KV cache
(`DynamicCache`, SDPA attention) one token per step. Every `check_every` steps the rows that have emitted a stop token
are dropped from the batch and the cache, and the batch ends when every row has stopped or hit `max_new_tokens`. The
rows a batch may hold are capped so that its KV cache stays within `kv_budget_bytes`.

Sampling is seeded per batch (`seed + batch index`), so a call's output is a pure function of its inputs and settings.
The output format is `generation.Generation`, the same as the HF path, so calibration code takes either.
"""

from __future__ import annotations

import logging

import torch
from tqdm.auto import tqdm

from .errors import SparseDecodingError
from .generation import Generation, left_pad, position_ids_from_mask
from .models import stop_token_ids

log = logging.getLogger(__name__)

DEFAULT_KV_BUDGET = 32 * 2**30


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Bytes of keys and values one position of one row holds across all layers."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * torch.empty((), dtype=dtype).element_size()


def plan_batches(lengths: list[int], batch_size: int, max_new_tokens: int, per_token: int,
                 kv_budget_bytes: int) -> list[list[int]]:
    """Indices grouped longest prompt first; a batch closes at `batch_size` rows or when one more row would make its
    cache (rows × (longest prompt + max_new_tokens) × per_token) exceed the budget."""
    order = sorted(range(len(lengths)), key=lambda index: -lengths[index])
    batches: list[list[int]] = []
    for index in order:
        if batches and len(batches[-1]) < batch_size:
            width = lengths[batches[-1][0]] + max_new_tokens
            if (len(batches[-1]) + 1) * width * per_token <= kv_budget_bytes:
                batches[-1].append(index)
                continue
        if (lengths[index] + max_new_tokens) * per_token > kv_budget_bytes:
            raise SparseDecodingError(f"one prompt of {lengths[index]} tokens plus {max_new_tokens} new tokens needs "
                                      f"more KV cache than the budget of {kv_budget_bytes} bytes; raise the budget "
                                      f"or drop long prompts")
        batches.append([index])
    return batches


def next_tokens(logits: torch.Tensor, do_sample: bool, temperature: float, top_p: float,
                generator: torch.Generator | None) -> torch.Tensor:
    """[B] ids from logits [B, V]: argmax, or a draw from softmax(logits / temperature) restricted to the smallest set
    of most likely tokens whose probability reaches `top_p` (the most likely token always stays)."""
    if not do_sample:
        return logits.argmax(-1)
    probs = (logits.float() / temperature).softmax(-1)
    if top_p >= 1.0:
        return torch.multinomial(probs, 1, generator=generator)[:, 0]
    sorted_probs, order = probs.sort(-1, descending=True)
    outside = sorted_probs.cumsum(-1) - sorted_probs >= top_p
    sorted_probs = sorted_probs.masked_fill(outside, 0.0)
    return order.gather(-1, torch.multinomial(sorted_probs, 1, generator=generator))[:, 0]


def check_settings(batch_size: int, max_new_tokens: int, do_sample: bool, temperature: float, top_p: float,
                   check_every: int) -> None:
    if batch_size < 1 or max_new_tokens < 1 or check_every < 1:
        raise SparseDecodingError(f"batch size, new tokens and check interval must be at least 1, got {batch_size}, "
                                  f"{max_new_tokens} and {check_every}")
    if do_sample and (temperature <= 0 or not 0 < top_p <= 1):
        raise SparseDecodingError(f"sampling needs temperature > 0 and 0 < top_p <= 1, got {temperature} and "
                                  f"{top_p}; for greedy decoding turn sampling off")


@torch.inference_mode()
def generate_batch(model, prompt_ids: list[list[int]], max_new_tokens: int, stops: list[int], pad_id: int,
                   do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0,
                   generator: torch.Generator | None = None, check_every: int = 16) -> list[list[int]]:
    """The new tokens of each prompt (one batch), cut after the first stop token; see the module docstring."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    ids, mask = left_pad(prompt_ids, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    positions = position_ids_from_mask(mask)
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                   use_cache=True, logits_to_keep=1).logits[:, -1]
    rows = len(prompt_ids)
    out = torch.full((rows, max_new_tokens), pad_id, dtype=torch.long, device=device)
    live = torch.arange(rows, device=device)  # original row of each row still in the batch
    stop_ids = torch.tensor(stops, device=device)
    finished = torch.zeros(rows, dtype=torch.bool, device=device)
    position = positions[:, -1]
    for step in range(max_new_tokens):
        token = next_tokens(logits, do_sample, temperature, top_p, generator)
        out[live, step] = token
        finished |= torch.isin(token, stop_ids)
        if step == max_new_tokens - 1:
            break
        if (step + 1) % check_every == 0:
            keep = (~finished).nonzero()[:, 0]  # one host sync per check, not per step
            if keep.numel() == 0:
                break
            if keep.numel() < finished.numel():
                cache.batch_select_indices(keep)
                live, finished, token, mask, position = (live[keep], finished[keep], token[keep], mask[keep],
                                                         position[keep])
        mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
        position = position + 1
        logits = model(input_ids=token[:, None], attention_mask=mask, position_ids=position[:, None],
                       past_key_values=cache, use_cache=True).logits[:, -1]
    results = []
    stop_set = set(stops)
    for tokens in out.tolist():
        cut = next((pos for pos, token in enumerate(tokens) if token in stop_set), None)
        results.append(tokens if cut is None else tokens[:cut + 1])
    return results


def generate_many(model, tokenizer, prompt_ids: list[list[int]], max_new_tokens: int, batch_size: int = 256,
                  do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                  kv_budget_bytes: int = DEFAULT_KV_BUDGET, check_every: int = 16,
                  progress: bool = True) -> list[Generation]:
    """Continue every prompt (token ids, already chat-formatted) and return one `Generation` per prompt, in order.

    batch_size: most rows per forward pass (256-512 on an H200 for a 1.5B model). kv_budget_bytes: cap on one batch's
    KV cache (rows are fewer when prompts are long). check_every: steps between dropping finished rows (each check
    syncs with the host once). Sampling (do_sample, temperature, top_p) draws from a generator seeded with
    `seed + batch index`; greedy otherwise."""
    check_settings(batch_size, max_new_tokens, do_sample, temperature, top_p, check_every)
    if any(not ids for ids in prompt_ids):
        raise SparseDecodingError("an empty prompt cannot be continued; drop empty prompts first")
    stops = stop_token_ids(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    device = next(model.parameters()).device
    per_token = kv_bytes_per_token(model.config, next(model.parameters()).dtype)
    batches = plan_batches([len(ids) for ids in prompt_ids], batch_size, max_new_tokens, per_token, kv_budget_bytes)
    results: list[Generation | None] = [None] * len(prompt_ids)
    for batch_index, batch in enumerate(tqdm(batches, desc="generating", unit="batch", disable=not progress)):
        generator = None
        if do_sample:
            generator = torch.Generator(device=device).manual_seed(seed + batch_index)
        new = generate_batch(model, [prompt_ids[index] for index in batch], max_new_tokens, stops, pad_id,
                             do_sample, temperature, top_p, generator, check_every)
        for index, tokens in zip(batch, new):
            results[index] = Generation(list(prompt_ids[index]), tokens, bool(tokens) and tokens[-1] in stops)
    return results  # type: ignore[return-value]
