"""Correctness of the engine on a real checkpoint, one command, a markdown report:

    python -m sparsedecoding.engine.check --model DIR [--prune 2:4] --out report.md

`logits`: the dense engine against transformers on the same weights, over each prompt and the dense engine's own
greedy continuation (prompt positions go through prefill, the rest through one-token decode steps, so the KV cache
is exercised). `tokens`: the dense and the sparse engine (block linears packed by `--sparse auto`) decode greedily
with the compiled engine; the report gives the identical-token fraction, the first divergence and the logit margin
there. Divergence is allowed only after a tie: the dense top-2 gap at that position, recomputed by replaying the
common prefix, is within TIE_TOLERANCE relative to the top logit."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor, nn

from ..errors import EngineError, SparseDecodingError
from ..kernels import PackedLinear
from ..patterns import SparsityPattern
from ..solvers import magnitude
from .bench import environment
from .config import load_hf_config
from .generate import Engine
from .loading import model_from_hf
from .model import Transformer

# Relative size of a logit gap that bf16 rounding can flip: 2^-6 is four units in the last place of a bf16 number
# at the bottom of its binade (8 significant bits).
TIE_TOLERANCE = 2.0**-6
# Engine-vs-transformers logits agree when the largest difference is within this fraction of the largest logit.
LOGIT_TOLERANCE = 2.0**-5

DEFAULT_PROMPTS = (
    'def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n',
    "The three primary colors are",
    "Write a Python function that checks whether a string is a palindrome.\n",
    "Once upon a time, in a small village by the sea,",
)


@dataclass(frozen=True)
class LogitComparison:
    """Engine logits against reference logits at the same positions."""

    positions: int
    max_abs_diff: float
    max_abs_logit: float
    top1_agreement: float
    unexplained_top1: int  # top-1 disagreements where the reference's top-2 gap is not a tie

    @property
    def passed(self) -> bool:
        return self.max_abs_diff <= LOGIT_TOLERANCE * self.max_abs_logit and self.unexplained_top1 == 0


@dataclass(frozen=True)
class TokenComparison:
    """Greedy tokens of the sparse engine against the dense engine's for one prompt."""

    new_tokens: int
    equal_fraction: float
    first_divergence: int | None  # index among the new tokens
    dense_gap: float | None  # dense logit of its token minus that of the sparse engine's token, at the divergence
    max_abs_diff: float | None  # largest |dense - sparse| logit difference at the divergence (same prefix)
    tie: bool | None

    @property
    def passed(self) -> bool:
        return self.first_divergence is None or bool(self.tie)


def is_tie(gap: float, top_logit: float) -> bool:
    return gap <= TIE_TOLERANCE * max(1.0, abs(top_logit))


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


def compare_logits(ours: Tensor, reference: Tensor) -> LogitComparison:
    """Both [positions, vocab] float32."""
    top2 = reference.topk(2, dim=-1).values
    disagree = ours.argmax(-1) != reference.argmax(-1)
    gaps = top2[:, 0] - top2[:, 1]
    ties = torch.tensor([is_tie(g, t) for g, t in zip(gaps.tolist(), top2[:, 0].tolist())], device=ours.device)
    return LogitComparison(
        positions=len(ours), max_abs_diff=(ours - reference).abs().max().item(),
        max_abs_logit=reference.abs().max().item(), top1_agreement=1 - disagree.float().mean().item(),
        unexplained_top1=int((disagree & ~ties).sum()))


def compare_tokens(dense_tokens: Tensor, sparse_tokens: Tensor, dense_logits: Tensor,
                   sparse_logits: Tensor) -> TokenComparison:
    """Token sequences [n]; logits [n, vocab] from replaying the dense tokens through each model (row i predicts
    token i), so that both are evaluated on the same prefix at the divergence."""
    equal = dense_tokens == sparse_tokens
    n = len(dense_tokens)
    if bool(equal.all()):
        return TokenComparison(n, 1.0, None, None, None, None)
    p = int((~equal).nonzero()[0])
    a, b = int(dense_tokens[p]), int(sparse_tokens[p])
    gap = (dense_logits[p, a] - dense_logits[p, b]).item()
    return TokenComparison(
        new_tokens=n, equal_fraction=equal.float().mean().item(), first_divergence=p, dense_gap=gap,
        max_abs_diff=(dense_logits[p] - sparse_logits[p]).abs().max().item(),
        tie=is_tie(gap, dense_logits[p, a].item()))


def prune_in_place(hf_model: nn.Module, pattern: SparsityPattern) -> None:
    """Magnitude-prunes every linear inside the decoder layers of a transformers model (embeddings and lm_head
    stay dense), so that the check can run on a model nobody has pruned yet."""
    for name, module in hf_model.named_modules():
        if isinstance(module, nn.Linear) and ".layers." in name:
            module.weight.copy_(magnitude(module.weight, None, pattern))


