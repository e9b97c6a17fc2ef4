"""Correctness of the engine on a real checkpoint, one command, a markdown report:

    sparsedecoding check --model DIR [--dtype bfloat16] --out report.md

DIR is an HF safetensors folder, dense (the logits check) or N:M-pruned (both checks; e.g. from `sparsedecoding prune
--solver magnitude --calibration text`). This module checks the runtime engine from outside: it imports the engine and
transformers, nothing of the pruning side.

`logits`: the dense engine against transformers on the same weights, over each prompt and the dense engine's own
greedy continuation (prompt positions go through prefill, the rest through one-token decode steps, so the KV cache
is exercised). In bf16 the two never agree exactly, and how far apart rounding puts them depends on the model and
the position, so the tolerance is measured rather than fixed: transformers runs a second time in float32 on the same
(bf16-valued) weights, float64 when `--dtype float32`, and the engine passes when its error against that wide
reference is at most ERROR_FACTOR times transformers' own error in the check's dtype, plus one epsilon of that dtype
times the largest logit, all over the same positions:

    max |engine - wide| <= 2 · max |transformers - wide| + eps · max |wide|

A mistake in the math (a wrong RoPE base, a misplaced norm) moves logits by much more than rounding does. Top-1
disagreements are reported but not judged apart: with every logit within e of the reference, the top token can only
change where the reference's top-2 gap is below 2e. The fixed rule used before (max |engine - transformers| <=
LOGIT_TOLERANCE · max |logit| and no top-1 miss outside a tie) is reported beside it, and is the pass rule only with
`--no-wide-reference`, for a model whose float32 copy does not fit beside its bf16 one.

`tokens`: the dense and the sparse engine (block linears packed by `--sparse auto`) decode greedily with the
compiled engine; the report gives the identical-token fraction, the first divergence and the logit margin there.
Divergence is allowed only after a tie: the dense engine's gap between its token and the sparse engine's token at
that position (recomputed by replaying the common prefix) is at most TIE_TOLERANCE times the top logit plus, with
the wide reference, ERROR_FACTOR times how much rounding moves that same gap in transformers (its gap in the
check's dtype minus its gap in the wide one). The measured term matters at ill-conditioned positions, where rounding
moves logits by far more than a fixed fraction of the top one."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from ..engine.config import load_hf_config
from ..engine.generate import Engine
from ..engine.loading import model_from_hf
from ..engine.model import Transformer
from ..errors import EngineError
from ..kernels import PackedLinear
from ..kernels.sp24_linear import Sp24Linear
from ..runenv import environment_markdown

# Relative size of a logit gap that bf16 rounding can flip: 2^-6 is four units in the last place of a bf16 number
# at the bottom of its binade (8 significant bits).
TIE_TOLERANCE = 2.0**-6
# The fixed rule: engine-vs-transformers logits agree when the largest difference is within this fraction of the
# largest logit. Reported always; the pass rule only without the wide reference.
LOGIT_TOLERANCE = 2.0**-5
# How much larger than transformers' own rounding error the engine's may be. The engine rounds in a different order
# (fused linears, folded GQA attention), so its error is another draw of the same size, not the same draw.
ERROR_FACTOR = 2.0
# The reference's dtype for each check dtype: the next wider float.
WIDER = {torch.bfloat16: torch.float32, torch.float16: torch.float32, torch.float32: torch.float64}

DEFAULT_PROMPTS = (
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "The three primary colors are",
    "Write a Python function that checks whether a string is a palindrome.\n",
    "Once upon a time, in a small village by the sea,",
)


@dataclass(frozen=True)
class LogitComparison:
    """Engine logits against transformers' at the same positions: in the check's dtype (the fixed rule) and, when
    run, against transformers in the wider dtype (the measured rule; `engine_error` and the rest are None without)."""

    positions: int
    max_abs_diff: float  # engine vs transformers, both in the check's dtype
    max_abs_logit: float
    top1_agreement: float
    unexplained_top1: int  # top-1 disagreements where the reference's top-2 gap is not a tie
    engine_error: float | None = None  # max |engine - wide|
    reference_error: float | None = None  # max |transformers - wide|, transformers in the check's dtype
    allowed_error: float | None = None  # ERROR_FACTOR · reference_error + eps · max |wide|
    engine_top1: float | None = None  # top-1 agreement with the wide reference
    reference_top1: float | None = None

    @property
    def within_fixed_tolerance(self) -> bool:
        return self.max_abs_diff <= LOGIT_TOLERANCE * self.max_abs_logit and self.unexplained_top1 == 0

    @property
    def passed(self) -> bool:
        if self.engine_error is None:
            return self.within_fixed_tolerance
        return self.engine_error <= self.allowed_error


@dataclass(frozen=True)
class TokenComparison:
    """Greedy tokens of the sparse engine against the dense engine's for one prompt."""

    new_tokens: int
    equal_fraction: float
    first_divergence: int | None  # index among the new tokens
    dense_gap: float | None  # dense logit of its token minus that of the sparse engine's token, at the divergence
    max_abs_diff: float | None  # largest |dense - sparse| logit difference at the divergence (same prefix)
    tie: bool | None
    rounding_shift: float | None = None  # |that gap in transformers' check-dtype logits - in its wide ones|

    @property
    def passed(self) -> bool:
        return self.first_divergence is None or bool(self.tie)


