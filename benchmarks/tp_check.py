"""Tensor-parallel correctness on a real model folder (issue 14): the engine split over the ranks of torchrun against
the same engine on one device, as a markdown report.

    torchrun --nproc-per-node 2 benchmarks/tp_check.py --model DIR --out benchmarks/results/tp_check_NAME.md
    torchrun --nproc-per-node 2 benchmarks/tp_check.py --model DIR --device cpu --no-compile   # gloo, on the CPU

Every rank first runs the whole model on its own device (TP=1) in the check's dtype and in float32, then its shards
(TP=N); rank 0 compares and writes the report. Both checks follow `sparsedecoding check`
(evaluation/engine_check.py), with the TP=1 engine in the place of transformers:

- logits: over each prompt and TP=1's greedy continuation, replayed (prefill, then one-token steps), TP=N passes when
  max |TP=N - float32| <= 2 · max |TP=1 - float32| + eps · max |float32|, i.e. the split changes logits by no more
  than rounding in the check's dtype does;
- tokens: the compiled TP=N engine's greedy tokens (its step captured in a CUDA graph with the collectives) equal
  TP=1's, or first differ at a logit tie of TP=1.

`--sparse auto` packs the N:M block linears of a pruned folder (TP=1 and TP=N alike; the float32 reference is the
same weights dense). A model whose heads or widths the ranks cannot split is refused with one error line (SmolLM2-135M
has 9 query heads: it does not split over 2)."""

from __future__ import annotations

import argparse
import gc
import os
import sys
from pathlib import Path

import torch

from sparsedecoding.engine import Engine, load_hf_config, load_model
from sparsedecoding.engine.parallel import check_world, start_from_env
from sparsedecoding.errors import SparseDecodingError
from sparsedecoding.evaluation.engine_check import (DEFAULT_PROMPTS, WIDER, compare_logits, compare_tokens,
                                                    replay_logits)
from sparsedecoding.kernels import PackedLinear
from sparsedecoding.runenv import environment_markdown, pick_device
from sparsedecoding.settings import add_all_reduce_option


def greedy_and_replay(model, prompts: list[torch.Tensor], new_tokens: int, compile: bool,
                      continuations: list[torch.Tensor] | None = None):
    """Greedy tokens of each prompt (compiled engine when `compile`), and logits replayed over each prompt +
    `continuations` (default: the model's own tokens)."""
    engine = Engine(model, batch=1, max_seq_len=max(len(p) for p in prompts) + new_tokens, compile=compile)
    tokens = [engine.generate(prompt[None], new_tokens).tokens[0] for prompt in prompts]
    replays = [replay_logits(model, prompt, tokens) for prompt, tokens in zip(prompts, continuations or tokens)]
    return tokens, replays