def run(folder: Path, prune: SparsityPattern | None, prompts: list[str], new_tokens: int, device: torch.device,
        compile: bool, checks: list[str], dtype: torch.dtype = torch.bfloat16) -> str:
    """Runs the checks and returns the markdown report."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    args = load_hf_config(folder)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    hf = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype).to(device).eval().requires_grad_(False)
    if prune is not None:
        prune_in_place(hf, prune)
    weights = hf.state_dict()
    dense = model_from_hf(args, weights.__getitem__, "none", dtype, device)
    encoded = [torch.tensor(tokenizer(text)["input_ids"]) for text in prompts]
    max_seq_len = max(len(p) for p in encoded) + new_tokens
    dense_tokens = _greedy(dense, encoded, new_tokens, max_seq_len, compile)
    dense_logits = [replay_logits(dense, prompt, tokens) for prompt, tokens in zip(encoded, dense_tokens)]
    lines = _header(folder, prune, new_tokens, device, dtype)
    if "logits" in checks:
        rows = []
        for prompt, tokens, ours in zip(encoded, dense_tokens, dense_logits):
            reference = hf(torch.cat([prompt, tokens])[None].to(device)).logits[0, :-1].float()
            rows.append(compare_logits(ours, reference))
        lines += _logit_section(rows)
    if "tokens" in checks:
        sparse = model_from_hf(args, weights.__getitem__, "auto", dtype, device)
        if not any(isinstance(m, PackedLinear) for m in sparse.modules()):
            raise EngineError(f"no block linear of {folder} is N:M sparse; pass a pruned folder or --prune 2:4")
        sparse_tokens = _greedy(sparse, encoded, new_tokens, max_seq_len, compile)
        rows = []
        for prompt, d, s, logits in zip(encoded, dense_tokens, sparse_tokens, dense_logits):
            start = len(prompt) - 1
            rows.append(compare_tokens(d, s, logits[start:], replay_logits(sparse, prompt, d)[start:]))
        lines += _token_section(rows)
    return "\n".join(lines) + "\n"


def _greedy(model: Transformer, prompts: list[Tensor], new_tokens: int, max_seq_len: int,
            compile: bool) -> list[Tensor]:
    engine = Engine(model, batch=1, max_seq_len=max_seq_len, compile=compile)
    return [engine.generate(prompt[None], new_tokens).tokens[0] for prompt in prompts]


def _header(folder: Path, prune: SparsityPattern | None, new_tokens: int, device: torch.device,
            dtype: torch.dtype) -> list[str]:
    command = " ".join(["python -m sparsedecoding.engine.check", *sys.argv[1:]])
    pruned = f", magnitude-pruned to {prune} in memory" if prune else ""
    return [f"# Engine correctness: {folder.name}", "", environment(device, command).rstrip(),
            f"- weights: {str(dtype).removeprefix('torch.')}{pruned}; {new_tokens} greedy tokens per prompt", ""]


def _logit_section(rows: list[LogitComparison]) -> list[str]:
    lines = ["## Dense engine vs transformers (logits)", "",
             f"Pass: max |diff| ≤ {LOGIT_TOLERANCE:g} · max |logit| and no top-1 disagreement outside a tie.", "",
             "| prompt | positions | max abs diff | max abs logit | top-1 agreement | non-tie top-1 misses | pass |",
             "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        lines.append(f"| {i} | {r.positions} | {r.max_abs_diff:.4f} | {r.max_abs_logit:.2f} | "
                     f"{r.top1_agreement:.4f} | {r.unexplained_top1} | {'yes' if r.passed else 'NO'} |")
    return lines + [""]


def _token_section(rows: list[TokenComparison]) -> list[str]:
    lines = ["## Sparse engine vs dense engine (greedy tokens, same pruned weights)", "",
             f"Divergence is allowed only at a tie: dense top-2 gap ≤ {TIE_TOLERANCE:g} · max(1, |top logit|).", "",
             "| prompt | new tokens | identical fraction | first divergence | dense gap there | max abs logit diff "
             "there | tie | pass |", "|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rows):
        at = "none" if r.first_divergence is None else str(r.first_divergence)
        gap = "" if r.dense_gap is None else f"{r.dense_gap:.4f}"
        diff = "" if r.max_abs_diff is None else f"{r.max_abs_diff:.4f}"
        tie = "" if r.tie is None else ("yes" if r.tie else "no")
        lines.append(f"| {i} | {r.new_tokens} | {r.equal_fraction:.4f} | {at} | {gap} | {diff} | {tie} | "
                     f"{'yes' if r.passed else 'NO'} |")
    return lines + [""]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sparsedecoding.engine.check", description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="HF safetensors folder (dense or pruned)")
    parser.add_argument("--prune", type=SparsityPattern.parse, help="magnitude-prune the block linears in memory")
    parser.add_argument("--new-tokens", type=int, default=256)
    parser.add_argument("--prompt", action="append", help="prompt text (repeatable); default: four built-in prompts")
    parser.add_argument("--checks", nargs="+", choices=["logits", "tokens"], default=["logits", "tokens"])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--no-compile", action="store_true", help="eager engine (CPU, or to isolate compile issues)")
    parser.add_argument("--out", type=Path, help="markdown report path (default: stdout)")
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    try:
        report = run(args.model, args.prune, args.prompt or list(DEFAULT_PROMPTS), args.new_tokens, device,
                     compile=device.type == "cuda" and not args.no_compile, checks=args.checks)
    except SparseDecodingError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
