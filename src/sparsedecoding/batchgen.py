"""Large-batch generation for building data: hundreds of rows per forward pass, with finished rows replaced by new
prompts, so the per-step cost (kernel launches, Python) is shared by many tokens.

`generation.generate` calls `model.generate` at batch 32, and a batch there lasts as long as its longest answer. One
decode step of a 1.5B model costs about the same at batch 32 as at 512 because the step is bound by launch overhead,
not arithmetic. Here up to `batch_size` rows decode together, one token per step. Every `check_every` steps (one host
sync) the rows that emitted a stop token or reached `max_new_tokens` leave the batch and waiting prompts take their
places. Prompts are admitted longest first, so memory peaks early. Two backends do the decoding:

- `hf`: the model's own forward, eager, with its KV cache (`DynamicCache`, SDPA attention). Newcomers are prefilled
  on their own (only their last position goes through the output layer), and their cache is joined to the running
  one, both left-padded to a common width; cache columns that have become padding in every row are cut off. A row
  spans at most (its prompt + max_new_tokens) columns, so the rows are capped such that
  rows × (longest prompt + max_new_tokens) positions of keys and values fit in `kv_budget_bytes`.
- `engine`: the engine's transformer (`engine.rows.RowDecoder`, built from the model's weights) over a static cache
  of slots, each at its own position; a finished row's slot is prefilled with the next prompt in place, and the decode
  step, sampling included, is one CUDA graph on a GPU. A slot spans longest prompt + max_new_tokens + check_every
  positions. Llama, Qwen2, Qwen3 and Mistral models only (anything else is refused, never run on `hf` instead). On an
  H200 with Qwen2.5-Coder-1.5B (512 prompts, 256 new tokens, batch 256, T=0.7, top-p 0.95) it decodes 11,328 tokens/s
  against 1,927 for `hf`, 5.9x (benchmarks/results/gen_bench_h200.md, from benchmarks/gen_bench.py).

`generate_many`'s own default is `hf`. The library's data generation (`selfdata`'s prompts and answers,
`repair.student_samples`; `prune --gen-backend`, default engine) runs on `engine`; evaluation keeps `hf`, the
model's own forward, as the reference.

Greedy output equals `generation.generate`'s on both backends on CPU (same model forward, padding masked). On CUDA
the engine's fused q|k|v and gate|up matmuls sum in another order than HF's separate ones, so a continuation may part
from `hf`'s at a near-tie of the logits and go on from there (bf16, 1.5B model: 28 of 32 greedy continuations
identical). Sampling: on `hf` one generator seeded with
`seed` draws for all rows, so a prompt's sample depends on the other prompts of the call; on `engine` each prompt
draws from its own hashed stream of (seed, prompt index), so its sample does not. The output format is
`generation.Generation`, as on the HF path.
"""

from __future__ import annotations

import logging
import math
from contextlib import contextmanager

import torch
from tqdm.auto import tqdm

from .errors import SparseDecodingError, UnsupportedArchitectureError
from .generation import Generation, left_pad, position_ids_from_mask
from .models import stop_token_ids

log = logging.getLogger(__name__)

DEFAULT_KV_BUDGET = 32 * 2**30
ATTENTION = "sparsedecoding_grouped_decode"
BACKENDS = ("hf", "engine")


def grouped_decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                             is_causal=None, **kwargs):
    """SDPA for one new token per row without copying keys and values per query head. HF's SDPA path repeats the
    KV heads to the query heads whenever a padding mask is given (about 6x the cache in memory traffic for Qwen2.5-1.5B,
    every step); with a single query position the G query heads of a KV head are instead read as G queries of that
    head. Prefill (several positions) goes to HF's own SDPA function."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    batch, heads, length, dim = query.shape
    if length != 1 or attention_mask is None or attention_mask.dtype != torch.bool:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    kv_heads = key.shape[1]
    grouped = query.reshape(batch, kv_heads, heads // kv_heads, dim)
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value,
                                                           attn_mask=attention_mask[:, :, :, :key.shape[2]],
                                                           scale=scaling)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2), None


@contextmanager
def decode_attention(model):
    """Run the model with `grouped_decode_attention` inside the block; its own attention setting is restored after."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTION, grouped_decode_attention)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)
    before = model.config._attn_implementation
    model.config._attn_implementation = ATTENTION
    try:
        yield
    finally:
        model.config._attn_implementation = before


def kv_bytes_per_token(config, dtype: torch.dtype) -> int:
    """Bytes of keys and values one position of one row holds across all layers."""
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return 2 * config.num_hidden_layers * heads * head_dim * torch.empty((), dtype=dtype).element_size()


