"""Batched generation with transformers: left padding, greedy or seeded sampling, sequences cut at the first stop
token. Used by decode-time calibration and by the evaluation suite."""

from __future__ import annotations

import json
import logging
import os
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

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


class BatchStore:
    """Finished generation batches as one JSON file each in `folder`, so an interrupted generation resumes at the
    first unfinished batch. A stored batch is reused only for the same prompts."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)

    def file(self, index: int) -> Path:
        return self.folder / f"batch-{index:05d}.json"

    def load(self, index: int, prompts: list[list[int]]) -> list[Generation] | None:
        file = self.file(index)
        if not file.exists():
            return None
        rows = json.loads(file.read_text())
        if [row["prompt_ids"] for row in rows] != prompts:
            return None
        return [Generation(**row) for row in rows]

    def save(self, index: int, generations: list[Generation]) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        temporary = self.file(index).with_suffix(".tmp")
        temporary.write_text(json.dumps([asdict(generation) for generation in generations]))
        os.replace(temporary, self.file(index))


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
    token_budget: int | None = None,
    store: BatchStore | None = None,
) -> list[Generation]:
    """Continue every prompt with the model (KV-cached `model.generate`), batched by similar length to waste little
    padding. Greedy unless `do_sample`; sampling is seeded per batch so results do not depend on batch order.

    token_budget: stop once the finished continuations hold this many consumed tokens (`Generation.consumed_ids`);
    batches then follow the prompt order, so what is generated is a prefix of the prompts (the prefix that
    `calibration.budget_counts` takes), only that prefix is returned, and no continuation is longer than the budget
    needs. store: reuse finished batches kept there and keep each new one (see `BatchStore`)."""
    stops = stop_token_ids(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    device = next(model.parameters()).device
    order = list(range(len(prompt_ids)))
    if token_budget is None:
        order.sort(key=lambda index: len(prompt_ids[index]))
    else:
        max_new_tokens = min(max_new_tokens, token_budget + 1)  # the last token is never consumed
    results: list[Generation | None] = [None] * len(prompt_ids)
    batches = [order[start:start + batch_size] for start in range(0, len(order), batch_size)]
    consumed, resumed = 0, 0
    bar = tqdm(total=token_budget or len(batches), desc="generating", unit="tok" if token_budget else "batch",
               disable=not progress)
    for batch_index, batch in enumerate(batches):
        if token_budget is not None and consumed >= token_budget:
            break
        prompts = [list(prompt_ids[index]) for index in batch]
        generations = store.load(batch_index, prompts) if store else None
        if generations is not None:
            resumed = batch_index + 1
        else:
            if resumed and resumed == batch_index:
                log.info("resuming generation at batch %d of %d (%d tokens kept)", batch_index + 1, len(batches),
                         consumed)
            generations = _generate_batch(model, prompts, max_new_tokens, stops, pad_id, device, do_sample,
                                          temperature, top_p, seed + batch_index)
            if store:
                store.save(batch_index, generations)
        for index, generation in zip(batch, generations):
            results[index] = generation
        batch_tokens = sum(len(generation.consumed_ids) for generation in generations)
        consumed += batch_tokens
        bar.update(min(batch_tokens, token_budget - bar.n) if token_budget else 1)
        bar.set_postfix(batch=f"{batch_index + 1}/{len(batches)}", tokens=consumed)
    bar.close()
    if token_budget is not None:
        return [generation for generation in results if generation is not None]
    return results  # type: ignore[return-value]


CPU_GQA_ATTENTION = "sparsedecoding_cpu_gqa_sdpa"  # the name `cpu_gqa_attention` registers with transformers


def _gqa_sdpa(module, query, key, value, attention_mask, dropout: float = 0.0, scaling: float | None = None,
              is_causal: bool | None = None, **kwargs):
    """transformers' attention call as SDPA with the key-value heads shared by their query heads (`enable_gqa`), mask
    or not. transformers' own SDPA path shares them only without a mask and otherwise copies the whole cache to every
    query head at each layer and step: on the CPU a left-padded batch then generated 1.4-2.2x slower than unpadded,
    and through this function in 0.67x the padded time, the same tokens (benchmarks/results/
    cpu_generate_padding_probe.md, cpu_generate_padding_gqa_probe.md)."""
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling,
        is_causal=bool(causal and attention_mask is None and query.shape[2] > 1),
        enable_gqa=query.shape[1] != key.shape[1])
    return out.transpose(1, 2).contiguous(), None


@contextmanager
def cpu_gqa_attention(model, device):
    """While generating on the CPU with SDPA and grouped key-value heads, run attention through `_gqa_sdpa` (the same
    products: the CPU kernel gives the same numbers either way), then restore the model's own implementation."""
    config = model.config
    grouped = getattr(config, "num_key_value_heads", None) not in (None, config.num_attention_heads)
    if torch.device(device).type != "cpu" or config._attn_implementation != "sdpa" or not grouped:
        yield
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(CPU_GQA_ATTENTION, _gqa_sdpa)
    AttentionMaskInterface.register(CPU_GQA_ATTENTION, sdpa_mask)
    model.set_attn_implementation(CPU_GQA_ATTENTION)
    try:
        yield
    finally:
        model.set_attn_implementation("sdpa")


def _generate_batch(model, prompts: list[list[int]], max_new_tokens: int, stops: list[int], pad_id: int, device,
                    do_sample: bool, temperature: float, top_p: float, seed: int) -> list[Generation]:
    from transformers import GenerationConfig

    ids, mask = left_pad(prompts, pad_id)
    sampling = {"do_sample": False}
    if do_sample:
        torch.manual_seed(seed)
        sampling = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0}
    # Our settings alone: the model folder's generation_config.json may add processors (a repetition penalty, say)
    # that would make "greedy" something else, and transformers fills every setting left unset from the model's
    # config, so the model holds a blank one for the call.
    config = GenerationConfig(max_new_tokens=max_new_tokens, eos_token_id=stops, pad_token_id=pad_id, **sampling)
    folder_config, model.generation_config = model.generation_config, GenerationConfig()
    try:
        with cpu_gqa_attention(model, device):
            output = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                    generation_config=config)
    finally:
        model.generation_config = folder_config
    generations = []
    for prompt, tokens in zip(prompts, output[:, ids.shape[1]:].tolist()):
        cut = next((pos for pos, token in enumerate(tokens) if token in stops), None)
        kept = tokens if cut is None else tokens[:cut + 1]
        generations.append(Generation(prompt, kept, cut is not None))
    return generations