def is_tie(gap: float, top_logit: float, rounding_shift: float = 0.0) -> bool:
    return gap <= TIE_TOLERANCE * max(1.0, abs(top_logit)) + ERROR_FACTOR * rounding_shift


@torch.no_grad()
def replay_logits(model: Transformer, prompt: Tensor, continuation: Tensor) -> Tensor:
    """Float32 logits [T + n - 1, vocab] predicting tokens 1..T+n-1 of prompt [T] + continuation [n]: the prompt in
    one prefill, then one decode step per continuation token, as generation would run them."""
    length, device = len(prompt), model.norm.weight.device
    model.setup_caches(1, length + len(continuation))
    logits = [model(prompt[None].to(device), torch.arange(length, device=device))[0]]
    for i, token in enumerate(continuation[:-1].tolist()):
        step = torch.tensor([[token]], device=device)
        logits.append(model(step, torch.tensor([length + i], device=device))[0])
    return torch.cat(logits).float()


def compare_logits(ours: Tensor, reference: Tensor, wide: Tensor | None = None,
                   dtype: torch.dtype = torch.bfloat16) -> LogitComparison:
    """ours: the engine's logits, reference: transformers' in the same dtype, wide: transformers' in the wider
    dtype (optional); all [positions, vocab] at the same positions, upcast. `dtype`: the one both ran in."""
    top2 = reference.topk(2, dim=-1).values
    disagree = ours.argmax(-1) != reference.argmax(-1)
    gaps = top2[:, 0] - top2[:, 1]
    ties = torch.tensor([is_tie(g, t) for g, t in zip(gaps.tolist(), top2[:, 0].tolist())], device=ours.device)
    fixed = dict(positions=len(ours), max_abs_diff=(ours - reference).abs().max().item(),
                 max_abs_logit=reference.abs().max().item(), top1_agreement=1 - disagree.float().mean().item(),
                 unexplained_top1=int((disagree & ~ties).sum()))
    if wide is None:
        return LogitComparison(**fixed)
    reference_error = (reference - wide).abs().max().item()
    return LogitComparison(
        **fixed, engine_error=(ours - wide).abs().max().item(), reference_error=reference_error,
        allowed_error=ERROR_FACTOR * reference_error + torch.finfo(dtype).eps * wide.abs().max().item(),
        engine_top1=(ours.argmax(-1) == wide.argmax(-1)).float().mean().item(),
        reference_top1=(reference.argmax(-1) == wide.argmax(-1)).float().mean().item())


def compare_tokens(dense_tokens: Tensor, sparse_tokens: Tensor, dense_logits: Tensor, sparse_logits: Tensor,
                   reference: Tensor | None = None, wide: Tensor | None = None) -> TokenComparison:
    """Token sequences [n]; logits [n, vocab] from replaying the dense tokens through each model (row i predicts
    token i), so that both are evaluated on the same prefix at the divergence. `reference` and `wide`: transformers'
    logits on the same rows in the check's dtype and in the wider one, to measure how much rounding moves the gap."""
    equal = dense_tokens == sparse_tokens
    n = len(dense_tokens)
    if bool(equal.all()):
        return TokenComparison(n, 1.0, None, None, None, None)
    p = int((~equal).nonzero()[0])
    a, b = int(dense_tokens[p]), int(sparse_tokens[p])
    gap = (dense_logits[p, a] - dense_logits[p, b]).item()
    shift = None
    if wide is not None:
        shift = abs((reference[p, a] - reference[p, b]) - (wide[p, a] - wide[p, b])).item()
    return TokenComparison(
        new_tokens=n, equal_fraction=equal.float().mean().item(), first_divergence=p, dense_gap=gap,
        max_abs_diff=(dense_logits[p] - sparse_logits[p]).abs().max().item(),
        tie=is_tie(gap, dense_logits[p, a].item(), shift or 0.0), rounding_shift=shift)