def row_capacity(longest_prompt: int, max_new_tokens: int, per_token: int, kv_budget_bytes: int,
                 batch_size: int, slack: int = 0) -> int:
    """Rows that may decode at once: `batch_size`, or fewer when their KV cache would exceed the budget. A row holds
    longest_prompt + max_new_tokens + slack positions (slack: positions a backend reserves beyond the answer)."""
    rows = kv_budget_bytes // ((longest_prompt + max_new_tokens + slack) * per_token)
    if rows < 1:
        reserved = f" (and {slack} reserved positions)" if slack else ""
        raise SparseDecodingError(f"one prompt of {longest_prompt} tokens plus {max_new_tokens} new tokens{reserved} "
                                  f"needs more KV cache than the budget of {kv_budget_bytes} bytes; raise the budget "
                                  f"or drop long prompts")
    return min(batch_size, rows)


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


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise SparseDecodingError(f"generation backend {backend!r} is unknown; choose one of {', '.join(BACKENDS)}")


def check_settings(batch_size: int, max_new_tokens: int, do_sample: bool, temperature: float, top_p: float,
                   check_every: int, backend: str = "hf") -> None:
    check_backend(backend)
    if batch_size < 1 or max_new_tokens < 1 or check_every < 1:
        raise SparseDecodingError(f"batch size, new tokens and check interval must be at least 1, got {batch_size}, "
                                  f"{max_new_tokens} and {check_every}")
    if do_sample and (not math.isfinite(temperature) or temperature <= 0 or not 0 < top_p <= 1):
        raise SparseDecodingError(f"sampling needs temperature > 0 and 0 < top_p <= 1, got {temperature} and "
                                  f"{top_p}; for greedy decoding turn sampling off")


class Rows:
    """The rows decoding together: the KV cache, attention mask [R, T] (T = cache width), the position of each row's
    last token, the logits of its next token, its generated tokens so far and which prompt it answers."""

    def __init__(self, cache, mask, position, logits, prompt, out, count):
        self.cache, self.mask, self.position, self.logits = cache, mask, position, logits
        self.prompt, self.out, self.count = prompt, out, count
        self.finished = torch.zeros_like(count, dtype=torch.bool)

    def __len__(self) -> int:
        return self.prompt.shape[0]

    def select(self, keep: torch.Tensor) -> None:
        """Keep the rows `keep`, then cut the leading columns that are padding in every remaining row."""
        self.cache.batch_select_indices(keep)
        for name in ("mask", "position", "logits", "prompt", "out", "count", "finished"):
            setattr(self, name, getattr(self, name)[keep])
        first = int(self.mask.any(0).nonzero()[0])
        if first:
            for layer in self.cache.layers:
                layer.keys, layer.values = layer.keys[:, :, first:], layer.values[:, :, first:]
            self.mask = self.mask[:, first:]

    def join(self, other: Rows) -> None:
        """Append `other`'s rows, left-padding the narrower cache and mask with masked zeros."""
        width = max(self.mask.shape[1], other.mask.shape[1])

        def widen(tensor: torch.Tensor, dim: int) -> torch.Tensor:
            missing = width - tensor.shape[dim]
            if not missing:
                return tensor
            shape = list(tensor.shape)
            shape[dim] = missing
            return torch.cat([tensor.new_zeros(shape), tensor], dim=dim)

        for mine, theirs in zip(self.cache.layers, other.cache.layers):
            mine.keys = torch.cat([widen(mine.keys, 2), widen(theirs.keys, 2)])
            mine.values = torch.cat([widen(mine.values, 2), widen(theirs.values, 2)])
        self.mask = torch.cat([widen(self.mask, 1), widen(other.mask, 1)])
        for name in ("position", "logits", "prompt", "out", "count", "finished"):
            setattr(self, name, torch.cat([getattr(self, name), getattr(other, name)]))


def prefill(model, prompts: list[list[int]], indices: list[int], pad_id: int, out_width: int) -> Rows:
    """New rows for `prompts` (prompt numbers `indices`): their cache and the logits of their first new token."""
    from transformers import DynamicCache

    device = next(model.parameters()).device
    ids, mask = left_pad(prompts, pad_id)
    ids, mask = ids.to(device), mask.to(device)
    positions = position_ids_from_mask(mask)
    cache = DynamicCache(config=model.config)
    logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=cache,
                   use_cache=True, logits_to_keep=1).logits[:, -1]
    if any(getattr(layer, "is_sliding", False) for layer in cache.layers):
        raise UnsupportedArchitectureError("the large-batch generator joins full-attention caches only; this model "
                                           "uses sliding-window layers, use generation.generate")
    rows = len(prompts)
    out = torch.full((rows, out_width), pad_id, dtype=torch.long, device=device)
    return Rows(cache, mask, positions[:, -1], logits, torch.tensor(indices, device=device), out,
                torch.zeros(rows, dtype=torch.long, device=device))