def release(device: torch.device) -> None:
    torch._dynamo.reset()
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def run(args: argparse.Namespace, tp, device: torch.device) -> tuple[list[str], bool] | None:
    """The report's lines and whether both checks passed, on rank 0; None on the other ranks."""
    from transformers import AutoTokenizer

    world = tp.size()
    check_world(load_hf_config(args.model), world)
    dtype = getattr(torch, args.dtype)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    prompts = [torch.tensor(tokenizer(text)["input_ids"]) for text in DEFAULT_PROMPTS]
    compile = device.type == "cuda" and not args.no_compile

    single = load_model(args.model, args.sparse, dtype, device)
    single_tokens, single_logits = greedy_and_replay(single, prompts, args.new_tokens, compile)
    del single
    release(device)
    wide = load_model(args.model, "none", WIDER[dtype], device)
    wide_logits = [replay_logits(wide, prompt, tokens) for prompt, tokens in zip(prompts, single_tokens)]
    del wide
    release(device)
    split = load_model(args.model, args.sparse, dtype, device, tp)
    split_tokens, split_logits = greedy_and_replay(split, prompts, args.new_tokens, compile, single_tokens)
    packed = sum(isinstance(module, PackedLinear) for module in split.modules())
    if tp.rank() != 0:
        return None

    logit_rows, token_rows = [], []
    for prompt, *row in zip(prompts, single_tokens, split_tokens, single_logits, split_logits, wide_logits):
        one_tokens, many_tokens, one, many, reference = row
        logit_rows.append(compare_logits(many, one, reference, dtype))
        start = len(prompt) - 1
        token_rows.append(compare_tokens(one_tokens, many_tokens, one[start:], many[start:], one[start:],
                                         reference[start:]))
    passed = all(r.passed for r in logit_rows) and all(r.passed for r in token_rows)
    command = f"torchrun --nproc-per-node {world} " + " ".join(sys.argv)
    settings = ", ".join(f"{key}={os.environ.get(key, 'unset')}"
                         for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST"))
    lines = [f"# Tensor-parallel check: {args.model.name}, TP={world} vs TP=1", "",
             environment_markdown(command, device),
             f"- ranks: {world} × {device.type}; {args.dtype}, --sparse {args.sparse}, {args.new_tokens} new tokens, "
             f"{'compiled + CUDA graph' if compile else 'eager'}; {packed} packed block linears per rank; "
             f"{settings}", "",
             f"**{'PASS' if passed else 'FAIL'}**", "",
             "## Logits (prompt + TP=1's greedy continuation, replayed)", "",
             f"Pass: max |TP={world} - float32| <= 2 · max |TP=1 - float32| + eps · max |float32|.", "",
             f"| prompt | positions | max abs logit | max abs TP={world} - TP=1 | TP={world} error | TP=1 error | "
             "allowed | top-1 agreement | pass |", "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(logit_rows):
        lines.append(f"| {i} | {r.positions} | {r.max_abs_logit:.2f} | {r.max_abs_diff:.4g} | {r.engine_error:.4g} | "
                     f"{r.reference_error:.4g} | {r.allowed_error:.4g} | {r.top1_agreement:.4f} | "
                     f"{'yes' if r.passed else 'NO'} |")
    lines += ["", f"## Greedy tokens, TP={world} vs TP=1", "",
              "| prompt | new tokens | identical | first divergence | TP=1 gap there | tie | pass |",
              "|---|---|---|---|---|---|---|"]
    for i, r in enumerate(token_rows):
        divergence = "none" if r.first_divergence is None else str(r.first_divergence)
        gap = "" if r.dense_gap is None else f"{r.dense_gap:.4g}"
        lines.append(f"| {i} | {r.new_tokens} | {r.equal_fraction:.3f} | {divergence} | {gap} | "
                     f"{'' if r.tie is None else 'yes' if r.tie else 'no'} | {'yes' if r.passed else 'NO'} |")
    return lines + [""], passed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="HF safetensors folder or packed checkpoint")
    parser.add_argument("--dtype", choices=["bfloat16", "float16", "float32"], default="bfloat16")
    parser.add_argument("--sparse", choices=["none", "auto"], default="none",
                        help="auto: pack the N:M block linears of a pruned folder (default: none)")
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--device", default="auto", help="auto (cuda when available) or cpu (gloo)")
    parser.add_argument("--no-compile", action="store_true", help="eager TP=N decode, no CUDA graph")
    add_all_reduce_option(parser)
    parser.add_argument("--out", type=Path, help="also write the report here")
    args = parser.parse_args()
    if int(os.environ.get("WORLD_SIZE", "1")) < 2:
        print("error: run under `torchrun --nproc-per-node N` with N >= 2", file=sys.stderr)
        return 2
    try:
        with start_from_env(pick_device(args.device), args.all_reduce) as (tp, device):
            outcome = run(args, tp, device)
    except SparseDecodingError as exc:
        print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 2
    if outcome is None:
        return 0
    lines, passed = outcome
    report = "\n".join(lines)
    print(report)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(report)
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