def run(folder: Path, prompts: list[str], new_tokens: int, device: torch.device, compile: bool, checks: list[str],
        dtype: torch.dtype = torch.bfloat16, wide_reference: bool = True, command: str = "",
        verdict: bool = False) -> str | tuple[str, int]:
    """Runs the checks and returns the markdown report; with `verdict`, (the report, the number of rows that did
    not pass). `wide_reference`: also run transformers in WIDER[dtype] (float32 for bf16) and judge against it;
    without, the logits check falls back to the fixed tolerance."""
    from ..models import load_checkpoint, load_tokenizer
    from ..packed import packed_manifest

    if packed_manifest(Path(folder)) is not None:  # transformers would fill its packed linears with random weights
        raise EngineError(f"{folder} is a packed checkpoint, which transformers cannot load as it is; check the pruned "
                          f"folder it was packed from (packed.json's source.dir)")
    args = load_hf_config(folder)
    tokenizer = load_tokenizer(folder)
    hf = load_checkpoint(folder, dtype).to(device).eval().requires_grad_(False)
    weights = hf.state_dict()
    dense = model_from_hf(args, weights.__getitem__, "none", dtype, device)
    if "tokens" in checks:  # built first, so that a model the kernel cannot run fails before the long work
        sparse = model_from_hf(args, weights.__getitem__, "auto", dtype, device)
        if not any(isinstance(m, (PackedLinear, Sp24Linear)) for m in sparse.modules()):
            raise EngineError(f"no block linear of {folder} is N:M sparse; pass a pruned folder (sparsedecoding "
                              "prune --solver magnitude ...) or run --checks logits")
    encoded = [torch.tensor(tokenizer(text)["input_ids"]) for text in prompts]
    max_seq_len = max(len(p) for p in encoded) + new_tokens
    dense_tokens = _greedy(dense, encoded, new_tokens, max_seq_len, compile)
    dense_logits = [replay_logits(dense, prompt, tokens) for prompt, tokens in zip(encoded, dense_tokens)]
    sequences = [torch.cat([prompt, tokens])[None].to(device) for prompt, tokens in zip(encoded, dense_tokens)]
    references = [hf(sequence).logits[0, :-1].float() for sequence in sequences]
    wides = [None] * len(sequences)
    if wide_reference:
        # Upcasting replaces the module's parameters; the engines keep the dtype copies they were built from.
        hf.to(WIDER[dtype])
        wides = [hf(sequence).logits[0, :-1] for sequence in sequences]
    del hf
    lines = _header(folder, new_tokens, device, dtype, wide_reference, command)
    failed = 0
    if "logits" in checks:
        rows = [compare_logits(*logits, dtype) for logits in zip(dense_logits, references, wides)]
        lines += _logit_section(rows, dtype, wide_reference)
        failed += sum(not row.passed for row in rows)
    if "tokens" in checks:
        sparse_tokens = _greedy(sparse, encoded, new_tokens, max_seq_len, compile)
        rows = []
        for prompt, d, s, logits, reference, wide in zip(encoded, dense_tokens, sparse_tokens, dense_logits,
                                                          references, wides):
            start = len(prompt) - 1
            rows.append(compare_tokens(d, s, logits[start:], replay_logits(sparse, prompt, d)[start:],
                                       reference[start:], None if wide is None else wide[start:]))
        lines += _token_section(rows, dtype, wide_reference)
        failed += sum(not row.passed for row in rows)
    report = "\n".join(lines) + "\n"
    return (report, failed) if verdict else report


def _greedy(model: Transformer, prompts: list[Tensor], new_tokens: int, max_seq_len: int,
            compile: bool) -> list[Tensor]:
    engine = Engine(model, batch=1, max_seq_len=max_seq_len, compile=compile)
    return [engine.generate(prompt[None], new_tokens).tokens[0] for prompt in prompts]