def decode_step(model, rows: Rows, stop_ids: torch.Tensor, max_new_tokens: int, do_sample: bool, temperature: float,
                top_p: float, generator: torch.Generator | None) -> None:
    """Pick every row's next token, record it, and run the model on it for the logits of the one after. Finished
    rows keep stepping until the next check; what they write after their end is cut off when they are collected."""
    token = next_tokens(rows.logits, do_sample, temperature, top_p, generator)
    rows.out[torch.arange(len(rows), device=token.device), rows.count] = token
    rows.count += 1
    rows.finished |= torch.isin(token, stop_ids) | (rows.count >= max_new_tokens)
    rows.mask = torch.cat([rows.mask, rows.mask.new_ones(len(rows), 1)], dim=1)
    rows.position = rows.position + 1
    # A ready 4D mask is used as given: no per-step mask building, whose all-real-tokens test syncs with the host.
    rows.logits = model(input_ids=token[:, None], attention_mask=rows.mask.bool()[:, None, None, :],
                        position_ids=rows.position[:, None], past_key_values=rows.cache, use_cache=True).logits[:, -1]


@torch.inference_mode()
def generate_many(model, tokenizer, prompt_ids: list[list[int]], max_new_tokens: int, batch_size: int = 256,
                  do_sample: bool = False, temperature: float = 1.0, top_p: float = 1.0, seed: int = 0,
                  kv_budget_bytes: int = DEFAULT_KV_BUDGET, check_every: int = 16, prefill_rows: int = 64,
                  progress: bool = True, backend: str = "hf") -> list[Generation]:
    """Continue every prompt (token ids, already chat-formatted) and return one `Generation` per prompt, in order.

    batch_size: most rows decoding at once (256-512 on an H200 for a 1.5B model). kv_budget_bytes: cap on the KV
    cache (fewer rows when prompts are long). check_every: steps between collecting finished rows and admitting new
    prompts (each check syncs with the host once). prefill_rows: most prompts prefilled in one pass (bounds the
    prefill's activation memory). Sampling (do_sample, temperature, top_p) is seeded by `seed`; greedy otherwise.
    backend: "hf" (the model's own forward, eager; evaluation's reference) or "engine" (the engine's transformer over a
    static cache, the decode step in CUDA graphs on a GPU; Llama, Qwen2, Qwen3 and Mistral models; 5.9x hf's tokens/s
    on an H200, and what `selfdata` and `repair.student_samples` use by default)."""
    check_settings(batch_size, max_new_tokens, do_sample, temperature, top_p, check_every, backend)
    if not prompt_ids or any(not ids for ids in prompt_ids):
        raise SparseDecodingError("no prompts, or an empty prompt, to continue; drop empty prompts first")
    stops = stop_token_ids(model)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else stops[0]
    parameter = next(model.parameters())
    per_token = kv_bytes_per_token(model.config, parameter.dtype)
    if backend == "engine":
        return generate_with_engine(model, prompt_ids, max_new_tokens, stops, pad_id, batch_size,
                                    temperature if do_sample else 0.0, top_p if do_sample else 1.0, seed,
                                    per_token, kv_budget_bytes, check_every, prefill_rows, progress)
    capacity = row_capacity(max(map(len, prompt_ids)), max_new_tokens, per_token, kv_budget_bytes, batch_size)
    generator = torch.Generator(device=parameter.device).manual_seed(seed) if do_sample else None
    stop_ids = torch.tensor(stops, device=parameter.device)
    waiting = sorted(range(len(prompt_ids)), key=lambda index: -len(prompt_ids[index]))
    results: list[Generation | None] = [None] * len(prompt_ids)
    rows: Rows | None = None
    stop_set = set(stops)
    with decode_attention(model), tqdm(total=len(prompt_ids), desc="generating", unit="prompt",
                                       disable=not progress) as bar:
        while waiting or rows is not None:
            while waiting and (rows is None or len(rows) < capacity):
                room = capacity - (0 if rows is None else len(rows))
                admitted, waiting = waiting[:min(room, prefill_rows)], waiting[min(room, prefill_rows):]
                new = prefill(model, [prompt_ids[index] for index in admitted], admitted, pad_id,
                              max_new_tokens + check_every)
                if rows is None:
                    rows = new
                else:
                    rows.join(new)
            for _ in range(min(check_every, max_new_tokens)):  # every row is done after max_new_tokens steps
                decode_step(model, rows, stop_ids, max_new_tokens, do_sample, temperature, top_p, generator)
            done = rows.finished.nonzero()[:, 0]
            if done.numel():
                for index, tokens in zip(rows.prompt[done].tolist(), rows.out[done].tolist()):
                    results[index] = finished_generation(prompt_ids[index], tokens, max_new_tokens, stop_set)
                bar.update(done.numel())
                if done.numel() == len(rows):
                    rows = None
                else:
                    rows.select((~rows.finished).nonzero()[:, 0])
    return results  # type: ignore[return-value]


