"""Quality metrics from teacher-forced replays and from token lists.

On-policy divergence: the pruned model's own greedy continuations are replayed through the dense model p and the
pruned model q; at every generated position t (the prompt excluded) KL(p_t ‖ q_t) = Σ_v p_t(v)·(log p_t(v) − log q_t(v))
and the dense model's NLL −log p_t(y_t) of the token the pruned model chose, both in float32 from log_softmax of the
logits, averaged over all generated tokens. The logits come as the models give them (bfloat16 for a bfloat16 model),
so a very small KL reads slightly high (their rounding adds to the divergence; no committed measurement of how
much). Perplexity: exp of the token-weighted mean NLL over non-overlapping windows of held-out text (each window's
first token is context only). Repetition: distinct-n (unique n-grams / n-grams in one sequence) and the longest
n-gram that occurs twice in a sequence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from ..generation import Generation, left_pad, position_ids_from_mask


@torch.no_grad()
def continuation_logits(model, contexts: list[list[int]], continuations: list[list[int]], pad_id: int,
                        ) -> torch.Tensor:
    """Logits [B, L, V] (L = longest continuation) predicting each continuation token from everything before it,
    in one left-padded teacher-forced pass. Row i's continuation scores sit at its last len(continuations[i])
    positions, so positions of the prompt are never sent through the output layer."""
    sequences = [context + continuation[:-1] for context, continuation in zip(contexts, continuations)]
    ids, mask = left_pad(sequences, pad_id)
    device = next(model.parameters()).device
    width = max(len(continuation) for continuation in continuations)
    return model(input_ids=ids.to(device), attention_mask=mask.to(device),
                 position_ids=position_ids_from_mask(mask).to(device), use_cache=False,
                 logits_to_keep=width).logits


@dataclass(frozen=True)
class ContinuationScore:
    """Sums over one continuation's tokens: KL(dense ‖ pruned), the dense model's NLL, and the token count."""

    kl: float
    dense_nll: float
    tokens: int


def batches_by_length(lengths: list[int], batch_size: int) -> list[list[int]]:
    """Indices grouped into batches of similar total length (little padding)."""
    order = sorted(range(len(lengths)), key=lengths.__getitem__)
    return [order[start:start + batch_size] for start in range(0, len(order), batch_size)]


@torch.no_grad()
def on_policy_scores(dense, pruned, generations: list[Generation], pad_id: int, batch_size: int = 8,
                     ) -> list[ContinuationScore]:
    """Per generation (in order): KL(dense ‖ pruned) and dense NLL summed over its generated tokens, see the module
    docstring. `generations` are the pruned model's own; both models read exactly those tokens."""
    scores: list[ContinuationScore | None] = [ContinuationScore(0.0, 0.0, 0) if not gen.new_ids else None
                                              for gen in generations]  # nothing generated: nothing to score
    lengths = [len(gen.prompt_ids) + len(gen.new_ids) for gen in generations]
    scored = [index for index, gen in enumerate(generations) if gen.new_ids]
    for positions in batches_by_length([lengths[index] for index in scored], batch_size):
        batch = [scored[position] for position in positions]
        contexts = [generations[index].prompt_ids for index in batch]
        continuations = [generations[index].new_ids for index in batch]
        logits_p = continuation_logits(dense, contexts, continuations, pad_id)
        logits_q = continuation_logits(pruned, contexts, continuations, pad_id)
        for row, index in enumerate(batch):
            n = len(continuations[row])
            log_p = logits_p[row, -n:].float().log_softmax(-1)
            log_q = logits_q[row, -n:].to(log_p.device).float().log_softmax(-1)
            kl = (log_p.exp() * (log_p - log_q)).sum()
            targets = torch.tensor(continuations[row], device=log_p.device)
            nll = -log_p.gather(-1, targets[:, None]).sum()
            scores[index] = ContinuationScore(float(kl), float(nll), n)
    return scores  # type: ignore[return-value]