def _header(folder: Path, new_tokens: int, device: torch.device, dtype: torch.dtype, wide_reference: bool,
            command: str) -> list[str]:
    wide = f"transformers in {_name(dtype)} and {_name(WIDER[dtype])}" if wide_reference else "none (fixed rule)"
    return [f"# Engine correctness: {folder.name}", "", environment_markdown(command, device).rstrip(),
            f"- weights: {_name(dtype)}; {new_tokens} greedy tokens per prompt",
            f"- reference: {wide}", ""]


def _logit_section(rows: list[LogitComparison], dtype: torch.dtype, wide_reference: bool) -> list[str]:
    fixed = f"max |engine − transformers| ≤ {LOGIT_TOLERANCE:g} · max |logit|, no top-1 miss outside a tie"
    if not wide_reference:
        lines = ["## Dense engine vs transformers (logits)", "", f"Pass (fixed rule): {fixed}.", "",
                 "| prompt | positions | max abs diff | max abs logit | top-1 agreement | non-tie top-1 misses | "
                 "pass |", "|---|---|---|---|---|---|---|"]
        for i, r in enumerate(rows):
            lines.append(f"| {i} | {r.positions} | {r.max_abs_diff:.4f} | {r.max_abs_logit:.2f} | "
                         f"{r.top1_agreement:.4f} | {r.unexplained_top1} | {_verdict(r.passed)} |")
        return lines + [""]
    low, wide = _name(dtype), _name(WIDER[dtype])
    lines = ["## Dense engine vs transformers (logits)", "",
             f"Errors are max |logit − transformers in {wide}| over all positions of the prompt, on the same "
             f"weights. Pass: engine error ≤ {ERROR_FACTOR:g} · transformers-{low} error + "
             f"{torch.finfo(dtype).eps:g} (eps of {low}) · max |logit|. Top-1 columns: agreement with the {wide} "
             f"reference. Fixed rule (reported, not the pass rule): {fixed}; its columns compare with transformers "
             f"in {low}.", "",
             f"| prompt | positions | max abs logit | engine error | transformers-{low} error | allowed | engine top-1 "
             f"| transformers top-1 | diff vs transformers-{low} | non-tie top-1 misses | fixed rule | pass |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        lines.append(f"| {i} | {r.positions} | {r.max_abs_logit:.2f} | {r.engine_error:.4g} | "
                     f"{r.reference_error:.4g} | {r.allowed_error:.4g} | {r.engine_top1:.4f} | "
                     f"{r.reference_top1:.4f} | {r.max_abs_diff:.4g} | {r.unexplained_top1} | "
                     f"{'yes' if r.within_fixed_tolerance else 'no'} | {_verdict(r.passed)} |")
    return lines + [""]


def _token_section(rows: list[TokenComparison], dtype: torch.dtype, wide_reference: bool) -> list[str]:
    rule = f"dense gap ≤ {TIE_TOLERANCE:g} · max(1, |top logit|)"
    if wide_reference:
        rule += (f" + {ERROR_FACTOR:g} · rounding shift, the rounding shift being how much {_name(dtype)} moves "
                 f"the same gap in transformers (|its {_name(dtype)} gap − its {_name(WIDER[dtype])} gap|)")
    lines = ["## Sparse engine vs dense engine (greedy tokens, same pruned weights)", "",
             f"Divergence is allowed only at a tie: {rule}.", "",
             "| prompt | new tokens | identical fraction | first divergence | dense gap there | rounding shift "
             "there | max abs logit diff there | tie | pass |", "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        at = "none" if r.first_divergence is None else str(r.first_divergence)
        gap = "" if r.dense_gap is None else f"{r.dense_gap:.4f}"
        shift = "" if r.rounding_shift is None else f"{r.rounding_shift:.4f}"
        diff = "" if r.max_abs_diff is None else f"{r.max_abs_diff:.4f}"
        tie = "" if r.tie is None else ("yes" if r.tie else "no")
        lines.append(f"| {i} | {r.new_tokens} | {r.equal_fraction:.4f} | {at} | {gap} | {shift} | {diff} | {tie} | "
                     f"{_verdict(r.passed)} |")
    return lines + [""]


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _verdict(passed: bool) -> str:
    return "yes" if passed else "NO"