def finished_generation(prompt: list[int], tokens: list[int], max_new_tokens: int, stop_set: set[int]) -> Generation:
    """A row's `Generation` from its output columns: at most max_new_tokens, cut after the first stop token."""
    tokens = tokens[:max_new_tokens]
    cut = next((pos for pos, token in enumerate(tokens) if token in stop_set), None)
    return Generation(list(prompt), tokens if cut is None else tokens[:cut + 1], cut is not None)


def generate_with_engine(model, prompt_ids: list[list[int]], max_new_tokens: int, stops: list[int], pad_id: int,
                         batch_size: int, temperature: float, top_p: float, seed: int, per_token: int,
                         kv_budget_bytes: int, check_every: int, prefill_rows: int,
                         progress: bool) -> list[Generation]:
    """`generate_many` on the engine (`engine.rows.RowDecoder`): slots of a static cache instead of a growing one,
    refilled in place; when no prompt waits any more, the running rows move to the front and the step narrows to
    them. temperature 0 is greedy. A slot spans longest prompt + max_new_tokens + check_every positions (rounded up to
    16), room for the steps a finished row runs until the next check. The engine model shares the embedding, norms
    and o/down weights with `model` and holds its own fused q|k|v and gate|up weights (about 2/3 of the blocks'
    weights) for the call."""
    from .engine.rows import RowDecoder, RowSampling, engine_model, row_seed

    longest = max(map(len, prompt_ids))
    positions = longest + max_new_tokens + check_every
    slots = min(row_capacity(longest, max_new_tokens, per_token, kv_budget_bytes, batch_size,
                             slack=check_every + -positions % 16), len(prompt_ids))
    try:
        engine = engine_model(model)
    except UnsupportedArchitectureError as error:
        raise UnsupportedArchitectureError(f"{error}; use backend='hf'") from None
    decoder = RowDecoder(engine, slots, positions, max_new_tokens + check_every, stops, max_new_tokens,
                         RowSampling(temperature, top_p))
    owner: list[int | None] = [None] * slots  # the prompt each slot answers
    waiting = sorted(range(len(prompt_ids)), key=lambda index: -len(prompt_ids[index]))
    results: list[Generation | None] = [None] * len(prompt_ids)
    stop_set = set(stops)
    with tqdm(total=len(prompt_ids), desc="generating", unit="prompt", disable=not progress) as bar:
        while waiting or any(index is not None for index in owner):
            free = [slot for slot in range(decoder.width) if owner[slot] is None]
            while waiting and free:
                take = min(len(free), len(waiting), prefill_rows)
                admitted, waiting = waiting[:take], waiting[take:]
                chosen, free = free[:take], free[take:]
                decoder.admit(chosen, [prompt_ids[index] for index in admitted],
                              [row_seed(seed, index) for index in admitted], pad_id)
                for slot, index in zip(chosen, admitted):
                    owner[slot] = index
            decoder.run(min(check_every, max_new_tokens - 1))  # a newcomer's first token comes from its prefill
            finished = decoder.finished_slots()
            done = [slot for slot, index in enumerate(owner) if index is not None and finished[slot]]
            if done:
                for slot, tokens in zip(done, decoder.outputs(done)):
                    results[owner[slot]] = finished_generation(prompt_ids[owner[slot]], tokens, max_new_tokens,
                                                               stop_set)
                    owner[slot] = None
                bar.update(len(done))
            active = [slot for slot, index in enumerate(owner) if index is not None]
            if not waiting and active and decoder.keep(active):
                owner = [owner[slot] for slot in active] + [None] * (slots - len(active))
    return results  # type: ignore[return-value]