@torch.no_grad()
def answer_log_probs(model, answers: list[Generation], pad_id: int) -> list[torch.Tensor]:
    """Per answer, the model's next-token log-probabilities [tokens, vocabulary] along its tokens (float32)."""
    return [continuation_logits(model, [gen.prompt_ids], [gen.new_ids], pad_id)[0, -len(gen.new_ids):].float()
            .log_softmax(-1) for gen in answers]


def answer_agreement(dense: list[torch.Tensor], model: list[torch.Tensor],
                     answers: list[Generation]) -> tuple[float, float]:
    """From `answer_log_probs` of the dense model and of another along the dense model's own answers: KL(dense ‖
    model) per token, and the share of tokens where the model's top-1 is the token the dense model chose."""
    kl = agree = count = 0.0
    for log_p, log_q, gen in zip(dense, model, answers):
        log_q = log_q.to(log_p.device)
        kl += float((log_p.exp() * (log_p - log_q)).sum())
        agree += float((log_q.argmax(-1).cpu() == torch.tensor(gen.new_ids)).sum())
        count += len(gen.new_ids)
    return kl / count, agree / count


@torch.no_grad()
def perplexity(model, token_ids: list[int], window: int = 512, batch_size: int = 8) -> tuple[float, int]:
    """(perplexity, scored tokens) of a token stream cut into non-overlapping windows of `window` tokens."""
    windows = [token_ids[start:start + window] for start in range(0, len(token_ids), window)]
    windows = [piece for piece in windows if len(piece) >= 2]
    if not windows:
        raise ValueError(f"perplexity needs at least 2 tokens, got {len(token_ids)}")
    nll, count = 0.0, 0
    for start in range(0, len(windows), batch_size):
        chunk = windows[start:start + batch_size]
        contexts, continuations = [piece[:1] for piece in chunk], [piece[1:] for piece in chunk]
        logits = continuation_logits(model, contexts, continuations, pad_id=0)
        for row, continuation in enumerate(continuations):
            log_p = logits[row, -len(continuation):].float().log_softmax(-1)
            targets = torch.tensor(continuation, device=log_p.device)
            nll -= float(log_p.gather(-1, targets[:, None]).sum())
            count += len(continuation)
    return math.exp(nll / count), count


def distinct_n(tokens: list[int], n: int) -> float | None:
    """Unique n-grams / n-grams of one sequence (1 = no repeats); None when it has no n-gram."""
    grams = [tuple(tokens[start:start + n]) for start in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else None


def has_repeat(tokens: list[int], length: int) -> bool:
    seen = set()
    for start in range(len(tokens) - length + 1):
        gram = tuple(tokens[start:start + length])
        if gram in seen:
            return True
        seen.add(gram)
    return False


def longest_repeated_ngram(tokens: list[int]) -> int:
    """The largest L such that some L-gram occurs at least twice (occurrences may overlap); 0 if no token repeats.
    A repeated L-gram contains a repeated (L−1)-gram, so the property is monotone and L is found by bisection."""
    low, high = 0, max(len(tokens) - 1, 0)
    while low < high:
        middle = (low + high + 1) // 2
        if has_repeat(tokens, middle):
            low = middle
        else:
            high = middle - 1
    return low


def mean(values: list[float | None]) -> float | None:
    present = [value for value in values if value is not None]
    return sum(present) / len(present) if present else None


def repetition_summary(sequences: list[list[int]], ngram_sizes: tuple[int, ...] = (1, 2, 4)) -> dict[str, float]:
    """Means over sequences of distinct-n, the longest repeated n-gram and the length in tokens."""
    summary = {f"distinct_{n}": mean([distinct_n(tokens, n) for tokens in sequences]) for n in ngram_sizes}
    summary["longest_repeat"] = mean([longest_repeated_ngram(tokens) for tokens in sequences])
    summary["mean_length"] = mean([len(tokens) for tokens in sequences])
    return summary
