"""How far pruned models' residual streams sit from the dense model's on held-out prompts (prompt only, teacher
forced), and where they put `<|im_end|>` for the first answer token. Used for benchmarks/results/refine-smollm2-cpu/.

    python benchmarks/hidden_state_gap.py --dense smollm2-135m --models plain=DIR refine2=DIR [--prompts 8]

Per model: mean over prompts of ‖h − h_dense‖/‖h_dense‖ at chosen layers (transformers' `output_hidden_states`; the
last entry is the final normed output), at the last prompt position (which predicts the first answer token) and over
the other prompt positions; and the rank of the end-of-turn token in the first-token logits per prompt."""

from __future__ import annotations

import argparse

import torch

from sparsedecoding.data import chat_format, read_prompts
from sparsedecoding.generation import tokenize_prompts
from sparsedecoding.models import load_model


@torch.no_grad()
def states(folder: str, prompts: list[str]) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], object]:
    model, tokenizer, _ = load_model(folder, torch.device("cpu"))
    result = []
    for ids in tokenize_prompts(tokenizer, chat_format(tokenizer, prompts)):
        out = model(torch.tensor([ids]), output_hidden_states=True)
        result.append((torch.stack([h[0] for h in out.hidden_states]), out.logits[0, -1]))
    return result, tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dense", required=True)
    parser.add_argument("--models", nargs="+", required=True, help="NAME=FOLDER of pruned models")
    parser.add_argument("--prompts", type=int, default=8, help="first N prompts of humaneval:eval (default 8)")
    parser.add_argument("--end-token", default="<|im_end|>")
    args = parser.parse_args()
    prompts = read_prompts("humaneval:eval")[:args.prompts]
    dense, tokenizer = states(args.dense, prompts)
    end = tokenizer.convert_tokens_to_ids(args.end_token)
    depth = dense[0][0].shape[0] - 1
    layers = sorted({0, *range(5, depth, 5), depth})
    print(f"layers {layers} (the last is the final normed output)")
    for spec in args.models:
        name, folder = spec.split("=", 1)
        last, others, ranks = [], [], []
        for (h_dense, _), (h, logits) in zip(dense, states(folder, prompts)[0]):
            gap = (h - h_dense).norm(dim=-1) / h_dense.norm(dim=-1)  # [layers + 1, positions]
            last.append(gap[:, -1])
            others.append(gap[:, :-1].mean(-1))
            ranks.append(int((logits > logits[end]).sum()))
        last, others = torch.stack(last).mean(0), torch.stack(others).mean(0)
        print(f"{name}: last prompt position {[round(float(last[i]), 3) for i in layers]}")
        print(f"{name}: other prompt positions {[round(float(others[i]), 3) for i in layers]}")
        print(f"{name}: rank of {args.end_token} in the first-token logits per prompt {ranks}")


if __name__ == "__main__":
    main()
